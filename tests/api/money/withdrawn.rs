//! A payment the provider reported failed, canceled or refunded is never issued, by any
//! key.

use mongodb::bson::doc;
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_refunded_canceled_or_failed_payment_is_never_issued_by_any_key() {
    let app = app().await;
    let t = now();
    let cases = [
        ("refunded", refund_event("evt_m_ref", "pi_m_refunded", t)),
        (
            "canceled",
            intent_event("evt_m_can", "canceled", "pi_m_canceled", t, "3"),
        ),
        (
            "failed",
            intent_event("evt_m_fail", "payment_failed", "pi_m_failed", t, "3"),
        ),
    ];
    for (state, event) in &cases {
        let payment = event["data"]["object"]["payment_intent"]
            .as_str()
            .or(event["data"]["object"]["id"].as_str())
            .unwrap()
            .to_owned();
        let delivered = deliver_stripe(&app, event).await;
        assert_eq!(delivered.status(), 200, "{state}: the event is accepted");
        assert_eq!(payment_status(&app, &payment).await.0, *state);

        for key in [WRITER_KEY, ADMIN_KEY, REQUEST_KEY] {
            for mode in ["upsert", "atomic"] {
                let mut body = issuance_body(&payment, 3);
                body["mode"] = json!(mode);
                let problem =
                    assert_problem(app.issue(key, &body).await, 409, "payment_not_succeeded").await;
                assert!(
                    problem["detail"].as_str().unwrap_or("").contains(state),
                    "{state}, {key}, {mode}: the answer names the state: {problem}"
                );
            }
        }
        assert_eq!(
            app.count_records(doc! { "paymentIntentId": &payment })
                .await,
            0,
            "{state}: no issuance record"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": &payment })
                .await,
            0,
            "{state}: no token"
        );
    }

    // A success event that the provider sent before the refund or cancellation but that is
    // delivered late issues nothing either: the payment does not stand.
    for (state, payment) in [("refunded", "pi_m_refunded"), ("canceled", "pi_m_canceled")] {
        let late = intent_event(
            &format!("evt_m_late_{state}"),
            "succeeded",
            payment,
            t - 60,
            "3",
        );
        assert_eq!(deliver_stripe(&app, &late).await.status(), 200);
        assert_eq!(payment_status(&app, payment).await.0, state);
        assert_problem(
            app.issue(WRITER_KEY, &issuance_body(payment, 3)).await,
            409,
            "payment_not_succeeded",
        )
        .await;
        assert_eq!(
            app.count_records(doc! { "paymentIntentId": payment }).await,
            0,
            "{state}: no issuance record after the late success"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": payment })
                .await,
            0,
            "{state}: no token after the late success"
        );
    }
    assert_eq!(app.count_records(doc! {}).await, 0);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}

/// Concurrent atomic issuances of one refunded payment (in one batch, all but the first
/// are split off as its replays): every one of them must see the refund (409), and
/// nothing may be written.
#[tokio::test]
async fn concurrent_atomic_requests_for_one_refunded_payment_all_see_the_refund() {
    let app = app().await;
    for round in 0..6 {
        let payment = format!("pi_m_same_{round}");
        let refund = refund_event(&format!("evt_m_same_{round}"), &payment, now());
        assert_eq!(deliver_stripe(&app, &refund).await.status(), 200);
        let mut body = issuance_body(&payment, 2);
        body["mode"] = json!("atomic");
        let answers = futures::future::join_all((0..6).map(|_| app.issue(WRITER_KEY, &body))).await;
        for answer in answers {
            assert_problem(answer, 409, "payment_not_succeeded").await;
        }
        assert_eq!(
            app.count_records(doc! { "paymentIntentId": &payment })
                .await,
            0,
            "{payment}: no issuance record"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": &payment })
                .await,
            0,
            "{payment}: no token"
        );
    }
}
