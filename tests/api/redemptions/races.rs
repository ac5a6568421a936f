//! Redemptions at once: together they never redeem a token twice nor more tokens than
//! exist, the same reference is one redemption, and a refund racing a redemption leaves
//! each token redeemed (the refund's shortfall) or revoked, never both, never neither.

use std::collections::{HashMap, HashSet};

use futures::future::join_all;
use mongodb::bson::{Document, doc};
use serde_json::Value;

use super::{count_status, owner_tokens, redeem, redemption};
use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_redemptions_asking_for_more_than_the_balance_never_overspend() {
    let app = spawn_app().await;
    let mut issued = Vec::new();
    for payment in 0..4 {
        issued.extend(app.issue_tokens(&format!("pi_race_{payment}"), 10).await);
    }
    // 64 redemptions of 1, 2 or 3 tokens: 128 asked of 40.
    let asks: Vec<i64> = (0..64).map(|i| 1 + i % 3).collect();
    let answers = join_all(asks.iter().enumerate().map(|(i, quantity)| {
        let app = &app;
        async move {
            let response =
                redeem(app, ADMIN_KEY, &redemption(*quantity, &format!("race-{i}"))).await;
            (response.status().as_u16(), json(response).await)
        }
    }))
    .await;

    let mut answered: HashMap<String, String> = HashMap::new();
    let mut redeemed_by_answers = 0;
    for ((status, body), quantity) in answers.iter().zip(&asks) {
        match status {
            201 => {
                let ids = token_ids(body);
                assert_eq!(ids.len() as i64, *quantity, "{body}");
                for id in ids {
                    let reference = body["redemption"]["reference"].as_str().unwrap().to_owned();
                    assert!(
                        answered.insert(id.clone(), reference).is_none(),
                        "{id} answered twice"
                    );
                }
                redeemed_by_answers += quantity;
            }
            409 => {
                assert_eq!(body["code"], "insufficient_balance", "{body}");
                assert!(body["available"].as_i64().unwrap() < *quantity, "{body}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(redeemed_by_answers <= 40);
    // Someone always got through while any token was left for the smallest ask.
    assert!(
        redeemed_by_answers >= 38,
        "only {redeemed_by_answers} redeemed"
    );

    // The database agrees with the answers: each redeemed token carries the reference
    // of the one redemption that named it, and nothing else was redeemed.
    let tokens = owner_tokens(&app).await;
    assert_eq!(tokens.len(), 40);
    let redeemed: Vec<&Document> = tokens
        .iter()
        .filter(|t| t.get_str("status").unwrap() == "redeemed")
        .collect();
    assert_eq!(redeemed.len() as i64, redeemed_by_answers);
    for token in &redeemed {
        let id = token.get_object_id("_id").unwrap().to_hex();
        assert_eq!(
            Some(token.get_str("redemptionRef").unwrap()),
            answered.get(&id).map(String::as_str),
            "{token}"
        );
        assert_eq!(
            stored_int(token, "_version"),
            Some(1),
            "redeemed once: {token}"
        );
    }
    let records = {
        use futures::TryStreamExt;
        app.db
            .collection::<Document>("redemptions")
            .find(doc! {})
            .await
            .unwrap()
            .try_collect::<Vec<Document>>()
            .await
            .unwrap()
    };
    let mut in_records = HashSet::new();
    for record in &records {
        for id in record.get_array("tokenIds").unwrap() {
            assert!(
                in_records.insert(id.as_object_id().unwrap()),
                "a token in two redemptions"
            );
        }
    }
    assert_eq!(in_records.len() as i64, redeemed_by_answers);
    assert_eq!(issued.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_reference_sent_at_once_is_one_redemption() {
    let app = spawn_app().await;
    app.issue_tokens("pi_race_same", 10).await;
    let answers = join_all((0..16).map(|_| async {
        let response = redeem(&app, ADMIN_KEY, &redemption(3, "same")).await;
        (response.status().as_u16(), json(response).await)
    }))
    .await;
    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 1, "{answers:?}");
    let ids = token_ids(&answers[0].1);
    for (status, body) in &answers {
        assert!([200, 201].contains(status), "{status}: {body}");
        assert_eq!(token_ids(body), ids);
    }
    assert_eq!(count_status(&app, "redeemed").await, 3);
    assert_eq!(app.count("redemptions", doc! {}).await, 1);
}

/// Another instance commits a redemption of the same reference after one instance's
/// transaction read it absent: the unique index then refuses the late one's record,
/// nothing of it is written, and it answers from the redemption that won.
#[tokio::test]
async fn a_reference_taken_after_it_was_read_absent_is_one_redemption() {
    let name = unique_app_name();
    let late = spawn_app_named(&name, "[repair]\nenabled = false\n").await;
    let first = spawn_app_on(&late.db_name, "").await;
    first.issue_tokens("pi_ref_standard", 5).await;
    let mut premium = issuance_body("pi_ref_premium", 5);
    premium["tokenType"] = "premium".into();
    assert_eq!(first.issue(ADMIN_KEY, &premium).await.status(), 201);

    // The late instance's records insert is held: by then it has read the reference
    // absent and redeemed premium tokens in its transaction.
    let held = FailPointTurn::take()
        .await
        .set(&name, &["insert"], Fault::Block { millis: 1500 }, 1)
        .await;
    let mut late_body = redemption(2, "shared");
    late_body["tokenType"] = "premium".into();
    let late_answer = tokio::spawn({
        let (http, url) = (late.http.clone(), late.url("/v1/redemptions"));
        async move {
            http.post(url)
                .bearer_auth(ADMIN_KEY)
                .json(&late_body)
                .send()
                .await
                .expect("request sent")
        }
    });
    assert!(
        held.fired_within(1, std::time::Duration::from_secs(5))
            .await
    );
    let won = redeem(&first, ADMIN_KEY, &redemption(3, "shared")).await;
    assert_eq!(won.status(), 201);

    let problem = assert_problem(late_answer.await.unwrap(), 409, "idempotency_conflict").await;
    let fields: Vec<&str> = problem["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"tokenType"), "{problem}");
    assert_eq!(held.off().await, 1);
    let owner = mongodb::bson::oid::ObjectId::parse_str(OWNER).unwrap();
    let redeemed = |token_type: &str| {
        first.count(
            "tokens",
            doc! { "owner": owner, "type": token_type, "status": "redeemed" },
        )
    };
    assert_eq!(redeemed("standard").await, 3);
    assert_eq!(redeemed("premium").await, 0);
    assert_eq!(first.count("redemptions", doc! {}).await, 1);
}

/// How many tokens a refund's receipt reports in `field` (absent: none).
fn counted(receipt: &Value, field: &str) -> u64 {
    receipt.get(field).and_then(Value::as_u64).unwrap_or(0)
}

/// Which of the two goes first in one round of the refund race.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// The redemption is answered before the refund is sent.
    RedemptionFirst,
    /// The refund is answered before the redemption is sent.
    RefundFirst,
    /// Both at once, the redemption started this many milliseconds after the refund.
    Race(u64),
}

/// Pays for 6 tokens, then redeems all 6 and refunds the whole payment in `order`, and
/// checks that each token ended redeemed (and the refund's shortfall) or revoked, never
/// both, never neither. Answers the redemption's status.
async fn refund_and_redeem(app: &TestApp, round: usize, order: Order) -> u16 {
    let payment = format!("pi_refund_race_{round}");
    let paid = intent_event(
        &format!("evt_paid_{round}"),
        "succeeded",
        &payment,
        now(),
        "6",
    );
    assert_eq!(deliver_stripe(app, &paid).await.status(), 200);
    let refund = refund_event(&format!("evt_refund_{round}"), &payment, now() + 1);
    let reference = format!("refund-race-{round}");
    let body = redemption(6, &reference);
    let (spent, refunded) = match order {
        Order::RedemptionFirst => {
            let spent = redeem(app, ADMIN_KEY, &body).await;
            (spent, deliver_stripe(app, &refund).await)
        }
        Order::RefundFirst => {
            let refunded = deliver_stripe(app, &refund).await;
            (redeem(app, ADMIN_KEY, &body).await, refunded)
        }
        Order::Race(delay) => {
            let delayed = async {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                redeem(app, ADMIN_KEY, &body).await
            };
            tokio::join!(delayed, deliver_stripe(app, &refund))
        }
    };
    let spent_status = spent.status().as_u16();
    let spent = json(spent).await;
    assert_eq!(refunded.status(), 200);
    let receipt = json(refunded).await;

    let states = app.token_states(&payment).await;
    assert_eq!(states.len(), 6);
    let redeemed = states.iter().filter(|(_, s)| s == "redeemed").count() as u64;
    let revoked = states.iter().filter(|(_, s)| s == "revoked").count() as u64;
    assert_eq!(
        redeemed + revoked,
        6,
        "{order:?}: never neither: {states:?}"
    );
    // All or nothing: the redemption took every token, or none.
    match spent_status {
        201 => {
            assert_eq!(redeemed, 6, "{order:?}: {states:?}");
            assert_eq!(counted(&receipt, "shortfall"), 6, "{receipt}");
            assert_eq!(counted(&receipt, "tokensRevoked"), 0, "{receipt}");
        }
        409 => {
            assert_eq!(spent["code"], "insufficient_balance", "{spent}");
            assert_eq!(revoked, 6, "{order:?}: {states:?}");
            assert_eq!(counted(&receipt, "tokensRevoked"), 6, "{receipt}");
            assert_eq!(
                app.count("redemptions", doc! { "reference": &reference })
                    .await,
                0
            );
        }
        other => panic!("{order:?}: {other} {spent}"),
    }
    spent_status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_racing_a_redemption_leaves_each_token_redeemed_or_revoked() {
    let app = spawn_app_with(PROVIDERS).await;
    // Each order on its own first, so both accountings are checked whatever the timing;
    // then rounds that start the redemption a little later each time, so that over the
    // rounds they meet at different steps. Which one wins a race is up to the machine.
    assert_eq!(
        refund_and_redeem(&app, 0, Order::RedemptionFirst).await,
        201
    );
    assert_eq!(refund_and_redeem(&app, 1, Order::RefundFirst).await, 409);
    let mut outcomes = HashSet::new();
    for round in 2..14 {
        let delay = (round as u64 - 2) * 5;
        outcomes.insert(refund_and_redeem(&app, round, Order::Race(delay)).await);
    }
    eprintln!("racing rounds answered the redemption with {outcomes:?}");
}
