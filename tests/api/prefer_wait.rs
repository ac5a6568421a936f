//! `Prefer: wait=N` on `POST /v1/issuances`: a checkout whose request is pending is held
//! until its payment's event has been applied, on any instance, or N seconds passed.
//!
//! The waiter gauge is one per process and these tests read it, so they take `WAITING`
//! in turn: the only other test of this binary that sends `Prefer` (the browser's,
//! `browser.rs`) takes it too, so while one of them holds it, every waiter the gauge
//! counts is its own.

use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};
use serde_json::Value;
use tokenmint::startup::Application;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;
use crate::provider_events::*;

pub(crate) static WAITING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The collection the waiters' change stream watches.
const EVENTS: &str = "webhook_events";

/// `POST {base}/v1/issuances` of `body` as `key` with `Prefer: {prefer}`; the answer and
/// the moment it arrived.
async fn send_preferring(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &Value,
    prefer: &str,
) -> (reqwest::Response, Instant) {
    let response = http
        .post(format!("{base}/v1/issuances"))
        .bearer_auth(key)
        .header("prefer", prefer)
        .json(body)
        .send()
        .await
        .expect("answered");
    (response, Instant::now())
}

async fn issue_preferring(
    app: &TestApp,
    key: &str,
    payment: &str,
    prefer: &str,
) -> reqwest::Response {
    let body = issuance_body(payment, 1);
    send_preferring(&app.http, &app.address, key, &body, prefer)
        .await
        .0
}

/// A checkout's request for `quantity` tokens of `payment`, sent in the background.
fn wait_in_background(
    app: &TestApp,
    payment: &str,
    quantity: i64,
    prefer: &'static str,
) -> tokio::task::JoinHandle<(reqwest::Response, Instant)> {
    let (http, base) = (app.http.clone(), app.address.clone());
    let body = issuance_body(payment, quantity);
    tokio::spawn(async move { send_preferring(&http, &base, REQUEST_KEY, &body, prefer).await })
}

/// `tokenmint_issuance_waiters` as `{base}/metrics` shows it.
async fn waiters_at(http: &reqwest::Client, base: &str) -> f64 {
    metric_value(
        &metrics_text(http, base).await,
        "tokenmint_issuance_waiters",
    )
    .unwrap_or(0.0)
}

