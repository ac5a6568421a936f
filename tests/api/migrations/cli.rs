//! The `migrate` and `duplicates` commands of the real binary: exit codes and what they
//! print.

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

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("applied"), "{out}");
    assert!(!out.contains("would apply"), "{out}");
    let rows = fresh.applied().await;
    assert_eq!(rows.len(), all().len());

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("nothing to apply"), "{out}");

    let (ok, out, err) = tokenmint(fresh.name(), &["duplicates"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("no duplicates"), "{out}");
    assert_eq!(fresh.applied().await, rows, "duplicates changes nothing");
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

    let (ok, out, err) = tokenmint(fresh.name(), &["migrate"]).await;
    assert!(!ok, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("pi_cli_dup"), "{err}");
    assert!(!err.contains("E11000"), "{err}");
    assert!(fresh.applied().await.is_empty());
    assert_eq!(fresh.count("tokens", doc! {}).await, 2);
}
