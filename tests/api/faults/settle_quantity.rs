//! A settle takes its quantity from the set it revokes from. A pending checkout request's
//! quantity is not that: the provider's success replaces it when it takes the request
//! over. A sweep that read the pending record, and revokes only after the take-over wrote
//! its tokens, must not revoke by the pending quantity.

use std::collections::HashSet;
use std::time::Duration;

use tokenmint::domain::IssuanceMode;
use tokenmint::issuing::{IdempotencyConfig, Issuer, IssuingConfig};

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_sweep_that_read_a_pending_record_revokes_by_the_set_taken_over_since() {
    let app = spawn_app_with(PROVIDERS).await;
    let payment = "pi_pending_then_ten";
    // A checkout asked for 2 tokens; half of the payment was refunded since.
    let pending = app.issue(REQUEST_KEY, &issuance_body(payment, 2)).await;
    assert_eq!(pending.status(), 202);
    let refund = partial_refund_event("evt_ptt_r", payment, now(), 1000, 500);
    assert_eq!(deliver_stripe(&app, &refund).await.status(), 200);

    // The sweep of recent withdrawals, on its own client, reads the pending record and
    // is held up at its revoke.
    let name = unique_app_name();
    let sweeper = Issuer::new(
        connect_store(&mongo_uri_named(&name), &app.db_name).await,
        IssuingConfig {
            default_mode: IssuanceMode::Upsert,
            providers: HashSet::from(["stripe".to_owned()]),
            customer_metadata: HashSet::new(),
            pending_ttl: Duration::from_secs(3600),
            idempotency: IdempotencyConfig {
                retention: Duration::from_secs(3600),
                lease: Duration::from_secs(30),
            },
            max_batches_in_flight: 2,
            prices: Default::default(),
        },
    );
    let failpoint = FailPoint::set(&name, &["update"], Fault::Block { millis: 6000 }, 1).await;
    let sweep = tokio::spawn(async move {
        sweeper
            .repair_recent_withdrawals(Duration::from_secs(600))
            .await
    });
    // A sweep that revokes by the pending quantity is held up at its revoke by now; one
    // that leaves a pending record alone has finished without any.
    let held_up = failpoint.fired_within(1, Duration::from_secs(2)).await;

    // Meanwhile the provider's success names 10 tokens: it takes the request over,
    // writes 10 and revokes the refunded half (5..9).
    let success = intent_event("evt_ptt_s", "succeeded", payment, now(), "10");
    assert_eq!(deliver_stripe(&app, &success).await.status(), 200);
    sweep.await.unwrap().unwrap();
    assert_eq!(failpoint.off().await, i64::from(held_up));

    let states = app.token_states(payment).await;
    assert_eq!(
        app.active_indexes(payment).await,
        vec![0, 1, 2, 3, 4],
        "{states:?}"
    );
}
