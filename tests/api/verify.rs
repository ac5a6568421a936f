//! The invariant checker (`Store::verify`, `tokenmint verify`) finds each kind of violation
//! and nothing on a healthy database.

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};

use crate::helpers::*;

fn token(payment: &str, index: i64) -> Document {
    doc! {
        "owner": ObjectId::parse_str(OWNER).unwrap(), "type": "standard", "tokenIndex": index,
        "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment, "date": DateTime::now() },
        "status": "active", "_version": 0, "createdAt": DateTime::now(), "updatedAt": DateTime::now(),
    }
}

#[tokio::test]
async fn verify_is_clean_after_normal_traffic_and_names_each_violation() {
    let app = spawn_app().await;
    for (payment, quantity, mode) in [("pi_a", 3, "upsert"), ("pi_b", 2, "atomic")] {
        let mut body = issuance_body(payment, quantity);
        body["mode"] = serde_json::json!(mode);
        assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    }
    let store = app.store().await;
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.issuances_checked, 2);
    assert_eq!(report.tokens_checked, 5);

    let tokens = app.db.collection::<Document>("tokens");
    // A partial set: pi_a loses its last token.
    tokens
        .delete_one(doc! { "origin.paymentIntentId": "pi_a", "tokenIndex": 2 })
        .await
        .unwrap();
    // An orphan token (no issuance record) that also lacks _version.
    let mut orphan = token("pi_orphan", 0);
    orphan.remove("_version");
    tokens.insert_one(orphan).await.unwrap();
    // A pending issuance whose payment is known to have succeeded.
    app.db.collection::<Document>("issuances").insert_one(doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_pending", "owner": ObjectId::new(),
        "tokenType": "standard", "quantity": 1, "paymentDate": DateTime::now(), "mode": "upsert",
        "status": "pending", "createdAt": DateTime::now(),
    }).await.unwrap();
    app.db.collection::<Document>("payments").insert_one(doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_pending", "status": "succeeded", "version": 1,
    }).await.unwrap();

    let report = store.verify().await.unwrap();
    assert!(!report.is_clean());
    assert_eq!(report.wrong_token_sets.count, 1, "{report}");
    assert!(
        report.wrong_token_sets.samples[0].contains("stripe/acct_1/pi_a"),
        "{report}"
    );
    assert_eq!(report.orphan_tokens.count, 1, "{report}");
    assert_eq!(report.tokens_without_version.count, 1, "{report}");
    assert_eq!(report.stranded_pending.count, 1, "{report}");
    assert_eq!(
        report.duplicate_tokens.count, 0,
        "the unique index makes duplicates impossible"
    );
    assert_eq!(report.violations(), 4);

    // The CLI prints the same and exits non-zero.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmint"))
        .arg("verify")
        .env("TOKENMINT__MONGO__URI", mongo_uri())
        .env("TOKENMINT__MONGO__DATABASE", &app.db_name)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("4 violation(s)"), "{stdout}");
    assert!(stdout.contains("pi_orphan"), "{stdout}");

    // The retry repairs the partial set; the report shrinks accordingly.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_a", 3))
            .await
            .status(),
        200
    );
    assert_eq!(store.verify().await.unwrap().wrong_token_sets.count, 0);
}

/// Runs the real binary's `verify` (with `args`) against `uri`/`database`.
async fn run_cli(uri: &str, database: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenmint"))
        .arg("verify")
        .args(args)
        .env("TOKENMINT__MONGO__URI", uri)
        .env("TOKENMINT__MONGO__DATABASE", database)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap()
}

fn states(statuses: &[&str]) -> Vec<(i64, String)> {
    statuses
        .iter()
        .enumerate()
        .map(|(i, s)| (i as i64, (*s).to_owned()))
        .collect()
}

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

async fn token_ids_of(app: &TestApp, payment: &str) -> Vec<String> {
    let response = app
        .get(ADMIN_KEY, &format!("/v1/issuances/stripe/acct_1/{payment}"))
        .await;
    assert_eq!(response.status(), 200);
    token_ids(&json(response).await)
}

