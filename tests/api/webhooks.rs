//! Webhooks: signatures, deduplication, out-of-order safety, effects, the trust flow.

use futures::future::join_all;
use mongodb::bson::{Document, doc, oid::ObjectId};
use serde_json::json;
use tokenmint::webhooks::signature::sign_stripe;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_succeeded_payment_issues_its_tokens_once() {
    let app = app().await;
    let event = intent_event("evt_1", "succeeded", "pi_wh", now(), "3");
    let first = send_stripe(&app, &event, STRIPE_NEW, now()).await;
    assert_eq!(first.status(), 200);
    let receipt = json(first).await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(receipt["tokensCreated"], 3);
    assert_eq!(app.token_indexes("pi_wh").await, vec![0, 1, 2]);
    let record = app
        .db
        .collection::<Document>("issuances")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_str("accountId").unwrap(), "acct_1");

    // The same event again: 200, duplicate, nothing more.
    let again = json(send_stripe(&app, &event, STRIPE_NEW, now()).await).await;
    assert_eq!(again["duplicate"], true);
    // Another event id for the same payment: nothing more either.
    let other = intent_event("evt_2", "succeeded", "pi_wh", now() + 1, "3");
    let other = json(send_stripe(&app, &other, STRIPE_NEW, now()).await).await;
    assert_eq!(other["outcome"], "already_issued");
    assert_eq!(app.count("tokens", doc! {}).await, 3);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("webhook_events", doc! {}).await, 2);

    let payment = json(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_wh")
            .await,
    )
    .await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["quantity"], 3);
    assert!(payment["version"].as_i64().unwrap() > 0);
}

#[tokio::test]
async fn signatures_rotation_and_refusals() {
    let app = app().await;
    // Signed only with the second (rotated-in) secret: accepted.
    let ok = send_stripe(
        &app,
        &intent_event("evt_rot", "processing", "pi_rot", now(), "1"),
        STRIPE_NEW,
        now(),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let ok = send_stripe(
        &app,
        &intent_event("evt_rot_old", "processing", "pi_rot", now(), "1"),
        STRIPE_OLD,
        now(),
    )
    .await;
    assert_eq!(ok.status(), 200);

    let event = intent_event("evt_bad", "succeeded", "pi_bad_sig", now(), "2");
    let body = event.to_string();
    let good_header = sign_stripe(STRIPE_NEW, now(), body.as_bytes());
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        (
            "wrong secret",
            Some(sign_stripe("whsec_other", now(), body.as_bytes())),
            "signature_invalid",
        ),
        ("missing header", None, "signature_missing"),
        (
            "v0 only",
            Some(good_header.replace("v1=", "v0=")),
            "signature_invalid",
        ),
        (
            // Well past the 300 s tolerance on either side: the server reads its own clock
            // after this one, so a margin of one second would flake when the second ticks.
            "330 s old",
            Some(sign_stripe(STRIPE_NEW, now() - 330, body.as_bytes())),
            "signature_timestamp_out_of_tolerance",
        ),
        (
            "330 s ahead",
            Some(sign_stripe(STRIPE_NEW, now() + 330, body.as_bytes())),
            "signature_timestamp_out_of_tolerance",
        ),
    ];
    for (case, header, code) in cases {
        let mut request = app
            .http
            .post(app.url("/v1/webhooks/stripe"))
            .body(body.clone());
        if let Some(header) = header {
            request = request.header("stripe-signature", header);
        }
        let problem = assert_problem(request.send().await.unwrap(), 401, code).await;
        assert!(problem["detail"].is_string(), "{case}");
    }
    // A tampered body with a once-valid signature.
    let tampered = app
        .http
        .post(app.url("/v1/webhooks/stripe"))
        .header("stripe-signature", good_header)
        .body(body.replace("\"2\"", "\"200\""))
        .send()
        .await
        .unwrap();
    assert_problem(tampered, 401, "signature_invalid").await;
    assert_eq!(
        app.count("payments", doc! { "paymentIntentId": "pi_bad_sig" })
            .await,
        0
    );
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "evt_bad" })
            .await,
        0
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Unknown provider: 404. Standard Webhooks with a bad signature: 401.
    assert_problem(
        app.http
            .post(app.url("/v1/webhooks/paypal"))
            .body("{}")
            .send()
            .await
            .unwrap(),
        404,
        "not_found",
    )
    .await;
    let bad = app
        .http
        .post(app.url("/v1/webhooks/acme"))
        .header("webhook-id", "msg_x")
        .header("webhook-timestamp", now().to_string())
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(bad, 401, "signature_invalid").await;
}

