//! The audit trail: every write names who caused it. An issuance record keeps the API
//! key (or provider) that created it as `requestedBy`; a token keeps the author of its last
//! change as `lastChangedBy` — the key that redeemed, revoked or transferred it, or the
//! provider whose refund took it back — in the database and in its answer.

use mongodb::bson::{Document, doc};

use crate::helpers::*;
use crate::provider_events::*;

async fn record(app: &TestApp, payment: &str) -> Document {
    app.db
        .collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no issuance record for {payment}"))
}

fn changed_by(token: &Document) -> Option<&str> {
    token.get_str("lastChangedBy").ok()
}

#[tokio::test]
async fn issuance_records_name_the_key_or_provider_that_created_them() {
    let app = app().await;
    // A trusted backend key.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_audit_writer", 1))
            .await
            .status(),
        201
    );
    // A checkout key's pending request.
    assert_eq!(
        app.issue(REQUEST_KEY, &issuance_body("pi_audit_checkout", 1))
            .await
            .status(),
        202
    );
    // The provider's success event, with no request before it.
    let paid = intent_event(
        "evt_audit_paid",
        "succeeded",
        "pi_audit_webhook",
        now(),
        "2",
    );
    assert_eq!(deliver_stripe(&app, &paid).await.status(), 200);

    for (payment, author) in [
        ("pi_audit_writer", "key:writer"),
        ("pi_audit_checkout", "key:checkout"),
        ("pi_audit_webhook", "provider:stripe"),
    ] {
        assert_eq!(
            record(&app, payment).await.get_str("requestedBy"),
            Ok(author),
            "{payment}"
        );
    }
    // Fresh tokens have not changed yet: no author of a change.
    let tokens = app.tokens_of("pi_audit_webhook").await;
    assert_eq!(tokens.len(), 2);
    assert!(tokens.iter().all(|t| changed_by(t).is_none()), "{tokens:?}");
}

#[tokio::test]
async fn token_changes_name_the_key_that_made_them_and_refunds_the_provider() {
    let app = app().await;
    let created = json(
        app.issue(WRITER_KEY, &issuance_body("pi_audit_tokens", 3))
            .await,
    )
    .await;
    let ids = token_ids(&created);

    let redeemed = app.redeem_token(ACCOUNT1_KEY, &ids[0]).await;
    assert_eq!(redeemed.status(), 200);
    assert_eq!(json(redeemed).await["lastChangedBy"], "key:acct1");

    let transferred = app.transfer_token(ADMIN_KEY, &ids[1], 0, OTHER_OWNER).await;
    assert_eq!(transferred.status(), 200);
    assert_eq!(json(transferred).await["lastChangedBy"], "key:admin");
    let stored = app.tokens_of("pi_audit_tokens").await;
    assert_eq!(changed_by(&stored[1]), Some("key:admin"), "{:?}", stored[1]);

    // The provider refunds the payment: the still active tokens are revoked on its word.
    let refund = refund_event("evt_audit_refund", "pi_audit_tokens", now());
    assert_eq!(deliver_stripe(&app, &refund).await.status(), 200);

    let authors: Vec<(i64, String, Option<String>)> = app
        .tokens_of("pi_audit_tokens")
        .await
        .iter()
        .map(|t| {
            (
                token_index(t),
                t.get_str("status").unwrap().to_owned(),
                changed_by(t).map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        authors,
        vec![
            (0, "redeemed".to_owned(), Some("key:acct1".to_owned())),
            (1, "revoked".to_owned(), Some("provider:stripe".to_owned())),
            (2, "revoked".to_owned(), Some("provider:stripe".to_owned())),
        ]
    );
    // The answer shows it too.
    let read = json(app.get(ADMIN_KEY, &format!("/v1/tokens/{}", ids[2])).await).await;
    assert_eq!(read["lastChangedBy"], "provider:stripe", "{read}");
}

/// The request's log lines carry the API key id (never the key) from authentication on:
/// read from the real binary's log (the span's fields open each line it writes).
#[tokio::test]
async fn request_log_lines_carry_the_api_key_id() {
    let scratch = ScratchDatabase::create("audit_log").await;
    let service = Service::start(scratch.name());
    let response = reqwest::Client::new()
        .post(format!("{}/v1/issuances", service.base))
        .bearer_auth(SERVICE_KEY)
        .header("x-request-id", "audit-log-1")
        .json(&issuance_body("pi_audit_log", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);

    // The child wrote the line before answering, but the harness reads its stderr on
    // another thread: wait (bounded) for the line to arrive.
    let is_access_line =
        |line: &&str| line.contains("request_id=audit-log-1") && line.contains("request completed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut log = service.recent_log();
    while !log.lines().any(|line| is_access_line(&line)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        log = service.recent_log();
    }
    let completed: Vec<&str> = log.lines().filter(is_access_line).collect();
    assert_eq!(completed.len(), 1, "the request's access log line:\n{log}");
    assert!(
        completed[0].contains(r#"key_id="service""#),
        "{}",
        completed[0]
    );
    assert!(
        !log.contains(SERVICE_KEY),
        "the key itself was logged:\n{log}"
    );
}
