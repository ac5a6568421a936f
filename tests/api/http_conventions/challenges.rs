//! Refusals before anything runs: the operations the OpenAPI document puts behind a key
//! are the ones that ask for one, a 401 always carries its `WWW-Authenticate` challenge,
//! and a known path asked with another method is 405 with its `Allow`.

use mongodb::bson::doc;
use reqwest::Method;
use tokenmint::webhooks::signature::sign_stripe;

use super::header;
use crate::helpers::*;
use crate::provider_events::{STRIPE_NEW, intent_event, now};

/// The methods of an `Allow` header, sorted.
fn allowed(response: &reqwest::Response) -> Vec<String> {
    let mut methods: Vec<String> = header(response, "allow")
        .expect("an Allow header")
        .split(',')
        .map(|m| m.trim().to_owned())
        .collect();
    methods.sort();
    methods
}

/// The document's `security` is what the service does: every operation it lists behind
/// an API key asks a request without one for it (401 with the bearer challenge), and no
/// operation it lists as open does. The failures every keyed operation answers are added
/// to the document by its `security` alone, so this keeps them on the right operations.
#[tokio::test]
async fn the_operations_the_document_puts_behind_a_key_are_the_ones_that_ask_for_one() {
    let app = crate::provider_events::app().await;
    let doc =
        serde_json::to_value(<tokenmint::http::ApiDoc as utoipa::OpenApi>::openapi()).unwrap();
    let mut keyed = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        // Any well-formed value for each path parameter: the key is asked for first.
        let path = template
            .replace("{tokenId}", "65f1a0c2b3d4e5f601234567")
            .replace("{owner}", "65f1a0c2b3d4e5f601234567")
            .replace("{reference}", "ref-1")
            .replace("{provider}", "stripe")
            .replace("{accountId}", "acct_1")
            .replace("{paymentIntentId}", "pi_1")
            .replace("{code}", "not_found");
        assert!(!path.contains('{'), "a parameter left in {path}");
        for (method, operation) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = app
                .http
                .request(method.clone(), app.url(&path))
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let challenge = header(&response, "www-authenticate").unwrap_or_default();
            let documented = operation["security"]
                .as_array()
                .is_some_and(|s| !s.is_empty());
            if documented {
                keyed += 1;
                assert_eq!(response.status(), 401, "{method} {path}");
                assert!(
                    challenge.starts_with("Bearer "),
                    "{method} {path}: {challenge}"
                );
                assert!(
                    operation["responses"]["401"].is_object(),
                    "{method} {path} does not document its 401"
                );
            } else {
                assert!(
                    !challenge.starts_with("Bearer "),
                    "{method} {path} asks for a key the document does not name"
                );
                assert!(
                    operation["responses"]["403"].is_null(),
                    "{method} {path} documents a key's refusal it never answers"
                );
            }
        }
    }
    assert!(keyed >= 11, "{keyed} keyed operations");
}

#[tokio::test]
async fn every_401_carries_a_www_authenticate_challenge() {
    let app = crate::provider_events::app().await;
    let body = issuance_body("pi_challenge", 1);
    let plain = "Bearer realm=\"tokenmint\"";
    let invalid = "Bearer realm=\"tokenmint\", error=\"invalid_token\"";
    let cases: [(&str, Option<&str>, &str); 6] = [
        ("no Authorization header", None, plain),
        ("another scheme", Some("Basic dXNlcjpwYXNz"), plain),
        ("scheme only", Some("Bearer"), plain),
        ("empty bearer", Some("Bearer "), plain),
        ("unknown key", Some("Bearer not-a-key"), invalid),
        (
            "valid key with a suffix",
            Some("Bearer test-admin-key2"),
            invalid,
        ),
    ];
    for (case, authorization, challenge) in cases {
        let mut request = app.http.post(app.url("/v1/issuances")).json(&body);
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            header(&response, "www-authenticate").as_deref(),
            Some(challenge),
            "{case}"
        );
        assert_problem(response, 401, "unauthorized").await;
    }
    // Reads too.
    let response = app.get("nope", "/v1/tokens").await;
    assert_eq!(
        header(&response, "www-authenticate").as_deref(),
        Some(invalid)
    );
    assert_problem(response, 401, "unauthorized").await;
    // Answers other than 401 carry no challenge.
    let forbidden = app.issue(READER_KEY, &body).await;
    assert_eq!(header(&forbidden, "www-authenticate"), None);
    assert_problem(forbidden, 403, "forbidden").await;

    // Webhook deliveries: the signature scheme's challenge, naming the failure.
    let event = intent_event("evt_challenge", "succeeded", "pi_challenge", now(), "1").to_string();
    let signed_by = |secret: &str, at: i64| sign_stripe(secret, at, event.as_bytes());
    let cases = [
        (None, "signature_missing"),
        (Some(signed_by("whsec_wrong", now())), "signature_invalid"),
        (
            Some(signed_by(STRIPE_NEW, now() - 3600)),
            "signature_timestamp_out_of_tolerance",
        ),
    ];
    for (signature, code) in cases {
        let mut request = app
            .http
            .post(app.url("/v1/webhooks/stripe"))
            .header("content-type", "application/json")
            .body(event.clone());
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            header(&response, "www-authenticate"),
            Some(format!("Signature realm=\"webhooks\", error=\"{code}\"")),
            "{code}"
        );
        assert_problem(response, 401, code).await;
    }
    assert_eq!(app.count("webhook_events", doc! {}).await, 0);
}

