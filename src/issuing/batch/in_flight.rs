//! How many of one mode's batches are committed at once: two, or, when
//! `issuance.max_batches_in_flight` leaves room above two, the number up to it that
//! answers requests soonest on the database at hand, found by trying.
//!
//! More batches in flight shorten a request's wait in the queue for a writer; but each
//! batch then gathers fewer requests, and mongod's work per issuance grows as batches
//! shrink, since much of it is per command. Which of the two wins depends on the
//! database. Where mongod's CPU is the limit (mongod beside the service on the same
//! cores), two batches in flight answer soonest and eight cost a quarter of the rate at
//! concurrency 32.
//! Where a batch's time is mostly round trips the database spends no CPU on (a database
//! on machines of its own, a majority across zones), more in flight answer sooner: with
//! every command held 5 ms, eight gave 1.5× the rate of two at concurrency 8.
//!
//! A batch's own latency cannot tell these apart: it hardly moves with the number in
//! flight, while the work per issuance and the wait in the queue do. So the limit is
//! judged by what requests live through, from queued to answered, and by how many are
//! answered a second: after every few measured periods at the current limit, one period
//! at a neighbour (one more, or one fewer, alternately) is measured against their
//! medians, and the neighbour taken when two trials of it in a row won. One more wins
//! when its requests were answered clearly sooner and no fewer a second; the rate is
//! needed because where the service's share of the cores is short, the part of a
//! request it can measure shrinks with more in flight while the rate falls. One fewer
//! wins when it is level (it asks less of the database) or clearly more a second. The
//! neighbour is measured right after the current limit, so a change of load between the
//! two is small; a trial that loses costs one period in `HOLD_PERIODS + 1` (and the
//! settling batches on either side of it).
//!
//! Why two by default: with mongod on the service's cores the search has nothing to find
//! and its trials cost (three interleaved pairs at concurrency 32, upsert mode, with the
//! search up to eight: 1, 13 and 12 % slower; two atomic pairs 2 and 19 % faster, within
//! the runs' spread); a database far away is what an operator knows and the service
//! cannot see.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
// The clock `lived` is measured on too (`batch.rs`).
use tokio::time::Instant;

use crate::domain::IssuanceMode;
use crate::telemetry::metric;

/// The fewest batches in flight: what answers soonest where mongod shares the service's
/// cores, so the search never goes below it.
const MIN_IN_FLIGHT: usize = 2;
/// Batches finished after a change of limit that are not counted: those already in
/// flight, and the backlog a new permit drains at once, would flatter or blame it.
const SETTLE_BATCHES: u32 = 16;
/// The fewest batches in one measured period.
const PERIOD_BATCHES: u32 = 32;
/// The shortest measured period: shorter ones are too noisy to tell the 5–10 % that one
/// batch more or fewer makes where mongod shares the service's cores.
const PERIOD_AT_LEAST: Duration = Duration::from_secs(1);
/// Periods at the current limit between two trials.
const HOLD_PERIODS: u32 = 4;
/// One more in flight wins a trial only when its requests took at most this share of the
/// current limit's time (clearly sooner, not within the noise of one period) and it
/// answered no fewer a second: where the service's own share of the cores is short, the
/// time it measures can fall while the rate falls too.
const MORE_TIME_AT_MOST: f64 = 0.9;
/// See `MORE_TIME_AT_MOST`: "no fewer", within the noise of a period.
const MORE_RATE_AT_LEAST: f64 = 0.99;
/// One fewer wins when its time is at most this share and its rate at least the
/// inverse (level is enough, since it asks less of the database), or when it answered
/// clearly more a second (`FEWER_RATE_GAIN`) in a time no worse than one more must
/// better: the service's part of a request can grow while the rate grows, the mirror of
/// `MORE_TIME_AT_MOST`, and a rate alone may be only the load rising.
const FEWER_LEVEL: f64 = 1.02;
/// See `FEWER_LEVEL`.
const FEWER_RATE_GAIN: f64 = 1.03;

