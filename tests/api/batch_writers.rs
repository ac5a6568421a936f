//! Group commit's writer tasks belong to the application: stopping them answers every
//! issuance queued before, in both modes, and ends them; an issuance after that is
//! refused rather than queued for writers that are gone.

use futures::future::join_all;
use mongodb::bson::doc;
use tokenmint::domain::{IssuanceMode, NewIssuance};
use tokenmint::issuing::{Caller, IssueError, IssueOutcome, Issuer};

use crate::helpers::*;

/// An issuance of `quantity` tokens for `payment` in `mode`.
fn issuance(payment: &str, quantity: i64, mode: IssuanceMode) -> NewIssuance {
    NewIssuance {
        mode,
        ..atomic_issuance(payment, quantity)
    }
}

/// A test app (its database, migrated), and an issuer of its own on that database, as
/// the application builds it.
async fn app_and_issuer() -> (TestApp, Issuer) {
    let app = spawn_app().await;
    let settings = test_settings(&app.db_name, "");
    let store = connect_store(&mongo_uri(), &app.db_name).await;
    (app, tokenmint::startup::issuer(&settings, store))
}

#[tokio::test]
async fn stopping_the_writers_answers_what_was_queued_then_ends_them() {
    let (app, issuer) = app_and_issuer().await;
    let requests: Vec<NewIssuance> = (0..6)
        .map(|i| {
            let mode = if i % 2 == 0 {
                IssuanceMode::Upsert
            } else {
                IssuanceMode::Atomic
            };
            issuance(&format!("pi_writers_{i}"), 3, mode)
        })
        .collect();
    let issuing = join_all(requests.iter().map(|r| issuer.issue(Caller::Trusted, r)));
    tokio::pin!(issuing);
    // One poll queues every request (the queue has room) and no answer can come yet:
    // the writers, on this test's one thread, have not run. So all six are queued
    // before the stop begins.
    assert!(futures::poll!(&mut issuing).is_pending());

    let (stopped, outcomes) = tokio::join!(issuer.stop_writers(), issuing);
    assert_eq!(stopped, 4, "two writers per mode, all ended");
    for outcome in outcomes {
        assert!(
            matches!(outcome, Ok(IssueOutcome::Created(ref set)) if set.tokens.len() == 3),
            "{outcome:?}"
        );
    }
    assert_eq!(app.count("tokens", doc! {}).await, 18);
    assert_eq!(app.count_records(doc! { "status": "issued" }).await, 6);

    // Nothing is left to write a later issuance, which is refused and writes nothing.
    let late = issuance("pi_writers_late", 3, IssuanceMode::Upsert);
    assert!(matches!(
        issuer.issue(Caller::Trusted, &late).await,
        Err(IssueError::Store(_))
    ));
    assert_eq!(issuer.stop_writers().await, 0, "already stopped");
    assert_eq!(app.count("tokens", doc! {}).await, 18);
}

#[tokio::test]
async fn stopping_writers_that_never_started_refuses_later_issuances() {
    let (app, issuer) = app_and_issuer().await;
    assert_eq!(issuer.stop_writers().await, 0);
    let late = issuance("pi_writers_never", 1, IssuanceMode::Atomic);
    assert!(matches!(
        issuer.issue(Caller::Trusted, &late).await,
        Err(IssueError::Store(_))
    ));
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}