/// Polls the waiter gauge until it shows `expected`, for at most 10 s.
async fn until_waiters_at(http: &reqwest::Client, base: &str, expected: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = waiters_at(http, base).await;
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waiters stayed at {now}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn until_waiters(app: &TestApp, expected: f64) {
    until_waiters_at(&app.http, &app.address, expected).await;
}

/// Waits until `payment`'s checkout is waiting: counted by the gauge (it registers before
/// its first check) and its pending record written (that check done, or nearly).
pub(crate) async fn until_waiting(app: &TestApp, payment: &str) {
    until_waiters(app, 1.0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let pending = doc! { "paymentIntentId": payment, "status": "pending" };
    while app.count("issuances", pending.clone()).await == 0 {
        assert!(Instant::now() < deadline, "no pending record for {payment}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a Stripe event of `kind` for `payment` whose metadata names `quantity` tokens;
/// returns when it was answered (200).
pub(crate) async fn apply(app: &TestApp, kind: &str, payment: &str, quantity: &str) -> Instant {
    let event = intent_event(
        &format!("evt_{payment}_{kind}"),
        kind,
        payment,
        now(),
        quantity,
    );
    assert_eq!(deliver_stripe(app, &event).await.status(), 200);
    Instant::now()
}

/// Asserts a waiter was answered by the event applied at `applied_at`, within `bound`
/// (its wait was 10 s or more).
fn assert_woken(applied_at: Instant, answered_at: Instant, bound: Duration) {
    let latency = answered_at.saturating_duration_since(applied_at);
    assert!(latency < bound, "answered {latency:?} after the event");
}

fn preference_applied(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("preference-applied")
        .map(|value| value.to_str().unwrap())
}

async fn record(app: &TestApp, payment: &str) -> Document {
    let records = app.db.collection::<Document>("issuances");
    let record = records
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap();
    record.expect("an issuance record")
}

async fn status(app: &TestApp, payment: &str) -> String {
    record(app, payment)
        .await
        .get_str("status")
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_waiting_checkout_gets_its_tokens_once_another_instance_applies_the_success() {
    let _turn = WAITING.lock().await;
    let a = app().await;
    let b = spawn_app_on(&a.db_name, PROVIDERS).await;
    let waiting = wait_in_background(&b, "pi_wait", 3, "wait=10");
    until_waiting(&b, "pi_wait").await;

    let applied_at = apply(&a, "succeeded", "pi_wait", "3").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(1));
    assert!(
        [200, 201].contains(&answer.status().as_u16()),
        "{}",
        answer.status()
    );
    assert_eq!(preference_applied(&answer), Some("wait=10"));
    let body = json(answer).await;
    let stored = b.stored_token_ids("pi_wait").await;
    assert_eq!(token_ids(&body), stored);
    let states = b.token_states("pi_wait").await;
    assert_eq!(
        states,
        [(0, "active"), (1, "active"), (2, "active")].map(|(i, s)| (i, s.to_owned()))
    );
    assert_eq!(status(&b, "pi_wait").await, "issued");
    assert_eq!(b.count("issuances", doc! {}).await, 1);
    until_waiters(&b, 0.0).await;
}

#[tokio::test]
async fn a_wait_with_no_event_ends_pending_after_its_seconds() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let started = Instant::now();
    let answer = issue_preferring(&app, REQUEST_KEY, "pi_late", "wait=1").await;
    let took = started.elapsed();
    assert_eq!(answer.status(), 202);
    assert_eq!(preference_applied(&answer), Some("wait=1"));
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(status(&app, "pi_late").await, "pending");
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Once the payment succeeded, the same request is answered at once: no wait applied.
    apply(&app, "succeeded", "pi_late", "1").await;
    let answer = issue_preferring(&app, REQUEST_KEY, "pi_late", "wait=10").await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        preference_applied(&answer),
        None,
        "answered without waiting"
    );
}

/// The providers, and a request timeout (1 s) far below the waits the tests ask for.
fn short_timeout() -> String {
    format!("{PROVIDERS}\n[server]\nrequest_timeout_ms = 1000\n")
}

#[tokio::test]
async fn a_wait_outlasts_the_request_timeout() {
    let _turn = WAITING.lock().await;
    // Waiting is not work: a wait longer than the request timeout is answered 202 when
    // it is over, not 503 `request_timeout` when the timeout would have been.
    let app = spawn_app_with(&short_timeout()).await;
    let started = std::time::Instant::now();
    let answer = issue_preferring(&app, REQUEST_KEY, "pi_outlasts", "wait=3").await;
    assert_eq!(answer.status(), 202);
    assert_eq!(preference_applied(&answer), Some("wait=3"));
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        record(&app, "pi_outlasts").await.get_str("status").unwrap(),
        "pending"
    );
}

#[tokio::test]
async fn a_waiter_hears_the_conflict_when_the_metadata_differs() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let waiting = wait_in_background(&app, "pi_differs", 3, "wait=10");
    until_waiting(&app, "pi_differs").await;
    let applied_at = apply(&app, "succeeded", "pi_differs", "5").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(5));
    assert_eq!(preference_applied(&answer), Some("wait=10"));
    assert_hidden_conflict(answer).await;
    // The provider's metadata won: its five tokens, nothing of the checkout's three.
    let record = record(&app, "pi_differs").await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_i64("quantity").unwrap(), 5);
    assert_eq!(app.token_indexes("pi_differs").await, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_waiter_hears_that_the_payment_was_canceled() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let waiting = wait_in_background(&app, "pi_fails", 2, "wait=10");
    until_waiting(&app, "pi_fails").await;
    let applied_at = apply(&app, "canceled", "pi_fails", "2").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(5));
    assert_eq!(preference_applied(&answer), Some("wait=10"));
    assert_problem(answer, 409, "payment_not_succeeded").await;
    assert_eq!(status(&app, "pi_fails").await, "pending");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn a_client_that_disconnects_frees_its_place_at_once() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let body = issuance_body("pi_gone", 1).to_string();
    let address = app.address.trim_start_matches("http://");
    let mut client = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {REQUEST_KEY}\r\nPrefer: wait=30\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    until_waiting(&app, "pi_gone").await;
    drop(client);
    // Within 10 s, well before the 30 s the request asked for.
    until_waiters(&app, 0.0).await;
    assert_eq!(status(&app, "pi_gone").await, "pending");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn beyond_max_waiters_a_request_is_answered_at_once() {
    let _turn = WAITING.lock().await;
    let app = spawn_app_with(&format!("{PROVIDERS}\n[issuance]\nmax_waiters = 1\n")).await;
    let first = wait_in_background(&app, "pi_first", 1, "wait=20");
    until_waiting(&app, "pi_first").await;

    let started = Instant::now();
    let second = issue_preferring(&app, REQUEST_KEY, "pi_second", "wait=20").await;
    assert_eq!(second.status(), 202);
    assert_eq!(preference_applied(&second), None, "it did not wait");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status(&app, "pi_second").await, "pending");

    // The first still waits, and is answered by its payment's success.
    apply(&app, "succeeded", "pi_first", "1").await;
    let (answer, _) = first.await.unwrap();
    assert_eq!(preference_applied(&answer), Some("wait=20"));
    assert!([200, 201].contains(&answer.status().as_u16()));
    assert_eq!(app.token_indexes("pi_first").await, vec![0]);
    assert_eq!(app.token_indexes("pi_second").await, Vec::<i64>::new());
}

