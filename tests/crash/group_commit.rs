//! Group commit under a crash (`crash_group_commit_{upsert,atomic}_mixed_retries_exactly_once`):
//! concurrent issuances share the batch's database commands (in atomic mode, one
//! transaction), and a SIGKILL mid-batch must still leave every payment issued exactly
//! once; in atomic mode no set is ever partial, even right after the kill.
//!
//! Per iteration, on a fresh database, the seeded RNG draws `REQUESTS` issuance requests:
//! new payments (quantity 1..=200, one of `OWNERS`, one of `TOKEN_TYPES`), 30 % identical
//! retries of one of them and 10 % conflicting ones (same payment, another owner or
//! quantity), each retry sent at once with the others (in a shuffled order, so it may reach
//! the service first) or right after its original was answered. They go to a freshly
//! started `tokenmint`, which is SIGKILLed after a seeded 5–95 % of the time an uncrashed
//! load of the same shape took (the calibration, itself checked like an iteration), so that
//! batches are in flight. The service is restarted with `FAST_REPAIR`, and every request
//! without a final answer (2xx or 409) is sent again until it has one; a conflicting
//! request is sent once more only, so the record it may have claimed can be left to
//! self-repair. Once no record is `issuing` (self-repair waited for, bounded), EVERY
//! payment in the database is checked:
//! - its record is `issued`; its tokens are exactly tokenIndex 0..quantity-1, active, with
//!   the record's owner and type; no token lacks a record, no record lacks a request;
//! - it was answered 201 at most once, over every answer before and after the kill;
//! - every 2xx answer (201 or 200) names the record (id, owner, type, quantity), went to
//!   a request with the record's parameters, and names exactly the stored token ids;
//! - every 409 `idempotency_conflict` went to a request whose parameters differ from the
//!   record's: a conflicting retry that reached the service first became the record, and
//!   then its original and their identical retries are the conflicts;
//! - `Store::verify()` is clean.

mod calls;
mod checks;

use std::time::{Duration, Instant};

use rand::RngExt;
use rand::rngs::StdRng;
use tokenmint_test_support::{ScratchDatabase, Service};

use self::calls::{Kind, Reply, pick_calls, resend_unanswered, send_load};
use self::checks::{check_payments, final_answers};
use super::kill::{Tally, check_after_kill};
use super::self_repair::{FAST_REPAIR, REPAIR_DEADLINE, issuing_records, wait_for_self_repair};
use super::{RETRY_DEADLINE, begin};

/// Requests per load: `IDENTICAL` identical retries, `CONFLICTING` conflicting ones, the
/// rest new payments; with the retries sent at once, well over 64 are in flight together.
const REQUESTS: usize = 96;
const IDENTICAL: usize = REQUESTS * 30 / 100;
const CONFLICTING: usize = REQUESTS / 10;
const MAX_QUANTITY: i64 = 200;
const OWNERS: [&str; 4] = [
    "65f1a0c2b3d4e5f601234567",
    "65f1a0c2b3d4e5f601234568",
    "65f1a0c2b3d4e5f601234569",
    "65f1a0c2b3d4e5f60123456a",
];
const TOKEN_TYPES: [&str; 2] = ["standard", "premium"];
const ACCOUNT: &str = "acct_group";
/// The kill comes after this many percent of the uncrashed load's time.
const KILL_PERCENT: std::ops::RangeInclusive<u32> = 5..=95;

/// Counts over the scenario, for its summary line.
#[derive(Debug, Default)]
struct Counts {
    identical: u64,
    conflicting: u64,
    issuing_after_kill: u64,
    resent: u64,
    conflicting_unanswered: u64,
    left_to_self_repair: u64,
    slowest_self_repair: Duration,
    created: u64,
    replayed: u64,
    conflicts: u64,
    conflicting_won: u64,
    payments: u64,
    tokens: u64,
}

/// One uncrashed load of the iterations' shape on a database of its own, checked like an
/// iteration; how long it took (the kills are a share of it).
async fn calibrate(
    rng: &mut StdRng,
    seed: u64,
    mode: &'static str,
    counts: &mut Counts,
) -> Duration {
    let scratch = ScratchDatabase::create("tokenmint_crash").await;
    let store = scratch.store();
    let mut service = Service::start(scratch.name());
    let calls = pick_calls(rng, "calibration", mode);
    let started = Instant::now();
    let first = send_load(&mut service, &calls, None).await;
    let took = started.elapsed();
    let (resent, _) = resend_unanswered(&service.base, &calls, &first).await;
    let left = wait_for_self_repair(store).await;
    let answers = final_answers(first, resent, "uncrashed");
    let mut calibration = Counts::default();
    let violations = check_payments(store, &calls, &answers, &mut calibration).await;
    counts.payments += calibration.payments;
    counts.tokens += calibration.tokens;
    assert!(
        violations.is_empty(),
        "crash[group-commit-{mode}] seed {seed}, uncrashed calibration load ({left} record(s) left issuing): {} violation(s):\n{}\nservice log:\n{}",
        violations.len(),
        violations.join("\n"),
        service.recent_log()
    );
    eprintln!(
        "crash[group-commit-{mode}]: an uncrashed load of {} requests took {took:?}: {} answered 201, {} 200, {} 409",
        calls.len(),
        calibration.created,
        calibration.replayed,
        calibration.conflicts
    );
    took
}

