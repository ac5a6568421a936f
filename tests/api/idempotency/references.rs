//! A redeem retried with the same non-empty `reference` is a replay of the first.

use serde_json::json;

use super::{post, seen};
use crate::helpers::*;

#[tokio::test]
async fn a_redeem_retried_with_its_reference_is_a_replay_and_writes_nothing() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_ref_replay", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    let body = json!({ "reference": "order-7" });

    let first = seen(post(&app, ADMIN_KEY, &path, None, Some("\"0\""), Some(&body)).await).await;
    assert_eq!(first.status, 200);
    assert!(!first.replayed);
    let stored = app.stored_token(&id).await;

    // The same retry without If-Match, and with the If-Match of the first attempt (now
    // stale): both are the first attempt again, never a 412 or a 409.
    for if_match in [None, Some("\"0\""), Some("*")] {
        let retry = seen(post(&app, ADMIN_KEY, &path, None, if_match, Some(&body)).await).await;
        assert_eq!(retry.status, 200, "{if_match:?}");
        assert!(retry.replayed, "{if_match:?}");
        assert_eq!(retry.body, first.body, "{if_match:?}");
        assert_eq!(retry.etag, first.etag);
    }
    assert_eq!(
        app.stored_token(&id).await,
        stored,
        "a replay writes nothing"
    );

    // Another reference, or none, is somebody else's redeem.
    for other in [
        json!({ "reference": "order-8" }),
        json!({}),
        json!({ "reference": "" }),
    ] {
        let response = post(&app, ADMIN_KEY, &path, None, None, Some(&other)).await;
        let problem = assert_problem(response, 409, "state_conflict").await;
        assert_eq!(problem["currentStatus"], "redeemed", "{other}");
    }
    assert_eq!(app.stored_token(&id).await, stored);
}
