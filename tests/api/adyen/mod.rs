//! The `adyen` scheme end to end: batches of standard notifications, each item signed
//! on its own (`additionalData.hmacSignature`), applied item by item and answered
//! `[accepted]`; a batch with one bad item is refused whole. Also [`basic_auth`] (the
//! HTTP Basic credentials checked before the signatures) and [`replays`] (signed items
//! sent again with their unsigned fields changed).

mod basic_auth;
mod replays;

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tokenmint::webhooks::adyen::sign_adyen;

use crate::helpers::*;

/// Two HMAC keys (a rotation) in the hex form Adyen's Customer Area shows.
pub const ADYEN_OLD: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
pub const ADYEN_NEW: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

pub const ADYEN: &str = r#"
[providers.adyen]
scheme = "adyen"
secrets = ["44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056", "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00"]
"#;

const MERCHANT: &str = "TestMerchant";

/// An AUTHORISATION of 1000 cents buying `quantity` tokens, shaped as in Adyen's
/// documentation, with the token parameters as `metadata.*` additional data.
pub fn authorisation(psp: &str, quantity: i64) -> Value {
    json!({
        "eventCode": "AUTHORISATION", "success": "true", "pspReference": psp,
        "merchantAccountCode": MERCHANT, "merchantReference": format!("order-{psp}"),
        "amount": { "value": 1000, "currency": "EUR" },
        "eventDate": "2026-11-30T10:00:00+01:00", "paymentMethod": "visa", "operations": ["CANCEL", "CAPTURE", "REFUND"],
        "reason": "033899:1111:03/2030",
        "additionalData": {
            "metadata.tokenmint_owner": OWNER,
            "metadata.tokenmint_token_type": "standard",
            "metadata.tokenmint_quantity": quantity.to_string(),
        },
    })
}

/// An item `code` (REFUND, CHARGEBACK, CANCELLATION…) of `value` cents against `original`.
pub fn modification(code: &str, psp: &str, original: &str, value: i64) -> Value {
    json!({
        "eventCode": code, "success": "true", "pspReference": psp,
        "originalReference": original, "merchantAccountCode": MERCHANT,
        "merchantReference": format!("order-{original}"),
        "amount": { "value": value, "currency": "EUR" },
        "eventDate": "2026-11-30T12:00:00+01:00",
    })
}

/// A batch of `items`, signed with `key`.
pub fn signed_batch(items: &[Value], key: &str) -> Vec<u8> {
    let items: Vec<Value> = items
        .iter()
        .map(|item| json!({ "NotificationRequestItem": item }))
        .collect();
    let batch = json!({ "live": "false", "notificationItems": items });
    sign_adyen(key, batch.to_string().as_bytes()).unwrap()
}