#[tokio::test]
async fn out_of_order_events_never_regress_the_state() {
    let app = app().await;
    let t = now();
    // succeeded (later) arrives before processing (earlier): stays succeeded.
    send_stripe(
        &app,
        &intent_event("evt_s", "succeeded", "pi_ooo", t, "1"),
        STRIPE_NEW,
        now(),
    )
    .await;
    let late = json(
        send_stripe(
            &app,
            &intent_event("evt_p", "processing", "pi_ooo", t - 60, "1"),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(late["outcome"], "stale");
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "succeeded");
    // A processing event with a LATER timestamp still cannot undo succeeded (rank first).
    send_stripe(
        &app,
        &intent_event("evt_p2", "processing", "pi_ooo", t + 60, "1"),
        STRIPE_NEW,
        now(),
    )
    .await;
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "succeeded");
    // refunded is not undone by a late succeeded.
    send_stripe(
        &app,
        &refund_event("evt_r", "pi_ooo", t + 100),
        STRIPE_NEW,
        now(),
    )
    .await;
    send_stripe(
        &app,
        &intent_event("evt_s2", "succeeded", "pi_ooo", t + 200, "1"),
        STRIPE_NEW,
        now(),
    )
    .await;
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "refunded");
    assert_eq!(app.count("tokens", doc! { "status": "revoked" }).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);

    // Standard Webhooks: version 5 then 3 stays 5.
    send_acme(&app, "msg_5", &acme_event("processing", "pay_v", 5)).await;
    let stale = json(send_acme(&app, "msg_3", &acme_event("succeeded", "pay_v", 3)).await).await;
    assert_eq!(stale["outcome"], "stale");
    assert_eq!(
        payment_status(&app, "pay_v").await,
        ("processing".to_owned(), 5)
    );
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pay_v" })
            .await,
        0,
        "a stale success issues nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_versions_the_highest_wins() {
    let app = app().await;
    let deliveries = (1..=20).map(|v| {
        let app = &app;
        async move {
            send_acme(
                app,
                &format!("msg_c{v}"),
                &acme_event("processing", "pay_c", v),
            )
            .await
            .status()
            .as_u16()
        }
    });
    let statuses = join_all(deliveries).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(payment_status(&app, "pay_c").await.1, 20);
    assert_eq!(app.count("payments", doc! {}).await, 1);
    assert_eq!(app.count("webhook_events", doc! {}).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_deliveries_have_one_effect() {
    let app = app().await;
    let event = intent_event("evt_dup", "succeeded", "pi_dup", now(), "5");
    let answers = join_all((0..16).map(|_| send_stripe(&app, &event, STRIPE_NEW, now()))).await;
    assert!(answers.iter().all(|r| r.status() == 200));
    assert_eq!(app.token_indexes("pi_dup").await, vec![0, 1, 2, 3, 4]);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "evt_dup" })
            .await,
        1
    );
}