#[tokio::test]
async fn a_trusted_key_issues_at_once_whatever_it_prefers() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let started = Instant::now();
    let answer = issue_preferring(&app, WRITER_KEY, "pi_trusted", "wait=10").await;
    assert_eq!(answer.status(), 201);
    assert_eq!(preference_applied(&answer), None);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(app.token_indexes("pi_trusted").await, vec![0]);
    assert_eq!(status(&app, "pi_trusted").await, "issued");
    assert_eq!(waiters_at(&app.http, &app.address).await, 0.0);
}

#[tokio::test]
async fn shutdown_answers_the_waiters_at_once() {
    let _turn = WAITING.lock().await;
    // An app of our own, to stop it while a checkout waits.
    let db_name = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    let app = Application::build(&test_settings(&db_name, PROVIDERS))
        .await
        .expect("app builds");
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let body = issuance_body("pi_stopping", 1);
    let waiting = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move { send_preferring(&http, &base, REQUEST_KEY, &body, "wait=25").await }
    });
    until_waiters_at(&http, &base, 1.0).await;

    let stopping = Instant::now();
    stop.send(()).unwrap();
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(answer.status(), 202);
    assert_eq!(preference_applied(&answer), Some("wait=25"));
    // Not cut off when the grace period (10 s) ends, nor held for its 25 s.
    assert_woken(stopping, answered_at, Duration::from_secs(5));
    running.await.unwrap().unwrap();
    let records = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
    let records = records
        .database(&db_name)
        .collection::<Document>("issuances");
    let pending = doc! { "paymentIntentId": "pi_stopping", "status": "pending" };
    assert_eq!(records.count_documents(pending).await.unwrap(), 1);
    drop_database_blocking(&db_name);
}

