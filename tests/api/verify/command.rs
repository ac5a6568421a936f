//! The `verify` command of the real binary: exit code 0 when clean, 1 on violations, 2
//! when it cannot run; `--repair` completes short sets and revokes unbacked tokens, once;
//! `--json` prints one document with the same findings and the same exit codes.

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};

use super::{run_verify, token};
use crate::helpers::*;

/// An issuance record as the service writes it (stripe, acct_1, OWNER, standard).
fn record(payment: &str, quantity: i64, status: &str) -> Document {
    doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
        "owner": ObjectId::parse_str(OWNER).unwrap(), "tokenType": "standard",
        "quantity": quantity, "paymentDate": DateTime::now(), "mode": "upsert",
        "status": status, "createdAt": DateTime::now(),
    }
}

/// A payment document as the projection writes it.
fn payment(payment: &str, status: &str, amount_refunded: Option<i64>) -> Document {
    let mut doc = doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
        "status": status, "version": 1_i64, "amount": 1000_i64, "currency": "eur",
        "lastEventId": format!("evt_{payment}"), "lastEventType": "charge.refunded",
        "createdAt": DateTime::now(), "updatedAt": DateTime::now(),
    };
    if let Some(refunded) = amount_refunded {
        doc.insert("amountRefunded", refunded);
    }
    doc
}

/// A refunded payment whose issued set of 2 tokens is all active, as a refund whose
/// settle was lost leaves it.
async fn refunded_with_active_tokens(app: &TestApp, payment_intent: &str) {
    app.db
        .collection::<Document>("issuances")
        .insert_one(record(payment_intent, 2, "issued"))
        .await
        .unwrap();
    app.db
        .collection::<Document>("tokens")
        .insert_many([token(payment_intent, 0), token(payment_intent, 1)])
        .await
        .unwrap();
    app.db
        .collection::<Document>("payments")
        .insert_one(payment(payment_intent, "refunded", None))
        .await
        .unwrap();
}

#[tokio::test]
async fn verify_exits_0_when_clean_1_on_violations_2_when_it_cannot_run() {
    let app = spawn_app().await;
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_exit", 2))
            .await
            .status(),
        201
    );
    let clean = run_verify(&app, &[]).await;
    let stdout = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("no violations"), "{stdout}");

    app.db
        .collection::<Document>("tokens")
        .delete_one(doc! { "origin.paymentIntentId": "pi_exit", "tokenIndex": 1 })
        .await
        .unwrap();
    let found = run_verify(&app, &[]).await;
    let stdout = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("1 violation(s)"), "{stdout}");
    assert!(stdout.contains("pi_exit"), "{stdout}");

    // Nothing listens on the port: the command cannot run, and says so quickly.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("mongodb://127.0.0.1:{port}/?directConnection=true");
    for args in [&[][..], &["--repair"][..], &["--json"][..]] {
        let started = std::time::Instant::now();
        let output = run_command(
            &closed,
            &app.db_name,
            &[&["verify"][..], args].concat(),
            &[("TOKENMINT__MONGO__SERVER_SELECTION_TIMEOUT_MS", "500")],
        )
        .await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "verify {args:?}: {stderr}");
        assert!(stderr.contains("error"), "{stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "took {:?}",
            started.elapsed()
        );
    }
    // The unreachable runs did not touch the real database.
    assert_eq!(app.token_indexes("pi_exit").await, vec![0]);
}

