//! Operational behaviour: CORS, rate limits, graceful shutdown, injection attempts.

use std::time::Duration;

use mongodb::bson::doc;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

#[tokio::test]
async fn cors_allows_only_configured_origins() {
    let app = spawn_app_with("[server]\ncors_origins = [\"https://shop.example\"]\n").await;
    let preflight = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/v1/issuances"))
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, if-match, prefer, x-request-id",
        )
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success());
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    assert!(
        preflight
            .headers()
            .get("access-control-allow-credentials")
            .is_none()
    );
    let methods = preflight.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(methods.contains("POST"), "{methods}");
    // A browser may ask to wait (`Prefer`) and read what was applied.
    let allowed = preflight.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for header in [
        "authorization",
        "content-type",
        "if-match",
        "prefer",
        "x-request-id",
    ] {
        assert!(allowed.contains(header), "{header} not allowed: {allowed}");
    }

    let refused = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/v1/issuances"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    let simple = app
        .http
        .get(app.url("/healthz"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(
        simple
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    let allowed = app
        .http
        .get(app.url("/healthz"))
        .header("origin", "https://shop.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    // What a checkout reads of an answer: its version, where it is, whether it was a
    // replay and whether it waited.
    let exposed = allowed.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for header in [
        "etag",
        "location",
        "idempotent-replayed",
        "preference-applied",
        "ratelimit-policy",
        "ratelimit",
    ] {
        assert!(exposed.contains(header), "{header} not exposed: {exposed}");
    }
}

#[tokio::test]
async fn a_key_over_its_rate_gets_429_with_retry_after() {
    let app = spawn_app_with("[rate_limit]\nper_key_per_second = 1\nburst = 3\n").await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(app.get(READER_KEY, "/v1/tokens").await);
    }
    let codes: Vec<u16> = statuses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(&codes[..3], &[200, 200, 200], "{codes:?}");
    assert!(codes[3..].contains(&429), "{codes:?}");
    let limited = statuses.into_iter().find(|r| r.status() == 429).unwrap();
    let retry_after: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after));
    assert_eq!(limited.headers()["ratelimit-policy"], "\"key\";q=3;w=3");
    let current = limited.headers()["ratelimit"].to_str().unwrap();
    assert!(current.starts_with("\"key\";r=0;t="), "{current}");
    assert_problem(limited, 429, "rate_limited").await;
    // Another key has its own allowance.
    assert_eq!(app.get(ADMIN_KEY, "/v1/tokens").await.status(), 200);
}

#[tokio::test]
async fn injection_attempts_are_rejected_before_any_query() {
    let app = spawn_app().await;
    let attempts = [
        ("owner", json!({"$gt": ""})),
        ("tokenType", json!("$where")),
        ("paymentIntentId", json!({"$ne": null})),
        ("paymentIntentId", json!("a b")),
        ("provider", json!("a.b")),
        ("accountId", json!("$gt")),
    ];
    for (field, value) in attempts {
        let mut body = issuance_body("pi_inject", 1);
        body[field] = value.clone();
        let problem =
            assert_problem(app.issue(ADMIN_KEY, &body).await, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["field"], field, "{value}");
    }
    assert_problem(
        app.get(ADMIN_KEY, "/v1/tokens?owner[$gt]=").await,
        422,
        "validation_failed",
    )
    .await;
    assert_problem(
        app.get(ADMIN_KEY, "/v1/tokens?tokenType=$where").await,
        422,
        "validation_failed",
    )
    .await;
    assert_problem(
        app.get(ADMIN_KEY, "/v1/issuances/stripe/$gt/pi_1").await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(app.count("issuances", doc! {}).await, 0);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn an_in_flight_request_completes_after_shutdown_begins() {
    use tokenmint::startup::Application;
    let db_name = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    let settings = test_settings(&db_name, "");
    let app = Application::build(&settings).await.unwrap();
    let address = app.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));

    // Start a request and send only half of its body.
    let body = issuance_body("pi_graceful", 2).to_string();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // SIGTERM's equivalent: shutdown begins while the request is in flight.
    stop_tx.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // New connections are no longer served.
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        reqwest::get(format!("http://{address}/healthz")),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(ref r)) if r.status().is_success()),
        "served a new request after shutdown began"
    );

    stream.write_all(rest.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let client = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
    let db = client.database(&db_name);
    assert_eq!(
        db.collection::<mongodb::bson::Document>("tokens")
            .count_documents(doc! {})
            .await
            .unwrap(),
        2
    );
    db.drop().await.unwrap();
}

