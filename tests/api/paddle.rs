//! The `paddle` scheme end to end: Paddle Billing's signature (`Paddle-Signature:
//! ts=…;h1=…` over `"{ts}:{raw body}"`), its transaction, refund and chargeback
//! adjustment events, and what they leave in the database.

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tokenmint::webhooks::paddle::sign_paddle;

use crate::helpers::*;

/// Two notification secret keys (a rotation), shaped like the ones Paddle shows.
pub const PADDLE_OLD: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_oldOLDold0123456789";
pub const PADDLE_NEW: &str = "pdl_ntfset_01hv8x2acma2gz7he8kg2s0hna_newNEWnew0123456789";

pub const PADDLE: &str = r#"
[providers.paddle]
scheme = "paddle"
secrets = ["pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_oldOLDold0123456789", "pdl_ntfset_01hv8x2acma2gz7he8kg2s0hna_newNEWnew0123456789"]
tolerance_secs = 60
"#;

async fn app() -> TestApp {
    spawn_app_with(PADDLE).await
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A `transaction.completed` for `quantity` tokens of a 1000-cent transaction, shaped as
/// in Paddle's documentation (amounts are strings of minor units).
pub(crate) fn completed(event_id: &str, txn: &str, quantity: i64) -> Value {
    json!({
        "event_id": event_id, "event_type": "transaction.completed",
        "occurred_at": "2026-11-30T10:00:00.000000Z", "notification_id": "ntf_01",
        "data": {
            "id": txn, "status": "completed", "currency_code": "EUR", "origin": "web",
            "details": { "totals": { "subtotal": "1000", "tax": "0", "grand_total": "1000" } },
            "custom_data": {
                "tokenmint_owner": OWNER, "tokenmint_token_type": "standard",
                "tokenmint_quantity": quantity.to_string(),
            },
        },
    })
}

/// An approved refund adjustment of `total` cents of `txn`.
pub(crate) fn refund(event_id: &str, adjustment: &str, txn: &str, kind: &str, total: i64) -> Value {
    let mut event = chargeback(event_id, adjustment, txn, kind, total);
    event["event_type"] = json!("adjustment.updated");
    event["data"]["action"] = json!("refund");
    event["data"]["reason"] = json!("requested");
    event
}

/// A chargeback adjustment of `total` cents of `txn`, as Paddle creates it when a
/// customer's dispute succeeds (approved from the start: no review).
pub(crate) fn chargeback(
    event_id: &str,
    adjustment: &str,
    txn: &str,
    kind: &str,
    total: i64,
) -> Value {
    json!({
        "event_id": event_id, "event_type": "adjustment.created",
        "occurred_at": "2026-11-30T11:00:00.000000Z", "notification_id": "ntf_02",
        "data": {
            "id": adjustment, "action": "chargeback", "status": "approved", "type": kind,
            "transaction_id": txn, "currency_code": "EUR", "reason": "fraudulent",
            "totals": { "subtotal": total.to_string(), "tax": "0", "total": total.to_string() },
        },
    })
}

async fn post(app: &TestApp, body: &str, signature: Option<String>) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url("/v1/webhooks/paddle"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header("paddle-signature", signature);
    }
    request.send().await.unwrap()
}

async fn send_signed(app: &TestApp, event: &Value, secret: &str, ts: i64) -> reqwest::Response {
    let body = event.to_string();
    post(app, &body, Some(sign_paddle(secret, ts, body.as_bytes()))).await
}

pub(crate) async fn send(app: &TestApp, event: &Value) -> Value {
    let answer = send_signed(app, event, PADDLE_NEW, now()).await;
    assert_eq!(answer.status(), 200);
    json(answer).await
}

async fn payment(app: &TestApp, txn: &str) -> Document {
    app.find_stored(
        "payments",
        doc! { "provider": "paddle", "paymentIntentId": txn },
    )
    .await
}

/// Asserts `answer` read the metadata as invalid, its detail naming each of `names`.
fn assert_invalid(answer: &Value, names: &[&str]) {
    assert_eq!(answer["outcome"], "metadata_invalid", "{answer}");
    let detail = answer["detail"].as_str().unwrap_or_default();
    for name in names {
        assert!(detail.contains(name), "{name}: {answer}");
    }
}

