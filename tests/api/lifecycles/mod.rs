//! Payment lifecycles as teams run them: [`livemode`] (live and test events on one
//! endpoint), [`accounts`] (whose events count on an endpoint many accounts share), [`stripe_checkout`] (Checkout Sessions beside PaymentIntents),
//! [`stripe_capture`], [`adyen_capture`] and [`adyen_partial_capture`] (manual capture). The bodies follow the providers' documented
//! example payloads, trimmed to the fields tokenmint reads plus a few it must ignore.

mod accounts;
mod adyen_capture;
mod adyen_partial_capture;
mod livemode;
mod stripe_capture;
mod stripe_checkout;

use mongodb::bson::doc;
use serde_json::{Value, json};

use crate::adyen::{ADYEN, modification};
use crate::helpers::*;

/// The Adyen provider under manual capture: the CAPTURE is the success.
pub fn adyen_manual() -> String {
    format!("{ADYEN}capture = \"manual\"\n")
}

/// An Adyen `CAPTURE` of `value` cents, `psp`, of the payment `original`, at `date`.
pub fn adyen_capture(psp: &str, original: &str, value: i64, date: &str) -> Value {
    let mut item = modification("CAPTURE", psp, original, value);
    item["eventDate"] = json!(date);
    item
}

/// Nothing of any payment was written: what an ignored event must leave.
pub async fn nothing_written(app: &TestApp) {
    for collection in ["payments", "issuances", "tokens"] {
        assert_eq!(app.count(collection, doc! {}).await, 0, "{collection}");
    }
}

/// The `webhook_events` record of `event_id`: (outcome, detail).
pub async fn recorded(app: &TestApp, event_id: &str) -> (String, Option<String>) {
    let record = app
        .find_stored("webhook_events", doc! { "eventId": event_id })
        .await;
    (
        record.get_str("outcome").unwrap().to_owned(),
        record.get_str("detail").ok().map(str::to_owned),
    )
}

/// The receipt's (outcome, detail).
pub fn receipt_outcome(receipt: &Value) -> (String, Option<String>) {
    (
        receipt["outcome"].as_str().unwrap_or_default().to_owned(),
        receipt["detail"].as_str().map(str::to_owned),
    )
}
