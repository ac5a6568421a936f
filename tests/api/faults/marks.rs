//! The mark that ends a batch's issuance is what tells a held record (a refund came while
//! its tokens were written) from a settled one. When the mark cannot say — it failed — no
//! set is answered as settled: each is settled again, with the payment read again.

use std::time::Duration;

use mongodb::bson::{Document, doc};
use mongodb::{Client, ClientSession};
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_set_a_refund_held_is_never_answered_unsettled_when_the_mark_fails() {
    let name = unique_app_name();
    let issuer = spawn_app_named(&name, &format!("{PROVIDERS}[repair]\nenabled = false\n")).await;
    let webhooks = spawn_app_on(&issuer.db_name, PROVIDERS).await;
    let payment = "pi_held_mark_fails";
    // The failpoint goes on mid-flow, while the issuance waits: the turn is taken first,
    // so that waiting for another test's failpoint cannot stretch that wait.
    let turn = FailPointTurn::take().await;

    let (holder, issuance) = issue_with_tokens_held(&issuer, payment).await;
    // Meanwhile the payment is refunded in full: the refund holds the `issuing` record
    // and finds no token to revoke yet. Then the tokens go in, and the mark fails.
    let refund = refund_event("evt_hmf_r", payment, now());
    assert_eq!(deliver_stripe(&webhooks, &refund).await.status(), 200);
    let mark_fails = turn.set(&name, &["update"], Fault::error(91), 1).await;
    holder.abort().await;

    let answer = issuance.await.unwrap();
    let states = issuer.token_states(payment).await;
    assert_eq!(mark_fails.off().await, 1, "the mark never failed");
    assert_eq!(
        answer.status(),
        409,
        "answered with the refunded payment's tokens: {states:?}"
    );
    assert_eq!(states.len(), 4);
    assert!(
        states.iter().all(|(_, status)| status == "revoked"),
        "{states:?}"
    );
    let record = issuer
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_inside_atomic_transactions_fails_the_batch_without_retrying_each_request() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        "[issuance]\ndefault_mode = \"atomic\"\n[repair]\nenabled = false\n",
    )
    .await;
    // Every insert inside a transaction fails as in a failover, labelled transient.
    let outage = FailPoint::always(
        &name,
        &["insert"],
        Fault::Error {
            code: 11600,
            labels: vec!["TransientTransactionError".to_owned()],
        },
    )
    .await;
    let bodies: Vec<_> = (0..20)
        .map(|i| issuance_body(&format!("pi_outage_{i}"), 2))
        .collect();
    let answers =
        futures::future::join_all(bodies.iter().map(|body| app.issue(WRITER_KEY, body))).await;
    let inserts = outage.off().await;
    for answer in answers {
        assert_problem(answer, 503, "database_unavailable").await;
    }
    // Ten transaction attempts per batch, for the few batches the twenty requests made:
    // not ten more for each request on its own.
    assert!(inserts <= 60, "{inserts} inserts for 20 requests");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
}

/// The stored token ids of stripe/acct_1 `payment`, in tokenIndex order.
async fn stored_ids(app: &TestApp, payment: &str) -> Vec<String> {
    let mut tokens = app.tokens_of(payment).await;
    tokens.sort_by_key(|t| t.get_i64("tokenIndex").unwrap());
    tokens
        .iter()
        .map(|t| t.get_object_id("_id").unwrap().to_hex())
        .collect()
}

#[tokio::test]
async fn a_set_whose_record_vanished_is_not_answered_when_its_mark_fails() {
    // The mark fails, so the set is settled again on the one-request path, which completes
    // and marks it there: a record that is gone by then makes that mark find nothing, and
    // the tokens just written are no issuance. A retry records it again and converges.
    let name = unique_app_name();
    let app = spawn_app_named(&name, "[repair]\nenabled = false\n").await;
    let payment = "pi_record_rolled_back";
    let turn = FailPointTurn::take().await;
    let (holder, issuance) = issue_with_tokens_held(&app, payment).await;
    let record = roll_back_the_record(&app, payment).await;
    let mark_fails = turn.set(&name, &["update"], Fault::error(91), 1).await;
    holder.abort().await;

    let answer = issuance.await.unwrap();
    assert_eq!(mark_fails.off().await, 1, "the mark never failed");
    assert_problem(answer, 503, "database_unavailable").await;
    assert_eq!(app.count_records(record.clone()).await, 0);

    let retried = app.issue(WRITER_KEY, &issuance_body(payment, 4)).await;
    assert_eq!(retried.status(), 201);
    let answered = token_ids(&json(retried).await);
    assert_eq!(answered, stored_ids(&app, payment).await);
    assert_eq!(answered.len(), 4);
    let stored = app.find_stored("issuances", record).await;
    assert_eq!(stored.get_str("status"), Ok("issued"), "{stored}");
}