async fn nothing_written(app: &TestApp) {
    for collection in ["payments", "webhook_events", "tokens", "issuances"] {
        assert_eq!(app.count(collection, doc! {}).await, 0, "{collection}");
    }
}

#[tokio::test]
async fn a_completed_transaction_issues_its_custom_data_tokens() {
    let app = app().await;
    let receipt = send(&app, &completed("evt_1", "txn_1", 4)).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(receipt["tokensCreated"], 4);
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1, 2, 3]);
    let stored = payment(&app, "txn_1").await;
    assert_eq!(stored.get_str("accountId").unwrap(), "default");
    assert_eq!(stored.get_str("status").unwrap(), "succeeded");
    assert_eq!(stored.get_i64("amount").unwrap(), 1000);
    assert_eq!(
        app.count(
            "webhook_events",
            doc! { "provider": "paddle", "eventId": "evt_1" }
        )
        .await,
        1
    );
}

/// Paddle's webhook simulator signs what its user wrote with the destination's key: a
/// simulated success issues nothing, and a simulated chargeback naming a real
/// transaction takes nothing back.
#[tokio::test]
async fn simulated_events_move_no_tokens() {
    let app = app().await;
    let simulated_success = completed("ntfsimevt_01jd00tmxmnjwedtm67q3rsasd", "txn_sim", 10);
    let receipt = send(&app, &simulated_success).await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count("payments", doc! {}).await, 0);

    assert_eq!(
        send(&app, &completed("evt_real", "txn_real", 4)).await["outcome"],
        "issued"
    );
    // An id of the real kind, sent as a simulation: its notification says so.
    let mut simulated_chargeback = chargeback("evt_cb", "adj_cb", "txn_real", "full", 1000);
    simulated_chargeback["notification_id"] = json!("ntfsimntf_01jd00tn1afm298jhrwvnhqh9a");
    let receipt = send(&app, &simulated_chargeback).await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    assert_eq!(app.active_indexes("txn_real").await, vec![0, 1, 2, 3]);
    let stored = payment(&app, "txn_real").await;
    assert_eq!(stored.get_str("status").unwrap(), "succeeded", "{stored}");
}

/// A refund of the tax alone (Paddle gives back VAT it collected, for a business customer
/// who added a VAT id) leaves what the tokens were sold for standing: no token is taken.
#[tokio::test]
async fn a_refund_of_the_tax_alone_takes_no_token_back() {
    let app = spawn_app_with(&format!(
        "{PADDLE}\n[issuance.token_prices.standard]\nEUR = 100\n"
    ))
    .await;
    let mut paid = completed("evt_tax_paid", "txn_tax", 10);
    paid["data"]["details"]["totals"] =
        json!({ "subtotal": "1000", "tax": "200", "grand_total": "1200" });
    assert_eq!(send(&app, &paid).await["outcome"], "issued");
    let mut tax_back = refund("evt_tax_back", "adj_tax", "txn_tax", "partial", 200);
    tax_back["data"]["totals"] = json!({ "subtotal": "0", "tax": "200", "total": "200" });
    tax_back["data"]["items"] = json!([{ "item_id": "txnitm_1", "type": "tax", "amount": "200" }]);
    let receipt = send(&app, &tax_back).await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    assert_eq!(app.active_indexes("txn_tax").await.len(), 10);
    // A refund of part of what was sold still takes its share.
    let mut part_back = refund("evt_part_back", "adj_part", "txn_tax", "partial", 600);
    part_back["data"]["totals"] = json!({ "subtotal": "500", "tax": "100", "total": "600" });
    send(&app, &part_back).await;
    assert_eq!(app.active_indexes("txn_tax").await.len(), 5);
}

