//! Authentication, scopes, account isolation, unauthenticated operations endpoints, the
//! error envelope of unknown routes, and request ids.

use mongodb::bson::doc;
use serde_json::json;

use crate::helpers::*;

async fn assert_nothing_written(app: &TestApp) {
    assert_eq!(app.count("tokens", doc! {}).await, 0, "no token written");
    assert_eq!(
        app.count("issuances", doc! {}).await,
        0,
        "no issuance written"
    );
}

/// POST /v1/issuances with a raw (or no) Authorization header.
async fn issue_with_authorization(
    app: &TestApp,
    authorization: Option<&str>,
    body: &serde_json::Value,
) -> reqwest::Response {
    let mut request = app.http.post(app.url("/v1/issuances")).json(body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send().await.expect("request sent")
}

#[tokio::test]
async fn missing_or_invalid_credentials_are_401() {
    let app = spawn_app().await;
    let body = issuance_body("pi_auth", 2);
    let writer = format!("Bearer {WRITER_KEY}");
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("no Authorization header", None),
        ("unknown bearer key", Some("Bearer wrong")),
        ("basic scheme", Some("Basic x")),
        ("empty bearer", Some("Bearer ")),
        ("scheme only", Some("Bearer")),
        ("key without scheme", Some(WRITER_KEY)),
        ("empty header", Some("")),
        ("valid key with a suffix", Some("Bearer test-writer-key2")),
    ];
    for (description, authorization) in cases {
        let response = issue_with_authorization(&app, authorization, &body).await;
        assert_eq!(response.status(), 401, "{description}");
        let problem = assert_problem(response, 401, "unauthorized").await;
        assert!(
            !problem.to_string().contains(WRITER_KEY),
            "{description}: the answer never echoes a key: {problem}"
        );
    }
    // Authentication comes before the body: a bad body without a key is still a 401.
    let response = app
        .http
        .post(app.url("/v1/issuances"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_problem(response, 401, "unauthorized").await;
    // Reads need a key too.
    let response = app
        .http
        .get(app.url("/v1/issuances/stripe/acct_1/pi_auth"))
        .send()
        .await
        .unwrap();
    assert_problem(response, 401, "unauthorized").await;
    assert_nothing_written(&app).await;

    // The same body with a valid key goes through.
    let response = issue_with_authorization(&app, Some(&writer), &body).await;
    assert_eq!(response.status(), 201);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 2);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    // RFC 9110 §11.1: authentication schemes are case-insensitive tokens.
    let app = spawn_app().await;
    for (i, scheme) in ["bearer", "BEARER", "Bearer"].into_iter().enumerate() {
        let authorization = format!("{scheme} {WRITER_KEY}");
        let body = issuance_body(&format!("pi_scheme_{i}"), 1);
        let response = issue_with_authorization(&app, Some(&authorization), &body).await;
        assert_eq!(response.status(), 201, "{scheme}");
    }
    assert_eq!(app.count("issuances", doc! {}).await, 3);
    assert_eq!(app.count("tokens", doc! {}).await, 3);
}

#[tokio::test]
async fn readiness_waits_for_migrations() {
    // A start that does not apply migrations, on a fresh database: alive but not ready.
    let app = spawn_app_with("[migrations]\napply_on_startup = false\n").await;
    let response = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let body = json(response).await;
    assert_eq!(body["status"], "unavailable");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("0001_tokens_unique_payment_index"),
        "{body}"
    );
    assert_eq!(app.count("_migrations", doc! {}).await, 0);
    assert_nothing_written(&app).await;
    // Nor did it change any other schema: webhook_events' TTL index is `migrate`'s too.
    let indexes = app.db.list_collection_names().await.unwrap();
    assert!(
        !indexes.contains(&"webhook_events".to_owned()),
        "{indexes:?}"
    );
    // The database answers: its gauge says so, whatever readiness says.
    let metrics = app.http.get(app.url("/metrics")).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.lines().any(|line| line == "tokenmint_mongodb_up 1"),
        "{metrics}"
    );
}

