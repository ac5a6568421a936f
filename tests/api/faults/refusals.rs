//! A batch reads its payments beside inserting their records, so a refused payment's
//! record is in before the refusal is known. It becomes a placeholder before the answer:
//! the refused request leaves no record and no token, and the payment's place stays
//! taken. When that write fails, the record is left `issuing`, and the service's own
//! repair ends it with every token revoked.

use std::time::{Duration, Instant};

use mongodb::bson::doc;
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

/// No repair on the faulty instance: its sweep would meet the failpoint too.
const NO_REPAIR: &str = "[repair]\nenabled = false\n";
/// The instance that heals: sweeps every 200 ms, a record older than 500 ms is abandoned.
const REPAIRER: &str = "[repair]\ninterval_ms = 200\nmin_age_ms = 500\n";

/// `payment` refunded in full two hours ago, its placeholder expired: only the batch's
/// payment read can tell.
async fn refunded_in_full_long_ago(app: &TestApp, payment: &str) {
    let refund = refund_event(&format!("evt_{payment}_r"), payment, now());
    super::withdrawn_long_ago(app, payment, &refund).await;
}

fn issuance(payment: &str, mode: &str) -> serde_json::Value {
    let mut body = issuance_body(payment, 3);
    body["mode"] = json!(mode);
    body
}

#[tokio::test]
async fn a_payment_refunded_long_ago_is_refused_and_leaves_only_its_place_taken() {
    let app = spawn_app_with(&format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_refused_long_ago";
    refunded_in_full_long_ago(&app, payment).await;

    // The first reaches the batch's read (nothing holds the place); the others run
    // into the placeholder it leaves, and read the payment on the one-request path.
    for mode in ["upsert", "upsert", "atomic"] {
        assert_problem(
            app.issue(WRITER_KEY, &issuance(payment, mode)).await,
            409,
            "payment_not_succeeded",
        )
        .await;
    }
    let filter = doc! { "paymentIntentId": payment };
    assert_eq!(app.count_records(filter.clone()).await, 0, "no record");
    assert_eq!(app.count("tokens", filter.clone()).await, 0, "no token");
    let place = app.find_stored("issuances", filter).await;
    assert_eq!(place.get_str("status"), Ok("placeholder"), "{place}");
    assert!(
        place.get_datetime("expiresAt").is_ok(),
        "it expires: {place}"
    );
}

#[tokio::test]
async fn a_refused_record_that_cannot_become_a_placeholder_is_revoked_by_the_service() {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_refused_vacate_fails";
    refunded_in_full_long_ago(&faulty, payment).await;

    let failpoint = FailPoint::set(&name, &["update"], Fault::error(91), 1).await;
    let answer = faulty.issue(WRITER_KEY, &issuance(payment, "upsert")).await;
    assert!(failpoint.off().await > 0, "the fault never happened");
    // The refusal is answered all the same: it never depended on that write.
    assert_problem(answer, 409, "payment_not_succeeded").await;
    let filter = doc! { "paymentIntentId": payment };
    let record = faulty.find_stored("issuances", filter.clone()).await;
    assert_eq!(record.get_str("status"), Ok("issuing"), "{record}");
    assert_eq!(faulty.count("tokens", filter.clone()).await, 0);

    // Another instance's repair finishes the record: it writes the set, and the settle
    // that follows revokes all of it.
    let _repairer = spawn_app_on(&faulty.db_name, &format!("{PROVIDERS}{REPAIRER}")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let record = faulty.find_stored("issuances", filter.clone()).await;
        let states = faulty.token_states(payment).await;
        if record.get_str("status") == Ok("issued") && states.len() == 3 {
            assert!(
                states.iter().all(|(_, state)| state == "revoked"),
                "every token of a refunded payment is revoked: {states:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not repaired: {record}, {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
