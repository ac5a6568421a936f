//! The oplog waiter: on a replica set of one member (the test mongod is one), a quiet
//! instance keeps a change stream open on `oplog_waiter`, a collection nothing writes, so
//! that mongod confirms majority writes at once; under load it closes it, and opens it
//! again once the load has passed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mongodb::bson::doc;

use crate::helpers::*;

const WAITER: &str = "oplog_waiter";

#[tokio::test]
async fn an_idle_instance_keeps_a_cursor_waiting_on_the_oplog_and_writes_nothing() {
    let app = spawn_app().await;
    until_change_streams(&app, WAITER, 1, Duration::from_secs(5)).await;
    // Issuing goes on as before, and the waiter's collection is never created.
    let tokens = app.issue_tokens("pi_waiter_idle", 2).await;
    assert_eq!(tokens.len(), 2);
    assert_eq!(app.count("tokens", doc! {}).await, 2);
    let collections = app.db.list_collection_names().await.unwrap();
    assert!(
        !collections.iter().any(|name| name == WAITER),
        "{collections:?}"
    );
}

/// Bound 0 turns it off; a pool of 3 connections is too small to give one to it.
#[tokio::test]
async fn with_no_bound_or_a_small_pool_no_waiter_is_opened() {
    let off = spawn_app_with("[mongo]\noplog_waiter_below_per_second = 0\n").await;
    let small = spawn_app_with("[mongo]\nmax_pool_size = 3\n").await;
    let roomy = spawn_app_with("[mongo]\nmax_pool_size = 4\n").await;
    until_change_streams(&roomy, WAITER, 1, Duration::from_secs(5)).await;
    for (app, what) in [
        (&off, "a waiter with bound 0"),
        (&small, "a waiter in a pool of 3"),
    ] {
        no_change_stream_during(app, WAITER, Duration::from_secs(1), what).await;
    }
}

/// Bound 300 documents a second: two clients issuing 100 tokens at a time, one issuance
/// after another, write far more documents than that in far fewer than 300 requests a
/// second, so the waiter closes while they run (the load is counted in documents, what
/// the stream costs mongod), and opens again once they stop.
#[tokio::test]
async fn under_load_the_waiter_is_closed_and_it_comes_back_once_quiet() {
    const QUANTITY: u64 = 100;
    let app = Arc::new(spawn_app_with("[mongo]\noplog_waiter_below_per_second = 300\n").await);
    until_change_streams(&app, WAITER, 1, Duration::from_secs(5)).await;

    let running = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    let clients: Vec<_> = (0..2)
        .map(|client| {
            let (app, running) = (app.clone(), running.clone());
            tokio::spawn(async move {
                let mut issued = 0;
                while running.load(Ordering::Relaxed) {
                    let payment = format!("pi_waiter_{client}_{issued}");
                    let body = issuance_body(&payment, QUANTITY as i64);
                    let answer = app.issue(WRITER_KEY, &body).await;
                    assert_eq!(answer.status(), 201, "{payment}");
                    issued += 1;
                }
                issued
            })
        })
        .collect();
    until_change_streams(&app, WAITER, 0, Duration::from_secs(10)).await;
    running.store(false, Ordering::Relaxed);
    let mut issued = 0;
    for client in clients {
        issued += client.await.unwrap();
    }
    let per_second = issued as f64 / started.elapsed().as_secs_f64();
    assert!(per_second < 300.0, "{per_second} requests a second");
    // Every answer was a set of tokens written: the load was real, and nothing was lost.
    assert_eq!(app.count("tokens", doc! {}).await, issued * QUANTITY);
    assert_eq!(
        app.count("issuances", doc! { "status": "issued" }).await,
        issued
    );

    until_change_streams(&app, WAITER, 1, Duration::from_secs(5)).await;
}

/// A waiter that cannot open (every `aggregate` of the service's client refused, as for
/// a user without the change-stream privilege) warns once, not every second, keeps
/// trying, and opens once it may. Read from the real binary's log.
#[tokio::test]
async fn a_waiter_that_cannot_open_warns_once_and_opens_once_it_may() {
    let scratch = ScratchDatabase::create("waiter_refused").await;
    // A first start migrates the database (migrations aggregate too).
    Service::start(scratch.name()).kill();
    let app_name = unique_app_name();
    let refused = FailPoint::always(&app_name, &["aggregate"], Fault::error(13)).await;
    let service = Service::start_named(scratch.name(), &app_name, &[]);
    // Three attempts, a second apart: the first warns, the others only at debug.
    assert!(
        refused.fired_within(3, Duration::from_secs(10)).await,
        "the waiter did not try three times:\n{}",
        service.recent_log()
    );
    let log = service.recent_log();
    let warnings = log
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("retrying every second"))
        .count();
    assert_eq!(warnings, 1, "{log}");

    assert!(refused.off().await >= 3);
    let client = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while change_streams_on(&client, scratch.name(), WAITER).await != 1 {
        assert!(
            Instant::now() < deadline,
            "no waiter once allowed:\n{}",
            service.recent_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
