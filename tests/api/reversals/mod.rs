//! Money that comes back: a dispute won, a refund that failed, a chargeback reversed.
//! The entitlement follows the money, so the tokens a withdrawal revoked become active
//! again — the same token ids, version-gated — while an operator's revoke and a
//! redemption stay as they are. Each reversal counts once (by the provider's id of what
//! it reverses), also when replayed or when it arrives before its withdrawal. Stripe
//! here, the other providers in [`providers`], tokens that changed hands in [`holders`];
//! every test reads the database.

mod holders;
mod providers;
mod races;

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::provider_events::{
    PROVIDERS, deliver_stripe, dispute, intent_event, partial_refund_event, recorded_outcome,
};

/// When the test payments were paid (Stripe `created`).
const PAID_AT: i64 = 1_780_000_000;

async fn app() -> TestApp {
    spawn_app_with(&format!("{PROVIDERS}{}", crate::adyen::ADYEN)).await
}

/// Delivers a Stripe event, asserting the 200; the receipt.
async fn stripe(app: &TestApp, event: &Value) -> Value {
    let answer = deliver_stripe(app, event).await;
    assert_eq!(answer.status(), 200);
    json(answer).await
}

/// Pays Stripe payment `payment` (1000 cents) for `quantity` tokens; their ids, by
/// tokenIndex.
async fn paid(app: &TestApp, payment: &str, quantity: &str) -> Vec<String> {
    let receipt = stripe(
        app,
        &intent_event("evt_paid", "succeeded", payment, PAID_AT, quantity),
    )
    .await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    app.stored_token_ids(payment).await
}

/// Half of the payment disputed: `funds_withdrawn` of 500 of its 1000 cents (event
/// `evt_dw`, 10 s after it was paid), which takes 2 of 4 tokens back.
fn half_withdrawn(payment: &str) -> Value {
    dispute("evt_dw", "funds_withdrawn", payment, 500, PAID_AT + 10)
}

/// [`half_withdrawn`]'s dispute won: `funds_reinstated` of the same 500 (event `evt_dr`,
/// 20 s after the payment).
fn half_reinstated(payment: &str) -> Value {
    dispute("evt_dr", "funds_reinstated", payment, 500, PAID_AT + 20)
}

/// A Stripe Refund event (`refund.failed`, `refund.updated`, `charge.refund.updated`) of
/// refund `re_1` of `amount` of charge `ch_1`, in `status`.
fn refund_event(
    event_id: &str,
    event_type: &str,
    payment: &str,
    amount: i64,
    status: &str,
    created: i64,
) -> Value {
    json!({
        "id": event_id, "object": "event", "type": event_type, "created": created,
        "account": "acct_1", "livemode": false,
        "data": { "object": {
            "id": "re_1", "object": "refund", "amount": amount, "charge": "ch_1",
            "currency": "eur", "payment_intent": payment, "status": status,
            "failure_reason": if status == "failed" { json!("expired_or_canceled_card") } else { Value::Null },
        } },
    })
}

/// Refund `re_1` (`amount` cents) failed, 20 s after the payment: `refund.failed` of
/// event `id`. That money came back.
fn refund_failed(id: &str, payment: &str, amount: i64) -> Value {
    refund_event(id, "refund.failed", payment, amount, "failed", PAID_AT + 20)
}

/// Stripe's report of charge `ch_1` (1000 cents) with `refunded` cents refunded so far,
/// a running total (`charge.refunded`, not in full).
fn refunded_so_far(event_id: &str, payment: &str, created: i64, refunded: i64) -> Value {
    partial_refund_event(event_id, payment, created, 1000, refunded)
}

/// Half of the payment refunded (refund `re_1`): the report of 500 refunded so far (event
/// `evt_r1`, 10 s after the payment), which takes 2 of 4 tokens back.
fn half_refunded(payment: &str) -> Value {
    refunded_so_far("evt_r1", payment, PAID_AT + 10, 500)
}