#[tokio::test]
async fn a_refund_after_partial_redemption_revokes_only_active_tokens() {
    let app = app().await;
    let t = now();
    let receipt = json(
        send_stripe(
            &app,
            &intent_event("evt_ok", "succeeded", "pi_ref", t, "4"),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["tokensCreated"], 4);
    let issued = json(
        app.get(ADMIN_KEY, "/v1/issuances/stripe/acct_1/pi_ref")
            .await,
    )
    .await;
    let ids = token_ids(&issued);
    for id in &ids[..2] {
        let redeemed = app
            .http
            .post(app.url(&format!("/v1/tokens/{id}/redeem")))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(redeemed.status(), 200);
    }
    let receipt = json(
        send_stripe(
            &app,
            &refund_event("evt_refund", "pi_ref", t + 10),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked");
    assert_eq!(receipt["tokensRevoked"], 2);
    assert_eq!(
        receipt["shortfall"], 2,
        "the redeemed ones are the shortfall"
    );
    assert_eq!(app.count("tokens", doc! { "status": "redeemed" }).await, 2);
    assert_eq!(
        app.count("tokens", doc! { "status": "revoked", "_version": 1 })
            .await,
        2
    );
    let event = app
        .db
        .collection::<Document>("webhook_events")
        .find_one(doc! { "eventId": "evt_refund" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.get_str("outcome").unwrap(), "revoked");
}

#[tokio::test]
async fn bad_metadata_and_ignored_events_answer_200_and_are_recorded() {
    let app = app().await;
    let mut event = intent_event("evt_meta", "succeeded", "pi_meta", now(), "lots");
    event["data"]["object"]["metadata"]["tokenmint_owner"] = json!("not-an-id");
    let receipt = json(send_stripe(&app, &event, STRIPE_NEW, now()).await).await;
    assert_eq!(receipt["outcome"], "metadata_invalid");
    assert!(
        receipt["detail"]
            .as_str()
            .unwrap()
            .contains("tokenmint_quantity")
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let payment = json(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_meta")
            .await,
    )
    .await;
    assert!(
        payment["metadataError"]
            .as_str()
            .unwrap()
            .contains("tokenmint_owner")
    );

    let other = json!({"id": "evt_cust", "type": "customer.created", "created": now(), "data": {"object": {"id": "cus_1"}}});
    let receipt = json(send_stripe(&app, &other, STRIPE_NEW, now()).await).await;
    assert_eq!(receipt["outcome"], "ignored");
    let refund_unknown = json(
        send_stripe(
            &app,
            &refund_event("evt_unknown", "pi_never_seen", now()),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(refund_unknown["tokensRevoked"], 0);
    assert_eq!(
        app.count("webhook_events", doc! { "outcome": "ignored" })
            .await,
        1
    );
    assert_problem(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_nothing")
            .await,
        404,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn checkout_requests_wait_for_the_payment_then_complete_once() {
    let app = app().await;
    let body = issuance_body("pi_trust", 3);
    // Unknown payment: 202, a pending issuance, no tokens.
    let pending = app.issue(REQUEST_KEY, &body).await;
    assert_eq!(pending.status(), 202);
    let pending = json(pending).await;
    assert_eq!(pending["issuance"]["status"], "pending");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(
        app.issue(REQUEST_KEY, &body).await.status(),
        202,
        "asking again is still pending"
    );

    // The success webhook completes it, exactly once.
    let receipt = json(
        send_stripe(
            &app,
            &intent_event("evt_t", "succeeded", "pi_trust", now(), "3"),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(app.token_indexes("pi_trust").await, vec![0, 1, 2]);
    let record = app
        .db
        .collection::<Document>("issuances")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.get_str("status").unwrap(), "issued");
    // The frontend's next request now replays.
    let done = app.issue(REQUEST_KEY, &body).await;
    assert_eq!(done.status(), 200);
    assert_eq!(token_ids(&json(done).await).len(), 3);

    // Payment known to have succeeded first: the frontend's request issues at once.
    send_stripe(
        &app,
        &intent_event("evt_t2", "succeeded", "pi_trust2", now(), "2"),
        STRIPE_NEW,
        now(),
    )
    .await;
    let mut mismatch = issuance_body("pi_trust2", 5);
    let conflict = assert_problem(
        app.issue(REQUEST_KEY, &mismatch).await,
        409,
        "idempotency_conflict",
    )
    .await;
    assert_eq!(conflict["mismatches"][0]["field"], "quantity");
    mismatch["quantity"] = json!(2);
    assert_eq!(
        app.issue(REQUEST_KEY, &mismatch).await.status(),
        200,
        "the webhook issued already"
    );

    // Canceled payment: 409 payment_not_succeeded, nothing written.
    send_stripe(
        &app,
        &intent_event("evt_c", "canceled", "pi_canceled", now(), "1"),
        STRIPE_NEW,
        now(),
    )
    .await;
    assert_problem(
        app.issue(REQUEST_KEY, &issuance_body("pi_canceled", 1))
            .await,
        409,
        "payment_not_succeeded",
    )
    .await;
    assert_eq!(
        app.count("issuances", doc! { "paymentIntentId": "pi_canceled" })
            .await,
        0
    );

    // A pending request whose parameters differ from the payment's metadata: the signed
    // metadata wins, and the checkout's own request is then refused without being shown
    // the recorded values.
    let mut asked = issuance_body("pi_trust3", 9);
    asked["owner"] = json!(OTHER_OWNER);
    assert_eq!(app.issue(REQUEST_KEY, &asked).await.status(), 202);
    let receipt = json(
        send_stripe(
            &app,
            &intent_event("evt_t3", "succeeded", "pi_trust3", now(), "2"),
            STRIPE_NEW,
            now(),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(receipt["tokensCreated"], 2);
    assert_eq!(app.token_indexes("pi_trust3").await, vec![0, 1]);
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_trust3", "owner": ObjectId::parse_str(OWNER).unwrap() }
        )
        .await,
        2,
        "the tokens belong to the owner the provider named"
    );
    let record = app
        .db
        .collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": "pi_trust3" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_i64("quantity").unwrap(), 2);
    assert!(!record.contains_key("expiresAt"), "no longer pending");
    assert_hidden_conflict(app.issue(REQUEST_KEY, &asked).await, &["owner", "quantity"]).await;
}