/// A start that may not change the schema refuses a TTL index that keeps webhook events
/// shorter than `webhooks.retention_days`: a replay within a provider's tolerance could
/// outlive its dedupe record. The same retention starts.
#[tokio::test]
async fn a_start_without_migrations_refuses_a_shorter_webhook_retention() {
    let scratch = ScratchDatabase::create("tm_retention").await;
    // As `tokenmint migrate` run with `retention_days = 1` leaves it.
    scratch.store().ensure_webhook_retention(1).await.unwrap();
    let without_migrations = |days: u32| {
        test_settings(
            scratch.name(),
            &format!(
                "[migrations]\napply_on_startup = false\n[webhooks]\nretention_days = {days}\n"
            ),
        )
    };
    let refused = tokenmint::startup::Application::build(&without_migrations(30))
        .await
        .err()
        .expect("a shorter retention is refused")
        .to_string();
    assert!(refused.contains("webhooks.retention_days"), "{refused}");
    assert!(refused.contains("tokenmint migrate"), "{refused}");
    assert_eq!(
        scratch.store().webhook_retention_days().await.unwrap(),
        Some(1)
    );
    let app = spawn_app_from(&without_migrations(1)).await;
    let response = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
}

/// The longest retention the settings allow is a TTL index the database builds, and one
/// day more is one it refuses: the bound is the database's own.
#[tokio::test]
async fn the_longest_webhook_retention_is_the_longest_ttl_the_database_keeps() {
    use tokenmint::settings::MAX_RETENTION_DAYS;
    let scratch = ScratchDatabase::create("tm_retention_max").await;
    assert!(
        scratch
            .store()
            .ensure_webhook_retention(MAX_RETENTION_DAYS + 1)
            .await
            .is_err()
    );
    scratch
        .store()
        .ensure_webhook_retention(MAX_RETENTION_DAYS)
        .await
        .unwrap();
    assert_eq!(
        scratch.store().webhook_retention_days().await.unwrap(),
        Some(u64::from(MAX_RETENTION_DAYS))
    );
}

#[tokio::test]
async fn keys_without_an_issuance_scope_cannot_issue() {
    // A read-only key holds neither issuances:write nor issuances:request. (A checkout key
    // with issuances:request follows the checkout request flow, tested elsewhere.)
    let app = spawn_app().await;
    let body = issuance_body("pi_scope", 2);
    let problem = assert_problem(app.issue(READER_KEY, &body).await, 403, "forbidden").await;
    assert!(
        problem["detail"].as_str().unwrap().contains("scope"),
        "{problem}"
    );
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn an_account_key_issues_only_for_its_account() {
    let app = spawn_app().await;
    let mut foreign = issuance_body("pi_acct", 2);
    foreign["accountId"] = json!("acct_2");
    assert_problem(app.issue(ACCOUNT1_KEY, &foreign).await, 403, "forbidden").await;
    // No accountId means `default`, which is not acct_1 either.
    let mut default_account = issuance_body("pi_acct", 2);
    default_account.as_object_mut().unwrap().remove("accountId");
    assert_problem(
        app.issue(ACCOUNT1_KEY, &default_account).await,
        403,
        "forbidden",
    )
    .await;
    assert_nothing_written(&app).await;

    let response = app.issue(ACCOUNT1_KEY, &issuance_body("pi_acct", 2)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        app.count("issuances", doc! { "accountId": "acct_1" }).await,
        1
    );
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.token_indexes("pi_acct").await, vec![0, 1]);
}

