//! A replay during replication lag (`failover_replay_during_replication_lag_…`): the
//! window between "applied on the primary" and "majority-committed". Issuances in both
//! modes, and a redemption retried after its first attempt gave up waiting for the
//! majority.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokenmint_test_support::{ADMIN_KEY, OWNER, TokenIds, indexed_token_ids};

use super::load::{issuance, issue_until_ok, stock_tokens};
use super::replica_set::ReplicaSet;
use super::{ONE_AT_A_TIME, start_app, start_impatient_app, verify};

/// The window between "applied on the primary" and "majority-committed": both secondaries
/// are paused (SIGSTOP), a first request for a payment is sent (its write is applied on the
/// primary only and waits for the majority), then an identical second request. If either
/// is answered 2xx from the primary's not-yet-durable data — the first, say, because a
/// batch answered before the majority write that ends it — killing the primary (the
/// secondaries resume and elect a new one) loses what it acknowledged. Per mode.
pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[replication-lag]: starting a 3-member replica set");
    let mut set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let secondaries: Vec<usize> = (0..3).filter(|i| *i != primary).collect();
    let database = "tokenmint_failover_lag";
    let app = start_app(&set, database).await;
    let base = app.address.clone();
    let redeemer = start_impatient_app(&set, database).await;
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let modes = ["upsert", "atomic"];
    // Durable first: after the failover a replay of these must name the same ids.
    let mut warm_ids = BTreeMap::new();
    for mode in modes {
        let payment = format!("pi_lag_warm_{mode}");
        let body = issuance(&payment, mode);
        let warm = issue_until_ok(&http, &base, Instant::now(), &payment, &body).await;
        assert!(warm.violations.is_empty(), "{:?}", warm.violations);
        warm_ids.insert(mode, warm.acknowledged[0].1.clone());
    }
    // The one token the lagging redemption spends, durable before the lag: the owner's
    // whole balance of its type, so that a retry reading the primary's snapshot without
    // seeing the first attempt's record would find nothing left to spend.
    stock_tokens(&http, &base, "pi_lag_spendable", LAG_TOKEN_TYPE, 1).await;

    for s in &secondaries {
        set.signal(*s, libc::SIGSTOP);
    }
    let mut firsts = Vec::new();
    for mode in modes {
        let (http, base) = (http.clone(), base.clone());
        firsts.push(tokio::spawn(async move {
            (mode, issue_lagging(&http, &base, mode).await)
        }));
    }
    // The redemption's first attempt waits out its commit's retries (each gives up on the
    // majority after 2 s), and its retry waits for that first: a longer client timeout.
    let patient = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let first_redemption = {
        let (http, base) = (patient.clone(), redeemer.address.clone());
        tokio::spawn(async move { redeem_lagging(&http, &base).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The second, identical requests, while the first ones wait for the majority.
    let mut seconds: BTreeMap<&str, (u16, TokenIds)> = BTreeMap::new();
    for mode in modes {
        let (status, ids) = issue_lagging(&http, &base, mode).await;
        eprintln!(
            "failover[replication-lag] {mode}: second request answered {status} while the first was not durable"
        );
        seconds.insert(mode, (status, ids));
    }

    // The redemption's retry, on the other instance (the first one's writer is still busy
    // with it): the first one's commit is applied on the primary, not durable. The retry
    // must neither answer from it (2xx) nor refuse for want of the token it spent (409
    // `insufficient_balance`): either would be contradicted by a later answer.
    let (second_redemption, _) = redeem_lagging(&patient, &base).await;
    eprintln!(
        "failover[replication-lag] redemption: second request answered {second_redemption} while the first was not durable"
    );

    // Two of three members are stopped: nothing written for these payments can be
    // majority-committed yet, so any 2xx so far acknowledged what a failover may lose,
    // whether or not this failover happens to lose it (a stopped secondary may still
    // find the last oplog entries in its socket when it resumes).
    let mut violations = Vec::new();
    let mut early = Vec::new();
    for first in &firsts {
        early.push(first.is_finished());
    }
    if second_redemption != 503 {
        violations.push(format!(
            "redemption: the retry was answered {second_redemption} while two of three members were stopped"
        ));
    }
    let first_redemption_early = first_redemption.is_finished();
    for (mode, (status, _)) in &seconds {
        if (200..300).contains(status) {
            violations.push(format!(
                "{mode}: the second request was answered {status} while two of three members were stopped"
            ));
        }
    }

    // The primary dies; the secondaries resume and elect a new one.
    set.kill(primary);
    for s in &secondaries {
        set.signal(*s, libc::SIGCONT);
    }
    // The first requests end with the primary: their batch's mark, the write whose
    // majority would make their record and tokens durable, never got it.
    let mut first_answers: BTreeMap<&str, (u16, TokenIds)> = BTreeMap::new();
    for (first, early) in firsts.into_iter().zip(early) {
        let (mode, answer) = first.await.unwrap();
        if early && (200..300).contains(&answer.0) {
            violations.push(format!(
                "{mode}: the first request was answered {} while two of three members were stopped",
                answer.0
            ));
        }
        eprintln!(
            "failover[replication-lag] {mode}: first request answered {}",
            answer.0
        );
        first_answers.insert(mode, answer);
    }
    let (first_redemption, _) = first_redemption.await.unwrap();
    eprintln!("failover[replication-lag] redemption: first request answered {first_redemption}");
    if first_redemption_early && (200..300).contains(&first_redemption) {
        violations.push(format!(
            "redemption: the first request was answered {first_redemption} while two of three members were stopped"
        ));
    }
    set.wait_until_healthy(Duration::from_secs(90)).await;
    let start = Instant::now();
    for mode in modes {
        let payment = format!("pi_lag_{mode}");
        let body = issuance(&payment, mode);
        let retried = issue_until_ok(&http, &base, start, &payment, &body).await;
        violations.extend(retried.violations);
        let Some((_, now)) = retried.acknowledged.first() else {
            continue;
        };
        for (which, (status, acknowledged)) in
            [("first", &first_answers[mode]), ("second", &seconds[mode])]
        {
            if (200..300).contains(status) && acknowledged != now {
                violations.push(format!(
                    "{mode}: the {which} request was answered {status} with tokens {:?}..., lost in the failover; after it the payment has {:?}...",
                    acknowledged.first(),
                    now.first()
                ));
            }
        }
        let warm = format!("pi_lag_warm_{mode}");
        let replay = issue_until_ok(&http, &base, start, &warm, &issuance(&warm, mode)).await;
        violations.extend(replay.violations);
        if replay.acknowledged.first().map(|(_, ids)| ids) != warm_ids.get(mode) {
            violations.push(format!(
                "{warm}: acknowledged before the failover, other ids after it"
            ));
        }
    }
    // After the failover the redemption is either lost with the old primary or durable:
    // its retry redeems the token or replays it, the same token either way.
    let (after, after_ids) = redeem_lagging(&patient, &redeemer.address).await;
    eprintln!("failover[replication-lag] redemption: retried after the failover, answered {after}");
    if !(200..300).contains(&after) || after_ids.len() != 1 {
        violations.push(format!(
            "redemption: retried after the failover, answered {after} naming {after_ids:?}"
        ));
    }
    redeemer.stop().await;
    app.stop().await;
    verify(&set.uri(), database, &mut violations).await;
    eprintln!(
        "failover[replication-lag] summary: second requests {:?} violations={}",
        seconds
            .iter()
            .map(|(m, (s, _))| format!("{m}={s}"))
            .collect::<Vec<_>>(),
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "failover[replication-lag]: {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Sends the issuance of the lagging payment of `mode` (`pi_lag_{mode}`) once; the same
/// request each time, so the second is a replay of the first.
async fn issue_lagging(http: &reqwest::Client, base: &str, mode: &str) -> (u16, TokenIds) {
    let answer = http
        .post(format!("{base}/v1/issuances"))
        .bearer_auth(ADMIN_KEY)
        .json(&issuance(&format!("pi_lag_{mode}"), mode))
        .send()
        .await;
    answered(answer).await
}

/// The type of the one token the lagging redemption spends.
const LAG_TOKEN_TYPE: &str = "lagonly";

/// Sends the lagging redemption (`OWNER`'s one token of [`LAG_TOKEN_TYPE`], reference
/// `lag-redemption`) once.
async fn redeem_lagging(http: &reqwest::Client, base: &str) -> (u16, TokenIds) {
    let request = http
        .post(format!("{base}/v1/redemptions"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({
            "owner": OWNER, "tokenType": LAG_TOKEN_TYPE, "quantity": 1, "reference": "lag-redemption",
        }));
    answered(request.send().await).await
}

/// An answer's status and token ids (status 0: no answer).
async fn answered(answer: reqwest::Result<reqwest::Response>) -> (u16, TokenIds) {
    match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            let ids = response
                .json::<Value>()
                .await
                .map(|b| indexed_token_ids(&b))
                .unwrap_or_default();
            (status, ids)
        }
        Err(_) => (0, Vec::new()),
    }
}
