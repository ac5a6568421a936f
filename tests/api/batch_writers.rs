//! Group commit's writer tasks belong to the application: stopping them answers every
//! issuance queued before, in both modes, and ends them; an issuance after that is
//! refused rather than queued for writers that are gone.

use std::time::{Duration, Instant};

use futures::future::join_all;
use mongodb::bson::doc;
use tokenmint::domain::{IssuanceMode, NewIssuance};
use tokenmint::issuing::{Caller, IssueError, IssueOutcome, Issuer};

use crate::helpers::*;

/// Longer than any healthy batch here takes.
const BOUND: Duration = Duration::from_secs(30);

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

    let (stopped, outcomes) = tokio::join!(issuer.stop_writers(BOUND), issuing);
    assert_eq!(stopped, 4, "two writers per mode by default, all ended");
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
    assert_eq!(issuer.stop_writers(BOUND).await, 0, "already stopped");
    assert_eq!(app.count("tokens", doc! {}).await, 18);
}

#[tokio::test]
async fn stopping_writers_that_never_started_refuses_later_issuances() {
    let (app, issuer) = app_and_issuer().await;
    assert_eq!(issuer.stop_writers(BOUND).await, 0);
    let late = issuance("pi_writers_never", 1, IssuanceMode::Atomic);
    assert!(matches!(
        issuer.issue(Caller::Trusted, &late).await,
        Err(IssueError::Store(_))
    ));
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn writers_that_hang_at_shutdown_are_aborted_at_the_bound_leaving_what_a_crash_leaves() {
    let name = unique_app_name();
    let app = spawn_app().await;
    let settings = test_settings_at(&mongo_uri_named(&name), &app.db_name, "");
    let store = connect_store(&mongo_uri_named(&name), &app.db_name).await;
    let issuer = tokenmint::startup::issuer(&settings, store);
    // The batch's record insert hangs 3 s on the server (then runs), as a database that
    // stalls at shutdown would.
    let hang = FailPoint::set(&name, &["insert"], Fault::Block { millis: 3_000 }, 1).await;
    let request = issuance("pi_writers_hang", 2, IssuanceMode::Upsert);

    let started = Instant::now();
    let stop = async {
        // Long enough for the writer to reach the hanging insert.
        tokio::time::sleep(Duration::from_millis(300)).await;
        issuer.stop_writers(Duration::from_millis(300)).await
    };
    let (_, outcome) = tokio::join!(stop, issuer.issue(Caller::Trusted, &request));
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2_000),
        "the stop waited {took:?} for a hanging batch"
    );
    assert!(matches!(outcome, Err(IssueError::Store(_))), "{outcome:?}");
    assert_eq!(hang.off().await, 1, "the insert never hung");

    // Once the server is done with the insert it held (here its `maxTimeMS` ran out
    // meanwhile), what is left is what a crash leaves: no token, and no record but an
    // `issuing` one, which self-repair would complete.
    tokio::time::sleep(Duration::from_millis(3_500).saturating_sub(took)).await;
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(
        app.count_records(doc! { "status": { "$ne": "issuing" } })
            .await,
        0
    );
}
