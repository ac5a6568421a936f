//! Applying migrations: each once and recorded with its checksum, an edited applied file
//! refused, concurrent starts applying each migration once, a dropped index dropped again
//! when its migration was not recorded, and a dry run that lists and writes nothing.

use mongodb::bson::{DateTime, doc};
use tokenmint::migrate::{
    MigrateError, TOKEN_PAYMENT_INDEX_KEYS, missing_indexes, parse, pending, run, verify_applied,
};

use super::{FreshDb, all, token};
use crate::helpers::{FailPoint, Fault, connect_store, mongo_uri_named, unique_app_name};

/// The text of migration file `id` in `migrations/`.
fn migration_file(id: &str) -> String {
    let path = format!("{}/migrations/{id}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test]
async fn run_applies_every_migration_once() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    assert_eq!(
        pending(&store).await.unwrap(),
        all(),
        "all pending at first"
    );

    let started = DateTime::now();
    let report = run(&store, false).await.unwrap();
    assert_eq!(report.applied, all());
    assert!(report.already_applied.is_empty());

    let applied = fresh.applied().await;
    assert_eq!(applied.len(), all().len(), "{applied:?}");
    for (row, id) in applied.iter().zip(&all()) {
        assert_eq!(row.get_str("_id").unwrap(), id);
        let checksum = row.get_str("checksum").unwrap();
        assert_eq!(checksum.len(), 64, "{row}");
        assert!(
            checksum
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "lower-case hex: {row}"
        );
        assert_eq!(
            checksum,
            parse(id, &migration_file(id)).unwrap().checksum,
            "the checksum is the file's"
        );
        let applied_at = row.get_datetime("appliedAt").unwrap();
        assert!(*applied_at >= started, "{row}");
    }

    let tokens = fresh.indexes("tokens").await;
    assert!(
        tokens.contains(&("uniq_token_payment_index".to_owned(), true)),
        "{tokens:?}"
    );
    let issuances = fresh.indexes("issuances").await;
    assert!(
        issuances.contains(&("uniq_issuance_payment".to_owned(), true)),
        "{issuances:?}"
    );
    // The key order of the token index is the one in the file.
    let index = fresh
        .index_models("tokens")
        .await
        .into_iter()
        .find(|i| {
            i.options.as_ref().and_then(|o| o.name.as_deref()) == Some("uniq_token_payment_index")
        })
        .unwrap();
    let keys: Vec<&String> = index.keys.keys().collect();
    assert_eq!(keys, TOKEN_PAYMENT_INDEX_KEYS);

    // Again: nothing to do, nothing rewritten.
    let again = run(&store, false).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.already_applied, all());
    assert_eq!(fresh.applied().await, applied, "records untouched");
    assert!(pending(&store).await.unwrap().is_empty());
    verify_applied(&store).await.unwrap();
    assert_eq!(
        fresh.count("_migrations_lock", doc! {}).await,
        0,
        "the lock is released"
    );
}

#[tokio::test]
async fn a_dropped_index_is_gone_and_dropping_it_again_is_done() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    let names = |indexes: Vec<(String, bool)>| -> Vec<String> {
        indexes.into_iter().map(|(name, _)| name).collect()
    };
    let tokens = names(fresh.indexes("tokens").await);
    assert!(
        !tokens.contains(&"tokens_owner_type_status".to_owned()),
        "0011's index is dropped by 0015: {tokens:?}"
    );
    assert!(
        tokens.contains(&"tokens_owner_type_status_age".to_owned()),
        "{tokens:?}"
    );

    // As if an instance died after the drop, before recording it: the step runs again
    // on an index already gone, and the migration is recorded.
    fresh
        .collection("_migrations")
        .delete_one(doc! { "_id": "0015_tokens_drop_owner_balance_index" })
        .await
        .unwrap();
    let again = run(&store, false).await.unwrap();
    assert_eq!(again.applied, ["0015_tokens_drop_owner_balance_index"]);
    assert_eq!(names(fresh.indexes("tokens").await), tokens);
}

#[tokio::test]
async fn an_edited_applied_migration_is_refused() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    let edited = "0".repeat(64);
    let result = fresh
        .collection("_migrations")
        .update_one(
            doc! { "_id": "0001_tokens_unique_payment_index" },
            doc! { "$set": { "checksum": &edited } },
        )
        .await
        .unwrap();
    assert_eq!(result.modified_count, 1);

    let check = |err: MigrateError| match err {
        MigrateError::ChecksumMismatch {
            id,
            applied,
            embedded,
        } => {
            assert_eq!(id, "0001_tokens_unique_payment_index");
            assert_eq!(applied, edited);
            assert_eq!(embedded, parse(&id, &migration_file(&id)).unwrap().checksum);
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    };
    let err = run(&store, false).await.unwrap_err();
    assert!(
        err.to_string().contains("0001_tokens_unique_payment_index"),
        "{err}"
    );
    check(err);
    check(verify_applied(&store).await.unwrap_err());
    check(run(&store, true).await.unwrap_err());
    // Nothing was changed by the refusals.
    assert_eq!(fresh.applied().await.len(), all().len());
    assert_eq!(
        fresh
            .count(
                "_migrations",
                doc! { "_id": "0001_tokens_unique_payment_index", "checksum": &edited }
            )
            .await,
        1
    );
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
}

