//! Money that comes back while other money goes: a re-activation and a withdrawal
//! recorded between its read of the payment and its writes. No token beyond the
//! entitlement may end active.

use std::time::Duration;

use super::{
    PAID_AT, half_reinstated, half_withdrawn, paid, refunded_so_far, statuses, stripe, verify_clean,
};
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe};

#[tokio::test]
async fn a_refund_recorded_during_a_reactivation_keeps_its_tokens_revoked() {
    let name = unique_app_name();
    let reinstating = spawn_app_named(&name, PROVIDERS).await;
    // A second instance of the deployment, whose commands no failpoint holds up.
    let refunding = spawn_app_on(&reinstating.db_name, PROVIDERS).await;
    paid(&reinstating, "pi_gap", "4").await;
    stripe(&reinstating, &half_withdrawn("pi_gap")).await;
    assert_eq!(
        statuses(&reinstating, "pi_gap").await,
        ["active", "active", "revoked", "revoked"]
    );

    // The dispute is won; its settle reads the payment (all 4 stand again), and its first
    // write after that read is held up while a refund of half the payment is recorded
    // and settled by the other instance.
    let failpoint = FailPoint::set(&name, &["update"], Fault::Block { millis: 3000 }, 1).await;
    let won = half_reinstated("pi_gap");
    let refund = refunded_so_far("evt_r", "pi_gap", PAID_AT + 30, 500);
    let (answer, ()) = tokio::join!(deliver_stripe(&reinstating, &won), async {
        assert!(
            failpoint.fired_within(1, Duration::from_secs(20)).await,
            "the reactivation's write was never held up"
        );
        stripe(&refunding, &refund).await;
    });
    assert!(failpoint.off().await > 0);
    assert_eq!(answer.status(), 200);

    // 500 of 1000 refunded for good: floor(4 × 0.5) = 2 tokens taken back, whatever the
    // reinstatement read before the refund was recorded.
    assert_eq!(
        statuses(&reinstating, "pi_gap").await,
        ["active", "active", "revoked", "revoked"]
    );
    verify_clean(&reinstating).await;
}