#[tokio::test]
async fn verify_reports_foreign_tokens_but_not_transferred_ones() {
    let app = spawn_app().await;
    for payment in ["pi_type", "pi_owner", "pi_moved"] {
        assert_eq!(
            app.issue(WRITER_KEY, &issuance_body(payment, 2))
                .await
                .status(),
            201
        );
    }
    let store = app.store().await;
    assert!(store.verify().await.unwrap().is_clean());

    // A transfer changes the owner on purpose: not foreign.
    let moved = token_ids_of(&app, "pi_moved").await.remove(0);
    let transfer = app
        .http
        .post(app.url(&format!("/v1/tokens/{moved}/transfer")))
        .bearer_auth(ADMIN_KEY)
        .header("if-match", "\"0\"")
        .json(&serde_json::json!({ "newOwner": OTHER_OWNER }))
        .send()
        .await
        .unwrap();
    assert_eq!(transfer.status(), 200);
    let tokens = app.db.collection::<Document>("tokens");
    let stored = tokens
        .find_one(doc! { "_id": ObjectId::parse_str(&moved).unwrap() })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_object_id("owner").unwrap(),
        ObjectId::parse_str(OTHER_OWNER).unwrap()
    );
    assert!(
        stored.get_datetime("transferredAt").is_ok(),
        "a transfer records transferredAt: {stored}"
    );
    let report = store.verify().await.unwrap();
    assert_eq!(report.foreign_tokens.count, 0, "{report}");
    assert!(report.is_clean(), "{report}");

    // Written behind the service's back: another type, another owner (not transferred).
    tokens
        .update_one(
            doc! { "origin.paymentIntentId": "pi_type", "tokenIndex": 1 },
            doc! { "$set": { "type": "gold" } },
        )
        .await
        .unwrap();
    tokens
        .update_one(
            doc! { "origin.paymentIntentId": "pi_owner", "tokenIndex": 0 },
            doc! { "$set": { "owner": ObjectId::parse_str(OTHER_OWNER).unwrap() } },
        )
        .await
        .unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.foreign_tokens.count, 2, "{report}");
    let samples = report.foreign_tokens.samples.join("\n");
    assert!(samples.contains("stripe/acct_1/pi_type"), "{report}");
    assert!(samples.contains("stripe/acct_1/pi_owner"), "{report}");
    assert!(!samples.contains("pi_moved"), "{report}");
    assert_eq!(report.violations(), 2, "{report}");

    // A transfer excuses the owner only, never the type.
    tokens
        .update_one(
            doc! { "_id": ObjectId::parse_str(&moved).unwrap() },
            doc! { "$set": { "type": "gold" } },
        )
        .await
        .unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.foreign_tokens.count, 3, "{report}");
    assert!(
        report
            .foreign_tokens
            .samples
            .join("\n")
            .contains("pi_moved")
    );
}

