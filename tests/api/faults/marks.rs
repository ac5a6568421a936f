//! The mark that ends a batch's issuance is what tells a held record (a refund came while
//! its tokens were written) from a settled one. When the mark cannot say — it failed — no
//! set is answered as settled: each is settled again, with the payment read again.

use std::time::Duration;

use mongodb::bson::doc;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_set_a_refund_held_is_never_answered_unsettled_when_the_mark_fails() {
    let name = unique_app_name();
    let issuer = spawn_app_named(&name, &format!("{PROVIDERS}[repair]\nenabled = false\n")).await;
    let webhooks = spawn_app_on(&issuer.db_name, PROVIDERS).await;
    let payment = "pi_held_mark_fails";

    // The record goes in; the tokens' insert is held up, long enough for a refund to be
    // delivered meanwhile on a busy machine.
    let held_up = FailPoint::after_first(&name, &["insert"], Fault::Block { millis: 6000 }).await;
    let issuance = {
        let (http, url) = (issuer.http.clone(), issuer.url("/v1/issuances"));
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(WRITER_KEY)
                .json(&issuance_body(payment, 4))
                .send()
                .await
                .unwrap()
        })
    };
    assert!(held_up.fired_within(1, Duration::from_secs(10)).await);
    // Meanwhile the payment is refunded in full: the refund holds the `issuing` record
    // and finds no token to revoke yet.
    let refund = refund_event("evt_hmf_r", payment, now());
    assert_eq!(deliver_stripe(&webhooks, &refund).await.status(), 200);
    // Then the mark fails.
    let mark_fails = held_up
        .replace(&name, &["update"], Fault::error(91), 1)
        .await;

    let answer = issuance.await.unwrap();
    let states = issuer.token_states(payment).await;
    assert!(mark_fails.off().await >= 1, "the mark never failed");
    assert_eq!(
        answer.status(),
        409,
        "answered with the refunded payment's tokens: {states:?}"
    );
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
