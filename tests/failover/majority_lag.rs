//! A redemption retried while its first attempt is applied on the primary but not yet
//! majority-committed (`failover_redemption_retried_before_the_majority_has_it_…`).
//!
//! The primary's committed snapshot is held back (`disableSnapshotting`, a test-only
//! failpoint): a write is applied, visible to a transaction's snapshot, and absent from
//! a majority read, as when the secondaries lag. The first attempt spends the owner's
//! only token of its type and gives up waiting for the majority; the retry, on another
//! instance, must answer neither 2xx (from data a failover may lose) nor 409
//! `insufficient_balance` (the token it finds spent is its own), but 503. Once the
//! majority has the first attempt, the retry replays it. Twice: with the owner's only
//! token of the type (nothing left to spend), and with two (another token it could
//! spend).
//!
//! Then another reference: a redemption that finds the owner's only token spent by a
//! redemption the majority does not have yet must not be refused 409
//! `insufficient_balance` either (a failover may roll that one back, and then the same
//! request would succeed), but answered 503 until the majority has it, then refused.
//!
//! Then an atomic issuance whose commit gives up waiting for the majority: 503, its retry
//! while the majority still lags 503 too (the record in the way is not the majority's
//! yet: neither a replay nor a bug), then a replay of the committed tokens.
//!
//! Before all that, neither instance holds an oplog waiter: on a set with secondaries
//! their oplog readers already wait on the primary's oplog.
//!
//! Last a single token's redeem with its `reference` and `If-Match`: 503, its retry
//! while the majority lags 503 (not 412 for the version its own first attempt made),
//! then a replay.

use std::time::{Duration, Instant};

use mongodb::Collection;
use mongodb::Database;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Document, doc};
use reqwest::RequestBuilder;
use serde_json::{Value, json};
use tokenmint_test_support::{
    ADMIN_KEY, OTHER_OWNER, OWNER, indexed_token_ids, issuance_body, no_change_stream_during,
    stored_int,
};

use super::load::stock_tokens;
use super::replica_set::ReplicaSet;
use super::{ONE_AT_A_TIME, start_app, start_impatient_app};

/// A status and a JSON body.
type Answer = (u16, Value);

/// The instances and the primary the cases run against.
struct Lag {
    http: reqwest::Client,
    admin: Database,
    /// An instance that waits for the majority as long as its requests may run.
    app: String,
    /// An instance whose writes give up waiting for the majority after 2 s.
    impatient: String,
    /// A collection of the database no case reads, for a write that moves the majority
    /// snapshot on.
    nudge: Collection<Document>,
}

impl Lag {
    fn post(&self, base: &str, path: &str, body: &Value) -> RequestBuilder {
        self.http
            .post(format!("{base}{path}"))
            .bearer_auth(ADMIN_KEY)
            .json(body)
    }

    /// `first`, then `retry`, while the primary's majority snapshot is held back
    /// (`disableSnapshotting`, a test-only failpoint); each answer logged under `label`.
    async fn while_lagging(
        &self,
        label: &str,
        first: RequestBuilder,
        retry: RequestBuilder,
    ) -> (Answer, Answer) {
        self.snapshotting("alwaysOn").await;
        let first = answer(first).await;
        eprintln!(
            "failover[majority-lag] {label}: first answered {} {}",
            first.0, first.1
        );
        let retry = answer(retry).await;
        eprintln!(
            "failover[majority-lag] {label}: retry answered {} {}",
            retry.0, retry.1
        );
        self.snapshotting("off").await;
        (first, retry)
    }

    /// Issues one token of `token_type` for `payment` on the patient instance: its id.
    async fn issue_one(&self, payment: &str, token_type: &str) -> String {
        let mut body = issuance_body(payment, 1);
        body["tokenType"] = json!(token_type);
        let (status, issued) = answer(self.post(&self.app, "/v1/issuances", &body)).await;
        assert_eq!(status, 201, "{issued}");
        indexed_token_ids(&issued).remove(0).1
    }

    /// A redeem of token `id` on the instance at `base`, without a body, under `key`.
    fn redeem_keyed(&self, base: &str, id: &str, key: &str) -> RequestBuilder {
        self.http
            .post(format!("{base}/v1/tokens/{id}/redeem"))
            .bearer_auth(ADMIN_KEY)
            .header("Idempotency-Key", key)
    }