/// A change stream makes the primary read its whole oplog, every token written included:
/// an instance opens one only while a checkout waits, and closes it a few seconds after
/// the last waiter left. The waiter still hears its event.
#[tokio::test]
async fn the_change_stream_is_open_only_while_someone_waits() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    no_change_stream_during(
        &app,
        EVENTS,
        Duration::from_millis(500),
        "a stream while nobody waits",
    )
    .await;
    let answer = issue_preferring(&app, REQUEST_KEY, "pi_nowait", "wait=0").await;
    assert_eq!(answer.status(), 202);
    // Asking to wait for a payment its first check answers: no wait, so no stream.
    apply(&app, "succeeded", "pi_ready", "1").await;
    let answer = issue_preferring(&app, REQUEST_KEY, "pi_ready", "wait=20").await;
    assert_eq!(answer.status(), 200);
    assert_eq!(preference_applied(&answer), None);
    no_change_stream_during(
        &app,
        EVENTS,
        Duration::from_millis(1500),
        "a stream for a checkout that did not wait",
    )
    .await;

    let waiting = wait_in_background(&app, "pi_watched", 2, "wait=20");
    until_waiting(&app, "pi_watched").await;
    until_change_streams(&app, EVENTS, 1, Duration::from_secs(5)).await;
    let applied_at = apply(&app, "succeeded", "pi_watched", "2").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(1));
    assert_eq!(answer.status(), 200);
    assert_eq!(app.token_indexes("pi_watched").await, vec![0, 1]);

    until_waiters(&app, 0.0).await;
    until_change_streams(&app, EVENTS, 0, Duration::from_secs(15)).await;
}

/// The success is applied while the first waiter's stream is still opening (its
/// `aggregate` held 2 s by a failpoint), so the stream never reports it: the watcher
/// wakes every waiter once the stream is open, and the checkout gets its tokens then,
/// not at the end of its 20 s.
#[tokio::test]
async fn an_event_applied_while_the_stream_opens_still_wakes_the_waiter() {
    let _turn = WAITING.lock().await;
    let turn = FailPointTurn::take().await;
    let name = unique_app_name();
    // No oplog waiter: its own `aggregate` could meet the failpoint first.
    let no_waiter = "[mongo]\noplog_waiter_below_per_second = 0\n";
    let app = spawn_app_named(&name, &format!("{PROVIDERS}\n{no_waiter}")).await;
    let opening = turn
        .set(&name, &["aggregate"], Fault::Block { millis: 2_000 }, 1)
        .await;
    let waiting = wait_in_background(&app, "pi_opening", 1, "wait=20");
    until_waiting(&app, "pi_opening").await;
    assert!(
        opening.fired_within(1, Duration::from_secs(5)).await,
        "the stream's aggregate was not held"
    );

    let applied_at = apply(&app, "succeeded", "pi_opening", "1").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(5));
    assert_eq!(answer.status(), 200);
    assert_eq!(preference_applied(&answer), Some("wait=20"));
    assert_eq!(status(&app, "pi_opening").await, "issued");
    assert_eq!(app.token_indexes("pi_opening").await, vec![0]);
}

/// The watcher's change stream ends (here: its collection dropped, which invalidates it)
/// and the success event is applied while no stream is open, so no stream ever sees it.
/// The watcher reopens the stream and wakes every waiter to check again: the checkout
/// still gets its tokens, about a second later, not at the end of its 20 s.
#[tokio::test]
async fn a_waiter_checks_again_when_the_change_stream_reopens() {
    let _turn = WAITING.lock().await;
    let app = app().await;
    let waiting = wait_in_background(&app, "pi_reopen", 2, "wait=20");
    until_waiting(&app, "pi_reopen").await;
    // The stream must be open before its collection is dropped, or nothing reopens.
    until_change_streams(&app, EVENTS, 1, Duration::from_secs(5)).await;

    app.db
        .collection::<Document>("webhook_events")
        .drop()
        .await
        .unwrap();
    let applied_at = apply(&app, "succeeded", "pi_reopen", "2").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_woken(applied_at, answered_at, Duration::from_secs(5));
    // The webhook fulfilled the pending request; the woken checkout reads the result.
    assert_eq!(answer.status(), 200);
    assert_eq!(status(&app, "pi_reopen").await, "issued");
    assert_eq!(app.token_indexes("pi_reopen").await, vec![0, 1]);
}

