//! Hardening of the webhook endpoint and of the issuance cap: unsigned noise cannot spend
//! a provider's rate limit, failed signatures are limited per remote address and counted
//! per configured provider, and the largest allowed issuance fits in one write.

use mongodb::bson::doc;
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

/// The test providers, a provider named for this file's metrics, and a provider rate
/// limit of 1/s with a burst of 3.
fn providers_with_tight_limits() -> String {
    format!(
        "{PROVIDERS}\n[providers.hardening]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_NEW}\"]\n\n[rate_limit]\nper_key_per_second = 1\nburst = 3\n"
    )
}

async fn unsigned(app: &TestApp, provider: &str) -> reqwest::Response {
    app.http
        .post(app.url(&format!("/v1/webhooks/{provider}")))
        .header("content-type", "application/json")
        .header(
            "stripe-signature",
            format!("t={},v1={}", now(), "ab".repeat(32)),
        )
        .body(r#"{"id":"evt_forged"}"#)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn unsigned_noise_cannot_delay_the_providers_events() {
    let app = spawn_app_with(&providers_with_tight_limits()).await;
    // 40 forged deliveries: refused (401), then limited for this address (429) — and none
    // of them touches the provider's own allowance of 3.
    let mut codes = Vec::new();
    let mut limited = None;
    for _ in 0..40 {
        let response = unsigned(&app, "stripe").await;
        codes.push(response.status().as_u16());
        if response.status() == 429 && limited.is_none() {
            limited = Some(response);
        }
    }
    assert!(codes.iter().all(|c| [401, 429].contains(c)), "{codes:?}");
    assert_eq!(&codes[..20], &[401; 20], "{codes:?}");
    assert!(codes.contains(&429), "failures are limited: {codes:?}");
    let limited = limited.unwrap();
    assert!(limited.headers().contains_key("retry-after"));
    assert_problem(limited, 429, "rate_limited").await;

    // The provider's next correctly signed event goes through at once, and so do the
    // rest of its burst.
    for (i, payment) in ["pi_h1", "pi_h2", "pi_h3"].iter().enumerate() {
        let event = intent_event(&format!("evt_h{i}"), "succeeded", payment, now(), "1");
        let response = deliver_stripe(&app, &event).await;
        assert_eq!(response.status(), 200, "signed event {i}");
        assert_eq!(json(response).await["outcome"], "issued");
    }
    assert_eq!(app.count("tokens", doc! {}).await, 3);
    // Signed deliveries still have the provider's limit.
    let mut signed = Vec::new();
    for i in 0..6 {
        let event = intent_event(&format!("evt_more{i}"), "processing", "pi_more", now(), "1");
        signed.push(deliver_stripe(&app, &event).await.status().as_u16());
    }
    assert!(signed.contains(&429), "{signed:?}");
    // Another provider's allowance is its own.
    assert_eq!(
        send_acme(&app, "msg_h", &acme_event("processing", "pay_h", 1))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn signature_rejections_are_counted_per_configured_provider_only() {
    let app = spawn_app_with(&providers_with_tight_limits()).await;
    for _ in 0..3 {
        assert_eq!(unsigned(&app, "hardening").await.status(), 401);
    }
    for _ in 0..2 {
        let unknown = unsigned(&app, "nosuchprovider-h4rd").await;
        assert_problem(unknown, 404, "not_found").await;
    }
    let text = app.metrics().await;
    let samples: Vec<(&str, f64)> = text
        .lines()
        .filter(|l| l.starts_with("tokenmint_webhook_events_total{"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series, value.parse().ok()?))
        })
        .collect();
    let rejected = samples
        .iter()
        .find(|(s, _)| {
            s.contains("provider=\"hardening\"") && s.contains("outcome=\"signature_rejected\"")
        })
        .unwrap_or_else(|| panic!("no hardening rejection in:\n{text}"));
    assert!(rejected.1 >= 3.0, "{rejected:?}");
    assert!(
        !samples
            .iter()
            .any(|(s, _)| s.contains("provider=\"-\"") && s.contains("signature_rejected")),
        "a signature rejection always names its provider:\n{text}"
    );
    assert!(
        !text.contains("nosuchprovider-h4rd"),
        "an unknown provider's name is never a label value"
    );
}

#[tokio::test]
async fn the_largest_issuance_fits_one_write() {
    // `issuance.max_quantity` at its cap, every id at its longest: the convergent upsert
    // bulk (one `update` command) must stay under MongoDB's 16 MiB command limit.
    let app = spawn_app_with("[issuance]\nmax_quantity = 10000\n").await;
    let body = json!({
        "provider": format!("p{}", "r".repeat(31)),
        "accountId": "a".repeat(64),
        "paymentIntentId": "p".repeat(128),
        "owner": OWNER,
        "tokenType": format!("t{}", "y".repeat(63)),
        "quantity": 10_000,
    });
    let created = app.issue(ADMIN_KEY, &body).await;
    assert_eq!(created.status(), 201);
    assert_eq!(token_ids(&json(created).await).len(), 10_000);
    assert_eq!(app.count("tokens", doc! {}).await, 10_000);
    let mut over = body.clone();
    over["paymentIntentId"] = json!("pi_over");
    over["quantity"] = json!(10_001);
    assert_problem(app.issue(ADMIN_KEY, &over).await, 422, "validation_failed").await;
}