#[tokio::test]
async fn verify_repair_completes_short_sets_and_revokes_unbacked_tokens() {
    let app = spawn_app().await;
    let issuances = app.db.collection::<Document>("issuances");
    let tokens = app.db.collection::<Document>("tokens");
    let payments = app.db.collection::<Document>("payments");
    // An `issued` record of 3 with only token 0, and an `issuing` one of 2 with token 0.
    issuances
        .insert_one(record("pi_short", 3, "issued"))
        .await
        .unwrap();
    tokens.insert_one(token("pi_short", 0)).await.unwrap();
    issuances
        .insert_one(record("pi_unfinished", 2, "issuing"))
        .await
        .unwrap();
    tokens.insert_one(token("pi_unfinished", 0)).await.unwrap();
    refunded_with_active_tokens(&app, "pi_refunded").await;
    // A payment half refunded (500 of 1000) whose 4 tokens are all active.
    issuances
        .insert_one(record("pi_half", 4, "issued"))
        .await
        .unwrap();
    tokens
        .insert_many((0..4).map(|i| token("pi_half", i)))
        .await
        .unwrap();
    payments
        .insert_one(payment("pi_half", "succeeded", Some(500)))
        .await
        .unwrap();

    // Plain verify reports, and changes nothing.
    let found = run_verify(&app, &[]).await;
    let stdout = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("4 violation(s)"), "{stdout}");
    assert!(!stdout.contains("repaired:"), "{stdout}");
    assert_eq!(app.count("tokens", doc! {}).await, 8);
    assert_eq!(app.count("tokens", doc! { "status": "active" }).await, 8);

    let repaired = run_verify(&app, &["--repair"]).await;
    let stdout = String::from_utf8_lossy(&repaired.stdout);
    let stderr = String::from_utf8_lossy(&repaired.stderr);
    assert_eq!(repaired.status.code(), Some(0), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("repaired:"))
        .unwrap_or_else(|| panic!("no repaired: line in {stdout}"));
    assert!(line.contains("3 token(s) written"), "{line}");
    assert!(line.contains("4 token(s) revoked"), "{line}");
    assert!(line.contains("0 could not be repaired"), "{line}");
    assert!(stdout.contains("no violations"), "{stdout}");

    assert_eq!(
        app.token_states("pi_short").await,
        indexed_statuses(&["active", "active", "active"])
    );
    assert_eq!(
        app.token_states("pi_unfinished").await,
        indexed_statuses(&["active", "active"])
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_refunded", "status": "active" }
        )
        .await,
        0
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_refunded", "status": "revoked", "revocationReason": "refunded" }
        )
        .await,
        2
    );
    assert_eq!(
        app.token_states("pi_half").await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
    for payment in ["pi_short", "pi_unfinished", "pi_refunded", "pi_half"] {
        let record = issuances
            .find_one(doc! { "paymentIntentId": payment })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.get_str("status").unwrap(), "issued", "{record}");
    }
    assert_eq!(app.count("tokens", doc! {}).await, 11);

    // Repaired for good: a second run finds nothing and has nothing to do.
    let again = run_verify(&app, &["--repair"]).await;
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 token(s) written"), "{stdout}");
    assert!(stdout.contains("0 token(s) revoked"), "{stdout}");
}

#[tokio::test]
async fn verify_repair_goes_past_documents_it_cannot_read_and_reports_them() {
    let app = spawn_app().await;
    let issuances = app.db.collection::<Document>("issuances");
    let payments = app.db.collection::<Document>("payments");
    // A refunded payment and an unfinished record, each with a field of the wrong type
    // (written by hand, or by a tool that knew another shape)...
    let mut garbled = payment("pi_garbled", "refunded", None);
    garbled.insert("amount", "one thousand");
    payments.insert_one(garbled).await.unwrap();
    let mut unreadable = record("pi_unreadable", 2, "issuing");
    unreadable.insert("quantity", "two");
    issuances.insert_one(unreadable).await.unwrap();
    // ...beside a refunded payment whose 2 tokens are active, and a short unfinished set.
    refunded_with_active_tokens(&app, "pi_refunded").await;
    issuances
        .insert_one(record("pi_unfinished", 2, "issuing"))
        .await
        .unwrap();

    let repaired = run_verify(&app, &["--repair", "--json"]).await;
    let stderr = String::from_utf8_lossy(&repaired.stderr);
    assert_eq!(repaired.status.code(), Some(1), "{stderr}");
    let report = json_report(&repaired);
    assert_eq!(report["repair"]["tokensRevoked"], 2, "{report}");
    assert_eq!(report["repair"]["tokensCreated"], 2, "{report}");
    assert_eq!(report["repair"]["failed"], 2, "{report}");
    // Reported by the check that follows the repair, each by what it is.
    assert_eq!(report["violations"], 2, "{report}");
    let unreadable = &report["findings"]["unreadablePayments"];
    assert_eq!(unreadable["count"], 1, "{report}");
    assert_eq!(
        unreadable["samples"][0], "stripe/acct_1/pi_garbled",
        "{report}"
    );
    let wrong_sets = &report["findings"]["wrongTokenSets"];
    assert_eq!(wrong_sets["count"], 1, "{report}");
    assert!(
        wrong_sets["samples"][0]
            .as_str()
            .is_some_and(|s| s.contains("pi_unreadable")),
        "{report}"
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_refunded", "status": "revoked" }
        )
        .await,
        2
    );
    assert_eq!(
        app.token_states("pi_unfinished").await,
        indexed_statuses(&["active", "active"])
    );
    // What could not be read is left as it was.
    let left = issuances
        .find_one(doc! { "paymentIntentId": "pi_unreadable" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(left.get_str("status"), Ok("issuing"), "{left}");
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pi_unreadable" })
            .await,
        0
    );
}

