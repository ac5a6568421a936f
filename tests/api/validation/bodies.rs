//! Bodies refused whole: malformed JSON is 400, JSON that is not an object 422, another
//! content type 415, and a body over the configured limit 413 (declared or chunked),
//! while the default limit admits a 2 KiB body.

use mongodb::bson::doc;
use serde_json::json;

use super::{assert_nothing_written, with};
use crate::helpers::*;

#[tokio::test]
async fn malformed_json_is_400() {
    let app = spawn_app().await;
    for raw in [
        r#"{"provider":"#,
        "",
        "not json",
        r#"{"provider": "stripe",}"#,
    ] {
        let response = app.issue_raw("application/json", raw).await;
        let problem = assert_problem(response, 400, "malformed_json").await;
        assert!(problem["detail"].is_string(), "{problem}");
    }
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_422() {
    let app = spawn_app().await;
    for raw in [
        r#"[{"provider": "stripe"}]"#,
        "[]",
        r#""stripe""#,
        "42",
        "null",
    ] {
        let response = app.issue_raw("application/json", raw).await;
        let problem = assert_problem(response, 422, "validation_failed").await;
        assert_eq!(error_fields(&problem), ["body"], "{raw}: {problem}");
    }
    assert_nothing_written(&app).await;
}

/// Well-formed JSON the parser cannot hold names its field, as any other misfit does.
#[tokio::test]
async fn a_number_too_large_or_nesting_too_deep_is_422_naming_the_field() {
    let app = spawn_app().await;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for (raw, field) in [
        (
            r#"{"provider":"stripe","paymentIntentId":"pi_big","owner":"65f1a0c2b3d4e5f601234567","tokenType":"standard","quantity":1e400}"#.to_owned(),
            "quantity",
        ),
        (
            format!(r#"{{"provider":"stripe","paymentIntentId":"pi_deep","owner":"65f1a0c2b3d4e5f601234567","tokenType":"standard","quantity":1,"mode":{deep}}}"#),
            "mode",
        ),
    ] {
        let response = app.issue_raw("application/json", raw.clone()).await;
        let problem = assert_problem(response, 422, "validation_failed").await;
        assert_eq!(error_fields(&problem), [field], "{raw}: {problem}");
    }
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn a_body_that_is_not_json_typed_is_415() {
    let app = spawn_app().await;
    let valid = serde_json::to_string(&issuance_body("pi_media", 1)).unwrap();
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
    ] {
        let response = app.issue_raw(content_type, valid.clone()).await;
        assert_problem(response, 415, "unsupported_media_type").await;
    }
    // No content type at all.
    let response = app
        .http
        .post(app.url("/v1/issuances"))
        .bearer_auth(WRITER_KEY)
        .body(valid.clone())
        .send()
        .await
        .unwrap();
    assert_problem(response, 415, "unsupported_media_type").await;
    assert_nothing_written(&app).await;

    // The same body as JSON (with parameters, or a +json type) is fine.
    let response = app
        .issue_raw("application/json; charset=utf-8", valid.clone())
        .await;
    assert_eq!(response.status(), 201);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);
}

/// Sends `body` chunked (no Content-Length) over a raw connection; returns the answer's
/// status line and headers.
async fn chunked_post(app: &TestApp, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let mut request = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {WRITER_KEY}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for chunk in body.as_bytes().chunks(256) {
        request.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            std::str::from_utf8(chunk).unwrap()
        ));
    }
    request.push_str("0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("answer within 30 s")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.split("\r\n\r\n").next().unwrap().to_owned()
}

/// A syntactically valid body of about `size` bytes whose paymentIntentId is too long,
/// so that a server which reads it answers 422, and only a size limit answers 413.
fn padded_body(size: usize) -> String {
    let body = with("paymentIntentId", json!("p".repeat(size)));
    serde_json::to_string(&body).unwrap()
}

#[tokio::test]
async fn a_body_over_the_configured_limit_is_413() {
    // The extra layer reopens [server], which the harness's base layer also sets.
    let app = spawn_app_with("[server]\nbody_limit_bytes = 1024\n").await;
    let body = padded_body(2048);
    assert!(body.len() > 1024);
    let response = app.issue_raw("application/json", body.clone()).await;
    assert_problem(response, 413, "payload_too_large").await;
    // Also when the client sends no Content-Length (chunked transfer encoding).
    let head = chunked_post(&app, &body).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{head}"
    );
    assert_nothing_written(&app).await;

    // The limit did not also reset the rest of [server]: a small body is served.
    let small = issuance_body("pi_small", 1);
    assert!(serde_json::to_string(&small).unwrap().len() < 1024);
    assert_eq!(app.issue(WRITER_KEY, &small).await.status(), 201);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);
}

#[tokio::test]
async fn the_default_limit_admits_a_2k_body() {
    // The same 2 KB body that the 1 KiB limit refuses is read (and found invalid) under
    // the default 64 KiB limit: the 413 above comes from the configured limit.
    let app = spawn_app().await;
    let problem = assert_problem(
        app.issue_raw("application/json", padded_body(2048)).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&problem), ["paymentIntentId"]);
    assert_nothing_written(&app).await;
}
