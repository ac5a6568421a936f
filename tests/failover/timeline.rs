//! What the watcher saw: elections (a change of primary, or a stretch without one) and
//! the longest stretch without a successful write around each.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mongodb::Client;

use super::replica_set::probe_primary;

/// Samples which member is primary every 200 ms until `stop`.
pub(super) async fn watch_primary(
    clients: Vec<Client>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<(Duration, Option<usize>)> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        samples.push((start.elapsed(), probe_primary(&clients).await));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    samples
}

/// An election seen by the watcher (a change of primary, or a stretch without one): from
/// whom, to whom, the last sample that still showed the old primary and the first that
/// showed the new one.
#[derive(Debug)]
pub(super) struct Election {
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) lost: Duration,
    pub(super) elected: Duration,
}

pub(super) fn elections(samples: &[(Duration, Option<usize>)]) -> Vec<Election> {
    let mut found = Vec::new();
    // The primary last seen and when; whether a sample since showed no primary at all.
    let mut current: Option<(usize, Duration)> = None;
    let mut without_primary = false;
    for &(at, primary) in samples {
        match primary {
            None => without_primary = current.is_some(),
            Some(to) => {
                if let Some((from, lost)) = current
                    && (without_primary || from != to)
                {
                    // Re-electing the same member (after its stepdown freeze) counts too.
                    found.push(Election {
                        from,
                        to,
                        lost,
                        elected: at,
                    });
                }
                current = Some((to, at));
                without_primary = false;
            }
        }
    }
    found
}

/// The longest stretch without a successful write that overlaps `[from, to]`.
pub(super) fn longest_gap_over(
    successes: &[Duration],
    from: Duration,
    to: Duration,
    end: Duration,
) -> Duration {
    let mut previous = successes
        .iter()
        .rev()
        .find(|s| **s <= from)
        .copied()
        .unwrap_or(from);
    let mut longest = Duration::ZERO;
    for next in successes.iter().copied().filter(|s| *s > from).chain([end]) {
        if previous > to {
            break;
        }
        longest = longest.max(next - previous);
        previous = next;
    }
    longest
}