/// The `--json` document of a run: exactly one JSON value on stdout.
fn json_report(output: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("one JSON document ({e}): {stdout}"))
}

#[tokio::test]
async fn verify_json_is_one_document_with_the_text_exit_codes() {
    let app = spawn_app().await;
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_json", 2))
            .await
            .status(),
        201
    );
    let clean = run_verify(&app, &["--json"]).await;
    assert_eq!(clean.status.code(), Some(0));
    let report = json_report(&clean);
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["violations"], 0, "{report}");
    assert_eq!(report["issuancesChecked"], 1, "{report}");
    assert_eq!(report["tokensChecked"], 2, "{report}");
    assert!(report["repair"].is_null(), "{report}");
    let kinds = [
        "wrongTokenSets",
        "duplicateTokens",
        "orphanTokens",
        "tokensWithoutVersion",
        "strandedPending",
        "foreignTokens",
        "unbackedActiveTokens",
        "unrestoredTokens",
        "unreadablePayments",
        "incompleteRedemptions",
        "missingIndexes",
    ];
    let findings = report["findings"].as_object().unwrap();
    let mut names: Vec<&str> = findings.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut expected = kinds.to_vec();
    expected.sort_unstable();
    assert_eq!(names, expected, "{report}");
    for kind in kinds {
        assert_eq!(findings[kind]["count"], 0, "{kind}: {report}");
        assert_eq!(findings[kind]["samples"], serde_json::json!([]), "{kind}");
    }

    // A token lost: exit 1, the payment named under its kind.
    app.db
        .collection::<Document>("tokens")
        .delete_one(doc! { "origin.paymentIntentId": "pi_json", "tokenIndex": 1 })
        .await
        .unwrap();
    let found = run_verify(&app, &["--json"]).await;
    assert_eq!(found.status.code(), Some(1));
    let report = json_report(&found);
    assert_eq!(report["clean"], false, "{report}");
    assert_eq!(report["violations"], 1, "{report}");
    let wrong = &report["findings"]["wrongTokenSets"];
    assert_eq!(wrong["count"], 1, "{report}");
    assert!(
        wrong["samples"][0].as_str().unwrap().contains("pi_json"),
        "{report}"
    );

    // With --repair: what was repaired, then a clean check, still one document.
    let repaired = run_verify(&app, &["--repair", "--json"]).await;
    assert_eq!(repaired.status.code(), Some(0));
    let report = json_report(&repaired);
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["repair"]["tokensCreated"], 1, "{report}");
    assert_eq!(report["repair"]["recordsReopened"], 1, "{report}");
    assert_eq!(report["repair"]["failed"], 0, "{report}");
    assert_eq!(app.token_indexes("pi_json").await, vec![0, 1]);
}

#[tokio::test]
async fn verify_repair_finishes_every_unfinished_record_however_many() {
    // More than a background sweep takes at once (1,000): `--repair` finishes them all,
    // as the contract says, not the first thousand.
    const RECORDS: i64 = 1_001;
    let app = spawn_app().await;
    app.db
        .collection::<Document>("issuances")
        .insert_many((0..RECORDS).map(|i| record(&format!("pi_many_{i}"), 1, "issuing")))
        .await
        .unwrap();

    let repaired = run_verify(&app, &["--repair", "--json"]).await;
    let report = json_report(&repaired);
    assert_eq!(repaired.status.code(), Some(0), "{report}");
    assert_eq!(report["repair"]["recordsFinished"], RECORDS, "{report}");
    assert_eq!(
        app.count("issuances", doc! { "status": "issuing" }).await,
        0
    );
    assert_eq!(app.count("tokens", doc! {}).await, RECORDS as u64);
}
