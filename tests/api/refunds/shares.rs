//! How much a partial refund takes back, and which tokens: the refunded share rounded
//! down, a number of tokens taken from the active ones, highest tokenIndex first,
//! redeemed tokens left redeemed (the shortfall when too few are active), and a full
//! refund taking the rest even within the same second.

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use super::{acme, acme_paid, payment_doc, revoked_in, stripe};
use crate::helpers::*;
use crate::provider_events::*;

/// The stored record of webhook event `event_id` of `provider`.
async fn event_record(app: &TestApp, provider: &str, event_id: &str) -> Document {
    app.find_stored(
        "webhook_events",
        doc! { "provider": provider, "eventId": event_id },
    )
    .await
}

/// A Standard Webhooks `payment.refunded`, without the payment's metadata; partial when
/// `amount_refunded` is given.
fn acme_refund(payment: &str, version: i64, amount_refunded: Option<i64>) -> Value {
    let mut data = json!({ "paymentIntentId": payment, "version": version });
    if let Some(refunded) = amount_refunded {
        data["amountRefunded"] = json!(refunded);
    }
    json!({ "type": "payment.refunded", "timestamp": "2026-11-30T00:00:00Z", "data": data })
}

/// Redeems a token as the admin, asserting the 200.
async fn redeem(app: &TestApp, token_id: &str) {
    let response = app.redeem_token(ADMIN_KEY, token_id).await;
    assert_eq!(response.status(), 200, "redeem {token_id}");
}

/// Asserts that the payment is refunded and every one of its `quantity` tokens revoked.
async fn assert_all_revoked_and_refunded(app: &TestApp, payment: &str, quantity: usize) {
    assert_eq!(
        app.token_states(payment).await,
        indexed_statuses(&vec!["revoked"; quantity])
    );
    assert_eq!(
        payment_doc(app, payment).await.get_str("status").unwrap(),
        "refunded"
    );
}

#[tokio::test]
async fn stripe_partial_refunds_take_back_the_refunded_share_highest_index_first() {
    let app = app().await;
    let t = now();
    let pi = "pi_partial";
    let paid = stripe(&app, &intent_event("evt_paid", "succeeded", pi, t, "4")).await;
    assert_eq!(paid["tokensCreated"], 4);

    // 250 of 1000 refunded: floor(4 × 250 ÷ 1000) = 1 token back, the highest index.
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_r250", pi, t + 10, 1000, 250),
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(receipt["shortfall"], 0, "{receipt}");
    assert_eq!(
        app.token_states(pi).await,
        indexed_statuses(&["active", "active", "active", "revoked"])
    );
    let revoked = &app.tokens_of(pi).await[3];
    assert_eq!(
        revoked.get_str("revocationReason").unwrap(),
        "partial_refund"
    );
    assert!(revoked.get_datetime("revokedAt").is_ok());
    assert_eq!(stored_int(revoked, "_version"), Some(1));
    let payment = payment_doc(&app, pi).await;
    assert_eq!(
        payment.get_str("status").unwrap(),
        "succeeded",
        "the payment still stands for the rest"
    );
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(250));
    let record = event_record(&app, "stripe", "evt_r250").await;
    assert_eq!(record.get_str("outcome").unwrap(), "revoked");
    assert_eq!(stored_int(&record, "tokensRevoked"), Some(1));
    assert_eq!(stored_int(&record, "shortfall"), Some(0));

    // 500 of 1000 so far: 2 back in all, so one more.
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_r500", pi, t + 20, 1000, 500),
    )
    .await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pi).await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        stored_int(&payment_doc(&app, pi).await, "amountRefunded"),
        Some(500)
    );

    // The same refund again under a new event id, and an older, smaller one delivered
    // late: nothing more is taken back, and the refunded amount does not shrink.
    let again = stripe(
        &app,
        &partial_refund_event("evt_r500_again", pi, t + 30, 1000, 500),
    )
    .await;
    assert_eq!(revoked_in(&again), 0, "{again}");
    let older = stripe(
        &app,
        &partial_refund_event("evt_r100_old", pi, t + 5, 1000, 100),
    )
    .await;
    assert_eq!(revoked_in(&older), 0, "{older}");
    assert_eq!(
        app.token_states(pi).await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": pi, "status": "revoked", "_version": 1 }
        )
        .await,
        2,
        "no token was written twice"
    );
    let payment = payment_doc(&app, pi).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(500));
    for event in ["evt_r500_again", "evt_r100_old"] {
        let record = event_record(&app, "stripe", event).await;
        assert_eq!(
            stored_int(&record, "tokensRevoked").unwrap_or(0),
            0,
            "{record}"
        );
    }

    // The full refund takes back the rest.
    let full = stripe(&app, &refund_event("evt_full", pi, t + 40)).await;
    assert_eq!(full["outcome"], "revoked", "{full}");
    assert_eq!(full["tokensRevoked"], 2, "{full}");
    assert_all_revoked_and_refunded(&app, pi, 4).await;
    assert_eq!(
        app.count("tokens", doc! {}).await,
        4,
        "nothing issued again"
    );
    assert_eq!(app.count("webhook_events", doc! {}).await, 6);
}

