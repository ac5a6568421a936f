//! Waiting for fulfilment (`Prefer: wait=N`): a checkout whose request would be answered
//! 202 may be held until the payment's provider event has been applied, on any instance,
//! and then answered what the request gets at that moment.
//!
//! Who may wait, and for how long, is decided here: checkout keys only (a trusted key
//! issues at once anyway), and at most `MAX_WAIT`. The wait is not work: the HTTP layer
//! adds it to the request's timeout, so a wait of N seconds never ends in a 503.
//!
//! Nobody polls the database. While anyone waits, each instance runs one change stream
//! (`Store::applied_payment_events`) and wakes, through an in-memory registry, the waiters
//! of the payment it names; a woken waiter checks again. A waiter registers before its
//! first check, so an event applied while that check runs still wakes it. Whenever the
//! stream is (re)opened, for a first waiter or after an error or a failover, every waiter
//! checks once more: an event applied while no stream was open would otherwise hold its
//! waiter until the deadline. The stream is closed once nobody has waited for
//! `IDLE_LINGER`: a change stream makes the primary read every entry of its oplog, every
//! token written included, which cost mongod a seventh of its CPU per issuance under a
//! steady load of issuances (docs/BENCHMARKS.md), and each instance pays it again; it is
//! worth paying only while someone waits. The number of waiters is bounded, in total (`issuance.max_waiters`) and per
//! client address (`issuance.max_waiters_per_address`, so one abuser holding a public
//! checkout key cannot take every place); beyond either a request is answered at once,
//! as if it had not asked to wait. A waiter is a guard: a client that disconnects drops the
//! request's future and with it its place. When the instance shuts down, every waiter
//! checks a last time and is answered at once, instead of being cut off when the grace
//! period ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Caller, IssueError, IssueOutcome, Issuer};
use crate::domain::{ClientAddress, NewIssuance, PaymentKey};
use crate::store::StoreError;
use crate::telemetry::metric;

/// The longest wait a client may ask for; a larger `wait` is clamped to it.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// The wait a request asking for `requested` seconds may get: at most `MAX_WAIT`.
pub fn longest_wait(requested: u64) -> Duration {
    Duration::from_secs(requested).min(MAX_WAIT)
}

/// How long the change stream's watcher waits before opening it again after a failure.
const REOPEN_DELAY: Duration = Duration::from_secs(1);
/// How long the change stream stays open after the last waiter left: long enough that a
/// steady trickle of waiting checkouts keeps one stream rather than opening one each.
const IDLE_LINGER: Duration = Duration::from_secs(5);

/// The bounds on waiting, taken from `Settings`.
#[derive(Debug, Clone, Copy, Default)]
pub struct WaitingConfig {
    /// Requests that may wait at once on this instance; 0: none may.
    pub max_waiters: usize,
    /// Of those, the most one client address may hold.
    pub max_waiters_per_address: usize,
}

/// An answer to an issuance request that may have waited.
#[derive(Debug)]
pub struct Waited {
    pub result: Result<IssueOutcome, IssueError>,
    /// The whole seconds it was allowed to wait, when it waited (`Preference-Applied`).
    pub waited_secs: Option<u64>,
}

impl Issuer {
    /// Bounds waiting with `config`; until called, nobody waits.
    pub fn with_waiting(mut self, config: WaitingConfig) -> Self {
        self.waiters = Arc::new(Waiters::new(config));
        self
    }

    /// Issues `request` as `caller` (from `client`) may; a checkout that asked to wait
    /// `wait_secs`, would be answered pending and finds a place is held until its
    /// payment's next applied event (then checked again, and held again while still
    /// pending) or until the wait is over (then checked a last time). `waits` hears the
    /// wait just before it begins, and only then: the caller's timeout grows by the wait,
    /// never for a request that does not wait (a trusted key, no place, not pending).
    pub async fn issue_waiting(
        &self,
        caller: Caller,
        request: &NewIssuance,
        wait_secs: Option<u64>,
        client: ClientAddress,
        waits: impl FnOnce(Duration),
    ) -> Waited {
        let deadline_from = Instant::now();
        // Registered before the first check, so nothing applied during it goes unheard.
        let slot = Self::allowed_wait(caller, wait_secs)
            .and_then(|secs| Some((secs, self.waiters.register(&request.key, client)?)));
        let first = self.issue(caller, request).await;
        let Some((secs, mut slot)) = slot.filter(|_| is_pending(&first)) else {
            return Waited {
                result: first,
                waited_secs: None,
            };
        };
        let deadline = deadline_from + Duration::from_secs(secs);
        // Only now, pending, does it need the change stream: a checkout answered by its
        // first check never makes the watcher open one.
        slot.begin_waiting();
        waits(Duration::from_secs(secs));
        loop {
            let woken = slot.woken_before(deadline).await;
            let result = self.issue(caller, request).await;
            if !woken || !is_pending(&result) {
                return Waited {
                    result,
                    waited_secs: Some(secs),
                };
            }
        }
    }