/// The `tokenmint_http_requests_total` series whose method is not a standard one.
fn made_up_method_series(metrics: &str) -> Vec<String> {
    const STANDARD: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    metrics
        .lines()
        .filter(|line| line.starts_with("tokenmint_http_requests_total{"))
        .filter(|line| {
            !STANDARD
                .iter()
                .any(|m| line.contains(&format!("method=\"{m}\"")))
        })
        .map(|line| {
            line.rsplit_once(' ')
                .map_or(line, |(series, _)| series)
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn made_up_methods_share_one_other_series_and_metrics_stay_small() {
    let app = spawn_app().await;
    let metrics_before = app.metrics().await;
    let before = made_up_method_series(&metrics_before);
    // A 200 KB token (hyper accepts it: it fits its header buffer) and several others,
    // each of which used to become a label value kept forever.
    let huge = format!("ZZPROBE{}", "X".repeat(200 * 1024));
    let mut methods = vec![huge];
    methods.extend((0..5).map(|i| format!("ZZPROBE{i}")));
    for method in &methods {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = app
            .http
            .request(method, app.url("/healthz"))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_client_error(), "{}", response.status());
    }
    let metrics = app.metrics().await;
    assert!(
        !metrics.contains("ZZPROBE"),
        "a made-up method became a label"
    );
    let after = made_up_method_series(&metrics);
    assert!(!after.is_empty(), "the made-up methods were counted");
    assert!(
        after.iter().all(|s| s.contains("method=\"other\"")),
        "{after:?}"
    );
    let added: Vec<_> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(added.len() <= 1, "{added:?}");
    assert!(
        metrics.lines().all(|line| line.len() < 1024),
        "a /metrics line grew with the request"
    );
    // Every app of this test binary records into the one recorder, and the other tests
    // add their series meanwhile: small means grown far less than one 200 KB label would
    // have grown it, not an exact size.
    assert!(
        metrics.len() < metrics_before.len() + 100 * 1024,
        "/metrics grew from {} to {} bytes",
        metrics_before.len(),
        metrics.len()
    );
}

/// A path that is no route is counted too, under the one route value `unmatched` (never
/// the raw path): scans of made-up paths show in the request metrics without adding a
/// series per path.
#[tokio::test]
async fn requests_for_no_route_are_counted_as_unmatched() {
    let app = spawn_app().await;
    let path = format!("/zz-scan-{}", uuid::Uuid::new_v4().simple());
    let unmatched = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("tokenmint_http_requests_total{")
                    && l.contains("route=\"unmatched\"")
                    && l.contains("status=\"404\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = unmatched(&app.metrics().await);
    for _ in 0..3 {
        let response = app.http.get(app.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 404);
    }
    let metrics = app.metrics().await;
    assert!(
        unmatched(&metrics) >= before + 3.0,
        "{before} → {}",
        unmatched(&metrics)
    );
    assert!(!metrics.contains("zz-scan-"), "the raw path became a label");
}

/// `/readyz` needs no key, so anyone may call it in bursts: while the service is ready,
/// a burst costs the database one check a second, not one per call.
#[tokio::test]
async fn a_burst_of_readiness_calls_costs_the_database_one_check_a_second() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    // Holds each read of the applied migations (one per check) up for 1 ms, to count them.
    let migrations = format!("{}._migrations", app.db_name);
    let counter =
        FailPoint::always_on(&name, &["find"], &migrations, Fault::Block { millis: 1 }).await;
    let started = std::time::Instant::now();
    let calls = (0..50).map(|_| async {
        let response = app.http.get(app.url("/readyz")).send().await.unwrap();
        response.status().as_u16()
    });
    let statuses = futures::future::join_all(calls).await;
    let took = started.elapsed();
    let checks = counter.off().await;
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    // One check per second begun, and the one a call at a second's edge may start.
    let allowed = took.as_secs() as i64 + 2;
    assert!(
        (1..=allowed).contains(&checks),
        "{checks} checks of the database for 50 calls in {took:?}"
    );
}

/// A "not ready" is never kept: the call after it checks again, so a database back from
/// a fault is seen at once.
#[tokio::test]
async fn a_readiness_check_that_failed_is_not_repeated_to_the_next_call() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let migrations = format!("{}._migrations", app.db_name);
    let fault = FailPoint::set_on(&name, &["find"], &migrations, Fault::error(2), 1).await;
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        json(response).await["reason"],
        "cannot read applied migrations"
    );
    assert_eq!(fault.off().await, 1);
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
}

/// A check stuck on the database (a connection that no longer answers) holds the calls
/// behind it no longer than the check's bound: they are answered not ready together.
#[tokio::test]
async fn a_readiness_check_that_hangs_answers_the_calls_behind_it_within_its_bound() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let migrations = format!("{}._migrations", app.db_name);
    let hang = FailPoint::set_on(
        &name,
        &["find"],
        &migrations,
        Fault::Block { millis: 6_000 },
        1,
    )
    .await;
    let call = || async {
        let response = app.http.get(app.url("/readyz")).send().await.unwrap();
        (response.status().as_u16(), json(response).await)
    };
    let started = std::time::Instant::now();
    let (first, second) = tokio::join!(call(), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        call().await
    });
    let took = started.elapsed();
    assert_eq!(hang.off().await, 1, "the check never reached the database");
    for (status, body) in [first, second] {
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["reason"], "database did not answer in time");
    }
    assert!(took < Duration::from_secs(4), "answered after {took:?}");
}