#[tokio::test]
async fn standard_webhooks_partial_refunds_use_the_known_amount_and_round_down() {
    let app = app().await;
    let pay = "pay_partial";
    let paid = acme(&app, "msg_paid", &acme_paid(pay, 1, 1000, 3)).await;
    assert_eq!(paid["tokensCreated"], 3, "{paid}");

    // 500 of 1000 (the amount the success event named): floor(3 × 0.5) = 1.
    let receipt = acme(&app, "msg_r500", &acme_refund(pay, 2, Some(500))).await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pay).await,
        indexed_statuses(&["active", "active", "revoked"])
    );
    let payment = payment_doc(&app, pay).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(500));
    assert_eq!(
        stored_int(&payment, "version"),
        Some(1),
        "a partial refund is no state change: it consumes no version"
    );

    // 700 of 1000: floor(2.1) = 2 in all.
    let receipt = acme(&app, "msg_r700", &acme_refund(pay, 3, Some(700))).await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pay).await,
        indexed_statuses(&["active", "revoked", "revoked"])
    );

    // Repeated (newer version, same amount) and older (lower version, lower amount):
    // nothing more.
    let again = acme(&app, "msg_r700_again", &acme_refund(pay, 4, Some(700))).await;
    assert_eq!(revoked_in(&again), 0, "{again}");
    let older = acme(&app, "msg_r500_old", &acme_refund(pay, 2, Some(500))).await;
    assert_eq!(revoked_in(&older), 0, "{older}");
    assert_eq!(
        app.token_states(pay).await,
        indexed_statuses(&["active", "revoked", "revoked"])
    );
    let payment = payment_doc(&app, pay).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(700));

    // A refund without amountRefunded is the full one: the last token goes too.
    let full = acme(&app, "msg_full", &acme_refund(pay, 5, None)).await;
    assert_eq!(full["tokensRevoked"], 1, "{full}");
    assert_eq!(
        app.token_states(pay).await,
        indexed_statuses(&["revoked", "revoked", "revoked"])
    );
    assert_eq!(
        payment_doc(&app, pay).await.get_str("status").unwrap(),
        "refunded"
    );
}

/// The share is a number of tokens: spent tokens stay spent, and active ones are taken
/// back in their place, highest first, whichever tokens were spent; only what no active
/// token is left for is the shortfall.
#[tokio::test]
async fn redeemed_tokens_stay_redeemed_and_the_share_is_taken_from_the_active_ones() {
    let app = app().await;
    let t = now();

    // The highest token redeemed: the share of 2 takes the two highest active ones.
    stripe(
        &app,
        &intent_event("evt_a", "succeeded", "pi_short1", t, "4"),
    )
    .await;
    let a = app.issued_token_ids("pi_short1").await;
    redeem(&app, &a[3]).await;
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_a_r", "pi_short1", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 2, "{receipt}");
    assert_eq!(receipt["shortfall"], 0, "{receipt}");
    assert_eq!(
        app.token_states("pi_short1").await,
        indexed_statuses(&["active", "revoked", "revoked", "redeemed"])
    );
    let record = event_record(&app, "stripe", "evt_a_r").await;
    assert_eq!(record.get_str("outcome").unwrap(), "revoked");
    assert_eq!(stored_int(&record, "tokensRevoked"), Some(2));
    assert_eq!(stored_int(&record, "shortfall"), Some(0));

    // The two highest spent before half of the payment was refunded: the customer, who
    // paid for two, spent two, and the two left are taken back — not kept beside them.
    stripe(
        &app,
        &intent_event("evt_b", "succeeded", "pi_short2", t, "4"),
    )
    .await;
    let b = app.issued_token_ids("pi_short2").await;
    redeem(&app, &b[2]).await;
    redeem(&app, &b[3]).await;
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_b_r", "pi_short2", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(receipt["tokensRevoked"], 2, "{receipt}");
    assert_eq!(receipt["shortfall"], 0, "{receipt}");
    assert_eq!(
        app.token_states("pi_short2").await,
        indexed_statuses(&["revoked", "revoked", "redeemed", "redeemed"])
    );

    // Three of four spent, half refunded: one active token for a share of two, and one
    // short.
    stripe(
        &app,
        &intent_event("evt_c", "succeeded", "pi_short3", t, "4"),
    )
    .await;
    let c = app.issued_token_ids("pi_short3").await;
    for id in &c[1..] {
        redeem(&app, id).await;
    }
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_c_r", "pi_short3", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(receipt["shortfall"], 1, "{receipt}");
    let record = event_record(&app, "stripe", "evt_c_r").await;
    assert_eq!(stored_int(&record, "shortfall"), Some(1));
    assert_eq!(
        app.token_states("pi_short3").await,
        indexed_statuses(&["revoked", "redeemed", "redeemed", "redeemed"])
    );

    // The full refund after the partial one takes the rest; redeemed ones stay redeemed.
    let full = stripe(&app, &refund_event("evt_a_full", "pi_short1", t + 20)).await;
    assert_eq!(full["tokensRevoked"], 1, "{full}");
    assert_eq!(full["shortfall"], 1, "{full}");
    assert_eq!(
        app.token_states("pi_short1").await,
        indexed_statuses(&["revoked", "revoked", "revoked", "redeemed"])
    );
    assert_eq!(
        payment_doc(&app, "pi_short1")
            .await
            .get_str("status")
            .unwrap(),
        "refunded"
    );
    // The other payments were not touched.
    assert_eq!(
        app.token_states("pi_short2").await,
        indexed_statuses(&["revoked", "revoked", "redeemed", "redeemed"])
    );
}