    /// The whole seconds `caller` may wait of the `requested`, if any.
    fn allowed_wait(caller: Caller, requested: Option<u64>) -> Option<u64> {
        if caller != Caller::Checkout {
            return None;
        }
        Some(longest_wait(requested?).as_secs()).filter(|secs| *secs > 0)
    }

    /// Starts this instance's watcher of applied payment events, which wakes the waiters
    /// of each payment it sees; it runs until the returned handle is dropped. It opens the
    /// change stream when a first request begins to wait (its first check said pending),
    /// and wakes every waiter once the stream is open (what was applied before went
    /// unseen), so a request never waits on a stream that is not watching; it closes the
    /// stream once nobody has waited for `IDLE_LINGER`.
    ///
    /// A new stream reports what is applied after it opens, and the waiters' checks after
    /// that first wake read at majority: nothing between is lost because an event is
    /// recorded only after its effects were acknowledged by the majority, so a check that
    /// follows the event's record sees them.
    pub fn watch_fulfilments(&self) -> FulfilmentWatch {
        let store = self.store.clone();
        let waiters = self.waiters.clone();
        let task = tokio::spawn(async move {
            let mut waiting = waiters.waiting.subscribe();
            loop {
                if waiting.wait_for(|count| *count > 0).await.is_err() {
                    return;
                }
                match store.applied_payment_events().await {
                    Ok(mut events) => {
                        // Whatever was applied while no stream was open went unseen.
                        waiters.wake_all();
                        let ended = tokio::select! {
                            ended = wake_on_events(&mut events, &waiters) => ended,
                            () = nobody_waits_for(&mut waiting, IDLE_LINGER) => continue,
                        };
                        if let Err(err) = ended {
                            tracing::warn!(error = %err, "the change stream of applied payment events failed; reopening it");
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot open the change stream of applied payment events; retrying");
                    }
                }
                tokio::time::sleep(REOPEN_DELAY).await;
            }
        });
        FulfilmentWatch {
            task,
            waiters: self.waiters.clone(),
        }
    }
}

/// Wakes the waiters of each payment `events` names, until the stream ends (the error
/// that ended it, if any).
async fn wake_on_events(
    events: &mut (impl Stream<Item = Result<PaymentKey, StoreError>> + Unpin),
    waiters: &Waiters,
) -> Result<(), StoreError> {
    while let Some(key) = events.next().await {
        waiters.wake(&key?);
    }
    Ok(())
}

/// Returns once the number of waiters `waiting` tells has stayed 0 for `linger`.
async fn nobody_waits_for(waiting: &mut watch::Receiver<usize>, linger: Duration) {
    loop {
        // The registry outlives its watcher, so these only end when the count does.
        let _ = waiting.wait_for(|count| *count == 0).await;
        tokio::select! {
            () = tokio::time::sleep(linger) => return,
            _ = waiting.wait_for(|count| *count > 0) => {}
        }
    }
}

fn is_pending(result: &Result<IssueOutcome, IssueError>) -> bool {
    matches!(result, Ok(IssueOutcome::Pending(_)))
}

/// The running watcher of `Issuer::watch_fulfilments`. Dropping it (at shutdown) stops
/// the watcher and closes the registry: every waiter is answered after a last check, and
/// nobody waits from then on.
pub struct FulfilmentWatch {
    task: JoinHandle<()>,
    waiters: Arc<Waiters>,
}

impl Drop for FulfilmentWatch {
    fn drop(&mut self) {
        self.task.abort();
        self.waiters.close();
    }
}

/// The waiters of this instance, by payment.
pub(super) struct Waiters {
    config: WaitingConfig,
    registry: Mutex<Registry>,
    /// How many wait (`Slot::begin_waiting`): the watcher opens its change stream only
    /// while this is above 0.
    waiting: watch::Sender<usize>,
}

#[derive(Default)]
struct Registry {
    /// Places taken, by requests that wait or are about to (their first check runs).
    count: usize,
    payments: HashMap<PaymentKey, Waitlist>,
    /// How many wait per client address; an address leaves with its last waiter, so
    /// this holds at most `max_waiters` entries.
    addresses: HashMap<ClientAddress, usize>,
    /// Set at shutdown: no new waiter, and woken ones stop waiting.
    closed: bool,
}

/// The waiters of one payment: a send on `wake` wakes them all.
struct Waitlist {
    wake: watch::Sender<()>,
    waiters: usize,
}

impl Waiters {
    pub(super) fn new(config: WaitingConfig) -> Self {
        Self {
            config,
            registry: Mutex::new(Registry::default()),
            waiting: watch::channel(0).0,
        }
    }

