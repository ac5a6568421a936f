//! Money that comes back to tokens that changed hands: a token is taken back and given
//! back by its tokenIndex, whoever holds it, so it comes back to its holder, and the
//! holder's balance follows; an operator's revoke in between outlasts the money.

use serde_json::Value;

use super::{
    app, half_reinstated, half_withdrawn, operator_revoke, paid, state, stripe, verify_clean,
};
use crate::helpers::*;

/// `owner`'s balance of `standard` tokens: (active, revoked).
async fn balance(app: &TestApp, owner: &str) -> (i64, i64) {
    let response = app
        .get(
            ADMIN_KEY,
            &format!("/v1/balances/{owner}?tokenType=standard"),
        )
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = json(response).await;
    let standard = &body["balances"][0];
    (
        standard["active"].as_i64().unwrap_or(0),
        standard["revoked"].as_i64().unwrap_or(0),
    )
}

#[tokio::test]
async fn a_transferred_token_taken_back_and_given_back_stays_with_its_holder() {
    let app = app().await;
    let ids = paid(&app, "pi_held", "4").await;
    let transfer = app.transfer_token(ADMIN_KEY, &ids[3], 0, OTHER_OWNER).await;
    assert_eq!(transfer.status(), 200);
    assert_eq!(balance(&app, OTHER_OWNER).await, (1, 0));

    // Half disputed: tokens 2 and 3 taken back, token 3 from its new holder.
    stripe(&app, &half_withdrawn("pi_held")).await;
    assert_eq!(state(&app, &ids[3]).await, ("revoked".to_owned(), 2));
    assert_eq!(balance(&app, OTHER_OWNER).await, (0, 1));
    assert_eq!(balance(&app, OWNER).await, (2, 1));
    // The operator revokes token 2 meanwhile: it is theirs now.
    assert_eq!(operator_revoke(&app, &ids[2], "fraud").await.status(), 200);

    // The dispute won: token 3 is active again, still its holder's; token 2 stays
    // revoked.
    stripe(&app, &half_reinstated("pi_held")).await;
    assert_eq!(state(&app, &ids[3]).await, ("active".to_owned(), 3));
    let token = app.stored_token(&ids[3]).await;
    assert_eq!(
        token.get_object_id("owner").unwrap().to_hex(),
        OTHER_OWNER,
        "{token}"
    );
    assert_eq!(state(&app, &ids[2]).await.0, "revoked");
    assert_eq!(balance(&app, OTHER_OWNER).await, (1, 0));
    assert_eq!(balance(&app, OWNER).await, (2, 1));
    verify_clean(&app).await;
}