pub async fn post_batch(app: &TestApp, body: Vec<u8>) -> reqwest::Response {
    app.http
        .post(app.url("/v1/webhooks/adyen"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Sends `items` signed with the current key; asserts Adyen's `[accepted]`.
pub async fn send(app: &TestApp, items: &[Value]) {
    let answer = post_batch(app, signed_batch(items, ADYEN_NEW)).await;
    assert_eq!(answer.status(), 200);
    assert!(
        answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(answer.text().await.unwrap(), "[accepted]");
}

async fn payment(app: &TestApp, psp: &str) -> Document {
    app.find_stored(
        "payments",
        doc! { "provider": "adyen", "paymentIntentId": psp },
    )
    .await
}

#[tokio::test]
async fn a_batch_of_several_items_is_applied_item_by_item() {
    let app = spawn_app_with(ADYEN).await;
    send(
        &app,
        &[
            authorisation("PSP_A", 2),
            authorisation("PSP_B", 3),
            modification("CANCELLATION", "PSP_C", "PSP_B", 1000),
            json!({ "eventCode": "REPORT_AVAILABLE", "success": "true", "pspReference": "PSP_R",
                "merchantAccountCode": MERCHANT, "eventDate": "2026-11-30T10:00:00Z" }),
        ],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1]);
    assert!(app.active_indexes("PSP_B").await.is_empty(), "canceled");
    assert_eq!(app.tokens_of("PSP_B").await.len(), 3);
    assert_eq!(
        payment(&app, "PSP_A").await.get_str("accountId").unwrap(),
        MERCHANT
    );
    let events = app
        .count("webhook_events", doc! { "provider": "adyen" })
        .await;
    assert_eq!(events, 4, "each item is its own event");
    assert_eq!(
        app.count(
            "webhook_events",
            doc! { "eventId": "AUTHORISATION:PSP_A:true" }
        )
        .await,
        1
    );
}

#[tokio::test]
async fn one_bad_item_refuses_the_whole_batch() {
    let app = spawn_app_with(ADYEN).await;
    let body = signed_batch(
        &[authorisation("PSP_A", 2), authorisation("PSP_B", 2)],
        ADYEN_NEW,
    );
    // The second item's amount changed after signing: its signature no longer holds.
    let mut batch: Value = serde_json::from_slice(&body).unwrap();
    batch["notificationItems"][1]["NotificationRequestItem"]["amount"]["value"] = json!(1);
    let answer = post_batch(&app, batch.to_string().into_bytes()).await;
    assert_problem(answer, 401, "signature_invalid").await;
    let wrong_key = signed_batch(&[authorisation("PSP_A", 2)], &"ab".repeat(32));
    assert_problem(post_batch(&app, wrong_key).await, 401, "signature_invalid").await;
    let mut unsigned: Value = serde_json::from_slice(&body).unwrap();
    unsigned["notificationItems"][0]["NotificationRequestItem"]["additionalData"]
        .as_object_mut()
        .unwrap()
        .remove("hmacSignature");
    let answer = post_batch(&app, unsigned.to_string().into_bytes()).await;
    assert_problem(answer, 401, "signature_missing").await;
    for collection in ["payments", "webhook_events", "tokens", "issuances"] {
        assert_eq!(app.count(collection, doc! {}).await, 0, "{collection}");
    }
}

#[tokio::test]
async fn both_keys_of_a_rotation_are_accepted() {
    let app = spawn_app_with(ADYEN).await;
    for (key, psp) in [(ADYEN_OLD, "PSP_A"), (ADYEN_NEW, "PSP_B")] {
        let answer = post_batch(&app, signed_batch(&[authorisation(psp, 1)], key)).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(app.active_indexes(psp).await, vec![0]);
    }
}

#[tokio::test]
async fn a_redelivered_batch_changes_nothing() {
    let app = spawn_app_with(ADYEN).await;
    let items = [
        authorisation("PSP_A", 2),
        modification("REFUND", "REF_1", "PSP_A", 500),
    ];
    send(&app, &items).await;
    let tokens = app.token_states("PSP_A").await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0]);
    send(&app, &items).await;
    assert_eq!(app.token_states("PSP_A").await, tokens);
    assert_eq!(app.count("webhook_events", doc! {}).await, 2);
    assert_eq!(
        payment(&app, "PSP_A")
            .await
            .get_i64("amountRefunded")
            .unwrap(),
        500
    );
}

#[tokio::test]
async fn a_refund_before_the_authorisation_is_whole_until_the_amount_is_known() {
    let app = spawn_app_with(ADYEN).await;
    // A quarter of the payment, but the payment's amount is not known yet: the share
    // cannot be computed, so the refund is read as whole (the documented choice)...
    send(&app, &[modification("REFUND", "REF_1", "PSP_A", 250)]).await;
    assert_eq!(
        payment(&app, "PSP_A").await.get_str("status").unwrap(),
        "refunded"
    );
    // ...until the authorisation names the amount: then the money decides, and a
    // quarter of 1000 takes floor(3 × 0.25) = 0 of the 3 tokens.
    send(&app, &[authorisation("PSP_A", 3)]).await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1, 2]);
    assert_eq!(
        payment(&app, "PSP_A").await.get_str("status").unwrap(),
        "succeeded"
    );
    // A second refund of the rest withdraws it whole again.
    send(&app, &[modification("REFUND", "REF_2", "PSP_A", 750)]).await;
    assert!(app.active_indexes("PSP_A").await.is_empty());
    assert_eq!(
        payment(&app, "PSP_A").await.get_str("status").unwrap(),
        "refunded"
    );
}

#[tokio::test]
async fn partial_refunds_add_up_and_a_replayed_one_counts_once() {
    let app = spawn_app_with(ADYEN).await;
    send(&app, &[authorisation("PSP_A", 10)]).await;
    send(&app, &[modification("REFUND", "REF_1", "PSP_A", 250)]).await;
    // floor(10 × 250 ÷ 1000) = 2, highest tokenIndex first.
    assert_eq!(
        app.active_indexes("PSP_A").await,
        (0..8).collect::<Vec<_>>()
    );
    send(&app, &[modification("REFUND", "REF_2", "PSP_A", 100)]).await;
    assert_eq!(
        app.active_indexes("PSP_A").await,
        (0..7).collect::<Vec<_>>()
    );
    // A crash between the effects and recording the event: Adyen sends it again.
    app.db
        .collection::<Document>("webhook_events")
        .delete_one(doc! { "eventId": "REFUND:REF_2:true" })
        .await
        .unwrap();
    send(&app, &[modification("REFUND", "REF_2", "PSP_A", 100)]).await;
    assert_eq!(
        app.active_indexes("PSP_A").await,
        (0..7).collect::<Vec<_>>()
    );
    let stored = payment(&app, "PSP_A").await;
    assert_eq!(stored.get_i64("amountRefunded").unwrap(), 350);
    assert_eq!(stored.get_str("status").unwrap(), "succeeded");
    // The rest refunded: everything goes, and the payment is refunded.
    send(&app, &[modification("REFUND", "REF_3", "PSP_A", 650)]).await;
    assert!(app.active_indexes("PSP_A").await.is_empty());
    assert_eq!(
        payment(&app, "PSP_A").await.get_str("status").unwrap(),
        "refunded"
    );
}

#[test]
fn a_key_that_is_not_hex_of_the_right_size_stops_the_start_naming_the_provider_only() {
    for leaked in ["Sup3rS3cretValueThatMustNeverBePrinted", "ABCDEF0123"] {
        let config = format!("[providers.adyen]\nscheme = \"adyen\"\nsecrets = [\"{leaked}\"]");
        let settings = tokenmint::settings::Settings::with_overrides(&[&config]).unwrap();
        let Err(err) = tokenmint::webhooks::Providers::from_settings(&settings.providers) else {
            panic!("the providers were built");
        };
        let err = err.to_string();
        assert!(
            err.contains("providers.adyen.secrets[0]") && err.contains("hex"),
            "{err}"
        );
        assert!(!err.contains(leaked), "{err}");
    }
}
