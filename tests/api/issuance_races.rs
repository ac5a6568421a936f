//! Concurrency: many identical or conflicting requests for the same payments at once.

use std::collections::HashSet;

use futures::future::join_all;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;

async fn identical_requests_race(mode: &str) {
    // 640 requests at once from this test's one address: more connections than one
    // address may hold by default (`server.max_connections_per_address`).
    let app = spawn_app_with("[server]\nmax_connections_per_address = 0\n").await;
    const PAYMENTS: usize = 20;
    const COPIES: usize = 32;
    let requests = (0..PAYMENTS)
        .flat_map(|p| (0..COPIES).map(move |_| p))
        .map(|p| {
            let mut body = issuance_body(&format!("pi_race_{p}"), 4);
            body["mode"] = json!(mode);
            let app = &app;
            async move {
                let response = app.issue(WRITER_KEY, &body).await;
                let status = response.status().as_u16();
                (p, status, response.json::<Value>().await.unwrap())
            }
        });
    let answers = join_all(requests).await;

    for p in 0..PAYMENTS {
        let mine: Vec<&(usize, u16, Value)> = answers.iter().filter(|(q, _, _)| *q == p).collect();
        let created = mine.iter().filter(|(_, s, _)| *s == 201).count();
        let statuses: Vec<u16> = mine.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(
            created, 1,
            "exactly one first write for payment {p}; statuses {statuses:?}"
        );
        assert!(
            mine.iter().all(|(_, s, _)| *s == 201 || *s == 200),
            "no errors: {:?}",
            mine.iter()
                .filter(|m| m.1 != 200 && m.1 != 201)
                .map(|m| format!("{} {}", m.1, m.2))
                .collect::<Vec<_>>()
        );
        let ids: HashSet<Vec<String>> = mine.iter().map(|(_, _, b)| token_ids(b)).collect();
        assert_eq!(
            ids.len(),
            1,
            "every answer lists the same token ids for payment {p}"
        );
        // Each token counted once, by the request that inserted it.
        let created: i64 = mine
            .iter()
            .map(|(_, _, b)| b["created"].as_i64().unwrap())
            .sum();
        assert_eq!(created, 4, "payment {p}: tokens counted as created");
        assert_eq!(
            app.token_indexes(&format!("pi_race_{p}")).await,
            vec![0, 1, 2, 3]
        );
    }
    assert_eq!(app.count("tokens", doc! {}).await, (PAYMENTS * 4) as u64);
    assert_eq!(app.count("issuances", doc! {}).await, PAYMENTS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upsert_identical_requests_race_to_exactly_quantity_tokens() {
    identical_requests_race("upsert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomic_identical_requests_race_to_exactly_quantity_tokens() {
    identical_requests_race("atomic").await;
}

async fn different_quantities_race(mode: &str) {
    let app = spawn_app().await;
    // A watcher samples the token count while the race runs: in atomic mode it must only
    // ever see 0 or the full winning quantity, never a partial set.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let tokens = app.db.collection::<Document>("tokens");
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seen.insert(tokens.count_documents(doc! {}).await.unwrap());
            }
            seen
        })
    };
    let requests = (1..=16).map(|quantity| {
        let mut body = issuance_body("pi_qty", quantity);
        body["mode"] = json!(mode);
        let app = &app;
        async move {
            let response = app.issue(WRITER_KEY, &body).await;
            (quantity, response.status().as_u16())
        }
    });
    let answers = join_all(requests).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.await.unwrap();

    let winners: Vec<i64> = answers
        .iter()
        .filter(|(_, s)| *s == 201)
        .map(|(q, _)| *q)
        .collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    assert!(
        answers.iter().all(|(q, s)| *s == 409 || *q == winners[0]),
        "{answers:?}"
    );
    let winner = winners[0];
    assert_eq!(
        app.token_indexes("pi_qty").await,
        (0..winner).collect::<Vec<_>>()
    );
    let record = app.find_stored("issuances", doc! {}).await;
    assert_eq!(
        record
            .get("quantity")
            .and_then(|q| q.as_i64().or(q.as_i32().map(i64::from))),
        Some(winner)
    );
    if mode == "atomic" {
        assert!(
            seen.iter().all(|&n| n == 0 || n == winner as u64),
            "partial set visible: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upsert_different_quantities_persist_one() {
    different_quantities_race("upsert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomic_different_quantities_persist_one_and_never_show_a_partial_set() {
    different_quantities_race("atomic").await;
}

/// Another writer put some of a payment's tokens in first (here: two of four, left
/// without their record, as a replay's or a repair's upserts racing a batch leave them):
/// the batch's token insert writes the other two and meets those, and the request
/// converges on the set. It is answered 201 with the four tokens, and `created` counts
/// the two it inserted, not only what the converging upserts found left to write.
#[tokio::test]
async fn a_batch_that_meets_another_writers_tokens_counts_the_ones_it_inserted() {
    let app = spawn_app().await;
    let payment = "pi_raced_insert";
    let body = issuance_body(payment, 4);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    app.db
        .collection::<Document>("issuances")
        .delete_many(doc! { "paymentIntentId": payment })
        .await
        .unwrap();
    app.db
        .collection::<Document>("tokens")
        .delete_many(doc! { "origin.paymentIntentId": payment, "tokenIndex": { "$lt": 2 } })
        .await
        .unwrap();

    let response = app.issue(WRITER_KEY, &body).await;
    assert_eq!(response.status(), 201);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["created"], 2, "{answer}");
    let stored = app.stored_token_ids(payment).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert_eq!(token_ids(&answer), stored);
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
}
