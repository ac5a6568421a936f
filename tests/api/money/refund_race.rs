//! Deterministic: the success webhook and the refund of the same payments at the same
//! moment.

use futures::future::join_all;
use mongodb::bson::doc;

use super::stored;
use crate::helpers::*;
use crate::provider_events::*;

/// How many of the payment's tokens are active.
async fn active_tokens(app: &TestApp, payment: &str) -> u64 {
    app.count(
        "tokens",
        doc! { "origin.paymentIntentId": payment, "status": "active" },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn issuance_that_races_a_refund_still_ends_revoked() {
    const PAYMENTS: usize = 12;
    const QUANTITY: i64 = 40;
    let app = app().await;
    let t = now();
    let payments: Vec<String> = (0..PAYMENTS).map(|p| format!("pi_money_tie_{p}")).collect();
    let answers = join_all(payments.iter().map(|payment| {
        let success = intent_event(
            &format!("evt_s_{payment}"),
            "succeeded",
            payment,
            t,
            &QUANTITY.to_string(),
        );
        let refund = refund_event(&format!("evt_r_{payment}"), payment, t + 1);
        let app = &app;
        async move {
            let (success, refund) =
                futures::join!(deliver_stripe(app, &success), deliver_stripe(app, &refund));
            (success.status().as_u16(), refund.status().as_u16())
        }
    }))
    .await;
    assert!(
        answers.iter().all(|&a| a == (200, 200)),
        "every delivery is accepted: {answers:?}"
    );

    for payment in &payments {
        assert_eq!(
            active_tokens(&app, payment).await,
            0,
            "{payment}: a refunded payment keeps no active token"
        );
        assert_eq!(payment_status(&app, payment).await.0, "refunded");
        let (records, tokens) = stored(&app, payment).await;
        match records.as_slice() {
            // The refund was recorded before the success event was processed: nothing issued.
            [] => assert!(tokens.is_empty(), "{payment}: tokens without a record"),
            [record] => {
                assert_eq!(record.get_str("status").unwrap(), "issued", "{payment}");
                assert_eq!(
                    tokens.iter().map(|t| t.index).collect::<Vec<_>>(),
                    (0..QUANTITY).collect::<Vec<_>>(),
                    "{payment}: the whole set, all revoked"
                );
                assert!(tokens.iter().all(|t| t.status == "revoked"), "{payment}");
            }
            more => panic!("{payment}: {} records", more.len()),
        }
        // Retries afterwards change nothing.
        assert_problem(
            app.issue(WRITER_KEY, &issuance_body(payment, QUANTITY))
                .await,
            409,
            "payment_not_succeeded",
        )
        .await;
        assert_eq!(active_tokens(&app, payment).await, 0, "{payment}");
    }
    assert_eq!(app.count("tokens", doc! { "status": "active" }).await, 0);
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}
