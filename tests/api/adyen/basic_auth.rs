//! HTTP Basic credentials on the `adyen` scheme (`basic_auth_username`,
//! `basic_auth_password`): checked before any HMAC work, so a delivery without them is
//! 401 and nothing is recorded, however well its items are signed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use mongodb::bson::doc;

use super::{ADYEN, ADYEN_NEW, authorisation, signed_batch};
use crate::helpers::*;

const USER: &str = "adyen-notifier";
const PASSWORD: &str = "N0tificati0n-Passw0rd";

fn config() -> String {
    format!("{ADYEN}basic_auth_username = \"{USER}\"\nbasic_auth_password = \"{PASSWORD}\"\n")
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", BASE64.encode(format!("{user}:{password}")))
}

async fn post(app: &TestApp, authorization: Option<&str>, body: Vec<u8>) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url("/v1/webhooks/adyen"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn a_delivery_without_the_right_credentials_is_401_and_records_nothing() {
    let app = spawn_app_with(&config()).await;
    let body = signed_batch(&[authorisation("PSP_A", 2)], ADYEN_NEW);
    let wrong = [
        None,
        Some(basic(USER, "wrong")),
        Some(basic("someone", PASSWORD)),
        Some(basic(USER, &format!("{PASSWORD}x"))),
        Some(format!("Bearer {PASSWORD}")),
        Some("Basic not-base64!".to_owned()),
    ];
    for authorization in &wrong {
        let answer = post(&app, authorization.as_deref(), body.clone()).await;
        let challenge = answer.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            challenge.starts_with("Basic realm=\"webhooks\""),
            "{challenge}"
        );
        assert_problem(answer, 401, "basic_auth_invalid").await;
    }
    // Checked before the signature: an unsigned body without credentials is the same 401.
    let answer = post(&app, None, b"{}".to_vec()).await;
    assert_problem(answer, 401, "basic_auth_invalid").await;
    for collection in ["payments", "webhook_events", "tokens", "issuances"] {
        assert_eq!(app.count(collection, doc! {}).await, 0, "{collection}");
    }
}

#[tokio::test]
async fn the_right_credentials_are_accepted() {
    let app = spawn_app_with(&config()).await;
    let body = signed_batch(&[authorisation("PSP_A", 2)], ADYEN_NEW);
    // The scheme's name is case-insensitive (RFC 7617 §2).
    let lower = basic(USER, PASSWORD).replacen("Basic", "basic", 1);
    for (authorization, psp) in [(basic(USER, PASSWORD), "PSP_A"), (lower, "PSP_B")] {
        let body = signed_batch(&[authorisation(psp, 2)], ADYEN_NEW);
        let answer = post(&app, Some(&authorization), body).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.text().await.unwrap(), "[accepted]");
        assert_eq!(app.active_indexes(psp).await, vec![0, 1]);
    }
    // The right credentials do not stand in for the signature.
    let mut unsigned: serde_json::Value = serde_json::from_slice(&body).unwrap();
    unsigned["notificationItems"][0]["NotificationRequestItem"]["additionalData"]["hmacSignature"] =
        serde_json::json!("AAAA");
    let answer = post(
        &app,
        Some(&basic(USER, PASSWORD)),
        unsigned.to_string().into_bytes(),
    )
    .await;
    assert_problem(answer, 401, "signature_invalid").await;
    assert_eq!(app.count("webhook_events", doc! {}).await, 2);
}

/// Neither an unknown provider nor a delivery without the provider's credentials costs
/// the service a read of its body: the answer comes while the body is still unsent (the
/// connection is closed after it), so a caller who knows no secret cannot make each
/// instance buffer `webhooks.body_limit_bytes` per connection.
#[tokio::test]
async fn a_delivery_refused_before_its_body_is_answered_without_reading_it() {
    let app = spawn_app_with(&config()).await;
    let wrong = basic(USER, "wrong");
    for (path, authorization, expected) in [
        ("/v1/webhooks/paypal", None, "404"),
        ("/v1/webhooks/adyen", None, "401"),
        ("/v1/webhooks/adyen", Some(wrong.as_str()), "401"),
    ] {
        let status = status_before_the_body(&app, path, authorization).await;
        assert_eq!(status.split(' ').nth(1), Some(expected), "{path}: {status}");
    }
    assert_eq!(app.count("webhook_events", doc! {}).await, 0);
}

/// Sends a POST's head announcing a 100,000-byte body, and none of the body; the status
/// line of the answer, or a panic when the answer and the connection's close do not come
/// within 5 s.
async fn status_before_the_body(app: &TestApp, path: &str, authorization: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("an answer, and the connection closed, before the body is sent")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}