    /// Holds the majority snapshot back now, and lets it catch up `behind` from now, in
    /// the background.
    async fn behind_for(&self, behind: Duration) -> tokio::task::JoinHandle<()> {
        self.snapshotting("alwaysOn").await;
        let admin = self.admin.clone();
        let nudge = self.nudge.clone();
        tokio::spawn(async move {
            tokio::time::sleep(behind).await;
            admin
                .run_command(doc! { "configureFailPoint": "disableSnapshotting", "mode": "off" })
                .await
                .expect("failpoint off");
            // The snapshot moves on at the next majority write: one now, as traffic would
            // make it, rather than the server's idle no-op ten seconds later.
            nudge
                .update_one(doc! { "_id": "nudge" }, doc! { "$inc": { "n": 1 } })
                .upsert(true)
                .await
                .expect("a write moves the majority's snapshot on");
        })
    }

    async fn snapshotting(&self, mode: &str) {
        self.admin
            .run_command(doc! { "configureFailPoint": "disableSnapshotting", "mode": mode })
            .await
            .expect("failpoint set");
    }
}

/// Sends `request`; its status and JSON body.
async fn answer(request: RequestBuilder) -> Answer {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json::<Value>().await.unwrap())
}

/// What `request` builds, sent until it is answered other than 503 (the majority catching
/// up once the failpoint is off), at most 20 times half a second apart.
async fn once_the_majority_has_it(request: impl Fn() -> RequestBuilder) -> Answer {
    let mut last = (0, Value::Null);
    for _ in 0..20 {
        last = answer(request()).await;
        if last.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

/// 503 `database_unavailable`: retry later.
fn assert_unavailable((status, body): &Answer, what: &str) {
    assert_eq!(
        (*status, body["code"].as_str()),
        (503, Some("database_unavailable")),
        "{what}: {body}"
    );
}

pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[majority-lag]: starting a 3-member replica set");
    let set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let database = "tokenmint_failover_majority_lag";
    let app = start_app(&set, database).await;
    let redeemer = start_impatient_app(&set, database).await;
    // With secondaries, their oplog readers already wait on the primary's oplog: neither
    // instance holds an oplog waiter of its own.
    for instance in [&app, &redeemer] {
        no_change_stream_during(
            instance,
            "oplog_waiter",
            Duration::from_secs(2),
            "an oplog waiter on a set of three",
        )
        .await;
    }
    let lag = Lag {
        http: tokenmint_test_support::http_client_builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        admin: set.clients()[primary].database("admin"),
        app: app.address.clone(),
        impatient: redeemer.address.clone(),
        nudge: set.clients()[primary]
            .database(database)
            .collection("majority_nudge"),
    };
    let tokens = set.clients()[primary]
        .database(database)
        .collection::<Document>("tokens");
    // One token: nothing is left to spend (the retry must not refuse). Two: another one
    // is (the retry must not spend it).
    for (token_type, stocked) in [("lagone", 1), ("lagtwo", 2)] {
        let payment = format!("pi_majority_{token_type}");
        stock_tokens(&lag.http, &lag.app, &payment, token_type, stocked).await;
        let body = json!({
            "owner": OWNER, "tokenType": token_type, "quantity": 1, "reference": token_type,
        });
        let redeem = |base: &str| lag.post(base, "/v1/redemptions", &body);
        let (first, retry) = lag
            .while_lagging(token_type, redeem(&lag.impatient), redeem(&lag.app))
            .await;
        assert!(
            !(200..300).contains(&first.0),
            "{token_type}: the first attempt was answered {first:?} before the majority had it"
        );
        // Retry later: the record its snapshot shows is not the majority's yet, and its
        // attempts' budget ends.
        assert_unavailable(
            &retry,
            &format!("{token_type}: the retry while its first attempt was applied, not durable"),
        );
        // Once the majority has the first attempt, a retry replays it: one token, the
        // only one redeemed.
        let replayed = once_the_majority_has_it(|| redeem(&lag.app)).await;
        assert_eq!(replayed.0, 200, "{token_type}: {}", replayed.1);
        assert_eq!(indexed_token_ids(&replayed.1).len(), 1, "{}", replayed.1);
        let redeemed = tokens
            .count_documents(doc! { "type": token_type, "status": "redeemed" })
            .await
            .unwrap();
        assert_eq!(redeemed, 1, "{token_type}");
    }
    another_reference_waits_for_the_majority(&lag).await;
    atomic_issuance_waits_for_the_majority(&lag).await;
    token_redeem_waits_for_the_majority(&lag).await;
    token_write_outwaits_a_majority_behind_for_seconds(&lag, &tokens).await;
    an_answer_the_majority_lacks_is_not_replayed(&lag, &tokens).await;
    a_retry_while_its_first_attempt_waits_is_told_it_runs(&lag).await;
    a_write_changed_again_before_the_majority_had_it_ends_at_once(&lag).await;
    redeemer.stop().await;
    app.stop().await;
}

/// A redemption of another reference, for the token a lagging redemption spent: 503
/// while the majority lags (a refusal would rest on what a failover may roll back),
/// 409 `insufficient_balance` once the majority has the first.
async fn another_reference_waits_for_the_majority(lag: &Lag) {
    stock_tokens(&lag.http, &lag.app, "pi_majority_lagother", "lagother", 1).await;
    let redemption = |reference: &str| json!({ "owner": OWNER, "tokenType": "lagother", "quantity": 1, "reference": reference });
    let (first, second) = (redemption("lagother-first"), redemption("lagother-second"));
    let redeem = |base: &str, body: &Value| lag.post(base, "/v1/redemptions", body);
    let (first_answer, other) = lag
        .while_lagging(
            "lagother",
            redeem(&lag.impatient, &first),
            redeem(&lag.impatient, &second),
        )
        .await;
    assert!(
        !(200..300).contains(&first_answer.0),
        "lagother: {first_answer:?}"
    );
    assert_unavailable(
        &other,
        "another reference while the token's redemption was applied, not durable",
    );
    let refused = once_the_majority_has_it(|| redeem(&lag.app, &second)).await;
    assert_eq!(
        (
            refused.0,
            refused.1["code"].as_str(),
            refused.1["available"].as_u64()
        ),
        (409, Some("insufficient_balance"), Some(0)),
        "once the majority has the first: {}",
        refused.1
    );
    let replayed = answer(redeem(&lag.app, &first)).await;
    assert_eq!(replayed.0, 200, "{}", replayed.1);
}

/// An atomic issuance whose commit applied on the primary and gave up waiting for the
/// majority: 503, then 503 for its retry while the majority lags (a record is in the
/// way that a majority read does not find), then a replay (200, nothing created) of the
/// tokens it committed, once.
async fn atomic_issuance_waits_for_the_majority(lag: &Lag) {
    let mut body = issuance_body("pi_majority_atomic", 2);
    body["mode"] = json!("atomic");
    let issue = |base: &str| lag.post(base, "/v1/issuances", &body);
    // The retry on the impatient instance too: a write of the retry's that waits for the
    // majority (a patient one waits until the request's own timeout) gives up after 2 s.
    let (first, retry) = lag
        .while_lagging("atomic", issue(&lag.impatient), issue(&lag.impatient))
        .await;
    assert_unavailable(&first, "the commit the majority did not confirm");
    assert_unavailable(&retry, "the retry while the majority lags");
    let replayed = once_the_majority_has_it(|| issue(&lag.app)).await;
    assert_eq!(
        (replayed.0, &replayed.1["created"]),
        (200, &json!(0)),
        "{}",
        replayed.1
    );
    assert_eq!(indexed_token_ids(&replayed.1).len(), 2, "{}", replayed.1);
}

/// A redeem of one token, with its `reference` and `If-Match: "0"`, whose write gave up
/// waiting for the majority: 503; its retry while the majority lags reads the token
/// active and its gated write misses the version its own first attempt made: 503, not
/// 412; once the majority has it, a replay (200), the token redeemed once.
async fn token_redeem_waits_for_the_majority(lag: &Lag) {
    let id = lag.issue_one("pi_majority_redeem", "lagredeem").await;
    let reference = json!({ "reference": "lagredeem" });
    let redeem = |base: &str| {
        lag.post(base, &format!("/v1/tokens/{id}/redeem"), &reference)
            .header("If-Match", "\"0\"")
    };
    let (first, retry) = lag
        .while_lagging("redeem", redeem(&lag.impatient), redeem(&lag.impatient))
        .await;
    assert_unavailable(&first, "the write the majority did not confirm");
    assert_unavailable(&retry, "the retry while the majority lags");
    let replayed = once_the_majority_has_it(|| redeem(&lag.app)).await;
    assert_eq!(
        (replayed.0, &replayed.1["version"], &replayed.1["status"]),
        (200, &json!(1), &json!("redeemed")),
        "{}",
        replayed.1
    );
}

/// A redeem of one token on the patient instance, without and with an `Idempotency-Key`,
/// while the majority is 3 s behind: its writes bound their wait for a document another
/// transaction holds (1 s), and that bound must not cut their wait for the majority
/// short. 200 once the majority has the redeem, not 503 while it applied; the token
/// redeemed once; the keyed one's retry replays it.
async fn token_write_outwaits_a_majority_behind_for_seconds(
    lag: &Lag,
    tokens: &Collection<Document>,
) {
    const BEHIND: Duration = Duration::from_secs(3);
    for (payment, key) in [
        ("pi_majority_plain", None),
        ("pi_majority_keyed", Some("lag-keyed-redeem")),
    ] {
        let id = lag.issue_one(payment, "lagplain").await;
        let redeem = || match key {
            Some(key) => lag.redeem_keyed(&lag.app, &id, key),
            None => lag
                .http
                .post(format!("{}/v1/tokens/{id}/redeem", lag.app))
                .bearer_auth(ADMIN_KEY),
        };
        let catch_up = lag.behind_for(BEHIND).await;
        let started = Instant::now();
        let (status, answered) = answer(redeem()).await;
        let waited = started.elapsed();
        catch_up.await.unwrap();
        eprintln!("failover[majority-lag] {payment}: answered {status} after {waited:?}");
        assert_eq!(
            (status, &answered["status"]),
            (200, &json!("redeemed")),
            "{payment}: {answered}"
        );
        assert!(
            waited >= BEHIND - Duration::from_millis(500),
            "{payment}: answered after {waited:?}, before the majority had it"
        );
        let stored = tokens
            .find_one(doc! { "_id": ObjectId::parse_str(&id).unwrap() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.get_str("status").unwrap(), "redeemed", "{payment}");
        assert_eq!(
            stored_int(&stored, "_version"),
            Some(1),
            "{payment}: redeemed once"
        );
        if key.is_some() {
            let replayed = redeem().send().await.unwrap();
            assert_eq!(replayed.status(), 200, "{payment}: the retry");
            assert_eq!(replayed.headers()["idempotent-replayed"], "true");
        }
    }
}

/// A key's answer on the primary that the majority does not have yet (as a commit still
/// waiting for the majority leaves it): the key's retry finds that answered record, and
/// its claim, which changes nothing, runs out of time waiting for the majority all the
/// same. It must not replay an answer a failover could still roll back, only once the
/// majority has it; one whose wait ends first (the impatient instance's `wtimeoutMS`) is
/// told 409 `request_in_progress`. The record is a copy, under another key, of a keyed
/// redeem's answered record, written on the primary alone (`w: 1`) while the majority is
/// held back.
async fn an_answer_the_majority_lacks_is_not_replayed(lag: &Lag, tokens: &Collection<Document>) {
    const BEHIND: Duration = Duration::from_secs(4);
    let id = lag.issue_one("pi_majority_replay", "lagreplay").await;
    let redeem = |key: &str| lag.redeem_keyed(&lag.app, &id, key);
    let redeemed = redeem("lag-replay").send().await.unwrap();
    assert_eq!(redeemed.status(), 200);
    let records = tokens
        .client()
        .database(&tokens.namespace().db)
        .collection::<Document>("idempotency_keys");
    let mut copy = records
        .find_one(doc! { "key": "lag-replay" })
        .await
        .unwrap()
        .expect("the key's record");
    copy.insert("_id", ObjectId::new());
    copy.insert("key", "lag-replay-copy");

    let catch_up = lag.behind_for(BEHIND).await;
    let started = Instant::now();
    records
        .insert_one(copy)
        .write_concern(
            mongodb::options::WriteConcern::builder()
                .w(mongodb::options::Acknowledgment::Nodes(1))
                .build(),
        )
        .await
        .expect("the primary takes the copy");
    // An instance whose wait for the majority ends first (its `wtimeoutMS`): the answer
    // is still settling, the key's retry is told so.
    let impatient = lag
        .redeem_keyed(&lag.impatient, &id, "lag-replay-copy")
        .send()
        .await
        .unwrap();
    let impatient_status = impatient.status().as_u16();
    let problem: Value = impatient.json().await.unwrap();
    assert_eq!(
        (impatient_status, problem["code"].as_str()),
        (409, Some("request_in_progress")),
        "{problem}"
    );
    let retry = redeem("lag-replay-copy").send().await.unwrap();
    let waited = started.elapsed();
    catch_up.await.unwrap();
    eprintln!(
        "failover[majority-lag] replay: answered {} after {waited:?}",
        retry.status()
    );
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert!(
        waited >= BEHIND - Duration::from_millis(500),
        "replayed after {waited:?}, before the majority had the answer"
    );
}

/// A keyed redeem whose claim waits for a majority 3 s behind, and its retry 0.3 s later:
/// the retry's claim finds the first attempt's record unanswered (the primary's, perhaps
/// not the majority's, and about to change) and is told 409 `request_in_progress` once
/// its own second is up, rather than wait for a state of that record the majority may
/// never show. The first attempt redeems.
async fn a_retry_while_its_first_attempt_waits_is_told_it_runs(lag: &Lag) {
    const BEHIND: Duration = Duration::from_secs(3);
    let id = lag.issue_one("pi_majority_running", "lagrunning").await;
    let redeem = || lag.redeem_keyed(&lag.app, &id, "lag-running").send();
    let records = lag
        .nudge
        .client()
        .database(&lag.nudge.namespace().db)
        .collection::<Document>("idempotency_keys");
    let catch_up = lag.behind_for(BEHIND).await;
    let first = tokio::spawn(redeem());
    // The first attempt's claim on the primary (this client reads it locally) before the
    // retry's.
    while records
        .find_one(doc! { "key": "lag-running" })
        .await
        .unwrap()
        .is_none()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let retry = redeem().await.unwrap();
    let waited = started.elapsed();
    let retry_status = retry.status();
    let problem: Value = retry.json().await.unwrap();
    let first = first.await.unwrap().unwrap();
    catch_up.await.unwrap();
    eprintln!(
        "failover[majority-lag] running: retry answered {retry_status} after {waited:?}, first {}",
        first.status()
    );
    assert_eq!(
        (retry_status.as_u16(), problem["code"].as_str()),
        (409, Some("request_in_progress")),
        "{problem}"
    );
    assert!(
        waited < BEHIND - Duration::from_millis(500),
        "the retry waited {waited:?} on a record it could not decide on"
    );
    assert_eq!(first.status(), 200);
}

/// A transfer whose write waits for a majority 4 s behind, and a redemption (on the
/// impatient instance, whose transaction reads the primary's latest) that spends the
/// transferred token on the primary meanwhile: the majority then shows the token past
/// the transfer's version, never as the transfer left it. The transfer is answered 503
/// `database_unavailable` as soon as the majority shows that, not held to its request's
/// timeout.
async fn a_write_changed_again_before_the_majority_had_it_ends_at_once(lag: &Lag) {
    const BEHIND: Duration = Duration::from_secs(4);
    let token_type = "lagsuperseded";
    let id = lag.issue_one("pi_majority_superseded", token_type).await;
    let transfer = lag
        .post(
            &lag.app,
            &format!("/v1/tokens/{id}/transfer"),
            &json!({ "newOwner": OTHER_OWNER }),
        )
        .header("If-Match", "\"0\"");
    let catch_up = lag.behind_for(BEHIND).await;
    let started = Instant::now();
    let transferred = tokio::spawn(answer(transfer));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spend = json!({
        "owner": OTHER_OWNER, "tokenType": token_type, "quantity": 1, "reference": token_type,
    });
    let spent = answer(lag.post(&lag.impatient, "/v1/redemptions", &spend)).await;
    let spent_at = started.elapsed();
    let transferred = transferred.await.unwrap();
    let waited = started.elapsed();
    catch_up.await.unwrap();
    eprintln!(
        "failover[majority-lag] superseded: transfer answered {} after {waited:?}; the spend {} after {spent_at:?}",
        transferred.0, spent.0
    );
    // A spend answered 2xx is the majority's: never before the majority caught up.
    assert!(
        !(200..300).contains(&spent.0) || spent_at >= BEHIND,
        "the spend answered {} after {spent_at:?}, before the majority had it",
        spent.0
    );
    assert_unavailable(&transferred, "the transfer the majority never showed");
    // Not before the majority showed the spend (the 1 s bound on a held token is not the
    // end of the wait), not long after it.
    assert!(
        waited >= BEHIND - Duration::from_millis(500) && waited < BEHIND + Duration::from_secs(3),
        "the transfer was answered after {waited:?}, not when the majority showed the later version"
    );
}
