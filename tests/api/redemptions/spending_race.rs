//! The seeded spending race: round after round, an owner's payments are issued by their
//! success webhooks, then full refunds of some of them and redemptions of random amounts
//! race in random order and timing. After every round, over everything so far:
//!
//! - every token a 201 names is redeemed with its reference, no token is named twice, and
//!   every redeemed token is named by one 201 (a refused redemption left nothing);
//! - every token of a refunded payment is either redeemed or revoked, and the refund's
//!   receipt counts exactly those: `tokensRevoked` the revoked ones, `shortfall` the
//!   redeemed ones (never both, never neither);
//! - the balance endpoint says what the database holds.
//!
//! `TOKENMINT_SPEND_SEED` replays a run's choices (timing is not replayed),
//! `TOKENMINT_SPEND_ROUNDS` sets the number of rounds (default 4).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::future::join_all;
use mongodb::bson::{Document, doc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;

use super::{owner_tokens, redeem, redemption, standard_balance};
use crate::helpers::*;
use crate::money::race_check::{rounds, seed};
use crate::provider_events::*;

/// Payments issued per round, and redemptions racing their refunds.
const PAYMENTS_PER_ROUND: usize = 6;
const REDEMPTIONS_PER_ROUND: usize = 8;
/// The longest a request waits before it starts, so that the requests interleave.
const MAX_START_DELAY_MS: u64 = 25;

/// One request of a round.
enum Action {
    Refund { payment: String, event: Value },
    Redeem { quantity: i64, reference: String },
}

/// What it was answered.
enum Answered {
    Refund { payment: String, receipt: Value },
    Redeem { status: u16, body: Value },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_and_redemptions_race_and_every_token_is_redeemed_or_revoked_once() {
    let seed = seed("TOKENMINT_SPEND_SEED");
    let rounds = rounds("TOKENMINT_SPEND_ROUNDS", 4);
    eprintln!(
        "spending race: seed {seed} (TOKENMINT_SPEND_SEED={seed} replays it), {rounds} rounds"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let app = spawn_app_with(PROVIDERS).await;
    let mut refunds: BTreeMap<String, Value> = BTreeMap::new();
    let mut named: HashMap<String, String> = HashMap::new();
    for round in 0..rounds {
        let mut actions = Vec::new();
        for p in 0..PAYMENTS_PER_ROUND {
            let payment = format!("pi_spend_r{round}_p{p}");
            let quantity = rng.random_range(1..=8).to_string();
            let paid = intent_event(
                &format!("evt_{payment}_paid"),
                "succeeded",
                &payment,
                now(),
                &quantity,
            );
            assert_eq!(deliver_stripe(&app, &paid).await.status(), 200);
            if rng.random_bool(0.5) {
                let event = refund_event(&format!("evt_{payment}_refund"), &payment, now() + 1);
                actions.push(Action::Refund { payment, event });
            }
        }
        for r in 0..REDEMPTIONS_PER_ROUND {
            actions.push(Action::Redeem {
                quantity: rng.random_range(1..=6),
                reference: format!("spend-r{round}-{r}"),
            });
        }
        let delays: Vec<u64> = actions
            .iter()
            .map(|_| rng.random_range(0..=MAX_START_DELAY_MS))
            .collect();
        let answers = join_all(actions.into_iter().zip(delays).map(|(action, delay)| {
            let app = &app;
            async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                match action {
                    Action::Refund { payment, event } => {
                        let response = deliver_stripe(app, &event).await;
                        assert_eq!(response.status(), 200);
                        Answered::Refund {
                            payment,
                            receipt: json(response).await,
                        }
                    }
                    Action::Redeem {
                        quantity,
                        reference,
                    } => {
                        let response =
                            redeem(app, ADMIN_KEY, &redemption(quantity, &reference)).await;
                        Answered::Redeem {
                            status: response.status().as_u16(),
                            body: json(response).await,
                        }
                    }
                }
            }
        }))
        .await;
        for answer in answers {
            match answer {
                Answered::Refund { payment, receipt } => {
                    refunds.insert(payment, receipt);
                }
                Answered::Redeem { status: 201, body } => {
                    let reference = body["redemption"]["reference"].as_str().unwrap().to_owned();
                    for id in token_ids(&body) {
                        assert!(
                            named.insert(id.clone(), reference.clone()).is_none(),
                            "seed {seed}: {id} named twice"
                        );
                    }
                }
                Answered::Redeem { status, body } => {
                    assert_eq!(
                        (status, body["code"].as_str()),
                        (409, Some("insufficient_balance")),
                        "seed {seed}: {body}"
                    );
                }
            }
        }
        check(&app, seed, &named, &refunds).await;
    }
    let shortfalls = refunds
        .values()
        .filter(|r| r.get("shortfall").and_then(Value::as_u64).unwrap_or(0) > 0)
        .count();
    eprintln!(
        "spending race: summary: {} tokens redeemed by {} redemptions; {} refunds, {shortfalls} of them short of tokens a redemption took first",
        named.len(),
        named
            .values()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        refunds.len(),
    );
}

async fn check(
    app: &TestApp,
    seed: u64,
    named: &HashMap<String, String>,
    refunds: &BTreeMap<String, Value>,
) {
    let tokens = owner_tokens(app).await;
    let status = |token: &Document| token.get_str("status").unwrap().to_owned();
    let mut redeemed = 0;
    for token in &tokens {
        let id = token.get_object_id("_id").unwrap().to_hex();
        let reference = token.get_str("redemptionRef").ok();
        match status(token).as_str() {
            "redeemed" => {
                redeemed += 1;
                assert_eq!(
                    reference,
                    named.get(&id).map(String::as_str),
                    "seed {seed}: {token}"
                );
            }
            _ => assert!(
                !named.contains_key(&id),
                "seed {seed}: a named token is not redeemed: {token}"
            ),
        }
    }
    assert_eq!(redeemed, named.len(), "seed {seed}");
    for (payment, receipt) in refunds {
        let states: Vec<String> = tokens
            .iter()
            .filter(|t| t.get_document("origin").unwrap().get_str("paymentIntentId") == Ok(payment))
            .map(status)
            .collect();
        let count = |wanted: &str| states.iter().filter(|s| *s == wanted).count() as u64;
        assert_eq!(
            count("active"),
            0,
            "seed {seed}: {payment} refunded: {states:?}"
        );
        assert_eq!(
            (
                receipt
                    .get("tokensRevoked")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
                receipt
                    .get("shortfall")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            ),
            (count("revoked"), count("redeemed")),
            "seed {seed}: {payment}: {receipt}"
        );
    }
    let balance = standard_balance(app).await;
    let active = tokens.iter().filter(|t| status(t) == "active").count();
    assert_eq!(balance["active"], active, "seed {seed}");
    assert_eq!(balance["redeemed"], redeemed, "seed {seed}");
    assert_eq!(
        app.count("redemptions", doc! {}).await as usize,
        named
            .values()
            .collect::<std::collections::HashSet<_>>()
            .len()
    );
}