#[tokio::test]
async fn an_account_key_sees_nothing_of_another_account() {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_x", 2);
    body["accountId"] = json!("acct_2");
    assert_eq!(app.issue(ADMIN_KEY, &body).await.status(), 201);

    let existing = assert_problem(
        app.get(ACCOUNT1_KEY, "/v1/issuances/stripe/acct_2/pi_x")
            .await,
        404,
        "not_found",
    )
    .await;
    let missing = assert_problem(
        app.get(ACCOUNT1_KEY, "/v1/issuances/stripe/acct_2/pi_missing")
            .await,
        404,
        "not_found",
    )
    .await;
    assert_eq!(
        existing["detail"], missing["detail"],
        "an existing foreign issuance is indistinguishable from a missing one"
    );
    // The admin (no account list) and a reader see it.
    assert_eq!(
        app.get(ADMIN_KEY, "/v1/issuances/stripe/acct_2/pi_x")
            .await
            .status(),
        200
    );
    assert_eq!(
        app.get(READER_KEY, "/v1/issuances/stripe/acct_2/pi_x")
            .await
            .status(),
        200
    );
    // A read changes nothing.
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 2);
}

#[tokio::test]
async fn reading_needs_the_read_scope() {
    let app = spawn_app().await;
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_read_scope", 1))
            .await
            .status(),
        201
    );
    for key in [WRITER_KEY, REQUEST_KEY] {
        let problem = assert_problem(
            app.get(key, "/v1/issuances/stripe/acct_1/pi_read_scope")
                .await,
            403,
            "forbidden",
        )
        .await;
        assert!(
            problem["detail"].as_str().unwrap().contains("read"),
            "{problem}"
        );
    }
    assert_eq!(
        app.get(ACCOUNT1_KEY, "/v1/issuances/stripe/acct_1/pi_read_scope")
            .await
            .status(),
        200
    );
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);
}

#[tokio::test]
async fn operations_endpoints_need_no_key() {
    let app = spawn_app().await;
    for path in ["/healthz", "/readyz"] {
        let response = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let body = json(response).await;
        assert!(body["status"].is_string(), "{path}: {body}");
    }
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(json(response).await["status"], "ready");
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn unknown_routes_are_problem_404() {
    let app = spawn_app().await;
    for path in ["/nope", "/v1/issuances/stripe", "/v2/issuances"] {
        let response = app.http.get(app.url(path)).send().await.unwrap();
        assert_problem(response, 404, "not_found").await;
        // With a key it is the same answer.
        assert_problem(app.get(ADMIN_KEY, path).await, 404, "not_found").await;
    }
    let response = app.http.post(app.url("/nope")).send().await.unwrap();
    assert_problem(response, 404, "not_found").await;
    assert_nothing_written(&app).await;
}

/// The `x-request-id` of a response; asserts it is present and sane.
fn request_id(response: &reqwest::Response) -> String {
    let id = response
        .headers()
        .get("x-request-id")
        .unwrap_or_else(|| panic!("x-request-id on {} {}", response.status(), response.url()))
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        (1..=128).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)),
        "sane request id: {id:?}"
    );
    id
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let app = spawn_app().await;
    let body = issuance_body("pi_rid", 1);
    let mut responses = vec![
        app.issue(WRITER_KEY, &body).await, // 201
        app.issue(WRITER_KEY, &body).await, // 200
        app.get(READER_KEY, "/v1/issuances/stripe/acct_1/pi_rid")
            .await, // 200
        app.issue(READER_KEY, &body).await, // 403
        app.issue("wrong", &body).await,    // 401
        app.issue(WRITER_KEY, &json!({ "provider": "Stripe" }))
            .await, // 422
        app.get(READER_KEY, "/v1/issuances/stripe/acct_1/pi_none")
            .await, // 404
        app.http.get(app.url("/nowhere")).send().await.unwrap(), // 404
        app.http.get(app.url("/healthz")).send().await.unwrap(), // 200
        app.http.get(app.url("/readyz")).send().await.unwrap(), // 200
    ];
    responses.push(
        app.issue_raw("text/plain", "x").await, // 415
    );
    let statuses: Vec<u16> = responses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(
        statuses,
        [201, 200, 200, 403, 401, 422, 404, 404, 200, 200, 415]
    );
    let ids: std::collections::HashSet<String> = responses.iter().map(request_id).collect();
    assert_eq!(ids.len(), responses.len(), "a fresh id per request");
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);
}