#[tokio::test]
async fn tokens_left_by_a_record_that_is_gone_are_never_answered_to_another_request() {
    // A failover that rolls a batch's record back after its tokens reached the new
    // primary leaves the tokens without a record; deleting the record stands in for it.
    let app = spawn_app_with("[repair]\nenabled = false\n").await;
    let fewer = issuance_body("pi_left_fewer", 2);
    let mut other_owner = issuance_body("pi_left_owner", 4);
    other_owner["owner"] = json!(OTHER_OWNER);
    let mut other_type = issuance_body("pi_left_type", 4);
    other_type["tokenType"] = json!("gold");
    for later in [fewer, other_owner, other_type] {
        let payment = later["paymentIntentId"].as_str().unwrap();
        let first = app.issue(WRITER_KEY, &issuance_body(payment, 4)).await;
        assert_eq!(first.status(), 201);
        let record = roll_back_the_record(&app, payment).await;

        // The later request runs into the 4 left behind: never answered with them.
        for _ in 0..2 {
            let answer = app.issue(WRITER_KEY, &later).await;
            assert_problem(answer, 500, "internal_error").await;
        }
        assert_eq!(stored_ids(&app, payment).await.len(), 4, "{later}");
        let stored = app.find_stored("issuances", record).await;
        assert_eq!(stored.get_str("status"), Ok("issuing"), "{stored}");
    }
    let report = app.store().await.verify().await.unwrap();
    assert_eq!(report.wrong_token_sets.count, 1, "{report}");
    assert_eq!(report.foreign_tokens.count, 2, "{report}");
}

/// Deletes `payment`'s issuance record, as a failover that rolled back its `w:1` insert
/// leaves it; returns the filter that finds it.
async fn roll_back_the_record(app: &TestApp, payment: &str) -> Document {
    let record = doc! { "paymentIntentId": payment };
    let removed = app
        .db
        .collection::<Document>("issuances")
        .delete_many(record.clone())
        .await
        .unwrap();
    assert_eq!(removed.deleted_count, 1);
    record
}

/// An open transaction holding the key of a payment's first token, and what it holds up.
struct HeldTokens {
    _client: Client,
    session: ClientSession,
}

impl HeldTokens {
    /// Lets the held-up token insert go on.
    async fn abort(mut self) {
        self.session.abort_transaction().await.unwrap();
    }
}

/// Holds the key of `payment`'s first token in another transaction, sends a 4-token
/// issuance for it and waits until its `issuing` record is in: the batch's token insert
/// then waits for the holder (a write never overtakes an uncommitted one of the same key).
async fn issue_with_tokens_held(
    app: &TestApp,
    payment: &'static str,
) -> (HeldTokens, tokio::task::JoinHandle<reqwest::Response>) {
    let client = Client::with_uri_str(mongo_uri()).await.unwrap();
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    client
        .database(&app.db_name)
        .collection::<Document>("tokens")
        .insert_one(doc! {
            "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment },
            "tokenIndex": 0_i64,
        })
        .session(&mut session)
        .await
        .unwrap();
    let issuance = {
        let (http, url) = (app.http.clone(), app.url("/v1/issuances"));
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(WRITER_KEY)
                .json(&issuance_body(payment, 4))
                .send()
                .await
                .unwrap()
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app
        .count_records(doc! { "paymentIntentId": payment, "status": "issuing" })
        .await
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the record never went in"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = HeldTokens {
        _client: client,
        session,
    };
    (held, issuance)
}