    /// The registry; a panic elsewhere while it was held left it consistent (every
    /// change under the lock is a single step).
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place among `key`'s waiters for a request from `client`, or `None` when
    /// `max_waiters` are waiting already, or `max_waiters_per_address` from `client` (or
    /// the instance is shutting down).
    fn register(self: &Arc<Self>, key: &PaymentKey, client: ClientAddress) -> Option<Slot> {
        let mut registry = self.registry();
        let from_client = registry.addresses.get(&client).copied().unwrap_or(0);
        if registry.closed
            || registry.count >= self.config.max_waiters
            || from_client >= self.config.max_waiters_per_address
        {
            return None;
        }
        registry.count += 1;
        registry.addresses.insert(client, from_client + 1);
        let waitlist = registry
            .payments
            .entry(key.clone())
            .or_insert_with(|| Waitlist {
                wake: watch::channel(()).0,
                waiters: 0,
            });
        waitlist.waiters += 1;
        let wake = waitlist.wake.subscribe();
        metrics::gauge!(metric::ISSUANCE_WAITERS).increment(1.0);
        Some(Slot {
            waiters: self.clone(),
            key: key.clone(),
            client,
            wake,
            waiting: false,
        })
    }

    /// Wakes the waiters of `key`, if any.
    fn wake(&self, key: &PaymentKey) {
        if let Some(waitlist) = self.registry().payments.get(key) {
            waitlist.wake.send_replace(());
        }
    }

    /// Wakes every waiter.
    fn wake_all(&self) {
        for waitlist in self.registry().payments.values() {
            waitlist.wake.send_replace(());
        }
    }

    /// Ends all waiting: the waiters are woken to stop, and no new one is admitted. Under
    /// the same lock as `register`, so no waiter slips in unwoken.
    fn close(&self) {
        let mut registry = self.registry();
        registry.closed = true;
        for waitlist in registry.payments.values() {
            waitlist.wake.send_replace(());
        }
    }

    fn is_closed(&self) -> bool {
        self.registry().closed
    }

    #[cfg(test)]
    fn count(&self) -> usize {
        self.registry().count
    }
}

/// One waiting request's place; dropping it (an answer, or a client gone) frees it.
struct Slot {
    waiters: Arc<Waiters>,
    key: PaymentKey,
    client: ClientAddress,
    wake: watch::Receiver<()>,
    /// Counted among those waiting (`begin_waiting`).
    waiting: bool,
}

impl Slot {
    /// Counts this slot among the waiting, which has the watcher open its change stream.
    fn begin_waiting(&mut self) {
        self.waiters.waiting.send_modify(|waiting| *waiting += 1);
        self.waiting = true;
    }