/// A customer can set a checkout's `custom_data` in the browser: with a price per token
/// configured, a transaction issues only what its total pays for, and one naming more
/// issues nothing and says why, as invalid metadata.
#[tokio::test]
async fn a_transaction_issues_only_the_tokens_its_total_pays_for() {
    let app = spawn_app_with(&format!(
        "{PADDLE}\n[issuance.token_prices.standard]\nEUR = 100\n"
    ))
    .await;
    // 1000 cents at 100 a token: ten, not fifty.
    let greedy = send(&app, &completed("evt_greedy", "txn_greedy", 50)).await;
    assert_invalid(&greedy, &["5000 EUR", "1000"]);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
    let stored = payment(&app, "txn_greedy").await;
    assert!(stored.get_str("metadataError").is_ok(), "{stored}");

    let paid = send(&app, &completed("evt_paid", "txn_paid", 10)).await;
    assert_eq!(paid["outcome"], "issued", "{paid}");
    assert_eq!(
        app.active_indexes("txn_paid").await,
        (0..10).collect::<Vec<_>>()
    );
}

/// Where prices are configured, a token type the customer names in `custom_data` that
/// has none issues nothing: otherwise a checkout for the cheapest item (or a free one)
/// could name any type the merchant issues elsewhere, in any quantity.
#[tokio::test]
async fn a_transaction_naming_a_token_type_without_a_price_issues_nothing() {
    let app = spawn_app_with(&format!(
        "{PADDLE}\n[issuance.token_prices.standard]\nEUR = 100\n"
    ))
    .await;
    let mut free = completed("evt_free", "txn_free", 1000);
    free["data"]["custom_data"]["tokenmint_token_type"] = json!("premium");
    free["data"]["details"]["totals"]["grand_total"] = json!("0");
    let answer = send(&app, &free).await;
    assert_invalid(&answer, &["premium"]);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
    let stored = payment(&app, "txn_free").await;
    assert!(stored.get_str("metadataError").is_ok(), "{stored}");
}

/// Prices and packs of the tests below: a token of type `standard` costs 100 cents, and
/// the Paddle price `pri_credits10` sells ten of them; `pri_plan` is a subscription's
/// price that sells none.
const PACKS: &str = "\n[issuance.token_prices.standard]\nEUR = 100\n\n[providers.paddle.token_packs.pri_credits10]\ntoken_type = \"standard\"\nquantity = 10\n";

/// `completed` for `quantity` tokens, the transaction's total `total` and its items
/// `items` (price id, quantity).
fn completed_with_items(
    event_id: &str,
    txn: &str,
    quantity: i64,
    total: i64,
    items: &[(&str, i64)],
) -> Value {
    let mut event = completed(event_id, txn, quantity);
    event["data"]["details"]["totals"]["grand_total"] = json!(total.to_string());
    event["data"]["items"] = items
        .iter()
        .map(|(price, quantity)| {
            json!({ "price": { "id": price, "product_id": "pro_01", "unit_price": { "amount": "1000", "currency_code": "EUR" } },
                "quantity": quantity, "proration": null })
        })
        .collect();
    event
}