#[tokio::test]
async fn concurrent_runs_apply_each_migration_once() {
    let fresh = FreshDb::new().await;
    let (a, b) = (fresh.store().await, fresh.store().await);
    let (ra, rb) = tokio::join!(run(&a, false), run(&b, false));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut applied: Vec<String> = ra.applied.iter().chain(&rb.applied).cloned().collect();
    applied.sort();
    assert_eq!(
        applied,
        all(),
        "each migration applied by exactly one runner"
    );

    let rows = fresh.applied().await;
    let ids: Vec<&str> = rows.iter().map(|r| r.get_str("_id").unwrap()).collect();
    assert_eq!(ids, all());
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
    assert!(pending(&a).await.unwrap().is_empty());

    // Three at once on another fresh database, with one store shared by two of them.
    let fresh = FreshDb::new().await;
    let (a, b) = (fresh.store().await, fresh.store().await);
    let (ra, rb, rc) = tokio::join!(run(&a, false), run(&b, false), run(&a, false));
    let total = [ra.unwrap(), rb.unwrap(), rc.unwrap()]
        .iter()
        .map(|r| r.applied.len())
        .sum::<usize>();
    assert_eq!(total, all().len());
    assert_eq!(fresh.applied().await.len(), all().len());
}

#[tokio::test]
async fn a_dry_run_lists_and_writes_nothing() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    fresh
        .collection("tokens")
        .insert_one(token("pi_dry", 0))
        .await
        .unwrap();

    let report = run(&store, true).await.unwrap();
    assert_eq!(report.applied, all());
    assert!(report.already_applied.is_empty());
    assert!(fresh.applied().await.is_empty());
    assert_eq!(
        fresh.collections().await,
        ["tokens"],
        "no _migrations, no lock, no issuances"
    );
    assert_eq!(
        fresh.indexes("tokens").await,
        [("_id_".to_owned(), false)],
        "no index built"
    );
    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        1,
        "no backfill"
    );

    // After a real run, a dry run has nothing left to do.
    run(&store, false).await.unwrap();
    let report = run(&store, true).await.unwrap();
    assert!(report.applied.is_empty());
    assert_eq!(report.already_applied, all());
}

/// A start that may not migrate (`migrations.apply_on_startup = false`) while the set
/// elects: its read of the applied migrations fails (no primary yet) before the database
/// ever answered it. It waits for the new primary and checks them, rather than ending the
/// start.
#[tokio::test]
async fn a_check_of_applied_migrations_waits_for_a_database_failing_its_first_reads() {
    let fresh = FreshDb::new().await;
    run(&fresh.store().await, false).await.unwrap();
    let app_name = unique_app_name();
    let starting = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let applied = format!("{}._migrations", fresh.name());
    // Four: the driver retries each read once on this error; two reads fail.
    let failpoint = FailPoint::set_on(&app_name, &["find"], &applied, Fault::error(91), 4).await;
    verify_applied(&starting)
        .await
        .expect("a database failing its first reads is waited for");
    assert_eq!(failpoint.off().await, 4, "the first reads failed");
}