#[tokio::test]
async fn verify_reports_active_tokens_a_refund_or_cancellation_no_longer_backs() {
    use crate::provider_events::*;
    let app = app().await;
    let t = now();
    let send = |event: serde_json::Value| {
        let app = &app;
        async move {
            let response = send_stripe(app, &event, STRIPE_NEW, now()).await;
            assert_eq!(response.status(), 200, "{event}");
        }
    };
    // Refunded, canceled, partly refunded (2 of 4 back), and partly refunded with the
    // refunded share redeemed: all settled by the service, so verify is clean.
    send(intent_event("evt_f", "succeeded", "pi_full", t, "2")).await;
    send(refund_event("evt_f_r", "pi_full", t + 10)).await;
    send(intent_event("evt_c", "succeeded", "pi_cancel", t, "2")).await;
    send(intent_event(
        "evt_c_c",
        "canceled",
        "pi_cancel",
        t + 10,
        "2",
    ))
    .await;
    send(intent_event("evt_p", "succeeded", "pi_part", t, "4")).await;
    send(partial_refund_event(
        "evt_p_r",
        "pi_part",
        t + 10,
        1000,
        500,
    ))
    .await;
    send(intent_event("evt_s", "succeeded", "pi_spent", t, "2")).await;
    let spent = token_ids_of(&app, "pi_spent").await;
    let redeemed = app
        .http
        .post(app.url(&format!("/v1/tokens/{}/redeem", spent[1])))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(redeemed.status(), 200);
    send(partial_refund_event(
        "evt_s_r",
        "pi_spent",
        t + 10,
        1000,
        500,
    ))
    .await;
    assert_eq!(
        app.token_states("pi_full").await,
        states(&["revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_cancel").await,
        states(&["revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_part").await,
        states(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_spent").await,
        states(&["active", "redeemed"])
    );
    let store = app.store().await;
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");

    // Revocations lost: the tokens are active again.
    let tokens = app.db.collection::<Document>("tokens");
    let reactivate = |payment: &'static str, from: i64| {
        let tokens = tokens.clone();
        async move {
            tokens
                .update_many(
                    doc! { "origin.paymentIntentId": payment, "tokenIndex": { "$gte": from }, "status": "revoked" },
                    doc! { "$set": { "status": "active" } },
                )
                .await
                .unwrap()
                .modified_count
        }
    };
    assert_eq!(reactivate("pi_full", 0).await, 2);
    assert_eq!(reactivate("pi_cancel", 1).await, 1);
    assert_eq!(reactivate("pi_part", 3).await, 1);
    let report = store.verify().await.unwrap();
    assert_eq!(report.unbacked_active_tokens.count, 3, "{report}");
    let samples = report.unbacked_active_tokens.samples.join("\n");
    assert!(
        samples.contains("stripe/acct_1/pi_full (refunded): 2 active token(s)"),
        "{report}"
    );
    assert!(
        samples.contains("stripe/acct_1/pi_cancel (canceled): 1 active token(s)"),
        "{report}"
    );
    assert!(
        samples.contains("stripe/acct_1/pi_part (succeeded): 1 active token(s)"),
        "only the refunded share counts: {report}"
    );
    assert!(!samples.contains("pi_spent"), "{report}");
    assert_eq!(report.violations(), 3, "{report}");
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
    let clean = run_cli(&mongo_uri(), &app.db_name, &[]).await;
    let stdout = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("no violations"), "{stdout}");

    app.db
        .collection::<Document>("tokens")
        .delete_one(doc! { "origin.paymentIntentId": "pi_exit", "tokenIndex": 1 })
        .await
        .unwrap();
    let found = run_cli(&mongo_uri(), &app.db_name, &[]).await;
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
    for args in [&[][..], &["--repair"][..]] {
        let started = std::time::Instant::now();
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenmint"))
            .arg("verify")
            .args(args)
            .env("TOKENMINT__MONGO__URI", &closed)
            .env("TOKENMINT__MONGO__DATABASE", &app.db_name)
            .env("TOKENMINT__MONGO__SERVER_SELECTION_TIMEOUT_MS", "500")
            .env("NO_COLOR", "1")
            .output()
            .await
            .unwrap();
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
    // A refunded payment whose 2 tokens are active.
    issuances
        .insert_one(record("pi_refunded", 2, "issued"))
        .await
        .unwrap();
    tokens
        .insert_many([token("pi_refunded", 0), token("pi_refunded", 1)])
        .await
        .unwrap();
    payments
        .insert_one(payment("pi_refunded", "refunded", None))
        .await
        .unwrap();
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
    let found = run_cli(&mongo_uri(), &app.db_name, &[]).await;
    let stdout = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("4 violation(s)"), "{stdout}");
    assert!(!stdout.contains("repaired:"), "{stdout}");
    assert_eq!(app.count("tokens", doc! {}).await, 8);
    assert_eq!(app.count("tokens", doc! { "status": "active" }).await, 8);

    let repaired = run_cli(&mongo_uri(), &app.db_name, &["--repair"]).await;
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
        states(&["active", "active", "active"])
    );
    assert_eq!(
        app.token_states("pi_unfinished").await,
        states(&["active", "active"])
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
        states(&["active", "active", "revoked", "revoked"])
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
    let again = run_cli(&mongo_uri(), &app.db_name, &["--repair"]).await;
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 token(s) written"), "{stdout}");
    assert!(stdout.contains("0 token(s) revoked"), "{stdout}");
}