/// Paddle copies a checkout's `custom_data` to the subscription it creates, and from there
/// to each renewal; a transaction may also buy other products beside a token pack. Where
/// the provider maps its prices to token packs, a transaction issues only the tokens its
/// items buy, whatever its total covers at the tokens' prices.
#[tokio::test]
async fn a_transaction_issues_only_the_tokens_its_items_buy() {
    let app = spawn_app_with(&format!("{PADDLE}{PACKS}")).await;
    // A renewal of a 1000-cent plan, its custom_data copied from a checkout that named
    // ten tokens: the total would pay for them, the items buy none.
    let mut renewal =
        completed_with_items("evt_renewal", "txn_renewal", 10, 1000, &[("pri_plan", 1)]);
    renewal["data"]["origin"] = json!("subscription_recurring");
    renewal["data"]["subscription_id"] = json!("sub_01");
    let answer = send(&app, &renewal).await;
    assert_invalid(&answer, &["pri_plan", "no whole token pack"]);
    let stored = payment(&app, "txn_renewal").await;
    assert!(stored.get_str("metadataError").is_ok(), "{stored}");

    // One pack and the plan: 3000 cents, and the pack's ten tokens named. Refunds are
    // shares of the whole total, so a refund of the pack alone would take back a third
    // of them: a transaction issues only when all it charges is packs of the type named.
    let mixed = completed_with_items(
        "evt_mixed",
        "txn_mixed",
        10,
        3000,
        &[("pri_credits10", 1), ("pri_plan", 1)],
    );
    assert_invalid(&send(&app, &mixed).await, &["pri_plan"]);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);

    // Two packs buy twenty, and issue them; fewer than bought may be named.
    let packs = completed_with_items("evt_packs", "txn_packs", 20, 2000, &[("pri_credits10", 2)]);
    assert_eq!(send(&app, &packs).await["outcome"], "issued");
    assert_eq!(
        app.active_indexes("txn_packs").await,
        (0..20).collect::<Vec<_>>()
    );
    let fewer = completed_with_items("evt_fewer", "txn_fewer", 5, 1000, &[("pri_credits10", 1)]);
    assert_eq!(send(&app, &fewer).await["outcome"], "issued");
    assert_eq!(app.active_indexes("txn_fewer").await.len(), 5);
    // Bought but not paid for (a total the prices do not cover) is still refused.
    let discounted =
        completed_with_items("evt_cheap", "txn_cheap", 10, 500, &[("pri_credits10", 1)]);
    assert_invalid(&send(&app, &discounted).await, &["1000 EUR", "500"]);
    assert_eq!(app.count("tokens", doc! {}).await, 25);
}

/// Packs of another type in the same transaction would be refunded as shares of the
/// whole total too: a transaction naming one type issues only when all its packs sell
/// that type.
#[tokio::test]
async fn a_transaction_of_packs_of_two_types_issues_nothing() {
    let passes = "\n[issuance.token_prices.pass]\nEUR = 500\n\n[providers.paddle.token_packs.pri_pass]\ntoken_type = \"pass\"\nquantity = 1\n";
    let app = spawn_app_with(&format!("{PADDLE}{PACKS}{passes}")).await;
    let both = completed_with_items(
        "evt_both",
        "txn_both",
        10,
        1500,
        &[("pri_credits10", 1), ("pri_pass", 1)],
    );
    assert_invalid(&send(&app, &both).await, &["pass"]);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let credits = completed_with_items("evt_one", "txn_one", 10, 1000, &[("pri_credits10", 1)]);
    assert_eq!(send(&app, &credits).await["outcome"], "issued");
}

/// A subscription whose own price is a token pack issues its tokens on every renewal:
/// each renewal is a transaction of its own, paid for by its items and its total.
#[tokio::test]
async fn a_subscription_sold_as_a_pack_issues_on_each_renewal() {
    let plan =
        "\n[providers.paddle.token_packs.pri_monthly]\ntoken_type = \"standard\"\nquantity = 10\n";
    let app = spawn_app_with(&format!("{PADDLE}{PACKS}{plan}")).await;
    for txn in ["txn_month1", "txn_month2"] {
        let mut renewal =
            completed_with_items(&format!("evt_{txn}"), txn, 10, 1000, &[("pri_monthly", 1)]);
        renewal["data"]["origin"] = json!("subscription_recurring");
        assert_eq!(send(&app, &renewal).await["outcome"], "issued", "{txn}");
        assert_eq!(app.active_indexes(txn).await.len(), 10, "{txn}");
    }
}

