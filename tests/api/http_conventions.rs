//! HTTP conventions every operation shares: `WWW-Authenticate` on every 401, 405 with
//! `Allow` for a known path's unsupported method, RFC 9110 strong `If-Match`, problem types
//! that resolve, a self-contained `/docs`, and whole-second `Retry-After`.

use mongodb::bson::{Document, doc, oid::ObjectId};
use reqwest::Method;
use serde_json::{Value, json};
use tokenmint::webhooks::signature::sign_stripe;

use crate::helpers::*;
use crate::provider_events::{STRIPE_NEW, intent_event, now};

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

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

/// Issues one token for `payment` and returns its id.
async fn one_token(app: &TestApp, payment: &str) -> String {
    let response = app.issue(ADMIN_KEY, &issuance_body(payment, 1)).await;
    assert_eq!(response.status(), 201);
    token_ids(&json(response).await).remove(0)
}

async fn change(app: &TestApp, id: &str, operation: &str, if_match: &[&str]) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url(&format!("/v1/tokens/{id}/{operation}")))
        .bearer_auth(ADMIN_KEY);
    for value in if_match {
        request = request.header("if-match", *value);
    }
    if operation == "transfer" {
        request = request.json(&json!({ "newOwner": OTHER_OWNER }));
    }
    request.send().await.unwrap()
}

async fn stored(app: &TestApp, id: &str) -> (String, i64) {
    let token = app
        .db
        .collection::<Document>("tokens")
        .find_one(doc! { "_id": ObjectId::parse_str(id).unwrap() })
        .await
        .unwrap()
        .unwrap();
    let version = token.get("_version").unwrap();
    let version = version
        .as_i64()
        .or(version.as_i32().map(i64::from))
        .unwrap();
    (token.get_str("status").unwrap().to_owned(), version)
}

/// Asserts a 200 with the token at `version` in the ETag and the body.
async fn assert_applied(response: reqwest::Response, version: i64) -> Value {
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "etag"),
        Some(format!("\"{version}\"")),
        "ETag"
    );
    let token = json(response).await;
    assert_eq!(token["version"], version);
    token
}

#[tokio::test]
async fn if_match_compares_strongly() {
    let app = spawn_app().await;
    let id = one_token(&app, "pi_if_match").await;

    // A weak tag never matches, even of the current version: 412 with where it is.
    for operation in ["redeem", "revoke", "transfer"] {
        for if_match in [
            &["W/\"0\""][..],
            &["W/0"],
            &["W/\"0\", \"7\""],
            &["\"7\"", "W/\"0\""],
        ] {
            let response = change(&app, &id, operation, if_match).await;
            let problem = assert_problem(response, 412, "version_conflict").await;
            assert_eq!(problem["currentVersion"], 0, "{operation} {if_match:?}");
            assert_eq!(problem["currentStatus"], "active");
        }
    }
    assert_eq!(stored(&app, &id).await, ("active".to_owned(), 0));

    // A list matches if any entry does; several If-Match lines are one list.
    let moved = change(&app, &id, "transfer", &["\"5\", W/\"9\", \"0\""]).await;
    assert_eq!(assert_applied(moved, 1).await["owner"], OTHER_OWNER);
    let moved = change(&app, &id, "transfer", &["\"0\"", "\"1\""]).await;
    assert_applied(moved, 2).await;
    // `*` matches whatever version the token is at, also for a transfer (which needs
    // If-Match: `*` is one).
    let moved = change(&app, &id, "transfer", &["*"]).await;
    assert_applied(moved, 3).await;
    let redeemed = change(&app, &id, "redeem", &[" * "]).await;
    assert_eq!(assert_applied(redeemed, 4).await["status"], "redeemed");
    // `*` is a precondition, not a way around the state rules.
    let again = change(&app, &id, "redeem", &["*"]).await;
    assert_eq!(
        assert_problem(again, 409, "state_conflict").await["currentStatus"],
        "redeemed"
    );
    // A stale list is 412 like a stale tag.
    let stale = change(&app, &id, "revoke", &["\"1\", \"2\", \"3\""]).await;
    assert_eq!(
        assert_problem(stale, 412, "version_conflict").await["currentVersion"],
        4
    );
    assert_eq!(stored(&app, &id).await, ("redeemed".to_owned(), 4));

    // `*` does not conjure a token: an absent one is 404, as without If-Match.
    let absent = change(&app, "65f1a0c2b3d4e5f60123ffff", "redeem", &["*"]).await;
    assert_problem(absent, 404, "not_found").await;
    let absent = change(&app, "65f1a0c2b3d4e5f60123ffff", "revoke", &["W/\"0\""]).await;
    assert_problem(absent, 404, "not_found").await;

    // Malformed: 422 naming If-Match, before anything is read.
    let other = one_token(&app, "pi_if_match_bad").await;
    for bad in [
        &["\"abc\""][..],
        &["*, \"1\""],
        &["*", "\"1\""],
        &["\"1\",,\"2\""],
        &["\"1\","],
        &["w/\"0\""],
        &["W/W/0"],
        &["+0"],
    ] {
        let response = change(&app, &other, "redeem", bad).await;
        let problem = assert_problem(response, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["field"], "If-Match", "{bad:?}");
    }
    // And a transfer without any If-Match is still 428.
    assert_problem(
        change(&app, &other, "transfer", &[]).await,
        428,
        "precondition_required",
    )
    .await;
    assert_eq!(stored(&app, &other).await, ("active".to_owned(), 0));
}