pub(super) async fn scenario(mode: &'static str) {
    let label = format!("group-commit-{mode}");
    let (seed, iterations, mut rng) = begin(&label);
    let mut tally = Tally::default();
    let mut counts = Counts::default();
    let calibration = calibrate(&mut rng, seed, mode, &mut counts).await;

    for iteration in 0..iterations {
        // A fresh database each iteration: "every payment in the database" is this load's.
        let scratch = ScratchDatabase::create("tokenmint_crash").await;
        let (store, database) = (scratch.store(), scratch.name());
        let mut loaded = Service::start(database);
        let calls = pick_calls(&mut rng, &format!("i{iteration}"), mode);
        let delay = calibration * rng.random_range(KILL_PERCENT) / 100;
        tally.requests += calls.len() as u64;
        counts.identical += calls.iter().filter(|c| c.kind == Kind::Identical).count() as u64;
        counts.conflicting += calls.iter().filter(|c| c.kind == Kind::Conflicting).count() as u64;

        // 1. Load, then SIGKILL after the delay.
        let first = send_load(&mut loaded, &calls, Some(delay)).await;
        tally.kills += 1;
        let acked_now = first
            .iter()
            .filter(|r| matches!(r, Reply::Issued(_)))
            .count() as u64;
        tally.acknowledged_before_kill += acked_now;
        tally.errors_before_kill += first.iter().filter(|r| !r.is_final()).count() as u64;

        // 2. What the kill left: no duplicate or orphan; short sets and `issuing` records.
        let before = store.verify().await.expect("verify after the kill");
        check_after_kill(mode, &before, &mut tally, iteration);
        tally.partial_sets_before_retry += before.wrong_token_sets.count;
        let issuing_now = issuing_records(store).await;
        counts.issuing_after_kill += issuing_now;

        // 3. Restart with fast self-repair; send again what got no final answer.
        let restarted = Service::start_with(database, &FAST_REPAIR);
        let (resent, attempts) = resend_unanswered(&restarted.base, &calls, &first).await;
        tally.retry_attempts += attempts;
        let resent_now = resent.iter().flatten().count() as u64;
        counts.resent += resent_now;
        for (index, (call, reply)) in calls.iter().zip(&resent).enumerate() {
            match reply {
                // Sent once: its record, if it claimed one, is self-repair's.
                Some(Reply::NoAnswer(_)) if call.kind == Kind::Conflicting => {
                    counts.conflicting_unanswered += 1
                }
                Some(Reply::NoAnswer(last)) => tally.violations.push(format!(
                    "{}: no final answer within {RETRY_DEADLINE:?} after the restart; last: {last}",
                    call.describe(index)
                )),
                _ => {}
            }
        }

        // 4. Whatever is still `issuing` (a conflicting request that claimed its record
        // and was not answered, a lost `issued` mark) is self-repair's.
        let repairing = Instant::now();
        let left_after_retries = issuing_records(store).await;
        counts.left_to_self_repair += left_after_retries;
        let still = wait_for_self_repair(store).await;
        counts.slowest_self_repair = counts.slowest_self_repair.max(repairing.elapsed());
        if still > 0 {
            tally.violations.push(format!(
                "{still} record(s) still issuing {REPAIR_DEADLINE:?} after the retries"
            ));
        }

        // 5. Every payment of the database against every answer.
        let answers = final_answers(first, resent, "before the kill");
        let (created, replayed, conflicts) = (counts.created, counts.replayed, counts.conflicts);
        tally
            .violations
            .extend(check_payments(store, &calls, &answers, &mut counts).await);
        tally.iterations += 1;
        if std::env::var_os("TOKENMINT_CRASH_VERBOSE").is_some() {
            eprintln!(
                "crash[{label}] iteration {iteration}; the restarted service's log:\n{}",
                restarted.recent_log()
            );
        }
        eprintln!(
            "crash[{label}] iteration {}/{iterations}: {} requests, killed after {} ms, {acked_now} acknowledged before the kill, {issuing_now} issuing record(s) and {} partial set(s) left, {resent_now} sent again ({attempts} attempts), {left_after_retries} left to self-repair, answered 201×{} 200×{} 409×{}, {} violation(s)",
            iteration + 1,
            calls.len(),
            delay.as_millis(),
            before.wrong_token_sets.count,
            counts.created - created,
            counts.replayed - replayed,
            counts.conflicts - conflicts,
            tally.violations.len(),
        );
        tally.assert_clean(
            &label,
            seed,
            iteration,
            delay,
            Some(&restarted.recent_log()),
        );
    }
    eprintln!(
        "crash[{label}] summary: seed={seed} iterations={} kills={} requests={} identical_retries={} conflicting_retries={} acknowledged_before_kill={} errors_before_kill={} issuing_records_after_kill={} partial_sets_after_kill={} sent_again={} retry_attempts={} conflicting_unanswered={} left_to_self_repair={} slowest_self_repair_ms={} answered_201={} answered_200={} answered_409={} conflicting_won={} payments={} tokens={} violations={}",
        tally.iterations,
        tally.kills,
        tally.requests,
        counts.identical,
        counts.conflicting,
        tally.acknowledged_before_kill,
        tally.errors_before_kill,
        counts.issuing_after_kill,
        tally.partial_sets_before_retry,
        counts.resent,
        tally.retry_attempts,
        counts.conflicting_unanswered,
        counts.left_to_self_repair,
        counts.slowest_self_repair.as_millis(),
        counts.created,
        counts.replayed,
        counts.conflicts,
        counts.conflicting_won,
        counts.payments,
        counts.tokens,
        tally.violations.len(),
    );
}