/// A pack is held to the money too: a trial's or a fully discounted transaction's items
/// are bought for nothing, which its type's price refuses. A prorated item (part of a
/// period, a plan changed mid-cycle) buys no pack, and units Paddle reports taken back
/// (a negative quantity) count against what the rest bought.
#[tokio::test]
async fn a_pack_bought_for_less_than_its_tokens_issues_nothing() {
    let app = spawn_app_with(&format!("{PADDLE}{PACKS}")).await;
    let trial = completed_with_items("evt_trial", "txn_trial", 10, 0, &[("pri_credits10", 1)]);
    assert_invalid(&send(&app, &trial).await, &["1000 EUR", "is 0"]);

    let mut upgrade = completed_with_items(
        "evt_upgrade",
        "txn_upgrade",
        10,
        1000,
        &[("pri_credits10", 1)],
    );
    upgrade["data"]["items"][0]["proration"] = json!({ "rate": "0.5", "billing_period": { "starts_at": "2026-11-15T00:00:00Z", "ends_at": "2026-12-01T00:00:00Z" } });
    assert_invalid(
        &send(&app, &upgrade).await,
        &["pri_credits10", "no whole token pack"],
    );

    let mut netted = completed_with_items(
        "evt_net",
        "txn_net",
        20,
        2000,
        &[("pri_credits10", 2), ("pri_credits10", -1)],
    );
    // Taken back for part of a period still counts against what was bought.
    netted["data"]["items"][1]["proration"] = json!({ "rate": "0.5" });
    assert_invalid(&send(&app, &netted).await, &["buy 10", "names 20"]);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
}

/// A declined attempt of `txn_1`, an hour before its success: ten packs, 10000 cents,
/// naming a hundred tokens (all paid for).
fn declined_attempt() -> Value {
    let mut declined = completed_with_items(
        "evt_declined",
        "txn_1",
        100,
        10_000,
        &[("pri_credits10", 10)],
    );
    declined["event_type"] = json!("transaction.payment_failed");
    declined["data"]["status"] = json!("past_due");
    declined["occurred_at"] = json!("2026-11-30T09:00:00.000000Z");
    declined
}

/// The customer's browser can change an open checkout's items and `custom_data` between
/// a declined attempt and the one that pays. Metadata the customer may have written is
/// issued only once a success fixed it, the success being the event checked against it:
/// a declined attempt's stays on the payment unfixed, and neither a success naming none
/// nor a checkout key's matching request issues it, in either order of arrival.
#[tokio::test]
async fn a_declined_attempts_custom_data_is_not_issued_by_the_success() {
    // Prices alone, and prices with packs.
    for pricing in ["\n[issuance.token_prices.standard]\nEUR = 100\n", PACKS] {
        for declined_first in [true, false] {
            let app = spawn_app_with(&format!("{PADDLE}{pricing}")).await;
            let declined = declined_attempt();
            // Paid: one pack, 1000 cents, its custom_data replaced by one without ours.
            let mut paid =
                completed_with_items("evt_paid", "txn_1", 1, 1000, &[("pri_credits10", 1)]);
            paid["data"]["custom_data"] = json!({ "x": 1 });
            let (first, second) = if declined_first {
                (&declined, &paid)
            } else {
                (&paid, &declined)
            };
            send(&app, first).await;
            let answer = send(&app, second).await;
            let case = format!("{pricing:?}, declined first {declined_first}: {answer}");
            assert_ne!(answer["outcome"], "issued", "{case}");
            let checkout = app.issue(REQUEST_KEY, &declined_params("txn_1")).await;
            assert_eq!(checkout.status(), 409, "{case}");
            assert_eq!(app.count("tokens", doc! {}).await, 0, "{case}");
            assert_eq!(app.count_records(doc! {}).await, 0, "{case}");
            let stored = payment(&app, "txn_1").await;
            assert_eq!(stored.get_str("status").unwrap(), "succeeded", "{case}");
            assert!(
                stored.get_str("tokenParamsFixedBy").is_err(),
                "{case}: {stored}"
            );
        }
    }
}