/// One mode's limit on batches in flight, and the permits that enforce it.
pub(super) struct InFlight {
    permits: Semaphore,
    climb: Mutex<Climb>,
    mode: IssuanceMode,
}

/// A batch's admission: held while it commits, then handed back with what its requests
/// lived through (`InFlight::finished`).
pub(super) struct Admitted<'a>(SemaphorePermit<'a>);

impl InFlight {
    /// Starts at the fewest; the search goes no higher than `most` (2 or less keeps 2).
    pub(super) fn new(mode: IssuanceMode, most: usize) -> Self {
        publish(mode, MIN_IN_FLIGHT);
        Self {
            permits: Semaphore::new(MIN_IN_FLIGHT),
            climb: Mutex::new(Climb::new(most.max(MIN_IN_FLIGHT))),
            mode,
        }
    }

    /// The most batches that may ever be in flight: the writer tasks it needs.
    pub(super) fn most(&self) -> usize {
        self.climb
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .most
    }

    /// Waits until fewer batches than the limit are in flight.
    pub(super) async fn admit(&self) -> Admitted<'_> {
        // The semaphore is never closed, so the wait ends only with a permit.
        Admitted(
            self.permits
                .acquire()
                .await
                .expect("the in-flight semaphore is never closed"),
        )
    }

    /// A batch is done: `requests` were answered, having lived `lived` between them from
    /// queued to answered. May move the limit.
    pub(super) fn finished(&self, admitted: Admitted<'_>, requests: usize, lived: Duration) {
        self.finished_at(admitted, requests, lived, Instant::now());
    }

    /// `finished`, for a batch that ended `at`.
    fn finished_at(&self, admitted: Admitted<'_>, requests: usize, lived: Duration, at: Instant) {
        let mut climb = self.climb.lock().unwrap_or_else(PoisonError::into_inner);
        let before = climb.limit;
        climb.record(requests, lived, at);
        self.follow(&climb, before, admitted);
    }

    /// Makes the permits follow `climb.limit` (from `before`, one step at most),
    /// `admitted` the permit of the batch that just finished.
    fn follow(&self, climb: &Climb, before: usize, admitted: Admitted<'_>) {
        let after = climb.limit;
        debug_assert!(after.abs_diff(before) <= 1, "{before} → {after}");
        if after > before {
            self.permits.add_permits(1);
        } else if after < before {
            // The finished batch's permit goes out of use: a step down never waits for
            // a batch in flight, nor stops one.
            admitted.0.forget();
        }
        if after != before {
            publish(self.mode, after);
        }
    }
}

/// Shows the limit in `ISSUANCE_BATCHES_IN_FLIGHT`.
fn publish(mode: IssuanceMode, limit: usize) {
    metrics::gauge!(metric::ISSUANCE_BATCHES_IN_FLIGHT, "mode" => mode.as_str()).set(limit as f64);
}

/// Which limit the period being measured is at.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The current limit.
    Hold,
    /// One more than the current limit, `held` the current limit's figures.
    TryMore { held: Period },
    /// One fewer.
    TryFewer { held: Period },
}

/// What one measured period's requests lived through.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Period {
    /// Mean seconds from queued to answered.
    time: f64,
    /// Requests answered a second.
    rate: f64,
}

/// The search itself, apart from the permits: fed each batch's figures, it moves
/// `limit`.
#[derive(Debug)]
struct Climb {
    limit: usize,
    /// The highest it may go.
    most: usize,
    phase: Phase,
    /// Batches still to skip after the last change.
    settling: u32,
    batches: u32,
    requests: u64,
    lived: f64,
    /// When the period being measured began: the end of the batch before its first.
    began: Option<Instant>,
    /// When the last batch ended.
    last: Option<Instant>,
    /// Each period held at the current limit since the last trial.
    held: Vec<Period>,
    /// Whether the next trial is of one fewer (they alternate where both are possible).
    fewer_next: bool,
    /// Whether the last trial of one more (of one fewer) won: a step is taken only
    /// when two trials of it in a row won, so that one lucky period moves nothing.
    more_won: bool,
    fewer_won: bool,
}