/// What [`half_refunded`] leaves of 4 tokens: the two highest revoked.
const HALF: [&str; 4] = ["active", "active", "revoked", "revoked"];

/// Pays `payment` for 4 tokens and refunds half of it ([`half_refunded`]), checking that
/// it leaves [`HALF`].
async fn paid_then_half_refunded(app: &TestApp, payment: &str) {
    paid(app, payment, "4").await;
    stripe(app, &half_refunded(payment)).await;
    assert_eq!(statuses(app, payment).await, HALF);
}

/// The full refund of charge `ch_1` (`refunded: true`).
fn full_refund(event_id: &str, payment: &str, created: i64) -> Value {
    json!({
        "id": event_id, "type": "charge.refunded", "created": created, "account": "acct_1",
        "data": { "object": { "id": "ch_1", "payment_intent": payment, "amount": 1000,
            "refunded": true, "amount_refunded": 1000 } },
    })
}

/// The token's stored status and `_version`.
async fn state(app: &TestApp, token: &str) -> (String, i64) {
    let token = app.stored_token(token).await;
    (
        token.get_str("status").unwrap().to_owned(),
        token
            .get("_version")
            .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
            .unwrap(),
    )
}

/// The statuses of a payment's tokens, by tokenIndex.
async fn statuses(app: &TestApp, payment: &str) -> Vec<String> {
    app.token_states(payment)
        .await
        .into_iter()
        .map(|(_, status)| status)
        .collect()
}

/// The payment's stored record.
async fn payment(app: &TestApp, payment: &str) -> Document {
    app.find_stored("payments", doc! { "paymentIntentId": payment })
        .await
}

/// The payment's stored status (`succeeded`, `refunded`, …).
async fn payment_status(app: &TestApp, payment: &str) -> String {
    self::payment(app, payment)
        .await
        .get_str("status")
        .unwrap()
        .to_owned()
}

/// How many reversals the payment records (one that arrives again must not add any).
async fn reversals_recorded(app: &TestApp, payment: &str) -> usize {
    self::payment(app, payment)
        .await
        .get_array("reversals")
        .unwrap()
        .len()
}

/// A receipt's `tokensRevoked`, 0 when it names none.
fn tokens_revoked(receipt: &Value) -> u64 {
    receipt["tokensRevoked"].as_u64().unwrap_or(0)
}

/// The operator (the admin key) revokes `token` for `reason`; the answer.
async fn operator_revoke(app: &TestApp, token: &str, reason: &str) -> reqwest::Response {
    app.http
        .post(app.url(&format!("/v1/tokens/{token}/revoke")))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({ "reason": reason }))
        .send()
        .await
        .unwrap()
}

/// Asserts `verify` finds nothing wrong, the reversal checks included.
async fn verify_clean(app: &TestApp) {
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}

/// Sends `event` again as a replay after its dedupe record expired: the record is
/// removed as the TTL index would, and the delivery is processed as new.
async fn replay_after_expiry(app: &TestApp, event: &Value) -> Value {
    let id = event["id"].as_str().unwrap();
    app.db
        .collection::<Document>("webhook_events")
        .delete_one(doc! { "provider": "stripe", "eventId": id })
        .await
        .unwrap();
    let receipt = stripe(app, event).await;
    assert_eq!(receipt["duplicate"], false, "{receipt}");
    receipt
}