/// A success delivered after a chargeback, its declined attempt's parameters and amount
/// (or its metadata error) already on the payment: the success is the first to name
/// valid ones, so it fixes its own, with its amount (the chargeback's share is of what
/// was paid), and the chargeback reversed issues them all.
#[tokio::test]
async fn a_late_success_fixes_its_own_parameters_over_a_declined_attempts() {
    for declined_type in ["standard", "unpriced"] {
        let app = spawn_app_with(&format!("{PADDLE}{PACKS}")).await;
        let mut declined = declined_attempt();
        declined["data"]["custom_data"]["tokenmint_token_type"] = json!(declined_type);
        send(&app, &declined).await;
        let chargeback = chargeback("evt_cb", "adj_cb", "txn_1", "full", 1000);
        send(&app, &chargeback).await;
        let money_version = |stored: &Document| stored.get_i64("moneyVersion").unwrap_or(0);
        let before = money_version(&payment(&app, "txn_1").await);
        let paid = completed_with_items("evt_paid", "txn_1", 10, 1000, &[("pri_credits10", 1)]);
        send(&app, &paid).await;
        let stored = payment(&app, "txn_1").await;
        assert!(
            money_version(&stored) > before,
            "a changed amount is a change of the money: {stored}"
        );
        let case = format!("declined {declined_type}: {stored}");
        assert_eq!(
            stored.get_str("tokenParamsFixedBy").ok(),
            Some("evt_paid"),
            "{case}"
        );
        assert_eq!(
            stored.get_i64("amount").ok(),
            Some(1000),
            "the success's: {case}"
        );
        let mut reverse = chargeback;
        reverse["event_id"] = json!("evt_reverse");
        reverse["occurred_at"] = json!("2026-11-30T12:00:00.000000Z");
        reverse["data"]["id"] = json!("adj_reverse");
        reverse["data"]["action"] = json!("chargeback_reverse");
        let answer = send(&app, &reverse).await;
        assert_eq!(
            app.active_indexes("txn_1").await.len(),
            10,
            "{case}: {answer}"
        );
        assert_eq!(app.count("tokens", doc! {}).await, 10, "{case}");
    }
}

/// The checkout key's request for what the declined attempt named: a hundred tokens.
fn declined_params(txn: &str) -> Value {
    json!({ "provider": "paddle", "accountId": "default", "paymentIntentId": txn,
        "owner": OWNER, "tokenType": "standard", "quantity": 100 })
}

#[tokio::test]
async fn forged_tampered_stale_and_unsigned_deliveries_write_nothing() {
    let app = app().await;
    let event = completed("evt_1", "txn_1", 4);
    let body = event.to_string();
    let signature = sign_paddle(PADDLE_NEW, now(), body.as_bytes());
    let tampered = body.replace("\"4\"", "\"40\"");
    assert_problem(
        post(&app, &tampered, Some(signature)).await,
        401,
        "signature_invalid",
    )
    .await;
    let other = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms9_notTheConfiguredOne";
    assert_problem(
        send_signed(&app, &event, other, now()).await,
        401,
        "signature_invalid",
    )
    .await;
    // An hour away, far outside the configured 60 s either way.
    for ts in [now() - 3600, now() + 3600] {
        let answer = send_signed(&app, &event, PADDLE_NEW, ts).await;
        assert_problem(answer, 401, "signature_timestamp_out_of_tolerance").await;
    }
    assert_problem(post(&app, &body, None).await, 401, "signature_missing").await;
    nothing_written(&app).await;
}

#[tokio::test]
async fn both_secrets_of_a_rotation_are_accepted() {
    let app = app().await;
    let old = send_signed(&app, &completed("evt_1", "txn_1", 1), PADDLE_OLD, now()).await;
    assert_eq!(old.status(), 200);
    let new = send_signed(&app, &completed("evt_2", "txn_2", 1), PADDLE_NEW, now()).await;
    assert_eq!(new.status(), 200);
    assert_eq!(app.active_indexes("txn_1").await, vec![0]);
    assert_eq!(app.active_indexes("txn_2").await, vec![0]);
}

#[tokio::test]
async fn a_duplicate_delivery_changes_nothing() {
    let app = app().await;
    let event = completed("evt_1", "txn_1", 3);
    send(&app, &event).await;
    let again = send(&app, &event).await;
    assert_eq!(
        (again["duplicate"].as_bool(), again["outcome"].as_str()),
        (Some(true), Some("duplicate"))
    );
    assert_eq!(app.tokens_of("txn_1").await.len(), 3);
    assert_eq!(app.count("webhook_events", doc! {}).await, 1);
}