#[tokio::test]
async fn indexes_lost_after_their_migration_are_found_and_built_again() {
    // A restore that left the indexes behind, or an index dropped by hand: `_migrations`
    // still lists the migrations, and nothing else would guard the payment's unique key.
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    fresh
        .collection("tokens")
        .drop_index("uniq_token_payment_index")
        .await
        .unwrap();
    fresh.collection("redemptions").drop().await.unwrap();
    let lost = vec![
        "tokens.uniq_token_payment_index (0001_tokens_unique_payment_index)".to_owned(),
        "redemptions.uniq_redemption_reference (0012_redemptions_unique_reference)".to_owned(),
    ];
    assert_eq!(missing_indexes(&store).await.unwrap(), lost);

    // A start that may not change the schema refuses, naming them.
    let err = verify_applied(&store).await.unwrap_err();
    assert!(matches!(err, MigrateError::IndexesMissing(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("uniq_token_payment_index") && text.contains("tokenmint migrate"),
        "{text}"
    );

    // A dry run says it would build them again, and builds nothing.
    let dry = run(&store, true).await.unwrap();
    assert_eq!(dry.recreated, lost);
    assert_eq!(missing_indexes(&store).await.unwrap(), lost);

    // A duplicate written while the index was gone blocks its build with the report.
    fresh
        .collection("tokens")
        .insert_many([token("pi_lost", 0), token("pi_lost", 0)])
        .await
        .unwrap();
    let err = run(&store, false).await.unwrap_err();
    let MigrateError::Duplicates { id, report } = err else {
        panic!("expected Duplicates, got {err:?}")
    };
    assert_eq!(id, "0001_tokens_unique_payment_index");
    assert_eq!(report.total, 1, "{report}");
    fresh
        .collection("tokens")
        .delete_one(doc! { "_id": report.groups[0].sample_ids[0].clone() })
        .await
        .unwrap();

    // Resolved, a run (`migrate`, or a start that applies migrations) builds them again.
    let report = run(&store, false).await.unwrap();
    assert_eq!(report.recreated, lost);
    assert!(report.applied.is_empty(), "{:?}", report.applied);
    assert!(
        fresh
            .indexes("tokens")
            .await
            .contains(&("uniq_token_payment_index".to_owned(), true))
    );
    assert!(
        fresh
            .indexes("redemptions")
            .await
            .contains(&("uniq_redemption_reference".to_owned(), true))
    );
    assert!(missing_indexes(&store).await.unwrap().is_empty());
    verify_applied(&store).await.unwrap();
    // An index a later migration dropped is not missing, and is not built again.
    assert!(
        !fresh
            .indexes("tokens")
            .await
            .iter()
            .any(|(name, _)| name == "tokens_owner_type_status")
    );
}

/// An index of another shape where a migration's stood (made by hand: its name without
/// `unique`, or its keys under another name) cannot be built over: it is named with
/// what the operator does, and every run and start refuses until it is dropped.
#[tokio::test]
async fn an_index_lost_in_another_shape_is_named_and_left_to_the_operator() {
    use mongodb::IndexModel;
    use mongodb::options::IndexOptions;
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    let by_hand = |keys, name: &str, unique: bool| {
        IndexModel::builder()
            .keys(keys)
            .options(
                IndexOptions::builder()
                    .name(name.to_owned())
                    .unique(unique)
                    .build(),
            )
            .build()
    };
    let payments = fresh.collection("payments");
    payments.drop_index("uniq_payment").await.unwrap();
    payments
        .create_index(by_hand(
            doc! { "provider": 1, "accountId": 1, "paymentIntentId": 1.0 },
            "uniq_payment",
            false,
        ))
        .await
        .unwrap();
    let redemptions = fresh.collection("redemptions");
    redemptions
        .drop_index("uniq_redemption_reference")
        .await
        .unwrap();
    redemptions
        .create_index(by_hand(
            doc! { "owner": 1, "reference": 1.0 },
            "by_hand",
            true,
        ))
        .await
        .unwrap();

    let found = missing_indexes(&store).await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with(
            "payments.uniq_payment (0006_payments_unique_payment) is not as its migration built it"
        ),
        "{found:?}"
    );
    assert!(
        found[1].starts_with("redemptions.uniq_redemption_reference (0012_redemptions_unique_reference) has its keys indexed as `by_hand`"),
        "{found:?}"
    );
    let err = run(&store, false).await.unwrap_err();
    assert!(matches!(err, MigrateError::IndexesMissing(_)), "{err:?}");
    assert!(err.to_string().contains("drop that index"), "{err}");
    assert!(matches!(
        verify_applied(&store).await.unwrap_err(),
        MigrateError::IndexesMissing(_)
    ));

    // Dropped, a run builds them as their migrations did.
    payments.drop_index("uniq_payment").await.unwrap();
    redemptions.drop_index("by_hand").await.unwrap();
    let report = run(&store, false).await.unwrap();
    assert_eq!(report.recreated.len(), 2, "{:?}", report.recreated);
    assert!(missing_indexes(&store).await.unwrap().is_empty());
}

/// What a pending migration drops is not built first, and a database a newer version
/// migrated is left to it: neither is lost.
#[tokio::test]
async fn indexes_a_pending_migration_drops_or_a_newer_version_migrated_are_not_lost() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    // 0015 dropped 0011's index; its record lost (an election before it was kept).
    fresh
        .collection("_migrations")
        .delete_one(doc! { "_id": "0015_tokens_drop_owner_balance_index" })
        .await
        .unwrap();
    assert!(missing_indexes(&store).await.unwrap().is_empty());
    verify_applied(&store).await.unwrap();
    run(&store, false).await.unwrap();

    // A newer version's migration recorded, one of ours gone: what it changed is its own.
    fresh
        .collection("_migrations")
        .insert_one(doc! { "_id": "9999_newer", "checksum": "0".repeat(64) })
        .await
        .unwrap();
    fresh
        .collection("tokens")
        .drop_index("tokens_owner_id")
        .await
        .unwrap();
    assert!(missing_indexes(&store).await.unwrap().is_empty());
    verify_applied(&store).await.unwrap();
}
