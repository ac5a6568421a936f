//! `providers.<name>.accounts`: one secret may sign many accounts' events (a Stripe
//! Connect endpoint signs every connected account's, and each account's holder makes
//! payments there at will), so a provider may list whose events may issue. An event of
//! another account that may issue is answered 200, recorded `ignored` with `detail:
//! "account_not_allowed"` apart from its own id (`#account`), and writes nothing;
//! `default` stands for the provider's own. Withdrawals of any account still apply.

use mongodb::bson::doc;
use serde_json::{Value, json};

use super::{nothing_written, receipt_outcome, recorded};
use crate::helpers::*;
use crate::provider_events::*;

fn stripe_for(accounts: &str) -> String {
    format!(
        "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_NEW}\"]\naccounts = {accounts}\n"
    )
}

/// `event` as sent by `account` (`None`: the platform's own, no `account` field).
fn from(mut event: Value, account: Option<&str>) -> Value {
    match account {
        Some(account) => event["account"] = json!(account),
        None => {
            event.as_object_mut().unwrap().remove("account");
        }
    }
    event
}

const NOT_ALLOWED: (&str, Option<&str>) = ("ignored", Some("account_not_allowed"));

/// `event` is ignored, `account_not_allowed`, recorded as `{id}#account` and not under
/// its own id.
async fn assert_not_allowed(app: &TestApp, event: &Value) {
    let receipt = json(deliver_stripe(app, event).await).await;
    let (outcome, detail) = receipt_outcome(&receipt);
    assert_eq!(
        (outcome.as_str(), detail.as_deref()),
        NOT_ALLOWED,
        "{receipt}"
    );
    let id = event["id"].as_str().unwrap();
    let (outcome, detail) = recorded(app, &format!("{id}#account")).await;
    assert_eq!((outcome.as_str(), detail.as_deref()), NOT_ALLOWED);
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": id }).await,
        0,
        "the event's own id is left free for a resend once the account is listed"
    );
}

#[tokio::test]
async fn a_provider_limited_to_accounts_issues_for_no_other_account() {
    let app = spawn_app_with(&stripe_for(r#"["acct_mine"]"#)).await;
    let succeeded = |id: &str, payment: &str| intent_event(id, "succeeded", payment, now(), "2");
    // A connected account paying itself, and the platform's own payment: neither listed.
    assert_not_allowed(
        &app,
        &from(succeeded("evt_theirs", "pi_x"), Some("acct_theirs")),
    )
    .await;
    assert_not_allowed(&app, &from(succeeded("evt_platform", "pi_p"), None)).await;
    nothing_written(&app).await;

    let mine = from(succeeded("evt_mine", "pi_x"), Some("acct_mine"));
    let receipt = json(deliver_stripe(&app, &mine).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(app.token_indexes("pi_x").await, vec![0, 1]);

    // Another account's refund of a payment id it shares is its own payment's: the
    // listed account's tokens stay.
    let refund = from(
        refund_event("evt_refund_theirs", "pi_x", now()),
        Some("acct_theirs"),
    );
    let receipt = json(deliver_stripe(&app, &refund).await).await;
    assert_ne!(receipt["detail"], "account_not_allowed", "{receipt}");
    assert_eq!(
        app.token_states("pi_x").await,
        vec![(0, "active".to_owned()), (1, "active".to_owned())]
    );
}

/// An account left out keeps its money rule: a payment it made while it could issue (here
/// by a trusted key) gives its tokens back when refunded.
#[tokio::test]
async fn an_account_left_out_still_loses_its_tokens_to_a_refund() {
    let app = spawn_app_with(&stripe_for(r#"["acct_mine"]"#)).await;
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_before", 2))
            .await
            .status(),
        201
    );
    let refund = refund_event("evt_refund_before", "pi_before", now());
    assert_eq!(
        refund["account"], "acct_1",
        "the issuance's account, not listed"
    );
    let receipt = json(deliver_stripe(&app, &refund).await).await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(
        app.token_states("pi_before").await,
        vec![(0, "revoked".to_owned()), (1, "revoked".to_owned())]
    );
}

#[tokio::test]
async fn default_lists_the_providers_own_events() {
    let app = spawn_app_with(&stripe_for(r#"["default"]"#)).await;
    let own = from(
        intent_event("evt_own", "succeeded", "pi_own", now(), "2"),
        None,
    );
    let receipt = json(deliver_stripe(&app, &own).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    let connected = from(
        intent_event("evt_connected", "succeeded", "pi_c", now(), "2"),
        Some("acct_1"),
    );
    assert_not_allowed(&app, &connected).await;
}