/// One client address holds at most `issuance.max_waiters_per_address` places: its next
/// request is answered at once (202, no `Preference-Applied`), not refused, while a
/// shopper from another address still waits.
#[tokio::test]
async fn one_address_waits_at_most_its_share_and_others_still_wait() {
    let _turn = WAITING.lock().await;
    let app = spawn_app_with(&format!(
        "{PROVIDERS}\n[issuance]\nmax_waiters_per_address = 1\n"
    ))
    .await;
    let from = |address: &str| {
        tokenmint_test_support::http_client_builder()
            .local_address(address.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let abuser = from("127.0.0.2");
    let held = tokio::spawn({
        let (http, base) = (abuser.clone(), app.address.clone());
        let body = issuance_body("pi_held", 1);
        async move { send_preferring(&http, &base, REQUEST_KEY, &body, "wait=20").await }
    });
    until_waiting(&app, "pi_held").await;

    let body = issuance_body("pi_more", 1);
    let (more, _) = send_preferring(&abuser, &app.address, REQUEST_KEY, &body, "wait=20").await;
    assert_eq!(more.status(), 202);
    assert_eq!(preference_applied(&more), None, "it did not wait");
    assert_eq!(status(&app, "pi_more").await, "pending");

    // The shopper's address has its place: it waits (its second, with no event) and says so.
    let shopper = from("127.0.0.3");
    let body = issuance_body("pi_shopper_waits", 1);
    let (waited, _) = send_preferring(&shopper, &app.address, REQUEST_KEY, &body, "wait=1").await;
    assert_eq!(waited.status(), 202);
    assert_eq!(preference_applied(&waited), Some("wait=1"));

    // The abuser's one waiter is still there, and is answered by its payment's success.
    apply(&app, "succeeded", "pi_held", "1").await;
    let (answer, _) = held.await.unwrap();
    assert!(
        [200, 201].contains(&answer.status().as_u16()),
        "{}",
        answer.status()
    );
    assert_eq!(preference_applied(&answer), Some("wait=20"));
    assert_eq!(app.token_indexes("pi_held").await, vec![0]);
    assert_eq!(app.token_indexes("pi_more").await, Vec::<i64>::new());
    until_waiters(&app, 0.0).await;
}

/// `Prefer: wait` lengthens a request's time only once it waits: a client that sends the
/// header and then trickles its body (no key checked, no body judged yet) gets the
/// ordinary request timeout, so it cannot hold a connection for the wait it named.
#[tokio::test]
async fn a_trickled_body_gets_no_longer_for_asking_to_wait() {
    let _turn = WAITING.lock().await;
    let app = spawn_app_with(&short_timeout()).await;
    let address = app.address.trim_start_matches("http://");
    let mut client = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {REQUEST_KEY}\r\nPrefer: wait=30\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"provider\""
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // The rest of the body never comes; the answer does, well before the 30 s asked for.
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = client.read(&mut chunk).await.unwrap();
            answer.extend_from_slice(&chunk[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 15 s");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(app.count("issuances", doc! {}).await, 0);
}

/// Naming a wait does not lengthen the work of a request that does not wait: a trusted
/// key's issuance (which never waits) on a database that hangs is answered 503 at the
/// ordinary request timeout, not after the 30 s it named.
#[tokio::test]
async fn a_request_that_does_not_wait_gets_no_longer_for_naming_a_wait() {
    let _turn = WAITING.lock().await;
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", short_timeout()),
    )
    .await;
    let hang = FailPoint::always(&name, &["find"], Fault::Block { millis: 4000 }).await;
    let started = Instant::now();
    let answer = app
        .http
        .post(app.url("/v1/issuances"))
        .bearer_auth(WRITER_KEY)
        .header("prefer", "wait=30")
        .json(&issuance_body("pi_trusted_waits", 1))
        .send()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    hang.off().await;
    assert_eq!(answer.status(), 503);
    assert!(elapsed < Duration::from_millis(3500), "{elapsed:?}");
}