impl Climb {
    fn new(most: usize) -> Self {
        Self {
            limit: MIN_IN_FLIGHT,
            most,
            phase: Phase::Hold,
            settling: SETTLE_BATCHES,
            batches: 0,
            requests: 0,
            lived: 0.0,
            began: None,
            last: None,
            held: Vec::with_capacity(HOLD_PERIODS as usize),
            fewer_next: false,
            more_won: false,
            fewer_won: false,
        }
    }

    /// Counts a batch that ended `at`, its `requests` having lived `lived` in all.
    fn record(&mut self, requests: usize, lived: Duration, at: Instant) {
        let previous = self.last.replace(at);
        if self.settling > 0 {
            self.settling -= 1;
            return;
        }
        if self.batches == 0 {
            self.began = Some(previous.unwrap_or(at));
        }
        self.batches += 1;
        self.requests += requests as u64;
        self.lived += lived.as_secs_f64();
        let lasted = self
            .began
            .map_or(Duration::ZERO, |began| at.duration_since(began));
        if self.batches < PERIOD_BATCHES || lasted < PERIOD_AT_LEAST || self.requests == 0 {
            return;
        }
        let seconds = lasted.as_secs_f64();
        let period = Period {
            time: self.lived / self.requests as f64,
            rate: self.requests as f64 / seconds.max(f64::MIN_POSITIVE),
        };
        (self.batches, self.requests, self.lived) = (0, 0, 0.0);
        match self.phase {
            Phase::Hold => {
                self.held.push(period);
                if self.held.len() == HOLD_PERIODS as usize {
                    // Medians: a stall in one period (a checkpoint) moves them little.
                    let held = Period {
                        time: median(self.held.iter().map(|p| p.time)),
                        rate: median(self.held.iter().map(|p| p.rate)),
                    };
                    self.held.clear();
                    self.start_trial(held);
                }
            }
            Phase::TryMore { held } => {
                let won = period.time <= held.time * MORE_TIME_AT_MOST
                    && period.rate >= held.rate * MORE_RATE_AT_LEAST;
                let keep = won && self.more_won;
                self.more_won = won && !keep;
                self.end_trial(if keep { self.limit } else { self.limit - 1 });
            }
            Phase::TryFewer { held } => {
                let won = (period.time <= held.time * FEWER_LEVEL
                    && period.rate >= held.rate / FEWER_LEVEL)
                    || (period.rate >= held.rate * FEWER_RATE_GAIN
                        && period.time <= held.time / MORE_TIME_AT_MOST);
                let keep = won && self.fewer_won;
                self.fewer_won = won && !keep;
                self.end_trial(if keep { self.limit } else { self.limit + 1 });
            }
        }
    }

    /// Moves to a neighbour of the current limit, `held` its figures.
    fn start_trial(&mut self, held: Period) {
        let can_more = self.limit < self.most;
        let can_fewer = self.limit > MIN_IN_FLIGHT;
        let fewer = can_fewer && (self.fewer_next || !can_more);
        self.fewer_next = !fewer;
        if fewer {
            self.limit -= 1;
            self.phase = Phase::TryFewer { held };
        } else if can_more {
            self.limit += 1;
            self.phase = Phase::TryMore { held };
        } else {
            // Only when the bounds leave no neighbour.
            return;
        }
        self.settling = SETTLE_BATCHES;
    }

    /// Back to holding, at `limit`: the trial's if it was kept, else the one before.
    fn end_trial(&mut self, limit: usize) {
        if limit != self.limit {
            self.settling = SETTLE_BATCHES;
        } else {
            // A new limit: what was won at the old one says nothing here.
            (self.more_won, self.fewer_won) = (false, false);
        }
        self.limit = limit;
        self.phase = Phase::Hold;
    }
}