#[tokio::test]
async fn a_full_refund_before_the_completion_leaves_no_active_token() {
    let app = app().await;
    send(&app, &refund("evt_r", "adj_1", "txn_1", "full", 1000)).await;
    let late = send(&app, &completed("evt_1", "txn_1", 4)).await;
    assert_ne!(late["outcome"], "issued", "{late}");
    assert!(app.active_indexes("txn_1").await.is_empty());
    assert_eq!(
        payment(&app, "txn_1").await.get_str("status").unwrap(),
        "refunded"
    );
}

#[tokio::test]
async fn a_partial_refund_before_the_completion_is_honoured_when_it_arrives() {
    let app = app().await;
    send(&app, &refund("evt_r", "adj_1", "txn_1", "partial", 250)).await;
    send(&app, &completed("evt_1", "txn_1", 4)).await;
    // floor(4 × 250 ÷ 1000) = 1: the highest tokenIndex goes.
    assert_eq!(
        app.token_states("txn_1").await,
        vec![
            (0, "active".to_owned()),
            (1, "active".to_owned()),
            (2, "active".to_owned()),
            (3, "revoked".to_owned())
        ]
    );
}

#[tokio::test]
async fn partial_refunds_add_up_and_a_replayed_one_counts_once() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 10)).await;
    let first = send(&app, &refund("evt_r1", "adj_1", "txn_1", "partial", 250)).await;
    assert_eq!(first["tokensRevoked"], 2, "{first}");
    assert_eq!(
        app.active_indexes("txn_1").await,
        (0..8).collect::<Vec<_>>()
    );
    let second = send(&app, &refund("evt_r2", "adj_2", "txn_1", "partial", 100)).await;
    assert_eq!(
        second["tokensRevoked"], 1,
        "350 of 1000: 3 in all: {second}"
    );
    assert_eq!(
        app.active_indexes("txn_1").await,
        (0..7).collect::<Vec<_>>()
    );

    // The same adjustment again under another event id (adjustment.created after
    // .updated), and a crash replay (the event not yet recorded as seen).
    let mut again = refund("evt_r3", "adj_1", "txn_1", "partial", 250);
    again["event_type"] = json!("adjustment.created");
    send(&app, &again).await;
    app.db
        .collection::<Document>("webhook_events")
        .delete_one(doc! { "eventId": "evt_r2" })
        .await
        .unwrap();
    let replayed = send(&app, &refund("evt_r2", "adj_2", "txn_1", "partial", 100)).await;
    assert_eq!(replayed["duplicate"], false);
    assert_eq!(
        app.active_indexes("txn_1").await,
        (0..7).collect::<Vec<_>>()
    );
    let stored = payment(&app, "txn_1").await;
    assert_eq!(stored.get_i64("amountRefunded").unwrap(), 350);
    assert_eq!(stored.get_array("refunds").unwrap().len(), 2);
    assert_eq!(stored.get_str("status").unwrap(), "succeeded");
}

#[tokio::test]
async fn a_refund_pending_approval_changes_nothing() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 2)).await;
    let mut pending = refund("evt_r", "adj_1", "txn_1", "full", 1000);
    pending["data"]["status"] = json!("pending_approval");
    let receipt = send(&app, &pending).await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1]);
}

/// The payment's status, refunded total and number of refunds, as stored.
async fn refunds_of(app: &TestApp, txn: &str) -> (String, i64, usize) {
    let stored = payment(app, txn).await;
    (
        stored.get_str("status").unwrap().to_owned(),
        stored.get_i64("amountRefunded").unwrap(),
        stored.get_array("refunds").unwrap().len(),
    )
}

/// Whether every token of `payment` is revoked.
async fn all_revoked(app: &TestApp, payment: &str) -> bool {
    app.token_states(payment)
        .await
        .iter()
        .all(|(_, status)| status == "revoked")
}

#[tokio::test]
async fn a_full_chargeback_revokes_every_token_and_refunds_the_payment() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 4)).await;
    let receipt = send(&app, &chargeback("evt_cb", "adj_cb", "txn_1", "full", 1000)).await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 4, "{receipt}");
    assert!(all_revoked(&app, "txn_1").await);
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("refunded".to_owned(), 1000, 1)
    );
}

