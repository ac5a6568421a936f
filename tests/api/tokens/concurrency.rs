//! Writers racing on one token: exactly one state change wins, and writers without
//! `If-Match` are retried, never lost.

use futures::future::join_all;

use super::{change, transfer, version_of};
use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_redeems_redeem_once() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_redeem_race", 2).await;
    // Without If-Match: one 200, the others re-read, see `redeemed`, and get 409.
    let plain =
        join_all((0..20).map(|_| change(&app, ADMIN_KEY, &ids[0], "redeem", None, None))).await;
    // With the same If-Match: one 200, the others 412 (stale) or 409.
    let gated =
        join_all((0..20).map(|_| change(&app, ADMIN_KEY, &ids[1], "redeem", Some("\"0\""), None)))
            .await;
    for (id, answers) in [(&ids[0], plain), (&ids[1], gated)] {
        let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            1,
            "{statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| [200, 409, 412].contains(s)),
            "{statuses:?}"
        );
        let db = app.stored_token(id).await;
        assert_eq!(db.get_str("status").unwrap(), "redeemed");
        assert_eq!(version_of(&db), 1, "_version incremented exactly once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transfer_and_redeem_one_wins() {
    let app = spawn_app().await;
    for round in 0..10 {
        let id = app
            .issue_tokens(&format!("pi_tr_{round}"), 1)
            .await
            .remove(0);
        let transfer = transfer(&app, &id, Some("\"0\""));
        let redeem = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), None);
        let (transfer, redeem) = tokio::join!(transfer, redeem);
        let (t, r) = (transfer.status().as_u16(), redeem.status().as_u16());
        assert!(
            (t == 200) ^ (r == 200),
            "exactly one wins: transfer {t}, redeem {r}"
        );
        assert!([200, 409, 412].contains(&t) && [200, 409, 412].contains(&r));
        let db = app.stored_token(&id).await;
        assert_eq!(version_of(&db), 1);
        if t == 200 {
            assert_eq!(db.get_str("status").unwrap(), "active");
            assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OTHER_OWNER);
        } else {
            assert_eq!(db.get_str("status").unwrap(), "redeemed");
            assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OWNER);
        }
    }
}

#[tokio::test]
async fn concurrent_writers_without_if_match_are_retried_not_lost() {
    // Revoke and redeem race without If-Match: the loser's retry re-reads and re-decides,
    // so the outcome is one terminal state and a consistent answer for the loser.
    let app = spawn_app().await;
    for round in 0..10 {
        let id = app
            .issue_tokens(&format!("pi_rr_{round}"), 1)
            .await
            .remove(0);
        let (revoke, redeem) = tokio::join!(
            change(&app, ADMIN_KEY, &id, "revoke", None, None),
            change(&app, ADMIN_KEY, &id, "redeem", None, None)
        );
        let db = app.stored_token(&id).await;
        let status = db.get_str("status").unwrap();
        match status {
            "revoked" => {
                assert_eq!(revoke.status(), 200);
                assert_eq!(redeem.status(), 409);
            }
            "redeemed" => {
                assert_eq!(redeem.status(), 200);
                assert_eq!(revoke.status(), 409);
            }
            other => panic!("unexpected state {other}"),
        }
        assert_eq!(version_of(&db), 1);
    }
}

/// A token that a transaction still open holds (a redemption whose instance died before
/// its commit reached the server, which ends it only at `transactionLifetimeLimitSeconds`):
/// a redeem is refused as the token kept changing, instead of waiting on the transaction
/// past its request and applying whenever that ended; nothing is written, and the redeem
/// goes through once the transaction is over.
#[tokio::test]
async fn a_token_an_open_transaction_holds_is_refused_not_waited_on() {
    use mongodb::bson::{Document, doc, oid::ObjectId};
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_held_token", 1).await.remove(0);
    let mut session = app.db.client().start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    app.db
        .collection::<Document>("tokens")
        .update_one(
            doc! { "_id": ObjectId::parse_str(&id).unwrap() },
            doc! { "$set": { "updatedAt": mongodb::bson::DateTime::now() } },
        )
        .session(&mut session)
        .await
        .unwrap();

    for if_match in [None, Some("\"0\"")] {
        let refused = change(&app, ADMIN_KEY, &id, "redeem", if_match, None).await;
        let problem = assert_problem(refused, 409, "state_conflict").await;
        assert_eq!(problem["currentStatus"], "active", "{if_match:?}");
    }
    let stored = app.stored_token(&id).await;
    assert_eq!(stored.get_str("status").unwrap(), "active");
    assert_eq!(stored_int(&stored, "_version"), Some(0));

    session.abort_transaction().await.unwrap();
    let redeemed = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), None).await;
    assert_eq!(redeemed.status(), 200);
    assert_eq!(
        stored_int(&app.stored_token(&id).await, "_version"),
        Some(1)
    );
}
