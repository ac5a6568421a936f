//! Terminal states and fixed parameters, for every provider: a canceled payment never
//! stands again, and a payment's token parameters are the first success's. An event
//! that would undo either is answered 200, recorded with its outcome (`terminal`,
//! `metadata_conflict`), and changes nothing in `payments`, `issuances` or `tokens`.
//! A failed payment is not terminal: the customer may retry it.

use mongodb::bson::doc;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_canceled_payment_never_succeeds_again() {
    let app = app().await;
    let t = now();
    let canceled = intent_event("evt_c", "canceled", "pi_can", t, "3");
    assert_eq!(deliver_stripe(&app, &canceled).await.status(), 200);
    let before = payment_state(&app).await;

    // Same rank as canceled and later: the version gate alone would let it through.
    let late = intent_event("evt_s", "succeeded", "pi_can", t + 60, "3");
    let receipt = json(deliver_stripe(&app, &late).await).await;
    assert_eq!(receipt["outcome"], "terminal", "{receipt}");
    assert_eq!(payment_state(&app).await, before, "nothing changed");
    assert_eq!(payment_status(&app, "pi_can").await.0, "canceled");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(recorded_outcome(&app, "evt_s").await, "terminal");
}

#[tokio::test]
async fn a_canceled_payment_stays_canceled_whatever_version_follows() {
    let app = app().await;
    send_acme(&app, "msg_c", &acme_event("canceled", "pay_t", 2)).await;
    let before = payment_state(&app).await;
    for (id, kind, version) in [
        ("msg_f", "failed", 3),
        ("msg_p", "processing", 4),
        ("msg_s", "succeeded", 5),
    ] {
        let receipt = json(send_acme(&app, id, &acme_event(kind, "pay_t", version)).await).await;
        assert_eq!(receipt["outcome"], "terminal", "{kind}: {receipt}");
        assert_eq!(payment_state(&app).await, before, "{kind} changed nothing");
    }
    assert_eq!(
        payment_status(&app, "pay_t").await,
        ("canceled".to_owned(), 2)
    );
    // A refund still reaches a canceled payment: both take everything back.
    let refunded = json(send_acme(&app, "msg_r", &acme_event("refunded", "pay_t", 6)).await).await;
    assert_eq!(refunded["outcome"], "revoked", "{refunded}");
    assert_eq!(payment_status(&app, "pay_t").await.0, "refunded");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn a_failed_payment_may_still_succeed() {
    let app = app().await;
    let t = now();
    deliver_stripe(
        &app,
        &intent_event("evt_f", "payment_failed", "pi_retry", t, "2"),
    )
    .await;
    assert_eq!(payment_status(&app, "pi_retry").await.0, "failed");
    let retried = intent_event("evt_ok", "succeeded", "pi_retry", t + 60, "2");
    let receipt = json(deliver_stripe(&app, &retried).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(app.token_indexes("pi_retry").await, vec![0, 1]);
    assert_eq!(payment_status(&app, "pi_retry").await.0, "succeeded");
}

#[tokio::test]
async fn a_later_success_naming_other_parameters_changes_nothing() {
    let app = app().await;
    let t = now();
    let first = intent_event("evt_1", "succeeded", "pi_fix", t, "3");
    assert_eq!(
        json(deliver_stripe(&app, &first).await).await["outcome"],
        "issued"
    );
    let before = payment_state(&app).await;

    for (id, kind, at) in [
        ("evt_later", "succeeded", t + 60),
        ("evt_earlier", "succeeded", t - 60),
        ("evt_processing", "processing", t + 30),
    ] {
        let other = intent_event(id, kind, "pi_fix", at, "5");
        let receipt = json(deliver_stripe(&app, &other).await).await;
        assert_eq!(receipt["outcome"], "metadata_conflict", "{id}: {receipt}");
        assert_eq!(payment_state(&app).await, before, "{id} changed nothing");
        assert_eq!(recorded_outcome(&app, id).await, "metadata_conflict");
    }
    // The same parameters again are no conflict.
    let same = intent_event("evt_same", "succeeded", "pi_fix", t + 90, "3");
    let receipt = json(deliver_stripe(&app, &same).await).await;
    assert_eq!(receipt["outcome"], "already_issued", "{receipt}");
    assert_eq!(app.token_indexes("pi_fix").await, vec![0, 1, 2]);
    let stored = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_fix" })
        .await;
    assert_eq!(stored.get_str("tokenParamsFixedBy").unwrap(), "evt_1");
}

#[tokio::test]
async fn a_failed_payment_keeps_no_token_and_its_retry_makes_them_active_again() {
    let app = app().await;
    send_acme(&app, "msg_p", &acme_event("processing", "pay_v", 1)).await;
    // A trusted backend vouched for the processing payment.
    let mut body = issuance_body("pay_v", 2);
    body["provider"] = serde_json::json!("acme");
    body["accountId"] = serde_json::json!("default");
    assert_eq!(app.issue(ADMIN_KEY, &body).await.status(), 201);
    let failed = json(send_acme(&app, "msg_f", &acme_event("failed", "pay_v", 2)).await).await;
    assert_eq!(failed["outcome"], "revoked", "{failed}");
    assert_eq!(failed["tokensRevoked"], 2, "{failed}");
    let revoked = vec![(0, "revoked".to_owned()), (1, "revoked".to_owned())];
    assert_eq!(app.token_states("pay_v").await, revoked);
    for token in app.tokens_of("pay_v").await {
        assert_eq!(token.get_str("revocationReason").unwrap(), "failed");
    }
    let ids: Vec<_> = app
        .tokens_of("pay_v")
        .await
        .iter()
        .map(|t| t.get_object_id("_id").unwrap())
        .collect();
    // The customer retries and pays: the payment stands again, and so do the tokens its
    // failure revoked (the same ones, no new set).
    let retried = json(send_acme(&app, "msg_s", &acme_event("succeeded", "pay_v", 3)).await).await;
    assert_eq!(retried["outcome"], "already_issued", "{retried}");
    assert_eq!(retried["tokensReactivated"], 2, "{retried}");
    assert_eq!(payment_status(&app, "pay_v").await.0, "succeeded");
    let active = vec![(0, "active".to_owned()), (1, "active".to_owned())];
    assert_eq!(app.token_states("pay_v").await, active);
    let again: Vec<_> = app
        .tokens_of("pay_v")
        .await
        .iter()
        .map(|t| t.get_object_id("_id").unwrap())
        .collect();
    assert_eq!(again, ids);
    assert_eq!(
        app.count_records(doc! { "paymentIntentId": "pay_v" }).await,
        1
    );
}

/// A failure takes every token back whatever metadata it carries, as a refund or a
/// cancellation does: one that names other parameters than the success that fixed them,
/// or only some of them, is not held back for it.
#[tokio::test]
async fn a_failure_naming_other_metadata_still_takes_the_tokens_back() {
    let app = app().await;
    for (payment, metadata) in [
        ("pay_m1", serde_json::json!({ "owner": OWNER })),
        (
            "pay_m2",
            serde_json::json!({ "owner": OWNER, "tokenType": "gold", "quantity": 5 }),
        ),
    ] {
        let paid = acme_event("succeeded", payment, 1);
        send_acme(&app, &format!("msg_ok_{payment}"), &paid).await;
        assert_eq!(app.active_indexes(payment).await, vec![0, 1]);
        let mut failure = acme_event("failed", payment, 2);
        failure["data"] = serde_json::json!({ "paymentIntentId": payment, "version": 2 });
        for (field, value) in metadata.as_object().unwrap() {
            failure["data"][field] = value.clone();
        }
        let receipt = json(send_acme(&app, &format!("msg_f_{payment}"), &failure).await).await;
        assert_ne!(receipt["outcome"], "metadata_conflict", "{receipt}");
        assert!(app.active_indexes(payment).await.is_empty(), "{payment}");
        assert_eq!(payment_status(&app, payment).await.0, "failed");
    }
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// A Standard Webhooks failure is a status, not money: after a refund that failed, the
/// payment's failure and its retried success leave the same tokens whichever order the
/// failure and the refund's failure arrive in (the failure, held back while the payment
/// is refunded, leaves nothing behind that the retry would have to undo).
#[tokio::test]
async fn a_retry_after_a_failure_issues_whichever_order_the_money_came_back_in() {
    let app = app().await;
    let event = |payment: &str, kind: &str, version: i64, field: Option<&str>| {
        let mut event = acme_event(kind, payment, version);
        event["data"]["amount"] = serde_json::json!(1000);
        if let Some(field) = field {
            event["data"][field] = serde_json::json!(1000);
        }
        event
    };
    for (payment, reinstated_before_the_failure) in [("pay_in_order", true), ("pay_late", false)] {
        let paid = event(payment, "succeeded", 1, None);
        let refunded = event(payment, "refunded", 2, Some("amountRefunded"));
        let reinstated = event(payment, "reinstated", 3, Some("amountReinstated"));
        let failed = event(payment, "failed", 4, None);
        let retried = event(payment, "succeeded", 5, None);
        let order = if reinstated_before_the_failure {
            [paid, refunded, reinstated, failed, retried]
        } else {
            [paid, refunded, failed, reinstated, retried]
        };
        for (i, body) in order.iter().enumerate() {
            let id = format!("msg_{payment}_{i}");
            assert_eq!(send_acme(&app, &id, body).await.status(), 200, "{id}");
        }
        assert_eq!(app.active_indexes(payment).await, vec![0, 1], "{payment}");
        assert_eq!(payment_status(&app, payment).await.0, "succeeded");
    }
    assert!(app.store().await.verify().await.unwrap().is_clean());
}
