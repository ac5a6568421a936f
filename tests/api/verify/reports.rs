//! What `verify` reports: nothing after normal traffic, then each violation by name (a
//! short set, an orphan, a token without `_version`, a stranded pending request, foreign
//! tokens, active tokens a refund or cancellation no longer backs, a redemption half
//! undone), transfers excepted.

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};

use super::{run_verify, token};
use crate::helpers::*;

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
    let output = run_verify(&app, &[]).await;
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
    let moved = app.issued_token_ids("pi_moved").await.remove(0);
    let transfer = app.transfer_token(ADMIN_KEY, &moved, 0, OTHER_OWNER).await;
    assert_eq!(transfer.status(), 200);
    let tokens = app.db.collection::<Document>("tokens");
    let stored = app.stored_token(&moved).await;
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
            let response = deliver_stripe(app, &event).await;
            assert_eq!(response.status(), 200, "{event}");
        }
    };
    // Refunded, canceled, partly refunded (2 of 4 back), and partly refunded after the
    // highest token was spent (the share taken from the other): all settled by the
    // service, so verify is clean.
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
    let spent = app.issued_token_ids("pi_spent").await;
    let redeemed = app.redeem_token(ADMIN_KEY, &spent[1]).await;
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
        indexed_statuses(&["revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_cancel").await,
        indexed_statuses(&["revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_part").await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_spent").await,
        indexed_statuses(&["revoked", "redeemed"])
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
    assert_eq!(reactivate("pi_spent", 0).await, 1);
    let report = store.verify().await.unwrap();
    assert_eq!(report.unbacked_active_tokens.count, 4, "{report}");
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
    assert!(
        samples.contains("stripe/acct_1/pi_spent (succeeded): 1 active token(s)"),
        "a spent token leaves the lower one beyond the share: {report}"
    );
    assert_eq!(report.violations(), 4, "{report}");
}

/// Every payment state against the money rule: `verify` selects the payments to check
/// with a MongoDB filter and judges them with `domain::entitlement`; over every status,
/// each with no refund, a share too small to take a token, a partial refund, that refund
/// given back, and a full refund, it flags exactly the payments whose four active tokens
/// the rule says are not all backed — a filter that missed a state would miss them.
#[tokio::test]
async fn verify_flags_unbacked_tokens_where_the_money_rule_says_in_every_payment_state() {
    let app = spawn_app().await;
    let statuses = ["processing", "succeeded", "failed", "canceled", "refunded"];
    // (name, refunds as (id, amount, full), reversals as (id, amount, of))
    type Refund = (&'static str, i64, bool);
    type Reversal = (&'static str, i64, &'static str);
    let money: [(&str, Vec<Refund>, Vec<Reversal>); 5] = [
        ("none", vec![], vec![]),
        ("small", vec![("re_s", 100, false)], vec![]),
        ("half", vec![("re_h", 500, false)], vec![]),
        (
            "given_back",
            vec![("re_g", 500, false)],
            vec![("rv_g", 500, "re_g")],
        ),
        ("full", vec![("re_f", 1000, true)], vec![]),
    ];
    let mut expected_unbacked = Vec::new();
    for status in statuses {
        for (name, refunds, reversals) in &money {
            let payment = format!("pi_state_{status}_{name}");
            let mut stored = doc! {
                "provider": "stripe", "accountId": "acct_1", "paymentIntentId": &payment,
                "status": status, "version": 1_i64, "amount": 1000_i64, "currency": "eur",
                "refunds": refunds.iter().map(|(id, amount, full)| doc! { "id": *id, "amount": *amount, "full": *full }).collect::<Vec<_>>(),
                "reversals": reversals.iter().map(|(id, amount, of)| doc! { "id": *id, "amount": *amount, "of": *of }).collect::<Vec<_>>(),
                "moneyVersion": 1_i64,
                "lastEventId": format!("evt_{payment}"), "lastEventType": "test",
                "createdAt": DateTime::now(), "updatedAt": DateTime::now(),
            };
            let refunded: i64 = refunds.iter().map(|(_, amount, _)| amount).sum();
            if refunded > 0 {
                stored.insert("amountRefunded", refunded);
            }
            let read: tokenmint::store::PaymentDoc =
                mongodb::bson::from_document(stored.clone()).unwrap();
            assert_eq!(read.status.as_str(), status);
            let keep = tokenmint::domain::entitlement(read.status, &read.money(), 4).kept(4);
            if keep < 4 {
                expected_unbacked.push(format!("{payment} ({status}): {} active", 4 - keep));
            }
            app.db
                .collection("payments")
                .insert_one(stored)
                .await
                .unwrap();
            app.db
                .collection("issuances")
                .insert_one(doc! {
                    "provider": "stripe", "accountId": "acct_1", "paymentIntentId": &payment,
                    "owner": ObjectId::parse_str(OWNER).unwrap(), "tokenType": "standard",
                    "quantity": 4_i64, "paymentDate": DateTime::now(), "mode": "upsert",
                    "status": "issued", "createdAt": DateTime::now(),
                })
                .await
                .unwrap();
            let tokens: Vec<Document> = (0..4).map(|i| token(&payment, i)).collect();
            app.db
                .collection("tokens")
                .insert_many(tokens)
                .await
                .unwrap();
        }
    }
    // The rule takes tokens back in most of these states, and not in all of them.
    assert!(
        (10..25).contains(&expected_unbacked.len()),
        "{expected_unbacked:?}"
    );

    let report = app.store().await.verify().await.unwrap();
    let found = &report.unbacked_active_tokens;
    assert_eq!(found.count as usize, expected_unbacked.len(), "{report}");
    for expected in &expected_unbacked {
        let (payment_status, active) = expected.rsplit_once(": ").unwrap();
        let payment = payment_status.split(' ').next().unwrap();
        assert!(
            found
                .samples
                .iter()
                .any(|s| s.contains(payment) && s.contains(&format!("{active} token"))),
            "{expected} not flagged: {:?}",
            found.samples
        );
    }
}

#[tokio::test]
async fn verify_reports_a_redemption_whose_tokens_are_not_all_redeemed_under_it() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_spent", 4).await;
    let body = serde_json::json!({
        "owner": OWNER, "tokenType": "standard", "quantity": 2, "reference": "order-half",
    });
    let response = app
        .http
        .post(app.url("/v1/redemptions"))
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    // A single redeem with a reference of its own is no redemption by amount: not checked.
    let single = app
        .http
        .post(app.url(&format!("/v1/tokens/{}/redeem", ids[3])))
        .bearer_auth(ADMIN_KEY)
        .header("if-match", "\"0\"")
        .json(&serde_json::json!({ "reference": "order-single" }))
        .send()
        .await
        .unwrap();
    assert_eq!(single.status(), 200);
    let store = app.store().await;
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");

    // Half undone: one of its two tokens made active again, by hand.
    let tokens = app.db.collection::<Document>("tokens");
    tokens
        .update_one(
            doc! { "_id": ObjectId::parse_str(&ids[1]).unwrap() },
            doc! { "$set": { "status": "active" }, "$unset": { "redemptionRef": "", "redeemedAt": "" } },
        )
        .await
        .unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.incomplete_redemptions.count, 1, "{report}");
    assert_eq!(
        report.incomplete_redemptions.samples,
        [format!(
            "{OWNER}/order-half (quantity 2): 1 of 2 token(s) redeemed under it"
        )]
    );
    assert_eq!(report.violations(), 1, "{report}");
    let output = run_verify(&app, &["--json"]).await;
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        json["findings"]["incompleteRedemptions"]["count"], 1,
        "{json}"
    );

    // Redeemed again, but under another reference: still not this redemption's.
    tokens
        .update_one(
            doc! { "_id": ObjectId::parse_str(&ids[1]).unwrap() },
            doc! { "$set": { "status": "redeemed", "redemptionRef": "order-other" } },
        )
        .await
        .unwrap();
    assert_eq!(
        store.verify().await.unwrap().incomplete_redemptions.count,
        1
    );
    // Its own again: clean.
    tokens
        .update_one(
            doc! { "_id": ObjectId::parse_str(&ids[1]).unwrap() },
            doc! { "$set": { "redemptionRef": "order-half" } },
        )
        .await
        .unwrap();
    assert!(store.verify().await.unwrap().is_clean());

    // A record naming fewer tokens than its quantity.
    app.db
        .collection::<Document>("redemptions")
        .update_one(
            doc! { "reference": "order-half" },
            doc! { "$pop": { "tokenIds": 1 } },
        )
        .await
        .unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.incomplete_redemptions.count, 1, "{report}");
    assert!(
        report.incomplete_redemptions.samples[0].ends_with("1 of 1 token(s) redeemed under it"),
        "{report}"
    );
}