/// A set still being written when its payment is settled (a sweep, or a refund, between
/// the insert of some tokens and the rest): the share is drawn by position, so the
/// settle after the rest is written takes exactly the positions the first one would
/// have, and never more than the share in all.
#[tokio::test]
async fn a_share_taken_while_the_set_is_still_written_is_the_same_positions() {
    use tokenmint::domain::{
        AccountId, Actor, PaymentIntentId, PaymentKey, Provider, RevocationReason,
    };
    let app = app().await;
    let key = PaymentKey {
        provider: Provider::parse("stripe").unwrap(),
        account_id: AccountId::parse("acct_1").unwrap(),
        payment_intent_id: PaymentIntentId::parse("pi_writing").unwrap(),
    };
    let token = |index: i64| {
        doc! {
            "owner": mongodb::bson::oid::ObjectId::parse_str(OWNER).unwrap(), "type": "standard",
            "tokenIndex": index, "status": "active", "_version": 0,
            "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_writing" },
        }
    };
    let tokens = app.db.collection::<Document>("tokens");
    let store = app.store().await;
    let by = Actor::provider(&key.provider);
    // 8 tokens, half refunded (4 kept); 5 written so far, one of them spent.
    tokens.insert_many((0..5).map(token)).await.unwrap();
    tokens
        .update_one(
            doc! { "tokenIndex": 4 },
            doc! { "$set": { "status": "redeemed" } },
        )
        .await
        .unwrap();
    let first = store
        .revoke_share(&key, 8, 4, RevocationReason::PartialRefund, &by)
        .await
        .unwrap();
    assert_eq!(
        first,
        (1, 0),
        "positions 7, 6 and 5 are not written yet, 4 is spent"
    );
    tokens.insert_many((5..8).map(token)).await.unwrap();
    let second = store
        .revoke_share(&key, 8, 4, RevocationReason::PartialRefund, &by)
        .await
        .unwrap();
    assert_eq!(second, (3, 0));
    assert_eq!(
        app.token_states("pi_writing").await,
        indexed_statuses(&[
            "active", "active", "active", "revoked", "redeemed", "revoked", "revoked", "revoked"
        ])
    );
}

/// Stripe `created` has a one-second resolution: a full refund in the same second as the
/// last partial one must still win (it outranks a partial refund, and reports the whole
/// amount refunded).
#[tokio::test]
async fn a_full_refund_in_the_same_second_as_a_partial_one_still_takes_back_the_rest() {
    let app = app().await;
    let t = now();
    let pi = "pi_same_second";
    stripe(&app, &intent_event("evt_ss", "succeeded", pi, t, "4")).await;
    stripe(
        &app,
        &partial_refund_event("evt_ss_r", pi, t + 10, 1000, 500),
    )
    .await;
    let full = stripe(&app, &refund_event("evt_ss_full", pi, t + 10)).await;
    assert_eq!(full["tokensRevoked"], 2, "{full}");
    assert_all_revoked_and_refunded(&app, pi, 4).await;
}

#[tokio::test]
async fn a_total_recorded_before_refunds_were_kept_one_by_one_stays_the_least_taken_back() {
    // A payment of 1000 for 10 tokens whose refunds (400) were recorded as a total alone,
    // before each was kept under its own id (a running total the next report of the
    // same refunds restates); then a dispute takes 100. The total stays a floor.
    let app = app().await;
    stripe(
        &app,
        &intent_event("evt_legacy", "succeeded", "pi_legacy", now(), "10"),
    )
    .await;
    app.db
        .collection::<Document>("payments")
        .update_one(
            doc! { "paymentIntentId": "pi_legacy" },
            doc! { "$set": { "amountRefunded": 400_i64 } },
        )
        .await
        .unwrap();
    let chargeback = dispute("evt_legacy_d", "funds_withdrawn", "pi_legacy", 100, now());
    stripe(&app, &chargeback).await;
    let active = app.active_indexes("pi_legacy").await;
    assert_eq!(active.len(), 6, "at least the 400 recorded taken back");
    // An entry that is no Stripe charge's total keeps no `release`.
    let stored = payment_doc(&app, "pi_legacy").await;
    let entry = stored.get_array("refunds").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(entry.get_str("id"), Ok("dispute:du_1"));
    assert!(entry.get("release").is_none(), "{entry}");
}
