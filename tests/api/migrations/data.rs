//! Migrations that meet existing data: duplicates block a unique index with a report
//! naming them, and a backfill gives every document its field, in batches.

use mongodb::bson::{Bson, Document, doc};
use tokenmint::migrate::{MigrateError, pending, run};

use super::{FreshDb, all, token};

#[tokio::test]
async fn duplicates_block_the_unique_index_with_a_report() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    fresh
        .collection("tokens")
        .insert_many([
            token("pi_dup", 0),
            token("pi_dup", 0),
            token("pi_dup", 1),
            token("pi_fine", 0),
        ])
        .await
        .unwrap();

    let err = run(&store, false).await.unwrap_err();
    let text = err.to_string();
    let MigrateError::Duplicates { id, report } = err else {
        panic!("expected Duplicates, got {err:?}")
    };
    assert_eq!(id, "0001_tokens_unique_payment_index");
    assert_eq!(report.index, "uniq_token_payment_index");
    assert_eq!(report.collection, "tokens");
    assert_eq!(report.groups.len(), 1, "{report}");
    let group = &report.groups[0];
    assert_eq!(group.count, 2);
    assert_eq!(group.sample_ids.len(), 2);
    assert_eq!(
        group.key.get_str("origin.paymentIntentId").unwrap(),
        "pi_dup"
    );
    assert!(
        matches!(
            group.key.get("tokenIndex"),
            Some(Bson::Int64(0) | Bson::Int32(0))
        ),
        "{}",
        group.key
    );
    assert!(text.contains("pi_dup"), "{text}");
    assert!(text.contains("uniq_token_payment_index"), "{text}");
    assert!(!text.contains("E11000"), "{text}");
    assert!(!text.contains("pi_fine"), "{text}");

    // Nothing applied, no index built, the lock released; the data is left alone.
    assert!(fresh.applied().await.is_empty());
    assert!(
        !fresh
            .indexes("tokens")
            .await
            .iter()
            .any(|(name, _)| name == "uniq_token_payment_index")
    );
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
    assert_eq!(fresh.count("tokens", doc! {}).await, 4);
    assert_eq!(pending(&store).await.unwrap(), all());

    // Once resolved, the migration applies.
    let group_ids = group.sample_ids.clone();
    fresh
        .collection("tokens")
        .delete_one(doc! { "_id": group_ids[1].clone() })
        .await
        .unwrap();
    assert_eq!(run(&store, false).await.unwrap().applied, all());
}

#[tokio::test]
async fn backfill_gives_every_token_a_version() {
    const TOKENS: i64 = 2_500;
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    let docs: Vec<Document> = (0..TOKENS).map(|i| token("pi_backfill", i)).collect();
    fresh.collection("tokens").insert_many(docs).await.unwrap();
    // One token already past version 0 must keep its version.
    let mut versioned = token("pi_versioned", 0);
    versioned.insert("_version", 3_i64);
    fresh
        .collection("tokens")
        .insert_one(versioned)
        .await
        .unwrap();
    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        TOKENS as u64
    );

    assert_eq!(run(&store, false).await.unwrap().applied, all());

    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        0
    );
    assert_eq!(
        fresh
            .count(
                "tokens",
                doc! { "origin.paymentIntentId": "pi_backfill", "_version": 0 }
            )
            .await,
        TOKENS as u64
    );
    assert_eq!(
        fresh
            .count(
                "tokens",
                doc! { "origin.paymentIntentId": "pi_versioned", "_version": 3 }
            )
            .await,
        1
    );
    // `_version` is stored as an integer type ($inc-compatible), not a double.
    let sample = fresh
        .collection("tokens")
        .find_one(doc! { "origin.paymentIntentId": "pi_backfill" })
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            sample.get("_version"),
            Some(Bson::Int32(0) | Bson::Int64(0))
        ),
        "{sample}"
    );
    assert_eq!(fresh.count("tokens", doc! {}).await, TOKENS as u64 + 1);
}

#[tokio::test]
async fn a_field_missing_and_the_same_field_null_are_one_duplicate_key() {
    // A unique index keys a missing field as null: these two collide, so the report that
    // stands in for the index build must group them, or it finds nothing and the build
    // then fails with the database's own error.
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    let mut missing = token("pi_null", 0);
    missing.remove("tokenIndex");
    let mut null = token("pi_null", 0);
    null.insert("tokenIndex", Bson::Null);
    fresh
        .collection("tokens")
        .insert_many([missing, null])
        .await
        .unwrap();

    let report = blocked_by_duplicates(&store).await;
    assert_eq!(report.groups.len(), 1, "{report}");
    assert_eq!(report.groups[0].count, 2, "{report}");
    assert_eq!(report.groups[0].key.get("tokenIndex"), Some(&Bson::Null));
    assert!(fresh.applied().await.is_empty());
}

#[tokio::test]
async fn a_report_lists_the_largest_groups_and_counts_them_all() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    let groups = 23;
    let tokens: Vec<Document> = (0..groups)
        .flat_map(|g| {
            [
                token(&format!("pi_many_{g}"), 0),
                token(&format!("pi_many_{g}"), 0),
            ]
        })
        .collect();
    fresh
        .collection("tokens")
        .insert_many(tokens)
        .await
        .unwrap();

    let report = blocked_by_duplicates(&store).await;
    assert_eq!(report.groups.len(), 20, "a report lists twenty: {report}");
    assert_eq!(report.total, groups, "{report}");
    let text = report.to_string();
    assert!(text.starts_with("23 group(s) of duplicates"), "{text}");
    assert!(text.contains("the 20 largest"), "{text}");
}

/// The report of the duplicates a run of the migrations stops on.
async fn blocked_by_duplicates(
    store: &tokenmint::store::Store,
) -> tokenmint::migrate::DuplicateReport {
    match run(store, false).await {
        Err(MigrateError::Duplicates { report, .. }) => report,
        other => panic!("expected Duplicates, got {other:?}"),
    }
}