/// The median of `values` (the mean of the middle two of an even count).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search's ceiling in these tests.
    const MOST: usize = 8;

    /// Feeds `climb` batches of 8 requests from 32 clients in a closed loop, whose mean
    /// time from queued to answered at each limit is `mean_ms(limit)` (so that they
    /// answer 32 ÷ that a second), until `batches` batches are done; returns the limits
    /// it went through.
    fn run(climb: &mut Climb, seconds: f64, mean_ms: impl FnMut(usize) -> f64) -> Vec<usize> {
        let mut figures = mean_ms;
        run_with(climb, seconds, |limit| {
            let ms = figures(limit);
            (ms, 32_000.0 / ms)
        })
    }

    /// As `run`, with `figures(limit)` the mean time in ms and the rate a second.
    fn run_with(
        climb: &mut Climb,
        seconds: f64,
        mut figures: impl FnMut(usize) -> (f64, f64),
    ) -> Vec<usize> {
        // On from where an earlier run left the clock.
        let start = climb.last.unwrap_or_else(Instant::now);
        let mut at = start;
        let mut limits = vec![climb.limit];
        while at.duration_since(start).as_secs_f64() < seconds {
            let (ms, rate) = figures(climb.limit);
            at += Duration::from_secs_f64(8.0 / rate);
            climb.record(8, Duration::from_secs_f64(8.0 * ms / 1000.0), at);
            if *limits.last().unwrap() != climb.limit {
                limits.push(climb.limit);
            }
        }
        limits
    }

    /// Enough seconds for `cycles` holds and their trials, at the rates of these tests
    /// (800 requests a second or more: a period lasts `PERIOD_AT_LEAST`, settling less).
    fn cycles(cycles: usize) -> f64 {
        cycles as f64 * (HOLD_PERIODS as f64 + 1.0) * (PERIOD_AT_LEAST.as_secs_f64() + 0.2)
    }

    #[test]
    fn where_more_in_flight_answer_later_the_limit_stays_at_its_floor_but_for_trials() {
        let mut climb = Climb::new(MOST);
        // As measured with mongod on the service's cores: each batch more, slower.
        let limits = run(&mut climb, cycles(20), |limit| 10.0 + 2.0 * limit as f64);
        assert_eq!(climb.limit, MIN_IN_FLIGHT);
        assert!(limits.iter().all(|&l| l <= MIN_IN_FLIGHT + 1), "{limits:?}");
    }

    #[test]
    fn where_round_trips_dominate_the_limit_climbs_to_where_it_stops_paying() {
        let mut climb = Climb::new(MOST);
        // Sooner with each batch more up to five, then later.
        let limits = run(&mut climb, cycles(40), |limit| {
            if limit <= 5 {
                40.0 / limit as f64
            } else {
                8.0 + limit as f64
            }
        });
        assert_eq!(climb.limit, 5, "{limits:?}");
        assert!(limits.iter().all(|&l| l <= 6), "{limits:?}");
    }

    #[test]
    fn a_limit_that_stopped_paying_comes_down_when_fewer_do_as_well() {
        let mut climb = Climb::new(MOST);
        run(&mut climb, cycles(40), |limit| 40.0 / limit as f64);
        assert_eq!(climb.limit, MOST);
        // The database moved beside the service: every batch more is now slower.
        let limits = run(&mut climb, cycles(40), |limit| 10.0 + 2.0 * limit as f64);
        assert_eq!(climb.limit, MIN_IN_FLIGHT, "{limits:?}");
    }

    #[test]
    fn a_gain_within_the_noise_does_not_raise_the_limit() {
        let mut climb = Climb::new(MOST);
        // 5 % sooner per batch more: below what one period can tell.
        run(&mut climb, cycles(20), |limit| {
            20.0 * 0.95f64.powi(limit as i32)
        });
        assert_eq!(climb.limit, MIN_IN_FLIGHT);
    }

    #[test]
    fn with_no_room_above_two_there_is_no_trial() {
        let mut climb = Climb::new(MIN_IN_FLIGHT);
        let limits = run(&mut climb, cycles(5), |limit| 40.0 / limit as f64);
        assert_eq!(limits, vec![MIN_IN_FLIGHT]);
    }

    #[test]
    fn a_time_that_falls_while_the_rate_falls_does_not_raise_the_limit() {
        let mut climb = Climb::new(MOST);
        // What the service sees when its share of the cores is short: each batch more
        // makes the part of a request it measures shorter, and the rate lower.
        run_with(&mut climb, cycles(20), |limit| {
            (30.0 - 4.0 * limit as f64, 2_000.0 - 100.0 * limit as f64)
        });
        assert_eq!(climb.limit, MIN_IN_FLIGHT);
    }

    #[test]
    fn a_rate_that_rises_while_requests_wait_longer_does_not_lower_the_limit() {
        let mut climb = Climb::new(MOST);
        climb.limit = 4;
        // One fewer: 5 % more answered a second (the load rising, say), but a third
        // longer for each; one more: sooner, but fewer a second.
        let limits = run_with(&mut climb, cycles(20), |limit| {
            (
                40.0 / limit as f64,
                1_000.0 * (1.0 + 0.05 * (4.0 - limit as f64)),
            )
        });
        // Trials only: a kept step would be followed by a trial beyond 3 or 5.
        assert!(limits.iter().all(|l| (3..=5).contains(l)), "{limits:?}");
    }

    #[test]
    fn a_trial_that_wins_only_now_and_then_moves_nothing() {
        let mut climb = Climb::new(MOST);
        // One more in flight looks far better in every other trial period, level in the
        // rest: one lucky period is not a step.
        let (mut trials, mut last) = (0, MIN_IN_FLIGHT);
        run(&mut climb, cycles(20), |limit| {
            if limit != last && limit > MIN_IN_FLIGHT {
                trials += 1;
            }
            last = limit;
            if limit > MIN_IN_FLIGHT && trials % 2 == 0 {
                10.0
            } else {
                20.0
            }
        });
        assert_eq!(climb.limit, MIN_IN_FLIGHT);
    }

    #[tokio::test]
    async fn permits_follow_the_limit_up_and_down_and_never_exceed_it() {
        let in_flight = InFlight::new(IssuanceMode::Upsert, MOST);
        let held: Vec<_> =
            futures::future::join_all((0..MIN_IN_FLIGHT).map(|_| in_flight.admit())).await;
        assert_eq!(in_flight.permits.available_permits(), 0);
        assert!(
            in_flight.permits.try_acquire().is_err(),
            "a third batch admitted"
        );
        for admitted in held {
            in_flight.finished(admitted, 1, Duration::from_millis(1));
        }
        // Batches one at a time through `finished`, as in `run`: first where each batch
        // more answers sooner, then where each answers later. With none in flight after
        // each, what is available is the limit, whatever the search did.
        let mut at = Instant::now();
        let mut seen = Vec::new();
        for phase in [
            |limit: usize| 40.0 / limit as f64,
            |limit: usize| 10.0 + 2.0 * limit as f64,
        ] {
            let end = at + Duration::from_secs_f64(cycles(40));
            while at < end {
                let limit = in_flight.climb.lock().unwrap().limit;
                let ms = phase(limit);
                at += Duration::from_secs_f64(8.0 * ms / 32_000.0);
                let admitted = in_flight.admit().await;
                let lived = Duration::from_secs_f64(8.0 * ms / 1000.0);
                in_flight.finished_at(admitted, 8, lived, at);
                let limit = in_flight.climb.lock().unwrap().limit;
                assert_eq!(in_flight.permits.available_permits(), limit);
                seen.push(limit);
            }
        }
        assert!(seen.contains(&MOST), "never climbed: {seen:?}");
        assert_eq!(*seen.last().unwrap(), MIN_IN_FLIGHT);
    }
}