#[tokio::test]
async fn a_dispute_won_makes_the_same_tokens_active_again() {
    let app = app().await;
    let ids = paid(&app, "pi_won", "4").await;
    // Half disputed: tokens 2 and 3 revoked, highest first.
    let withdrawn = stripe(&app, &half_withdrawn("pi_won")).await;
    assert_eq!(withdrawn["tokensRevoked"], 2, "{withdrawn}");
    assert_eq!(state(&app, &ids[3]).await, ("revoked".to_owned(), 1));

    let reinstated = stripe(&app, &half_reinstated("pi_won")).await;
    assert_eq!(reinstated["outcome"], "reinstated", "{reinstated}");
    assert_eq!(reinstated["tokensReactivated"], 2, "{reinstated}");
    assert_eq!(
        app.stored_token_ids("pi_won").await,
        ids,
        "the same tokens, no new ones"
    );
    for id in &ids[2..] {
        // Revoked at 1, active again at 2: every state change bumps the version.
        assert_eq!(state(&app, id).await, ("active".to_owned(), 2), "{id}");
        let token = app.stored_token(id).await;
        assert!(token.get("revocationReason").is_none(), "{token}");
        assert!(token.get("reactivatedAt").is_some(), "{token}");
    }
    let stored = payment(&app, "pi_won").await;
    assert_eq!(stored.get_str("status").unwrap(), "succeeded");
    let reversals = stored.get_array("reversals").unwrap();
    assert_eq!(reversals.len(), 1, "{stored}");
    assert_eq!(recorded_outcome(&app, "evt_dr").await, "reinstated");
    verify_clean(&app).await;
}

#[tokio::test]
async fn an_operators_revoke_and_a_redemption_outlast_a_failed_full_refund() {
    let app = app().await;
    let ids = paid(&app, "pi_op", "4").await;
    let revoke = operator_revoke(&app, &ids[0], "refunded").await;
    assert_eq!(revoke.status(), 200);
    let redeem = app
        .http
        .post(app.url(&format!("/v1/tokens/{}/redeem", ids[1])))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(redeem.status(), 200);

    let refunded = stripe(&app, &full_refund("evt_full", "pi_op", PAID_AT + 10)).await;
    assert_eq!(refunded["tokensRevoked"], 2, "{refunded}");
    assert_eq!(payment_status(&app, "pi_op").await, "refunded");

    // The refund failed: the whole amount came back, the payment stands again.
    let failed = stripe(&app, &refund_failed("evt_rf", "pi_op", 1000)).await;
    assert_eq!(failed["outcome"], "reinstated", "{failed}");
    assert_eq!(failed["tokensReactivated"], 2, "{failed}");
    assert_eq!(
        statuses(&app, "pi_op").await,
        ["revoked", "redeemed", "active", "active"],
        "the operator's revoke (even with the reason `refunded`) stays"
    );
    let operator = app.stored_token(&ids[0]).await;
    assert_eq!(operator.get_str("lastChangedBy").unwrap(), "key:admin");
    assert_eq!(payment_status(&app, "pi_op").await, "succeeded");
    // Issuable again: a trusted retry of the payment is a replay, not a refusal.
    let retry = app.issue(WRITER_KEY, &issuance_body("pi_op", 4)).await;
    assert_ne!(retry.status(), 409, "{:?}", retry.text().await);

    // The full refund's event replayed a month later (its dedupe record expired): the
    // refund that failed is not counted again, and the payment stays standing.
    let replayed = replay_after_expiry(&app, &full_refund("evt_full", "pi_op", PAID_AT + 10)).await;
    assert_eq!(tokens_revoked(&replayed), 0, "{replayed}");
    assert_eq!(
        statuses(&app, "pi_op").await,
        ["revoked", "redeemed", "active", "active"]
    );
    assert_eq!(payment_status(&app, "pi_op").await, "succeeded");
    verify_clean(&app).await;
}

/// The highest token spent, then half refunded: the share (2) is taken from the active
/// ones below it. Half of the dispute won back gives one of them back — the last one
/// revoked, the lowest — and not both, which would leave three standing for two paid.
#[tokio::test]
async fn money_that_comes_back_gives_back_as_many_tokens_as_it_pays_for() {
    let app = app().await;
    let ids = paid(&app, "pi_counted", "4").await;
    let redeem = app.redeem_token(ADMIN_KEY, &ids[3]).await;
    assert_eq!(redeem.status(), 200);
    let withdrawn = stripe(&app, &half_withdrawn("pi_counted")).await;
    assert_eq!(withdrawn["tokensRevoked"], 2, "{withdrawn}");
    assert_eq!(
        statuses(&app, "pi_counted").await,
        ["active", "revoked", "revoked", "redeemed"]
    );

    // 250 of the 500 disputed come back: the payment stands for 3 of 4, a share of 1.
    let back = stripe(
        &app,
        &dispute(
            "evt_dr_half",
            "funds_reinstated",
            "pi_counted",
            250,
            PAID_AT + 20,
        ),
    )
    .await;
    assert_eq!(back["tokensReactivated"], 1, "{back}");
    assert_eq!(
        statuses(&app, "pi_counted").await,
        ["active", "active", "revoked", "redeemed"]
    );
    verify_clean(&app).await;
}

