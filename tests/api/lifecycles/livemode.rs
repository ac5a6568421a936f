//! `providers.<name>.livemode`: Stripe's event `livemode` and an Adyen batch's `live`
//! are checked against the provider's mode. An event of the other mode (or one that does
//! not say) is answered 200, recorded `ignored` with `detail: "livemode_mismatch"`, and
//! writes nothing of the payment; unset (outside production) both modes count.

use mongodb::bson::doc;
use serde_json::{Value, json};
use tokenmint::webhooks::adyen::sign_adyen;

use super::{nothing_written, receipt_outcome, recorded};
use crate::adyen::{self, ADYEN_NEW, authorisation};
use crate::helpers::*;
use crate::provider_events::*;

fn stripe_with(livemode: &str) -> String {
    format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_NEW}\"]\n{livemode}\n")
}

/// A succeeded PaymentIntent event for 2 tokens, marked `livemode` (or not at all).
fn succeeded(event_id: &str, payment: &str, livemode: Option<bool>) -> Value {
    let mut event = intent_event(event_id, "succeeded", payment, now(), "2");
    if let Some(live) = livemode {
        event["livemode"] = json!(live);
        event["data"]["object"]["livemode"] = json!(live);
    }
    event
}

const MISMATCH: (&str, Option<&str>) = ("ignored", Some("livemode_mismatch"));

async fn assert_ignored(app: &TestApp, event: &Value) {
    let receipt = json(deliver_stripe(app, event).await).await;
    let (outcome, detail) = receipt_outcome(&receipt);
    assert_eq!((outcome.as_str(), detail.as_deref()), MISMATCH, "{receipt}");
    let id = event["id"].as_str().unwrap();
    let (outcome, detail) = recorded(app, id).await;
    assert_eq!((outcome.as_str(), detail.as_deref()), MISMATCH);
}

#[tokio::test]
async fn a_live_stripe_endpoint_ignores_test_events_and_unmarked_ones() {
    let app = spawn_app_with(&stripe_with("livemode = true")).await;
    assert_ignored(&app, &succeeded("evt_test", "pi_test", Some(false))).await;
    assert_ignored(&app, &succeeded("evt_unmarked", "pi_unmarked", None)).await;
    nothing_written(&app).await;
    // The same payment reported live is issued: the ignored events fixed nothing.
    let live = succeeded("evt_live", "pi_test", Some(true));
    let receipt = json(deliver_stripe(&app, &live).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(app.token_indexes("pi_test").await, vec![0, 1]);
    // A withdrawal of the other mode takes nothing back.
    let mut refund = refund_event("evt_refund_test", "pi_test", now());
    refund["livemode"] = json!(false);
    let receipt = json(deliver_stripe(&app, &refund).await).await;
    assert_eq!(receipt["detail"], "livemode_mismatch", "{receipt}");
    assert_eq!(
        app.token_states("pi_test").await,
        vec![(0, "active".to_owned()), (1, "active".to_owned())]
    );
    assert_eq!(payment_status(&app, "pi_test").await.0, "succeeded");
}

/// A signed event of the other mode is ignored before it is read any further: a body
/// this mode could not parse is still only the other mode's, not a malformed delivery.
#[tokio::test]
async fn an_event_of_the_other_mode_is_ignored_even_when_it_does_not_parse() {
    let app = spawn_app_with(&stripe_with("livemode = true")).await;
    let event = json!({ "id": "evt_odd", "type": "payment_intent.succeeded", "created": -1,
        "livemode": false, "data": { "object": {} } });
    assert_ignored(&app, &event).await;
    nothing_written(&app).await;
}

#[tokio::test]
async fn a_test_stripe_endpoint_ignores_live_events() {
    let app = spawn_app_with(&stripe_with("livemode = false")).await;
    assert_ignored(&app, &succeeded("evt_live", "pi_live", Some(true))).await;
    nothing_written(&app).await;
    let test = succeeded("evt_test", "pi_test", Some(false));
    assert_eq!(
        json(deliver_stripe(&app, &test).await).await["outcome"],
        "issued"
    );
    assert_eq!(app.token_indexes("pi_test").await, vec![0, 1]);
}

#[tokio::test]
async fn unset_outside_production_both_modes_count() {
    let app = spawn_app_with(&stripe_with("")).await;
    for (id, payment, live) in [("evt_l", "pi_l", true), ("evt_t", "pi_t", false)] {
        let receipt = json(deliver_stripe(&app, &succeeded(id, payment, Some(live))).await).await;
        assert_eq!(receipt["outcome"], "issued", "{receipt}");
        assert_eq!(app.token_indexes(payment).await, vec![0, 1]);
    }
}

/// A batch of `items` marked `live`, signed with the current key.
fn adyen_batch(items: &[Value], live: &str) -> Vec<u8> {
    let items: Vec<Value> = items
        .iter()
        .map(|item| json!({ "NotificationRequestItem": item }))
        .collect();
    let batch = json!({ "live": live, "notificationItems": items });
    sign_adyen(ADYEN_NEW, batch.to_string().as_bytes()).unwrap()
}

#[tokio::test]
async fn a_live_adyen_endpoint_ignores_every_item_of_a_test_batch() {
    let app = spawn_app_with(&format!("{}livemode = true\n", adyen::ADYEN)).await;
    let items = [authorisation("PSP_A", 2), authorisation("PSP_B", 1)];
    let answer = adyen::post_batch(&app, adyen_batch(&items, "false")).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "[accepted]");
    nothing_written(&app).await;
    for id in ["AUTHORISATION:PSP_A:true", "AUTHORISATION:PSP_B:true"] {
        let (outcome, detail) = recorded(&app, id).await;
        assert_eq!((outcome.as_str(), detail.as_deref()), MISMATCH, "{id}");
    }
    let live = [authorisation("PSP_C", 2)];
    let answer = adyen::post_batch(&app, adyen_batch(&live, "true")).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(app.active_indexes("PSP_C").await, vec![0, 1]);
}