#[tokio::test]
async fn every_problem_type_resolves() {
    let app = spawn_app().await;
    // The codes the OpenAPI document enumerates: each resolves, to its own description.
    let doc =
        serde_json::to_value(<tokenmint::http::ApiDoc as utoipa::OpenApi>::openapi()).unwrap();
    let codes: Vec<String> = doc["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode is an enum in the OpenAPI document")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert!(codes.len() >= 20, "{codes:?}");
    for code in [
        "method_not_allowed",
        "version_conflict",
        "signature_invalid",
    ] {
        assert!(codes.iter().any(|c| c == code), "{code}");
    }
    for code in &codes {
        let response = app
            .http
            .get(app.url(&format!("/problems/{code}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(
            header(&response, "content-type").as_deref(),
            Some("application/json")
        );
        let described = json(response).await;
        assert_eq!(described["code"], code.as_str());
        assert!(described["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(
            described["description"]
                .as_str()
                .is_some_and(|t| t.len() > 20)
        );
        let status = described["status"].as_u64().unwrap();
        assert!((400..600).contains(&status), "{code}: {status}");
    }

    // Problems the service actually answers with: their `type` resolves to their code,
    // status and title.
    let answers = vec![
        app.http.get(app.url("/nowhere")).send().await.unwrap(),
        app.http.delete(app.url("/healthz")).send().await.unwrap(),
        app.get("nope", "/v1/tokens").await,
        app.issue(READER_KEY, &issuance_body("pi_types", 1)).await,
        app.get(READER_KEY, "/v1/tokens?limit=0").await,
        app.get(READER_KEY, "/v1/tokens/65f1a0c2b3d4e5f60123ffff")
            .await,
        app.http
            .post(app.url("/v1/issuances"))
            .bearer_auth(WRITER_KEY)
            .header("content-type", "application/json")
            .body("{")
            .send()
            .await
            .unwrap(),
        app.http
            .post(app.url("/v1/issuances"))
            .bearer_auth(WRITER_KEY)
            .header("content-type", "text/plain")
            .body("x")
            .send()
            .await
            .unwrap(),
    ];
    let mut seen = Vec::new();
    for response in answers {
        let status = response.status().as_u16();
        let problem = json(response).await;
        let problem_type = problem["type"].as_str().unwrap().to_owned();
        assert_eq!(
            problem_type,
            format!("/problems/{}", problem["code"].as_str().unwrap())
        );
        let described = json(app.http.get(app.url(&problem_type)).send().await.unwrap()).await;
        assert_eq!(described["code"], problem["code"]);
        assert_eq!(described["status"], status);
        assert_eq!(described["title"], problem["title"]);
        seen.push(status);
    }
    assert_eq!(seen, [404, 405, 401, 403, 422, 404, 400, 415]);

    // Unknown codes are a 404 problem (whose own type resolves).
    for unknown in ["no_such_code", "NOT_FOUND", "not_found%00", "%FF"] {
        let response = app
            .http
            .get(app.url(&format!("/problems/{unknown}")))
            .send()
            .await
            .unwrap();
        assert_problem(response, 404, "not_found").await;
    }
    let response = app.http.get(app.url("/problems/")).send().await.unwrap();
    assert_problem(response, 404, "not_found").await;
}

#[tokio::test]
async fn docs_request_nothing_from_another_host() {
    let app = spawn_app().await;
    let get = |path: &'static str| {
        let request = app.http.get(app.url(path));
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            response.text().await.unwrap()
        }
    };
    let html = get("/docs/").await;
    let initializer = get("/docs/swagger-initializer.js").await;
    // Swagger UI's online validator (validator.swagger.io) is off.
    assert!(
        initializer.contains("\"validatorUrl\": \"none\""),
        "{initializer}"
    );
    assert!(initializer.contains("/openapi.json"), "{initializer}");
    for (name, text) in [
        ("index.html", &html),
        ("swagger-initializer.js", &initializer),
    ] {
        for external in ["http://", "https://", "\"//", "'//", "=//"] {
            assert!(
                !text.contains(external),
                "{name} names another host ({external}):\n{text}"
            );
        }
    }
    // Every script, style and icon the page loads is relative, and served here.
    let mut loaded = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for (start, _) in html.match_indices(attribute) {
            let rest = &html[start + attribute.len()..];
            let target = &rest[..rest.find('"').unwrap()];
            loaded.push(target.to_owned());
        }
    }
    assert!(loaded.len() >= 3, "{loaded:?}");
    for target in loaded {
        let relative = target.strip_prefix("./").unwrap_or(&target);
        assert!(
            !relative.contains(':') && !relative.starts_with('/'),
            "{target}"
        );
        let response = app
            .http
            .get(app.url(&format!("/docs/{relative}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{target}");
        // Stylesheets load nothing from elsewhere either (fonts, images: inline only).
        if relative.ends_with(".css") {
            let css = response.text().await.unwrap();
            assert!(!css.contains("@import"), "{target}");
            for (start, _) in css.match_indices("url(") {
                let reference = css[start + 4..].trim_start_matches(['"', '\'']);
                assert!(
                    reference.starts_with("data:")
                        || !reference[..reference.len().min(12)].contains("//"),
                    "{target}: url({})",
                    &reference[..reference.len().min(40)]
                );
            }
        }
    }
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up() {
    // Three a second, no burst: the next request is allowed ~0.33 s later.
    let app = spawn_app_with("[rate_limit]\nper_key_per_second = 3\nburst = 1\n").await;
    let responses =
        futures::future::join_all((0..8).map(|_| app.get(READER_KEY, "/v1/tokens"))).await;
    let limited = responses
        .into_iter()
        .find(|r| r.status() == 429)
        .expect("a 429 among eight concurrent requests");
    // An integer, and 0.33 s rounds up to 1, never down to 0.
    assert_eq!(header(&limited, "retry-after").as_deref(), Some("1"));
    let problem = assert_problem(limited, 429, "rate_limited").await;
    assert_eq!(problem["detail"], "Rate limit exceeded; retry after 1 s.");
}
