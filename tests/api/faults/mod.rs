//! MongoDB failing inside a flow: one command of one app made to fail or hang by a
//! `failCommand` failpoint aimed at that app's client name, at the step each test names.

mod batch_writes;
mod lost_settles;
mod marks;
mod settle_quantity;
mod status_moves;
mod stuck_payments;
mod unconfirmed;

use crate::helpers::*;

/// A faulty app whose own sweeps send no command: self-repair's reads and writes would
/// meet the failpoint a test aimed at the app's requests.
const NO_SWEEPS: &str = "[repair]\nenabled = false\n";

#[tokio::test]
async fn a_failpoint_fails_only_the_named_apps_commands() {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, NO_SWEEPS).await;
    let healthy = spawn_app().await;
    let failpoint = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
    let path = "/v1/issuances/stripe/acct_1/pi_fp_probe";
    // The other app's read passes; the named app's read fails twice (the driver retries
    // a read once): 503, no driver text. Its next read passes again.
    assert_eq!(healthy.get(ADMIN_KEY, path).await.status(), 404);
    let failed = faulty.get(ADMIN_KEY, path).await;
    let problem = assert_problem(failed, 503, "database_unavailable").await;
    assert!(
        !problem.to_string().contains("ShutdownInProgress"),
        "{problem}"
    );
    assert_eq!(faulty.get(ADMIN_KEY, path).await.status(), 404);
    assert_eq!(failpoint.off().await, 2);
}

#[tokio::test]
async fn a_failpoint_counts_only_its_own_failures() {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, NO_SWEEPS).await;
    let path = "/v1/issuances/stripe/acct_1/pi_fp_count";
    // The server counts every failpoint it ever entered; each one set here counts its own.
    for _ in 0..2 {
        let failpoint = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
        assert_eq!(faulty.get(ADMIN_KEY, path).await.status(), 503);
        assert_eq!(failpoint.off().await, 2);
    }
}
