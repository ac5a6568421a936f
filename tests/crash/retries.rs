//! Crash and retry (`crash_upsert_mode_…`, `crash_atomic_mode_…`): after each kill the
//! service is restarted and every request is retried until 2xx; every answer must name
//! the acknowledged ids and the database must hold exactly those.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use mongodb::bson::doc;
use tokenmint::store::Store;
use tokenmint_test_support::{ScratchDatabase, Service, TokenIds, mongo_uri};

use super::kill::{Tally, calibrate, check_after_kill, kill_delay, load_then_kill, record};
use super::requests::{http_client, pick_requests, retry_until_ok, stored_ids};
use super::{ITERATIONS_PER_DATABASE, begin};

/// See `shorten_transaction_lifetime`; `TOKENMINT_CRASH_TXN_LIFETIME_SECS=60` restores the
/// server default.
const DEFAULT_TRANSACTION_LIFETIME_SECS: i32 = 5;

/// An abandoned transaction (its process was killed before commit or abort) keeps its
/// locks until the server's `transactionLifetimeLimitSeconds` (default 60 s) reaps it;
/// until then a retry of that payment in atomic mode meets a write conflict. The crash
/// suite lowers the limit on its test mongod so an iteration does not wait a minute; the
/// retries still prove that the payment completes once the transaction is reaped.
async fn shorten_transaction_lifetime() -> i32 {
    let seconds = std::env::var("TOKENMINT_CRASH_TXN_LIFETIME_SECS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("TOKENMINT_CRASH_TXN_LIFETIME_SECS is a number")
        })
        .unwrap_or(DEFAULT_TRANSACTION_LIFETIME_SECS);
    let client = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
    client
        .database("admin")
        .run_command(doc! { "setParameter": 1, "transactionLifetimeLimitSeconds": seconds })
        .await
        .expect("setParameter transactionLifetimeLimitSeconds");
    seconds
}

pub(super) async fn scenario(mode: &str) {
    let (seed, iterations, mut rng) = begin(mode);
    let transaction_lifetime = shorten_transaction_lifetime().await;
    let mut tally = Tally::default();
    // Every payment's acknowledged ids so far, across the iterations on one database.
    let mut acknowledged: BTreeMap<String, TokenIds> = BTreeMap::new();
    let mut database = String::new();
    let mut store: Option<Store> = None;
    let mut service: Option<Service> = None;
    let mut calibration = Duration::ZERO;
    let mut databases: Vec<ScratchDatabase> = Vec::new();
    let (mut payments_checked, mut tokens_checked) = (0, 0);

    for iteration in 0..iterations {
        // A fresh database every few iterations: `verify` scans everything, and a database
        // that grows by 8000 tokens an iteration would make long runs quadratic.
        if iteration % ITERATIONS_PER_DATABASE == 0 {
            if let Some(store) = &store {
                let report = store.verify().await.expect("verify");
                payments_checked += report.issuances_checked;
                tokens_checked += report.tokens_checked;
            }
            drop(service.take());
            let scratch = ScratchDatabase::create("tokenmint_crash").await;
            database = scratch.name().to_owned();
            store = Some(scratch.store().clone());
            databases.push(scratch);
            acknowledged.clear();
            let started = Service::start(&database);
            calibration = calibrate(&mut rng, mode, &started, &mut acknowledged, &mut tally).await;
            service = Some(started);
        }
        let store = store.as_ref().expect("a database");
        let service = service.as_mut().expect("a running service");
        let earlier: Vec<String> = acknowledged.keys().cloned().collect();
        let requests = pick_requests(&mut rng, mode, &format!("i{iteration}"), &earlier);
        let delay = kill_delay(&mut rng, iteration, calibration);
        tally.requests += requests.len() as u64;

        // 1. Load, then SIGKILL after the delay.
        let acked_now =
            load_then_kill(service, &requests, delay, &mut acknowledged, &mut tally).await;

        // 2. Before any retry: the state the crash left.
        let before = store.verify().await.expect("verify after the kill");
        check_after_kill(mode, &before, &mut tally, iteration);
        tally.partial_sets_before_retry += before.wrong_token_sets.count;

        // 3. Restart on the same database and retry every request until 2xx.
        *service = Service::start(&database);
        let http = http_client();
        let retries = requests
            .iter()
            .cloned()
            .map(|request| retry_until_ok(http.clone(), service.base.clone(), request));
        for retried in join_all(retries).await {
            tally.retry_attempts += retried.attempts;
            for (status, n) in retried.failures {
                *tally.retry_failures.entry(status).or_default() += n;
            }
            tally.slowest_retry = tally.slowest_retry.max(retried.took);
            let payment = &retried.request.payment;
            match retried.result {
                Ok(ids) => record(&mut acknowledged, &mut tally, payment, ids, "on retry"),
                Err(err) => tally.violations.push(format!(
                    "{payment}: {err}\nservice log:\n{}",
                    service.recent_log()
                )),
            }
        }

        if std::env::var_os("TOKENMINT_CRASH_VERBOSE").is_some() {
            eprintln!(
                "crash[{mode}] iteration {iteration}, killed after {delay:?}; the restarted service's log:\n{}",
                service.recent_log()
            );
        }

        // 4. After the retries: the database holds exactly the acknowledged tokens.
        let mut payments: Vec<&String> = requests.iter().map(|r| &r.payment).collect();
        payments.dedup();
        for payment in payments {
            let stored = stored_ids(store, payment).await;
            if Some(&stored) != acknowledged.get(payment.as_str()) {
                tally.violations.push(format!(
                    "{payment}: stored tokens ({} of them) differ from the acknowledged ids",
                    stored.len()
                ));
            }
        }
        let after = store.verify().await.expect("verify after the retries");
        if !after.is_clean() {
            tally.violations.push(format!(
                "iteration {iteration}: verify after retries:\n{after}"
            ));
        }
        tally.iterations += 1;
        eprintln!(
            "crash[{mode}] iteration {}/{iterations}: {} requests, killed after {} ms, {acked_now} acknowledged before the kill, {} partial set(s) before retry, {} after retry",
            iteration + 1,
            requests.len(),
            delay.as_millis(),
            before.wrong_token_sets.count,
            after.violations(),
        );
        tally.assert_clean(mode, seed, iteration, delay, None);
    }
    drop(service);
    let Some(store) = store else {
        return; // zero iterations
    };
    let report = store.verify().await.expect("final verify");
    payments_checked += report.issuances_checked;
    tokens_checked += report.tokens_checked;
    drop(databases);
    eprintln!(
        "crash[{mode}] summary: seed={seed} {} partial_sets_before_retry={} retry_attempts={} retry_failures={:?} slowest_retry_ms={} transaction_lifetime_s={transaction_lifetime} databases={} payments={} tokens={} violations_after_retry={}",
        tally.figures(),
        tally.partial_sets_before_retry,
        tally.retry_attempts,
        tally.retry_failures,
        tally.slowest_retry.as_millis(),
        iterations.div_ceil(ITERATIONS_PER_DATABASE),
        payments_checked,
        tokens_checked,
        tally.violations.len() as u64 + report.violations(),
    );
    assert!(report.is_clean(), "{report}");
}
