//! A redeem retried with the same non-empty `reference` is a replay of the first.

use serde_json::json;

use super::{post, seen};
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe, dispute, intent_event};

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

/// A revoke or transfer retried with its first attempt's `If-Match` (stale since that
/// attempt) finds its change made: answered 200 with the token as it is, nothing
/// written, as the first attempt was. A change not made (another owner, a token a
/// withdrawal revoked, which an operator's revoke would make its own) stays a 412.
#[tokio::test]
async fn a_revoke_or_transfer_retried_with_its_if_match_is_answered_as_the_first() {
    let app = spawn_app_with(PROVIDERS).await;
    let ids = app.issue_tokens("pi_if_match_retry", 2).await;
    let (revoked, moved) = (&ids[0], &ids[1]);
    let revoke = format!("/v1/tokens/{revoked}/revoke");
    let transfer = format!("/v1/tokens/{moved}/transfer");
    let to_other = json!({ "newOwner": OTHER_OWNER });

    let first_revoke = seen(post(&app, ADMIN_KEY, &revoke, None, Some("\"0\""), None).await).await;
    let first_transfer = seen(
        post(
            &app,
            ADMIN_KEY,
            &transfer,
            None,
            Some("\"0\""),
            Some(&to_other),
        )
        .await,
    )
    .await;
    assert_eq!((first_revoke.status, first_transfer.status), (200, 200));
    let stored = (
        app.stored_token(revoked).await,
        app.stored_token(moved).await,
    );
    assert_eq!(stored_int(&stored.0, "_version"), Some(1));
    assert_eq!(stored_int(&stored.1, "_version"), Some(1));

    // The lone tag (the gate's own check) and a list (checked on the token as read).
    for if_match in ["\"0\"", "W/\"0\", \"0\""] {
        let retry = seen(post(&app, ADMIN_KEY, &revoke, None, Some(if_match), None).await).await;
        assert_eq!(retry.status, 200, "revoke {if_match}");
        assert_eq!(retry.body, first_revoke.body, "revoke {if_match}");
        assert_eq!(retry.etag, first_revoke.etag);
        let retry = seen(
            post(
                &app,
                ADMIN_KEY,
                &transfer,
                None,
                Some(if_match),
                Some(&to_other),
            )
            .await,
        )
        .await;
        assert_eq!(retry.status, 200, "transfer {if_match}");
        assert_eq!(retry.body, first_transfer.body, "transfer {if_match}");
    }
    assert_eq!(
        (
            app.stored_token(revoked).await,
            app.stored_token(moved).await
        ),
        stored,
        "a retry writes nothing"
    );

    // Another key's retry of the same change under the old tag is no retry of its own:
    // 412, whatever the token shows (a key may not learn a token's state by guessing).
    let response = post(&app, ACCOUNT1_KEY, &revoke, None, Some("\"0\""), None).await;
    assert_problem(response, 412, "version_conflict").await;
    // A tag the token has not reached is a read behind, not a retry: 412.
    let response = post(&app, ADMIN_KEY, &revoke, None, Some("\"5\""), None).await;
    assert_problem(response, 412, "version_conflict").await;
    let response = post(&app, ADMIN_KEY, &revoke, None, Some("\"0\", \"5\""), None).await;
    assert_problem(response, 412, "version_conflict").await;
    // Under an Idempotency-Key the answer is kept like any other, and replayed.
    let revoke_keyed = || async {
        let key = Some("k-revoke-again");
        seen(post(&app, ADMIN_KEY, &revoke, key, Some("\"0\""), None).await).await
    };
    let keyed = revoke_keyed().await;
    assert_eq!((keyed.status, keyed.replayed), (200, false));
    let replayed = revoke_keyed().await;
    assert_eq!((replayed.status, replayed.replayed), (200, true));
    assert_eq!(replayed.body, keyed.body);
    assert_eq!(app.stored_token(revoked).await, stored.0, "nothing written");

    // A transfer to someone else under the old tag is not what was done: 412.
    let elsewhere = json!({ "newOwner": OWNER });
    let response = post(
        &app,
        ADMIN_KEY,
        &transfer,
        None,
        Some("\"0\""),
        Some(&elsewhere),
    )
    .await;
    let problem = assert_problem(response, 412, "version_conflict").await;
    assert_eq!(problem["currentVersion"], 1);
    assert_eq!(app.stored_token(moved).await, stored.1);

    // A token a withdrawal revoked: an operator's revoke under an old tag would make the
    // revocation theirs, which it is not yet: 412, nothing written.
    stripe(
        &app,
        &intent_event("evt_paid", "succeeded", "pi_withdrawn", PAID_AT, "4"),
    )
    .await;
    // The dispute's 500 takes back the last of four tokens.
    let withdrawn = app.stored_token_ids("pi_withdrawn").await.remove(3);
    stripe(
        &app,
        &dispute(
            "evt_dw",
            "funds_withdrawn",
            "pi_withdrawn",
            500,
            PAID_AT + 10,
        ),
    )
    .await;
    let before = app.stored_token(&withdrawn).await;
    assert_eq!(before.get_str("status").unwrap(), "revoked", "{before}");
    let path = format!("/v1/tokens/{withdrawn}/revoke");
    let response = post(&app, ADMIN_KEY, &path, None, Some("\"0\""), None).await;
    assert_problem(response, 412, "version_conflict").await;
    assert_eq!(app.stored_token(&withdrawn).await, before);
}

const PAID_AT: i64 = 1_780_000_000;

async fn stripe(app: &TestApp, event: &serde_json::Value) {
    assert_eq!(deliver_stripe(app, event).await.status(), 200);
}
