//! The public checkout key (only `issuances:request`): anyone can copy it from a checkout
//! page, so its requests are limited per client address, not per key. Two clients bound
//! to different loopback addresses (on Linux all of 127.0.0.0/8 reaches the server on
//! 127.0.0.1) stand for an abuser and a shopper.
//!
//! No assertion depends on timing: the buckets hold 2 and refill 1 a second, the first
//! two requests of a fresh bucket are always admitted, and an abuser sends until it is
//! refused rather than a fixed number of requests.

use std::net::IpAddr;
use std::time::Duration;

use mongodb::bson::doc;

use crate::helpers::*;
use crate::provider_events::PROVIDERS;

/// Two requests per address, then one a second.
const LIMITS: &str = "[rate_limit]\nper_address_per_second = 1\nper_address_burst = 2\n";
const POLICY: &str = "\"address\";q=2;w=2";

/// An HTTP client whose connections come from `address`.
fn client_from(address: &str) -> reqwest::Client {
    tokenmint_test_support::http_client_builder()
        .local_address(address.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A checkout's request for `payment` from `http`, with `X-Forwarded-For: forwarded`.
async fn checkout(
    app: &TestApp,
    http: &reqwest::Client,
    payment: &str,
    forwarded: Option<&str>,
) -> reqwest::Response {
    let mut request = http
        .post(app.url("/v1/issuances"))
        .bearer_auth(REQUEST_KEY)
        .json(&issuance_body(payment, 1));
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    request.send().await.expect("answered")
}

/// Checkout requests for made-up payments `{prefix}_<i>` from `http` until one is
/// refused; the `i`-th sends `X-Forwarded-For: forwarded(i)`. Asserts that the bucket's
/// two were admitted (202, a pending record each) before the refusal, and returns the
/// 429 and how many were admitted.
async fn exhaust(
    app: &TestApp,
    http: &reqwest::Client,
    prefix: &str,
    forwarded: impl Fn(usize) -> Option<String>,
) -> (reqwest::Response, usize) {
    for i in 0..100 {
        let answer = checkout(app, http, &format!("{prefix}_{i}"), forwarded(i).as_deref()).await;
        if answer.status() == 429 {
            assert!(i >= 2, "refused after {i}: a fresh bucket admits 2");
            let refused = doc! { "paymentIntentId": format!("{prefix}_{i}") };
            assert_eq!(
                app.count("issuances", refused).await,
                0,
                "a 429 writes nothing"
            );
            return (answer, i);
        }
        assert_eq!(answer.status(), 202, "request {i}");
    }
    panic!("100 requests from one address and never refused");
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Asserts a 429 of the address limit with its headers.
async fn assert_address_limited(refused: reqwest::Response) {
    let retry_after: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(header(&refused, "ratelimit-policy"), Some(POLICY));
    let current = header(&refused, "ratelimit").unwrap().to_owned();
    assert!(current.starts_with("\"address\";r=0;t="), "{current}");
    assert_problem(refused, 429, "rate_limited").await;
}

async fn pending_records(app: &TestApp, prefix: &str) -> u64 {
    let filter =
        doc! { "paymentIntentId": { "$regex": format!("^{prefix}_") }, "status": "pending" };
    app.count("issuances", filter).await
}

fn address_limited_total(metrics: &str) -> f64 {
    metric_value(metrics, "tokenmint_rate_limited_total{limiter=\"address\"}").unwrap_or(0.0)
}

#[tokio::test]
async fn one_abuser_exhausts_its_address_and_the_shopper_next_door_is_served() {
    let app = spawn_app_with(&format!("{PROVIDERS}\n{LIMITS}")).await;
    let limited_before = address_limited_total(&app.metrics().await);
    let abuser = client_from("127.0.0.2");

    let (refused, admitted) = exhaust(&app, &abuser, "pi_abuse", |_| None).await;
    assert_address_limited(refused).await;
    // What the flood left: one pending record per admitted request, no more.
    assert_eq!(pending_records(&app, "pi_abuse").await, admitted as u64);

    // The shopper's address has its own, full allowance.
    let shopper = client_from("127.0.0.3");
    let answer = checkout(&app, &shopper, "pi_shopper", None).await;
    assert_eq!(answer.status(), 202);
    assert_eq!(header(&answer, "ratelimit-policy"), Some(POLICY));
    assert_eq!(header(&answer, "ratelimit"), Some("\"address\";r=1;t=1"));
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": "pi_shopper" })
        .await;
    assert_eq!(record.get_str("status").unwrap(), "pending");

    // A trusted key from the abuser's address keeps its per-key bucket.
    let trusted = abuser
        .post(app.url("/v1/issuances"))
        .bearer_auth(WRITER_KEY)
        .json(&issuance_body("pi_backend", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(trusted.status(), 201);
    assert!(
        !header(&trusted, "ratelimit-policy")
            .unwrap()
            .contains("address"),
        "counted by its key"
    );
    assert_eq!(app.token_indexes("pi_backend").await, vec![0]);

    let limited_after = address_limited_total(&app.metrics().await);
    assert!(
        limited_after >= limited_before + 1.0,
        "{limited_before} → {limited_after}"
    );
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_only_from_a_trusted_proxy() {
    let app = spawn_app_with(&format!(
        "{PROVIDERS}\n{LIMITS}\n[server]\ntrusted_proxies = [\"127.0.0.2\"]\n"
    ))
    .await;
    let proxy = client_from("127.0.0.2");

    // Behind the proxy, one client exhausts its own allowance, though it writes another
    // made-up address left of its own each time (were any believed, none would be
    // refused).
    let (refused, _) = exhaust(&app, &proxy, "pi_behind", |i| {
        Some(format!("203.0.113.{i}, 198.51.100.7"))
    })
    .await;
    assert_address_limited(refused).await;
    // Another client behind the same proxy is served, from a full allowance.
    let other = checkout(&app, &proxy, "pi_other", Some("198.51.100.8")).await;
    assert_eq!(other.status(), 202);
    assert_eq!(header(&other, "ratelimit"), Some("\"address\";r=1;t=1"));

    // An IPv6 client counts by its /64: a new address of it per request is no fresh
    // allowance; the next /64 is another client.
    let (refused, _) = exhaust(&app, &proxy, "pi_v6", |i| {
        Some(format!("2001:db8:1:2:{i:x}::1"))
    })
    .await;
    assert_address_limited(refused).await;
    let next_net = checkout(&app, &proxy, "pi_v6_next", Some("2001:db8:1:3::1")).await;
    assert_eq!(next_net.status(), 202);

    // From an untrusted peer the header is ignored: a new made-up address per request
    // still spends the peer's one allowance.
    let untrusted = client_from("127.0.0.3");
    let (refused, _) = exhaust(&app, &untrusted, "pi_direct", |i| {
        Some(format!("192.0.2.{i}"))
    })
    .await;
    assert_address_limited(refused).await;
}
