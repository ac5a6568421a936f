//! An election between a batch's token insert and its mark
//! (`failover_election_between_tokens_and_mark_…`). In upsert mode the primary alone
//! acknowledges a batch's tokens, and the batch's `w: majority` mark makes them durable
//! only when the same primary acknowledged it in the same term. Here the mark of one
//! issuance is held on the primary (`failCommand` `blockConnection`) while that member
//! steps down, another is elected, and the first is elected again: the mark then runs in
//! a later term than the tokens. Meanwhile the tokens are deleted, as a rollback would
//! take them from a new primary that never had them. The service must not answer from
//! the batch (its counter of such batches rises by one) but settle the set again from
//! what a majority read finds (nothing), write the tokens again and answer those.

use std::time::{Duration, Instant};

use mongodb::bson::doc;
use tokenmint_test_support::{
    ADMIN_KEY, indexed_token_ids, metric_value, spawn_app_from, test_settings_at,
};

use super::load::issuance;
use super::replica_set::ReplicaSet;
use super::{ONE_AT_A_TIME, stored_tokens, verify};

/// The `appName` of the service's client, so the failpoint holds its commands only.
const APP_NAME: &str = "tokenmint_term";
/// How long the mark is held: long enough for two elections.
const HOLD: Duration = Duration::from_secs(12);
/// Tokens per issuance of the failover load (`load::issuance`).
const QUANTITY: u64 = super::load::QUANTITY as u64;

pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[term]: starting a 3-member replica set");
    let set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let database = "tokenmint_failover_term";
    let app = spawn_app_from(&test_settings_at(
        &format!("{}&appName={APP_NAME}", set.uri()),
        database,
        "[mongo]\nserver_selection_timeout_ms = 5000\n[repair]\nenabled = false\n",
    ))
    .await;
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // A first issuance, so that the service knows the deployment and has connections.
    let warm = http
        .post(format!("{}/v1/issuances", app.address))
        .bearer_auth(ADMIN_KEY)
        .json(&issuance("pi_term_warm", "upsert"))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), 201);
    let counter = "tokenmint_batch_term_changes_total";
    let before = metric_value(&app.metrics().await, counter).unwrap_or(0.0);

    let admin = set.clients()[primary].database("admin");
    let term_before = term(&admin).await;
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": {
                "failCommands": ["update"],
                "blockConnection": true,
                "blockTimeMS": HOLD.as_millis() as i64,
                "appName": APP_NAME,
            },
        })
        .await
        .expect("failCommand (the members run with enableTestCommands)");
    let request = {
        let (http, base) = (http.clone(), app.address.clone());
        tokio::spawn(async move {
            let answer = http
                .post(format!("{base}/v1/issuances"))
                .bearer_auth(ADMIN_KEY)
                .json(&issuance("pi_term", "upsert"))
                .send()
                .await
                .expect("an answer");
            let status = answer.status().as_u16();
            (status, answer.json::<serde_json::Value>().await.unwrap())
        })
    };
    // The records and tokens are written (the mark follows at once, and is held).
    let tokens = set.clients()[primary]
        .database(database)
        .collection::<mongodb::bson::Document>("tokens");
    let written = doc! { "origin.paymentIntentId": "pi_term" };
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokens.count_documents(written.clone()).await.unwrap() < QUANTITY {
        assert!(
            Instant::now() < deadline,
            "the batch's tokens were never written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // What a new primary that never had the tokens would show: the records, no tokens (a
    // rollback, simulated, so that answering from the batch would name lost tokens).
    let deleted = tokens.delete_many(written.clone()).await.unwrap();
    assert_eq!(deleted.deleted_count, QUANTITY);
    // A later term on the same primary: it steps down (another member may be elected),
    // then is elected again.
    let _ = admin
        .run_command(doc! { "replSetStepDown": 2, "secondaryCatchUpPeriodSecs": 1, "force": true })
        .await;
    let deadline = Instant::now() + HOLD - Duration::from_secs(1);
    while set.primary().await != Some(primary) || term(&admin).await <= term_before {
        assert!(
            Instant::now() < deadline,
            "member {primary} was not primary again in a later term before the held mark ran"
        );
        let _ = admin.run_command(doc! { "replSetStepUp": 1 }).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let term_after = term(&admin).await;
    eprintln!("failover[term]: member {primary} primary again, term {term_before} -> {term_after}");

    let (status, body) = request.await.unwrap();
    assert_eq!(status, 201, "{body}");
    let answered = indexed_token_ids(&body);
    assert_eq!(answered.len() as u64, QUANTITY, "{body}");
    let stored = stored_tokens(&set.uri(), database).await;
    assert_eq!(
        stored.get("pi_term"),
        Some(&answered),
        "the answer names the tokens written again, not those the (simulated) rollback took"
    );
    let after = metric_value(&app.metrics().await, counter).unwrap_or(0.0);
    assert_eq!(
        after - before,
        1.0,
        "the mark came from another term: the batch must settle its set again"
    );
    app.stop().await;
    let mut violations = Vec::new();
    verify(&set.uri(), database, &mut violations).await;
    assert!(violations.is_empty(), "{violations:?}");
}

/// The replica set's term, as member `admin`'s client sees it.
async fn term(admin: &mongodb::Database) -> i64 {
    let status = admin
        .run_command(doc! { "replSetGetStatus": 1 })
        .await
        .expect("replSetGetStatus");
    status.get_i64("term").expect("a term")
}