#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_allow() {
    let app = spawn_app().await;
    let token = "65f1a0c2b3d4e5f601234567";
    let cases: Vec<(Method, String, &[&str])> = vec![
        (Method::DELETE, "/v1/tokens".to_owned(), &["GET", "HEAD"]),
        (Method::POST, "/v1/tokens".to_owned(), &["GET", "HEAD"]),
        (Method::PUT, format!("/v1/tokens/{token}"), &["GET", "HEAD"]),
        (Method::GET, format!("/v1/tokens/{token}/redeem"), &["POST"]),
        (
            Method::PATCH,
            format!("/v1/tokens/{token}/transfer"),
            &["POST"],
        ),
        (Method::GET, "/v1/issuances".to_owned(), &["POST"]),
        (
            Method::DELETE,
            "/v1/issuances/stripe/acct_1/pi_1".to_owned(),
            &["GET", "HEAD"],
        ),
        (
            Method::POST,
            "/v1/payments/stripe/acct_1/pi_1".to_owned(),
            &["GET", "HEAD"],
        ),
        (Method::GET, "/v1/webhooks/stripe".to_owned(), &["POST"]),
        (Method::POST, "/healthz".to_owned(), &["GET", "HEAD"]),
        (Method::DELETE, "/metrics".to_owned(), &["GET", "HEAD"]),
        (Method::POST, "/openapi.json".to_owned(), &["GET", "HEAD"]),
        (
            Method::POST,
            "/problems/not_found".to_owned(),
            &["GET", "HEAD"],
        ),
    ];
    for (method, path, allow) in cases {
        // Without a key: the method is wrong whoever asks, so 405 comes before 401.
        let response = app
            .http
            .request(method.clone(), app.url(&path))
            .send()
            .await
            .unwrap();
        assert_eq!(allowed(&response), allow, "{method} {path}");
        let problem = assert_problem(response, 405, "method_not_allowed").await;
        assert_eq!(problem["type"], "/problems/method_not_allowed");
        // With a key: the same.
        let response = app
            .http
            .request(method.clone(), app.url(&path))
            .bearer_auth(ADMIN_KEY)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(allowed(&response), allow, "{method} {path}");
        assert_problem(response, 405, "method_not_allowed").await;
    }
    // Unknown paths stay 404, whatever the method, and say nothing about methods.
    for (method, path) in [
        (Method::GET, "/nowhere"),
        (Method::POST, "/nowhere"),
        (Method::DELETE, "/v1/tokens/a/b/c"),
        (Method::GET, "/v1"),
    ] {
        let response = app
            .http
            .request(method.clone(), app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(header(&response, "allow"), None, "{method} {path}");
        assert_problem(response, 404, "not_found").await;
    }
    // The supported method still works; HEAD follows GET.
    assert_eq!(app.get(READER_KEY, "/v1/tokens").await.status(), 200);
    let head = app.http.head(app.url("/healthz")).send().await.unwrap();
    assert_eq!(head.status(), 200);
}
