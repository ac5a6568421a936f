//! The `migrate` and `duplicates` commands of the real binary: exit codes and what they
//! print, as text and as `duplicates --json`.

use mongodb::bson::doc;

use super::{FreshDb, all, token};
use crate::helpers::{mongo_uri, run_command};

/// Runs the real `tokenmint` binary on database `db` of the test mongod: (success,
/// stdout, stderr).
async fn tokenmint(db: &str, args: &[&str]) -> (bool, String, String) {
    let output = run_command(&mongo_uri(), db, args, &[]).await;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (
        output.status.success(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

/// `expireAfterSeconds` of webhook_events' TTL index, if it has one.
async fn webhook_ttl_secs(fresh: &FreshDb) -> Option<i64> {
    use futures::TryStreamExt;
    let indexes = fresh
        .collection("webhook_events")
        .list_indexes()
        .await
        .ok()?;
    let indexes: Vec<mongodb::IndexModel> = indexes.try_collect().await.ok()?;
    indexes
        .into_iter()
        .filter_map(|index| index.options)
        .find(|options| options.name.as_deref() == Some("webhook_events_ttl"))
        .and_then(|options| options.expire_after)
        .map(|after| after.as_secs() as i64)
}

#[tokio::test]
async fn cli_migrate_and_duplicates() {
    let fresh = FreshDb::new().await;

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate", "--dry-run"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("would apply"), "{out}");
    for id in all() {
        assert!(out.contains(&id), "{out}");
    }
    assert!(fresh.applied().await.is_empty(), "a dry run writes nothing");
    assert!(out.contains("would keep events 30 days"), "{out}");
    assert_eq!(
        webhook_ttl_secs(&fresh).await,
        None,
        "a dry run writes nothing"
    );

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("applied"), "{out}");
    assert!(!out.contains("would apply"), "{out}");
    let rows = fresh.applied().await;
    assert_eq!(rows.len(), all().len());
    // The webhook retention is schema work `migrate` does too.
    assert!(out.contains("now keeps events 30 days"), "{out}");
    assert_eq!(webhook_ttl_secs(&fresh).await, Some(30 * 86_400));

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("nothing to apply"), "{out}");
    assert!(!out.contains("keeps events"), "{out}");

    let (ok, out, err) = tokenmint(fresh.name(), &["duplicates"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("no duplicates"), "{out}");
    let (ok, out, err) = tokenmint(fresh.name(), &["duplicates", "--json"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["groups"], 0, "{report}");
    assert_eq!(fresh.applied().await, rows, "duplicates changes nothing");

    // An index lost after its migration: `verify` finds it, `migrate` builds it again.
    fresh
        .collection("payments")
        .drop_index("uniq_payment")
        .await
        .unwrap();
    let (ok, out, err) = tokenmint(fresh.name(), &["verify", "--json"]).await;
    assert!(
        !ok,
        "a missing index is a finding\nstdout: {out}\nstderr: {err}"
    );
    let report: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    let missing = &report["findings"]["missingIndexes"];
    assert_eq!(missing["count"], 1, "{report}");
    assert_eq!(
        missing["samples"][0], "payments.uniq_payment (0006_payments_unique_payment)",
        "{report}"
    );
    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("rebuilt          payments.uniq_payment"),
        "{out}"
    );
    let (ok, out, err) = tokenmint(fresh.name(), &["verify"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert_eq!(fresh.applied().await, rows, "nothing recorded anew");
}

#[tokio::test]
async fn cli_reports_duplicates_and_refuses_to_migrate() {
    let fresh = FreshDb::new().await;
    fresh
        .collection("tokens")
        .insert_many([token("pi_cli_dup", 0), token("pi_cli_dup", 0)])
        .await
        .unwrap();

    let (ok, out, err) = tokenmint(fresh.name(), &["duplicates"]).await;
    assert!(
        !ok,
        "duplicates found is a failure\nstdout: {out}\nstderr: {err}"
    );
    assert!(out.contains("uniq_token_payment_index"), "{out}");
    assert!(out.contains("pi_cli_dup"), "{out}");
    assert!(out.contains("2 x"), "the group and its size: {out}");
    assert!(out.contains("1 group(s) of duplicates"), "{out}");

    // The same as one JSON document, with the same exit status.
    let (ok, out, err) = tokenmint(fresh.name(), &["duplicates", "--json"]).await;
    assert!(!ok, "stdout: {out}\nstderr: {err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("one JSON document ({e}): {out}"));
    assert_eq!(report["clean"], false, "{report}");
    assert_eq!(report["groups"], 1, "{report}");
    let indexes = report["indexes"].as_array().unwrap();
    assert!(indexes.len() > 1, "every unique index is listed: {report}");
    let blocked: Vec<&serde_json::Value> = indexes
        .iter()
        .filter(|i| !i["groups"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(blocked.len(), 1, "{report}");
    assert_eq!(blocked[0]["index"], "uniq_token_payment_index", "{report}");
    assert_eq!(blocked[0]["collection"], "tokens", "{report}");
    let group = &blocked[0]["groups"][0];
    assert_eq!(group["count"], 2, "{report}");
    assert_eq!(
        group["key"]["origin.paymentIntentId"], "pi_cli_dup",
        "{report}"
    );
    assert_eq!(group["key"]["tokenIndex"], 0, "{report}");
    let ids = group["sampleIds"].as_array().unwrap();
    assert_eq!(ids.len(), 2, "{report}");
    assert!(ids.iter().all(|id| id["$oid"].is_string()), "{report}");

    // Duplicates found, as `duplicates` reports them: exit 1, not 2 (it could run).
    let output = run_command(&mongo_uri(), fresh.name(), &["migrate"], &[]).await;
    let (out, err) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "stdout: {out}\nstderr: {err}"
    );
    assert!(err.contains("pi_cli_dup"), "{err}");
    assert!(!err.contains("E11000"), "{err}");
    assert!(fresh.applied().await.is_empty());
    assert_eq!(fresh.count("tokens", doc! {}).await, 2);
}