/// An operator who revokes again a token a refund took (for fraud, say) becomes its last
/// author, and no settle after that takes another token in its place: the share is drawn
/// by position and spending, not by who revoked.
#[tokio::test]
async fn an_operators_second_revoke_of_a_refunded_token_takes_no_other_token() {
    let app = app().await;
    paid_then_half_refunded(&app, "pi_again").await;
    let ids = app.stored_token_ids("pi_again").await;
    let again = operator_revoke(&app, &ids[3], "fraud").await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        app.stored_token(&ids[3])
            .await
            .get_str("lastChangedBy")
            .unwrap(),
        "key:admin"
    );

    // The refund reported again under another id: the payment is settled again.
    let again = stripe(
        &app,
        &refunded_so_far("evt_r1_again", "pi_again", PAID_AT + 30, 500),
    )
    .await;
    assert_eq!(tokens_revoked(&again), 0, "{again}");
    assert_eq!(statuses(&app, "pi_again").await, HALF);
    verify_clean(&app).await;
}

#[tokio::test]
async fn an_operators_revoke_of_a_token_a_refund_revoked_outlasts_the_refunds_failure() {
    let app = app().await;
    let ids = paid(&app, "pi_opr", "4").await;
    let refunded = stripe(&app, &full_refund("evt_full", "pi_opr", PAID_AT + 10)).await;
    assert_eq!(refunded["tokensRevoked"], 4, "{refunded}");
    let (_, withdrawn_version) = state(&app, &ids[0]).await;

    // The operator revokes token 0 too: it is theirs to keep revoked from now on.
    let revoke = operator_revoke(&app, &ids[0], "fraud").await;
    assert_eq!(revoke.status(), 200);
    let answer = json(revoke).await;
    assert_eq!(answer["status"], "revoked", "{answer}");
    let operator = app.stored_token(&ids[0]).await;
    assert_eq!(operator.get_str("lastChangedBy").unwrap(), "key:admin");
    assert_eq!(operator.get_str("revocationReason").unwrap(), "fraud");
    assert_eq!(
        state(&app, &ids[0]).await,
        ("revoked".to_owned(), withdrawn_version + 1),
        "a write, through the version gate"
    );

    // The refund failed: the whole amount came back, but not token 0.
    let failed = stripe(&app, &refund_failed("evt_rf", "pi_opr", 1000)).await;
    assert_eq!(failed["tokensReactivated"], 3, "{failed}");
    assert_eq!(
        statuses(&app, "pi_opr").await,
        ["revoked", "active", "active", "active"]
    );
    assert_eq!(
        app.stored_token(&ids[0])
            .await
            .get_str("lastChangedBy")
            .unwrap(),
        "key:admin"
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_failed_refund_gives_its_tokens_back_and_later_charge_reports_count_it_once() {
    let app = app().await;
    paid(&app, "pi_rf", "4").await;
    // 500 of 1000 refunded (re_1): two tokens back.
    let refunded = stripe(&app, &half_refunded("pi_rf")).await;
    assert_eq!(refunded["tokensRevoked"], 2, "{refunded}");
    // Stripe reports the failure twice, once per event type: it counts once.
    for (event_id, event_type) in [
        ("evt_f1", "charge.refund.updated"),
        ("evt_f2", "refund.failed"),
    ] {
        let failure = refund_event(event_id, event_type, "pi_rf", 500, "failed", PAID_AT + 20);
        let receipt = stripe(&app, &failure).await;
        assert_eq!(receipt["outcome"], "reinstated", "{receipt}");
    }
    assert_eq!(statuses(&app, "pi_rf").await, ["active"; 4]);

    // The charge's report from before the failure, replayed after its dedupe record
    // expired, says 500 again: it is the refund that failed, nothing more is taken.
    let replayed = replay_after_expiry(&app, &half_refunded("pi_rf")).await;
    assert_eq!(tokens_revoked(&replayed), 0, "{replayed}");
    assert_eq!(statuses(&app, "pi_rf").await, ["active"; 4]);

    // A new refund of 250 after the failure: Stripe's running total is now 250 (the
    // failed 500 left out), and that is what is taken back: one token.
    let second = stripe(&app, &refunded_so_far("evt_r2", "pi_rf", PAID_AT + 30, 250)).await;
    assert_eq!(second["tokensRevoked"], 1, "{second}");
    assert_eq!(
        statuses(&app, "pi_rf").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_refund_update_that_did_not_fail_gives_nothing_back() {
    let app = app().await;
    paid_then_half_refunded(&app, "pi_ok").await;
    let receipt = stripe(
        &app,
        &refund_event(
            "evt_u",
            "refund.updated",
            "pi_ok",
            500,
            "succeeded",
            PAID_AT + 20,
        ),
    )
    .await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    assert_eq!(
        statuses(&app, "pi_ok").await,
        ["active", "active", "revoked", "revoked"]
    );
}

#[tokio::test]
async fn a_reversal_replayed_under_any_id_or_after_expiry_counts_once() {
    let app = app().await;
    paid(&app, "pi_rep", "4").await;
    stripe(&app, &half_withdrawn("pi_rep")).await;
    // Part of the disputed amount also refunded separately: 300 of the charge.
    stripe(&app, &refunded_so_far("evt_r", "pi_rep", PAID_AT + 15, 300)).await;
    assert_eq!(
        statuses(&app, "pi_rep").await,
        ["active", "revoked", "revoked", "revoked"]
    );

    let won = half_reinstated("pi_rep");
    let first = stripe(&app, &won).await;
    // 300 of 1000 still withdrawn: floor(4 × 0.3) = 1 token stays revoked.
    assert_eq!(first["tokensReactivated"], 2, "{first}");
    let after_first = crate::provider_events::payment_state(&app).await;

    let mut other_id = won.clone();
    other_id["id"] = json!("evt_dr_again");
    let again = stripe(&app, &other_id).await;
    assert_eq!(again["tokensReactivated"], 0, "{again}");
    let replayed = replay_after_expiry(&app, &won).await;
    assert_eq!(replayed["tokensReactivated"], 0, "{replayed}");

    // Nothing but the write's time and counter moved: the same tokens, versions and money.
    let strip = |docs: Vec<Document>| -> Vec<Document> {
        docs.into_iter()
            .map(|mut d| {
                d.remove("updatedAt");
                d.remove("moneyVersion");
                d
            })
            .collect()
    };
    assert_eq!(
        strip(crate::provider_events::payment_state(&app).await),
        strip(after_first)
    );
    assert_eq!(
        statuses(&app, "pi_rep").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_reinstatement_before_its_withdrawal_converges() {
    let app = app().await;
    paid(&app, "pi_ooo", "4").await;
    let early = stripe(&app, &half_reinstated("pi_ooo")).await;
    assert_eq!(early["outcome"], "reinstated", "{early}");
    assert_eq!(early["tokensReactivated"], 0, "{early}");
    // An unrelated refund in between is not offset by the dispute's early reversal.
    let refund = stripe(&app, &refunded_so_far("evt_r", "pi_ooo", PAID_AT + 15, 250)).await;
    assert_eq!(refund["tokensRevoked"], 1, "{refund}");
    let late = stripe(&app, &half_withdrawn("pi_ooo")).await;
    assert_eq!(tokens_revoked(&late), 0, "{late}");
    assert_eq!(
        statuses(&app, "pi_ooo").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn verify_reports_tokens_a_lost_reversal_left_revoked_and_repair_restores_them() {
    let app = app().await;
    paid(&app, "pi_lost", "4").await;
    stripe(&app, &half_withdrawn("pi_lost")).await;
    // The reversal recorded, its settle lost (the process died in between).
    app.db
        .collection::<Document>("payments")
        .update_one(
            doc! { "paymentIntentId": "pi_lost" },
            doc! { "$set": { "reversals": [
                { "id": "dispute:du_1", "amount": 500_i64, "of": "dispute:du_1", "at": PAID_AT + 20 },
            ] } },
        )
        .await
        .unwrap();
    let report = app.store().await.verify().await.unwrap();
    assert_eq!(report.unrestored_tokens.count, 1, "{report}");
    assert!(
        report.unrestored_tokens.samples[0].contains("2 token(s)"),
        "{report}"
    );
    assert_eq!(report.unbacked_active_tokens.count, 0, "{report}");

    let repaired = run_command(&mongo_uri(), &app.db_name, &["verify", "--repair"], &[]).await;
    assert_eq!(
        repaired.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&repaired.stdout)
    );
    assert_eq!(statuses(&app, "pi_lost").await, ["active"; 4]);
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_reversal_whose_reactivation_fails_is_answered_503_and_its_retry_counts_once() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, PROVIDERS).await;
    let ids = paid(&app, "pi_retry", "4").await;
    stripe(&app, &half_withdrawn("pi_retry")).await;
    assert_eq!(
        statuses(&app, "pi_retry").await,
        ["active", "active", "revoked", "revoked"]
    );

    // The settle's revoke (the first `update`) passes; the reactivation's writes fail.
    let won = half_reinstated("pi_retry");
    let failpoint = FailPoint::after_first(&name, &["update"], Fault::error(91)).await;
    let answer = deliver_stripe(&app, &won).await;
    assert!(failpoint.off().await > 0, "the fault never happened");
    assert_eq!(answer.status(), 503, "the provider is asked to retry");
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "evt_dr" })
            .await,
        0,
        "not recorded as processed before its effects"
    );
    // The reversal itself was recorded, once; its tokens are not back yet.
    assert_eq!(reversals_recorded(&app, "pi_retry").await, 1);

    // The provider's retry finishes it: the same tokens, the reversal still counted once.
    let retried = stripe(&app, &won).await;
    assert_eq!(retried["outcome"], "reinstated", "{retried}");
    assert_eq!(statuses(&app, "pi_retry").await, ["active"; 4]);
    assert_eq!(app.stored_token_ids("pi_retry").await, ids);
    assert_eq!(reversals_recorded(&app, "pi_retry").await, 1);
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_failure_delivered_after_its_charges_next_report_is_counted_against_the_gross() {
    let app = app().await;
    paid(&app, "pi_late", "4").await;
    // re_1: 500 refunded; it fails at +20, but that event is delayed.
    stripe(&app, &half_refunded("pi_late")).await;
    // re_2: 250 more at +30. Stripe's running total then leaves the failed 500 out: 250.
    stripe(
        &app,
        &refunded_so_far("evt_r2", "pi_late", PAID_AT + 30, 250),
    )
    .await;
    // Until the failure is heard of, the larger figure stands: two tokens taken back.
    assert_eq!(
        statuses(&app, "pi_late").await,
        ["active", "active", "revoked", "revoked"]
    );
    let failed = stripe(&app, &refund_failed("evt_f", "pi_late", 500)).await;
    // The report at +30 left re_1 out: the gross is 250 + 500, re_1's 500 comes back,
    // and re_2's 250 stays taken: floor(4 × 0.25) = 1 token.
    assert_eq!(failed["tokensReactivated"], 1, "{failed}");
    assert_eq!(
        statuses(&app, "pi_late").await,
        ["active", "active", "active", "revoked"]
    );
    // Its redelivery (as `charge.refund.updated`, later) counts nothing more.
    let mut again = refund_failed("evt_f2", "pi_late", 500);
    again["type"] = json!("charge.refund.updated");
    again["created"] = json!(PAID_AT + 25);
    assert_eq!(stripe(&app, &again).await["tokensReactivated"], 0);
    assert_eq!(
        statuses(&app, "pi_late").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_failure_of_a_refund_no_report_counted_yet_waits_for_that_report() {
    let app = app().await;
    // re_1: 500 refunded, reported at +10: two tokens taken back.
    paid_then_half_refunded(&app, "pi_two").await;
    // re_2: 500 more, made at +15; it fails at +20, and that event comes before the
    // charge's report that counts re_2 (delayed). No report recorded counted re_2, so
    // its failure gives nothing back yet: re_1's 500 is still refunded.
    let mut failed = refund_failed("evt_f_re2", "pi_two", 500);
    failed["data"]["object"]["id"] = json!("re_2");
    failed["data"]["object"]["created"] = json!(PAID_AT + 15);
    let receipt = stripe(&app, &failed).await;
    assert_eq!(receipt["tokensReactivated"], 0, "{receipt}");
    assert_eq!(statuses(&app, "pi_two").await, HALF);
    verify_clean(&app).await;
    // The delayed report (re_1 and re_2: the whole 1000, at +15) counts re_2, whose
    // failure then gives it back: re_1's 500 stays taken.
    stripe(&app, &full_refund("evt_r2", "pi_two", PAID_AT + 15)).await;
    assert_eq!(statuses(&app, "pi_two").await, HALF);
    verify_clean(&app).await;
}

/// `verify --repair` lists the payments whose money takes tokens back, then settles each:
/// a payment that stands again between the listing and its settle (here the refund
/// failed meanwhile) is settled by what it is now. Its tokens are not revoked by the
/// listing's state, not even for a moment (which, were the settle's later read to fail,
/// would leave them revoked with nothing listing the payment again).
#[tokio::test]
async fn a_repair_settles_a_listed_payment_by_what_it_is_when_settled() {
    let app = app().await;
    paid_then_half_refunded(&app, "pi_listed").await;
    // The command's reads of `issuances` after its first (the unfinished records') are
    // held: the listing is taken, the payment's own settle waits.
    let command = unique_app_name();
    let records = format!("{}.issuances", app.db_name);
    let hold = Fault::Block { millis: 3_000 };
    let held = FailPoint::after_first_on(&command, &["find"], &records, hold).await;
    let uri = mongo_uri_named(&command);
    let repair = run_command(&uri, &app.db_name, &["verify", "--repair"], &[]);
    let meanwhile = async {
        assert!(
            held.fired_within(1, std::time::Duration::from_secs(20))
                .await,
            "the settle's read was never held"
        );
        let failed = stripe(&app, &refund_failed("evt_f_listed", "pi_listed", 500)).await;
        assert_eq!(failed["tokensReactivated"], 2, "{failed}");
        held.off().await
    };
    let (repaired, entered) = tokio::join!(repair, meanwhile);
    assert!(entered >= 1);
    let printed = String::from_utf8_lossy(&repaired.stdout);
    assert_eq!(repaired.status.code(), Some(0), "{printed}");
    assert!(printed.contains(" 0 token(s) revoked"), "{printed}");
    assert_eq!(statuses(&app, "pi_listed").await, ["active"; 4]);
    for id in app.stored_token_ids("pi_listed").await {
        assert!(
            state(&app, &id).await.1 <= 2,
            "revoked and restored again: {id}"
        );
    }
    verify_clean(&app).await;
}

/// The same sweep whose read of a listed payment fails (after the listing succeeded):
/// the command fails and changes nothing of it; run again, it settles the payment. Here
/// the half refund's settle was lost (its tokens left active).
#[tokio::test]
async fn a_repair_whose_read_of_a_listed_payment_fails_changes_nothing_and_its_rerun_settles() {
    let app = app().await;
    paid_then_half_refunded(&app, "pi_unread").await;
    app.db
        .collection::<Document>("tokens")
        .update_many(
            doc! { "origin.paymentIntentId": "pi_unread" },
            doc! { "$set": { "status": "active" } },
        )
        .await
        .unwrap();
    let command = unique_app_name();
    let payments = format!("{}.payments", app.db_name);
    let failing = FailPoint::after_first_on(&command, &["find"], &payments, Fault::error(2)).await;
    let uri = mongo_uri_named(&command);
    let failed = run_command(&uri, &app.db_name, &["verify", "--repair"], &[]).await;
    assert!(failing.off().await >= 1, "the payment's read never failed");
    assert_ne!(failed.status.code(), Some(0));
    assert_eq!(statuses(&app, "pi_unread").await, ["active"; 4]);

    let rerun = run_command(&mongo_uri(), &app.db_name, &["verify", "--repair"], &[]).await;
    let printed = String::from_utf8_lossy(&rerun.stdout);
    assert_eq!(rerun.status.code(), Some(0), "{printed}");
    assert!(printed.contains(" 2 token(s) revoked"), "{printed}");
    assert_eq!(statuses(&app, "pi_unread").await, HALF);
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_set_completed_while_its_money_came_back_is_answered_as_stored() {
    // A payment of 1000 known to tokenmint, half of it disputed, before any token of its
    // 4 is written. The first write fails (its record stays `issuing`, no token), so the
    // retry completes the set, tokens 2 and 3 written revoked by its read before the
    // write. That write is held on the server while the dispute is won: the event finds
    // no token to bring back, and the completion's settle, by a read after the write,
    // makes 2 and 3 active again. The answer must name them as they are stored.
    let name = unique_app_name();
    // No self-repair: it would complete the set itself, and its write could be the one
    // held.
    let app = spawn_app_named(&name, &format!("{PROVIDERS}[repair]\nenabled = false\n")).await;
    let payment = "pi_back_while_written";
    let paid_at = mongodb::bson::DateTime::from_millis(PAID_AT * 1000);
    app.db
        .collection::<Document>("payments")
        .insert_one(doc! {
            "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
            "status": "succeeded", "version": 1_i64, "amount": 1000_i64, "currency": "eur",
            "lastEventId": "evt_paid", "lastEventType": "payment_intent.succeeded",
            "createdAt": paid_at, "updatedAt": paid_at,
        })
        .await
        .unwrap();
    stripe(&app, &half_withdrawn(payment)).await;
    // Its hour over, the dispute's placeholder is gone: the issuance writes a record.
    app.db
        .collection::<Document>("issuances")
        .delete_one(doc! { "paymentIntentId": payment, "status": "placeholder" })
        .await
        .unwrap();
    let body = issuance_body(payment, 4);
    let tokens = format!("{}.tokens", app.db_name);
    let failpoint = FailPoint::set_on(&name, &["insert"], &tokens, Fault::error(91), 2).await;
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 503);
    assert!(failpoint.off().await > 0, "the token insert never failed");

    let held = FailPoint::set_on(
        &name,
        &["update"],
        &tokens,
        // Long enough for the dispute's delivery to be answered first on a busy
        // machine: the test needs its settle to come before the write.
        Fault::Block { millis: 4000 },
        1,
    )
    .await;
    let won_meanwhile = async {
        assert!(
            held.fired_within(1, std::time::Duration::from_secs(10))
                .await,
            "the completion's write was never held"
        );
        stripe(&app, &half_reinstated(payment)).await;
        (held, std::time::Instant::now())
    };
    let issue = async {
        let answer = app.issue(WRITER_KEY, &body).await;
        (answer, std::time::Instant::now())
    };
    let ((answer, issued_at), (held, won_at)) = tokio::join!(issue, won_meanwhile);
    assert!(held.off().await > 0);
    assert!(
        won_at < issued_at,
        "the dispute was answered while the write was held"
    );
    assert!(answer.status().is_success(), "{}", answer.status());
    let answer = json(answer).await;
    let answered: Vec<&str> = answer["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses(&app, payment).await,
        ["active"; 4],
        "money came back"
    );
    assert_eq!(answered, ["active"; 4], "{answer}");
}
