//! Readiness says whether writes can succeed, not only whether MongoDB answers: an
//! instance connected to one member directly (`directConnection=true`), whose member
//! steps down, still has its `ping` answered, but every write refused. It reports not
//! ready until that member is primary again, and `tokenmint_mongodb_up` stays 1 (the
//! database answers; it is readiness that it cannot take writes).

use std::time::{Duration, Instant};

use serde_json::Value;
use tokenmint_test_support::{TestApp, spawn_app_from, test_settings_at};

use super::ONE_AT_A_TIME;
use super::replica_set::ReplicaSet;

/// `/readyz` as (status, reason).
async fn readiness(app: &TestApp) -> (u16, String) {
    let response = app.http.get(app.url("/readyz")).send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (
        status,
        body["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Polls `/readyz` until its status is `want`, for at most `within`.
async fn until_readiness(app: &TestApp, want: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (status, reason) = readiness(app).await;
        if status == want {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} ({reason}) after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    let set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let app = spawn_app_from(&test_settings_at(
        &set.direct_uri(primary),
        "readiness",
        "[mongo]\nserver_selection_timeout_ms = 2000\n",
    ))
    .await;
    until_readiness(&app, 200, Duration::from_secs(5)).await;

    // Stepped down for 10 s: the member answers, as a secondary.
    set.step_down(primary).await;
    let reason = until_readiness(&app, 503, Duration::from_secs(8)).await;
    assert!(reason.contains("not writable"), "{reason}");
    let metrics = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|line| line == "tokenmint_mongodb_up 1"),
        "the database answers: {metrics}"
    );

    // Member 0 (priority 2, the first primary) takes over again once its 10 s are over;
    // the instance is ready again, with no restart.
    let deadline = Instant::now() + Duration::from_secs(60);
    while set.primary().await != Some(primary) {
        assert!(
            Instant::now() < deadline,
            "member {primary} never primary again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    until_readiness(&app, 200, Duration::from_secs(10)).await;
}