#[tokio::test]
async fn a_sane_request_id_is_echoed_and_others_are_replaced() {
    let app = spawn_app().await;
    let send = |id: String| {
        let request = app.http.get(app.url("/healthz")).header("x-request-id", id);
        async move { request.send().await.unwrap() }
    };

    let response = send("abc-123".to_owned()).await;
    assert_eq!(request_id(&response), "abc-123");
    // Echoed on an error answer too.
    let response = app
        .http
        .post(app.url("/v1/issuances"))
        .header("x-request-id", "req_42.a:b")
        .json(&issuance_body("pi_rid", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(request_id(&response), "req_42.a:b");

    let long = "a".repeat(10 * 1024);
    for bad in [
        long,
        "a".repeat(129),
        "abc\tdef".to_owned(),
        "abc def".to_owned(),
        "a\"b".to_owned(),
        "<script>".to_owned(),
    ] {
        let response = send(bad.clone()).await;
        assert_eq!(response.status(), 200);
        let id = request_id(&response);
        assert_ne!(id, bad, "{bad:?} is replaced");
    }
    assert_nothing_written(&app).await;
}

/// A key limited to `stripe/acct_1`: the account at that provider only.
const STRIPE_ACCT1_KEY: &str = "test-stripe-acct1-key";

#[tokio::test]
async fn an_account_entry_with_a_provider_covers_that_provider_only() {
    let keys = format!(
        "[[auth.keys]]\nid = \"admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n\
         [[auth.keys]]\nid = \"stripe-acct1\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\naccounts = [\"stripe/acct_1\"]\n\
         [[auth.keys]]\nid = \"acct1\"\nsha256 = \"{}\"\nscopes = [\"read\"]\naccounts = [\"acct_1\"]\n",
        tokenmint::http::auth::key_hash(ADMIN_KEY),
        tokenmint::http::auth::key_hash(STRIPE_ACCT1_KEY),
        tokenmint::http::auth::key_hash(ACCOUNT1_KEY),
    );
    let app = spawn_app_with(&keys).await;
    let stripe = app.issue_tokens("pi_scoped", 1).await;
    let mut paddle_body = issuance_body("pi_scoped", 1);
    paddle_body["provider"] = json!("paddle");
    let paddle = token_ids(&json(app.issue(ADMIN_KEY, &paddle_body).await).await);
    assert_eq!(paddle.len(), 1);

    // The same account id at another provider is foreign: 404, as for another account.
    for path in [
        "/v1/issuances/paddle/acct_1/pi_scoped".to_owned(),
        format!("/v1/tokens/{}", paddle[0]),
    ] {
        assert_problem(app.get(STRIPE_ACCT1_KEY, &path).await, 404, "not_found").await;
    }
    let redeem = app.redeem_token(STRIPE_ACCT1_KEY, &paddle[0]).await;
    assert_problem(redeem, 404, "not_found").await;
    assert_eq!(
        app.stored_token(&paddle[0]).await.get_str("status"),
        Ok("active")
    );
    let mut other = issuance_body("pi_scoped_2", 1);
    other["provider"] = json!("paddle");
    assert_problem(app.issue(STRIPE_ACCT1_KEY, &other).await, 403, "forbidden").await;
    assert_eq!(
        app.count("issuances", doc! { "paymentIntentId": "pi_scoped_2" })
            .await,
        0
    );

    // Its own provider's account works, and the listing holds only those tokens.
    let path = "/v1/issuances/stripe/acct_1/pi_scoped";
    assert_eq!(app.get(STRIPE_ACCT1_KEY, path).await.status(), 200);
    let listed = json(app.get(STRIPE_ACCT1_KEY, "/v1/tokens").await).await;
    let listed: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec![stripe[0].as_str()]);
    other["provider"] = json!("stripe");
    assert_eq!(app.issue(STRIPE_ACCT1_KEY, &other).await.status(), 201);

    // A plain entry still means the account at every provider.
    let paddle_path = "/v1/issuances/paddle/acct_1/pi_scoped";
    assert_eq!(app.get(ACCOUNT1_KEY, paddle_path).await.status(), 200);
    let listed = json(app.get(ACCOUNT1_KEY, "/v1/tokens").await).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 3);
}
