//! `If-Match` is compared strongly (RFC 9110): a weak tag never matches, a list matches
//! when any entry does, `*` matches any version of an existing token, and a malformed
//! header is 422 before anything is read.

use serde_json::{Value, json};

use super::header;
use crate::helpers::*;

/// Asks for `operation` on token `id` as the admin, with these `If-Match` headers.
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

/// A stored token's (status, version).
async fn stored(app: &TestApp, id: &str) -> (String, i64) {
    let token = app.stored_token(id).await;
    let version = stored_int(&token, "_version").expect("a _version");
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
    let id = app.issue_tokens("pi_if_match", 1).await.remove(0);

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
    // The token is the new owner's now: the same transfer again, under a list naming its
    // version or its first attempt's, and under `*` (a transfer needs If-Match: `*` is
    // one), is done already: 200, nothing written.
    for if_match in [&["\"0\"", "\"1\""][..], &["\"0\""], &["*"]] {
        let moved = change(&app, &id, "transfer", if_match).await;
        assert_applied(moved, 1).await;
    }
    assert_eq!(stored(&app, &id).await, ("active".to_owned(), 1));
    // `*` matches whatever version the token is at.
    let redeemed = change(&app, &id, "redeem", &[" * "]).await;
    assert_eq!(assert_applied(redeemed, 2).await["status"], "redeemed");
    // `*` is a precondition, not a way around the state rules.
    let again = change(&app, &id, "redeem", &["*"]).await;
    assert_eq!(
        assert_problem(again, 409, "state_conflict").await["currentStatus"],
        "redeemed"
    );
    // A stale list is 412 like a stale tag.
    let stale = change(&app, &id, "revoke", &["\"0\", \"1\", \"3\""]).await;
    assert_eq!(
        assert_problem(stale, 412, "version_conflict").await["currentVersion"],
        2
    );
    assert_eq!(stored(&app, &id).await, ("redeemed".to_owned(), 2));

    // `*` does not conjure a token: an absent one is 404, as without If-Match.
    let absent = change(&app, "65f1a0c2b3d4e5f60123ffff", "redeem", &["*"]).await;
    assert_problem(absent, 404, "not_found").await;
    let absent = change(&app, "65f1a0c2b3d4e5f60123ffff", "revoke", &["W/\"0\""]).await;
    assert_problem(absent, 404, "not_found").await;

    // Malformed: 422 naming If-Match, before anything is read.
    let other = app.issue_tokens("pi_if_match_bad", 1).await.remove(0);
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