    /// Waits for a wake since the last one this slot saw (or since it registered), or
    /// for `deadline`; true when woken to check again, false when the wait is over (the
    /// deadline, or shutdown).
    async fn woken_before(&mut self, deadline: Instant) -> bool {
        tokio::select! {
            changed = self.wake.changed() => changed.is_ok() && !self.waiters.is_closed(),
            () = tokio::time::sleep_until(deadline) => false,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut registry = self.waiters.registry();
        registry.count -= 1;
        if self.waiting {
            self.waiters.waiting.send_modify(|waiting| *waiting -= 1);
        }
        if let Some(from_client) = registry.addresses.get_mut(&self.client) {
            *from_client -= 1;
            if *from_client == 0 {
                registry.addresses.remove(&self.client);
            }
        }
        if let Some(waitlist) = registry.payments.get_mut(&self.key) {
            waitlist.waiters -= 1;
            if waitlist.waiters == 0 {
                registry.payments.remove(&self.key);
            }
        }
        metrics::gauge!(metric::ISSUANCE_WAITERS).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AccountId, PaymentIntentId, Provider};

    fn key(payment: &str) -> PaymentKey {
        PaymentKey {
            provider: Provider::parse("stripe").unwrap(),
            account_id: AccountId::default(),
            payment_intent_id: PaymentIntentId::parse(payment).unwrap(),
        }
    }

    fn waiters(max_waiters: usize) -> Arc<Waiters> {
        Arc::new(Waiters::new(WaitingConfig {
            max_waiters,
            max_waiters_per_address: max_waiters,
        }))
    }

    fn client(address: &str) -> ClientAddress {
        ClientAddress::of(address.parse().unwrap())
    }

    /// A place for `payment`'s waiter from the test's one client.
    fn register(waiters: &Arc<Waiters>, payment: &str) -> Option<Slot> {
        waiters.register(&key(payment), client("192.0.2.1"))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(200)
    }

    #[tokio::test]
    async fn a_wake_before_the_wait_is_not_lost() {
        let waiters = waiters(10);
        let mut slot = register(&waiters, "pi_1").unwrap();
        // Sent while the waiter was still checking: heard when it starts waiting.
        waiters.wake(&key("pi_1"));
        assert!(slot.woken_before(soon()).await);
        // Heard once: the next wait times out.
        assert!(!slot.woken_before(soon()).await);
    }

    #[tokio::test]
    async fn wakes_reach_only_their_payment_but_wake_all_reaches_everyone() {
        let waiters = waiters(10);
        let mut first = register(&waiters, "pi_1").unwrap();
        let mut second = register(&waiters, "pi_2").unwrap();
        waiters.wake(&key("pi_2"));
        assert!(!first.woken_before(soon()).await);
        assert!(second.woken_before(soon()).await);
        waiters.wake_all();
        assert!(first.woken_before(soon()).await);
        assert!(second.woken_before(soon()).await);
    }

    #[tokio::test]
    async fn closing_ends_every_wait_and_admits_nobody() {
        let waiters = waiters(10);
        let mut slot = register(&waiters, "pi_1").unwrap();
        waiters.close();
        // Far off: only the close can end this wait.
        let later = Instant::now() + Duration::from_secs(60);
        assert!(!slot.woken_before(later).await, "a closed wait is over");
        assert!(register(&waiters, "pi_2").is_none());
    }

    #[test]
    fn only_a_place_whose_request_waits_asks_for_the_change_stream() {
        let waiters = waiters(10);
        let waiting = waiters.waiting.subscribe();
        let mut first = register(&waiters, "pi_1").unwrap();
        let second = register(&waiters, "pi_2").unwrap();
        assert_eq!(*waiting.borrow(), 0, "registered, still checking");
        first.begin_waiting();
        assert_eq!(*waiting.borrow(), 1);
        drop(second);
        assert_eq!(
            *waiting.borrow(),
            1,
            "a place that never waited leaves no trace"
        );
        drop(first);
        assert_eq!(*waiting.borrow(), 0);
    }

    #[test]
    fn places_are_bounded_and_freed_on_drop() {
        let waiters = waiters(2);
        let first = register(&waiters, "pi_1").unwrap();
        let second = register(&waiters, "pi_1").unwrap();
        assert!(register(&waiters, "pi_2").is_none(), "beyond the cap");
        drop(first);
        assert_eq!(waiters.count(), 1);
        assert_eq!(waiters.registry().payments.len(), 1);
        drop(second);
        assert_eq!(waiters.count(), 0);
        assert!(
            waiters.registry().payments.is_empty(),
            "no empty waitlist kept"
        );
        assert!(register(&waiters, "pi_2").is_some());
    }

    #[test]
    fn one_address_holds_at_most_its_share_of_places() {
        let waiters = Arc::new(Waiters::new(WaitingConfig {
            max_waiters: 5,
            max_waiters_per_address: 2,
        }));
        let abuser = client("203.0.113.7");
        let first = waiters.register(&key("pi_1"), abuser).unwrap();
        let second = waiters.register(&key("pi_2"), abuser).unwrap();
        assert!(
            waiters.register(&key("pi_3"), abuser).is_none(),
            "its share"
        );
        // Another address of the same IPv6 /64 is the same client.
        let v6_first = waiters
            .register(&key("pi_4"), client("2001:db8::1"))
            .unwrap();
        let v6_second = waiters
            .register(&key("pi_5"), client("2001:db8::ffff"))
            .unwrap();
        assert!(
            waiters
                .register(&key("pi_6"), client("2001:db8::abcd:1"))
                .is_none()
        );
        // Places are left for everyone else.
        let shopper = waiters
            .register(&key("pi_7"), client("198.51.100.1"))
            .unwrap();
        assert_eq!(waiters.count(), 5);
        // Freed with the waiter.
        drop(first);
        let again = waiters.register(&key("pi_3"), abuser).unwrap();
        assert_eq!(waiters.registry().addresses.len(), 3);
        // And no address is kept once its last waiter is gone.
        drop((again, second, v6_first, v6_second, shopper));
        assert!(waiters.registry().addresses.is_empty());
    }

    #[test]
    fn only_checkouts_wait_and_never_longer_than_the_cap() {
        assert_eq!(Issuer::allowed_wait(Caller::Checkout, Some(10)), Some(10));
        assert_eq!(Issuer::allowed_wait(Caller::Checkout, Some(3600)), Some(30));
        assert_eq!(Issuer::allowed_wait(Caller::Checkout, Some(0)), None);
        assert_eq!(Issuer::allowed_wait(Caller::Checkout, None), None);
        assert_eq!(Issuer::allowed_wait(Caller::Trusted, Some(10)), None);
    }
}