#[tokio::test]
async fn a_partial_chargeback_revokes_its_share_and_counts_once() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 4)).await;
    let receipt = send(
        &app,
        &chargeback("evt_cb", "adj_cb", "txn_1", "partial", 600),
    )
    .await;
    // floor(4 × 600 ÷ 1000) = 2: the highest tokenIndexes go.
    assert_eq!(receipt["tokensRevoked"], 2, "{receipt}");
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1]);
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("succeeded".to_owned(), 600, 1)
    );
    // Redelivered as it was, and reported again under another event id.
    let again = send(
        &app,
        &chargeback("evt_cb", "adj_cb", "txn_1", "partial", 600),
    )
    .await;
    assert_eq!(again["outcome"], "duplicate", "{again}");
    let mut other = chargeback("evt_cb2", "adj_cb", "txn_1", "partial", 600);
    other["event_type"] = json!("adjustment.updated");
    send(&app, &other).await;
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1]);
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("succeeded".to_owned(), 600, 1)
    );
    // A refund of the rest adds up to the total with it: the payment is refunded.
    send(&app, &refund("evt_r", "adj_r", "txn_1", "partial", 400)).await;
    assert!(app.active_indexes("txn_1").await.is_empty());
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("refunded".to_owned(), 1000, 2)
    );
}

#[tokio::test]
async fn partial_refunds_adding_up_to_the_total_refund_the_payment() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 4)).await;
    let first = send(&app, &refund("evt_r1", "adj_1", "txn_1", "partial", 500)).await;
    assert_eq!(first["tokensRevoked"], 2, "{first}");
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("succeeded".to_owned(), 500, 1)
    );
    let second = send(&app, &refund("evt_r2", "adj_2", "txn_1", "partial", 500)).await;
    assert_eq!(second["outcome"], "revoked", "{second}");
    assert_eq!(second["tokensRevoked"], 2, "{second}");
    assert!(all_revoked(&app, "txn_1").await);
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("refunded".to_owned(), 1000, 2)
    );
    // The first half reported again under another event id still counts once.
    let mut again = refund("evt_r3", "adj_1", "txn_1", "partial", 500);
    again["event_type"] = json!("adjustment.created");
    send(&app, &again).await;
    assert_eq!(
        refunds_of(&app, "txn_1").await,
        ("refunded".to_owned(), 1000, 2)
    );
}

#[tokio::test]
async fn a_chargeback_warning_is_ignored_with_its_reason() {
    let app = app().await;
    send(&app, &completed("evt_1", "txn_1", 2)).await;
    let mut warning = chargeback("evt_w", "adj_w", "txn_1", "full", 1000);
    warning["data"]["action"] = json!("chargeback_warning");
    let receipt = send(&app, &warning).await;
    assert_eq!(receipt["outcome"], "ignored", "{receipt}");
    let recorded = app
        .find_stored("webhook_events", doc! { "eventId": "evt_w" })
        .await;
    assert!(
        recorded.get_str("outcome").unwrap() == "ignored"
            && recorded
                .get_str("detail")
                .unwrap()
                .contains("chargeback warning"),
        "{recorded}"
    );
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1]);
    let stored = payment(&app, "txn_1").await;
    assert_eq!(stored.get_str("status").unwrap(), "succeeded");
    assert!(stored.get("refunds").is_none(), "{stored}");
}

#[test]
fn a_secret_not_shaped_like_paddles_stops_the_start_naming_the_provider_only() {
    let leaked = "whsec_Sup3rS3cretValueThatMustNeverBePrinted";
    let config = format!(
        "[providers.billing]\nscheme = \"paddle\"\nsecrets = [\"{PADDLE_NEW}\", \"{leaked}\"]"
    );
    let settings = tokenmint::settings::Settings::with_overrides(&[&config]).unwrap();
    let Err(err) = tokenmint::webhooks::Providers::from_settings(&settings.providers) else {
        panic!("the providers were built");
    };
    let err = err.to_string();
    assert!(
        err.contains("providers.billing.secrets[1]") && err.contains("pdl_ntfset_"),
        "{err}"
    );
    assert!(!err.contains("Sup3r"), "{err}");
}
