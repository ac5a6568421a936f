//! `tokenmint webhooks sign`: what it prints is accepted by a running service, for every
//! scheme (headers for `curl -H @FILE`; for Adyen, the signed batch as the body).

use serde_json::{Value, json};
use tokenmint::cli::sign_webhook;

use crate::adyen::{ADYEN, authorisation};
use crate::helpers::*;
use crate::paddle::PADDLE;
use crate::provider_events::{PROVIDERS, acme_event, intent_event, now};

/// Posts what `webhooks sign` printed for `body` to provider `name`; returns the answer.
async fn post_signed(app: &TestApp, extra: &str, name: &str, body: &[u8]) -> reqwest::Response {
    let settings = test_settings(&app.db_name, extra);
    let printed = sign_webhook(&settings, name, body, None).unwrap();
    let mut request = app.http.post(app.url(&format!("/v1/webhooks/{name}")));
    let body = if name == "adyen" {
        request = request.header("content-type", "application/json");
        printed.into_bytes()
    } else {
        for line in printed.lines() {
            let (header, value) = line.split_once(": ").expect("`Name: value` lines");
            request = request.header(header, value);
        }
        body.to_vec()
    };
    request.body(body).send().await.unwrap()
}

#[tokio::test]
async fn what_the_sign_command_prints_is_accepted_for_every_scheme() {
    let extra = format!("{PROVIDERS}{PADDLE}{ADYEN}");
    let app = spawn_app_with(&extra).await;
    let paddle = json!({ "event_id": "evt_p", "event_type": "transaction.completed",
        "occurred_at": "2026-11-30T10:00:00Z",
        "data": { "id": "txn_1", "details": { "totals": { "grand_total": "1000" } },
            "custom_data": { "tokenmint_owner": OWNER, "tokenmint_token_type": "standard", "tokenmint_quantity": "1" } } });
    let adyen = json!({ "live": "false", "notificationItems": [
        { "NotificationRequestItem": authorisation("PSP_A", 1) } ] });
    let deliveries: [(&str, Value, &str); 4] = [
        (
            "stripe",
            intent_event("evt_s", "succeeded", "pi_1", now(), "1"),
            "pi_1",
        ),
        ("acme", acme_event("succeeded", "pay_1", 1), "pay_1"),
        ("paddle", paddle, "txn_1"),
        ("adyen", adyen, "PSP_A"),
    ];
    for (name, event, payment) in deliveries {
        let answer = post_signed(&app, &extra, name, event.to_string().as_bytes()).await;
        assert_eq!(
            answer.status(),
            200,
            "{name}: {}",
            answer.text().await.unwrap()
        );
        assert!(!app.tokens_of(payment).await.is_empty(), "{name} issued");
    }
}

#[tokio::test]
async fn an_unknown_provider_is_named() {
    let settings = test_settings("unused", PROVIDERS);
    let err = sign_webhook(&settings, "nope", b"{}", None).unwrap_err();
    assert!(err.to_string().contains("`nope`"), "{err}");
}