/// Adyen signs no `live`: a copy of a genuine live withdrawal or reversal flipped to
/// `"false"` (by anyone who saw the delivery, sent before Adyen's own retry of it) is
/// ignored apart from the item's own id, and the genuine item that follows is applied,
/// not a duplicate. A test success ignored keeps its own id: its copy flipped to `"true"`
/// is a duplicate.
#[tokio::test]
async fn an_adyen_item_copied_with_live_flipped_does_not_stand_for_the_genuine_one() {
    let app = spawn_app_with(&format!("{}livemode = true\n", adyen::ADYEN)).await;
    let answer = adyen::post_batch(&app, adyen_batch(&[authorisation("PSP_L", 2)], "true")).await;
    assert_eq!(answer.status(), 200);
    let refund = adyen_batch(
        &[adyen::modification("REFUND", "REF_L", "PSP_L", 1000)],
        "true",
    );
    let mut flipped: Value = serde_json::from_slice(&refund).unwrap();
    flipped["live"] = json!("false");
    let answer = adyen::post_batch(&app, flipped.to_string().into_bytes()).await;
    assert_eq!(
        answer.status(),
        200,
        "the signatures hold: live is not signed"
    );
    assert_eq!(app.active_indexes("PSP_L").await, vec![0, 1]);

    let answer = adyen::post_batch(&app, refund).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(app.active_indexes("PSP_L").await, Vec::<i64>::new());
    assert_eq!(payment_status(&app, "PSP_L").await.0, "refunded");
    assert_eq!(recorded(&app, "REFUND:REF_L:true").await.0, "revoked");
    let (outcome, detail) = recorded(&app, "REFUND:REF_L:true#live").await;
    assert_eq!((outcome.as_str(), detail.as_deref()), MISMATCH);

    let live = |items: &[Value]| adyen_batch(items, "true");
    adyen::post_batch(&app, live(&[authorisation("PSP_V", 2)])).await;
    let chargeback = adyen::modification("CHARGEBACK", "CB_V", "PSP_V", 1000);
    adyen::post_batch(&app, live(&[chargeback])).await;
    assert_eq!(app.active_indexes("PSP_V").await, Vec::<i64>::new());
    let reversed = live(&[adyen::modification(
        "CHARGEBACK_REVERSED",
        "CB_V",
        "PSP_V",
        1000,
    )]);
    let mut flipped: Value = serde_json::from_slice(&reversed).unwrap();
    flipped["live"] = json!("false");
    adyen::post_batch(&app, flipped.to_string().into_bytes()).await;
    assert_eq!(app.active_indexes("PSP_V").await, Vec::<i64>::new());
    adyen::post_batch(&app, reversed).await;
    assert_eq!(app.active_indexes("PSP_V").await, vec![0, 1]);

    let test_payment = adyen_batch(&[authorisation("PSP_T", 2)], "false");
    assert_eq!(
        adyen::post_batch(&app, test_payment.clone()).await.status(),
        200
    );
    let mut flipped: Value = serde_json::from_slice(&test_payment).unwrap();
    flipped["live"] = json!("true");
    let answer = adyen::post_batch(&app, flipped.to_string().into_bytes()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "PSP_T" })
            .await,
        0
    );
    let (outcome, detail) = recorded(&app, "AUTHORISATION:PSP_T:true").await;
    assert_eq!((outcome.as_str(), detail.as_deref()), MISMATCH);
}

#[test]
fn livemode_is_refused_for_schemes_whose_events_do_not_say() {
    let config = format!(
        "[providers.acme]\nscheme = \"standard-webhooks\"\nsecrets = [\"{ACME_SECRET}\"]\nlivemode = true\n"
    );
    let err = tokenmint::settings::Settings::with_overrides(&[&config])
        .unwrap_err()
        .to_string();
    assert!(err.contains("providers.acme.livemode"), "{err}");
}
