//! Redemptions of different owners arriving together share one transaction: each still
//! redeems its own owner's oldest tokens, all or nothing, and a batch that cannot commit
//! writes nothing and lets each of its redemptions go through alone.

use std::collections::HashSet;

use futures::TryStreamExt;
use futures::future::join_all;
use mongodb::bson::{Document, doc, oid::ObjectId};
use serde_json::{Value, json};

use tokenmint::domain::{Owner, TokenStatus, TokenType};
use tokenmint::store::{
    RedemptionAttempt, RedemptionDoc, Spend, SpendPlan, Spendable, TokenDoc, TokenQuery,
};

use super::redeem;
use crate::helpers::*;

/// No self-repair pass sends commands the failpoints could catch.
const NO_REPAIR: &str = "[repair]\nenabled = false\n";

/// Owners in a burst, and what each holds.
const OWNERS: usize = 16;
const HELD: i64 = 10;

/// Issues `HELD` standard tokens to each of `OWNERS` new owners; returns the owners.
async fn stocked_owners(app: &TestApp) -> Vec<String> {
    let owners: Vec<String> = (0..OWNERS).map(|_| ObjectId::new().to_hex()).collect();
    for (i, owner) in owners.iter().enumerate() {
        let mut body = issuance_body(&format!("pi_batch_{i}"), HELD);
        body["owner"] = json!(owner);
        assert_eq!(app.issue(ADMIN_KEY, &body).await.status(), 201);
    }
    owners
}

/// Sends, all at once, a redemption of `quantity` for each (owner, reference, quantity).
async fn redeem_all(app: &TestApp, asks: &[(String, String, i64)]) -> Vec<(u16, Value)> {
    join_all(asks.iter().map(|(owner, reference, quantity)| async move {
        let body = json!({
            "owner": owner, "tokenType": "standard", "quantity": quantity, "reference": reference,
        });
        let response = redeem(app, ADMIN_KEY, &body).await;
        (response.status().as_u16(), json(response).await)
    }))
    .await
}

/// Two redemptions of 3 per owner, and for the first owner a third of 7: of the first
/// owner's three, whichever come first go through and the last is refused, whatever the
/// order.
fn two_each_and_one_too_many(owners: &[String]) -> Vec<(String, String, i64)> {
    let mut asks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        asks.push((owner.clone(), format!("first-{i}"), 3));
        asks.push((owner.clone(), format!("second-{i}"), 3));
    }
    asks.push((owners[0].clone(), "greedy".to_owned(), HELD - 3));
    asks
}

/// Every document of `collection`.
async fn all(app: &TestApp, collection: &str) -> Vec<Document> {
    app.db
        .collection::<Document>(collection)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Checks the answers against the database: every 201 redeemed its owner's own tokens,
/// each token once, under its reference; one of the first owner's asks, and no other,
/// was refused for want of tokens; nothing else was redeemed.
async fn check_each_redeemed_its_own(
    app: &TestApp,
    asks: &[(String, String, i64)],
    answers: &[(u16, Value)],
) {
    let mut answered = HashSet::new();
    let (mut created, mut refused) = (0, 0);
    for ((owner, reference, quantity), (status, body)) in asks.iter().zip(answers) {
        if *status == 409 {
            assert_eq!(owner, &asks[0].0, "{reference}: {body}");
            assert_eq!(body["code"], "insufficient_balance", "{body}");
            assert!(body["available"].as_i64().unwrap() < *quantity, "{body}");
            refused += 1;
            continue;
        }
        assert_eq!(*status, 201, "{reference}: {body}");
        created += 1;
        let ids = token_ids(body);
        assert_eq!(ids.len() as i64, *quantity, "{body}");
        for id in ids {
            let token = app.stored_token(&id).await;
            assert_eq!(token.get_object_id("owner").unwrap().to_hex(), *owner);
            assert_eq!(token.get_str("status").unwrap(), "redeemed");
            assert_eq!(token.get_str("redemptionRef").unwrap(), reference);
            assert_eq!(stored_int(&token, "_version"), Some(1), "{token}");
            assert!(answered.insert(id), "a token answered twice");
        }
    }
    let redeemed = all(app, "tokens")
        .await
        .into_iter()
        .filter(|t| t.get_str("status").unwrap() == "redeemed")
        .count();
    assert_eq!(
        redeemed,
        answered.len(),
        "only what was answered is redeemed"
    );
    assert_eq!(all(app, "redemptions").await.len(), created);
    assert_eq!((created, refused), (2 * OWNERS, 1), "{answers:?}");
}

/// How many redemption records each of the database's committed transactions inserted
/// (from the oplog: a transaction commits as one `applyOps` entry).
async fn redemptions_per_transaction(app: &TestApp) -> Vec<usize> {
    let ns = format!("{}.redemptions", app.db_name);
    let oplog = app
        .db
        .client()
        .database("local")
        .collection::<Document>("oplog.rs");
    let entries: Vec<Document> = oplog
        .find(doc! { "o.applyOps.ns": &ns })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    entries
        .iter()
        .map(|entry| {
            let ops = entry
                .get_document("o")
                .unwrap()
                .get_array("applyOps")
                .unwrap();
            ops.iter()
                .filter_map(|op| op.as_document())
                .filter(|op| op.get_str("ns") == Ok(ns.as_str()) && op.get_str("op") == Ok("i"))
                .count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redemptions_of_many_owners_at_once_share_transactions_and_each_spends_its_own() {
    let app = spawn_app().await;
    let owners = stocked_owners(&app).await;
    let asks = two_each_and_one_too_many(&owners);
    let answers = redeem_all(&app, &asks).await;
    check_each_redeemed_its_own(&app, &asks, &answers).await;

    let per_transaction = redemptions_per_transaction(&app).await;
    assert_eq!(per_transaction.iter().sum::<usize>(), 2 * OWNERS);
    assert!(
        per_transaction.iter().any(|&n| n > 1),
        "no transaction carried more than one redemption: {per_transaction:?}"
    );
}

/// Each write of a batch's transaction fails in turn, once, after the ones before it
/// succeeded: the token update loses a write conflict, the records' insert fails, the
/// commit's answer is lost, the commit applies but answers a write concern error. Every
/// redemption is answered 201 with its own tokens (a 5xx only for one that was alone in
/// its batch, and then by its retry), each token redeemed once, and the records match: a
/// batch that did not commit wrote nothing and its redemptions went through alone; one
/// whose commit applied is not applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_writes_fail_one_by_one_redeems_each_token_once() {
    let conflict = Fault::Error {
        code: 112,
        labels: vec!["TransientTransactionError".to_owned()],
    };
    // Redemptions send no other `update` or `insert` than their batch's.
    let faults = [
        ("update", conflict),
        ("insert", Fault::error(2)),
        ("commitTransaction", Fault::CloseConnection),
        ("commitTransaction", Fault::WriteConcernError { code: 64 }),
    ];
    for (command, fault) in faults {
        let name = unique_app_name();
        let app = spawn_app_named(&name, NO_REPAIR).await;
        let owners = stocked_owners(&app).await;
        let asks = two_each_and_one_too_many(&owners);
        let failpoint = FailPoint::set(&name, &[command], fault, 1).await;
        let mut answers = redeem_all(&app, &asks).await;
        assert_eq!(failpoint.off().await, 1, "{command} never failed");
        // A redemption that was alone in its batch answers the failure itself (5xx, as
        // a client retries it): its retry, with the same reference, must go through.
        for (ask, answer) in asks.iter().zip(answers.iter_mut()) {
            if answer.0 >= 500 {
                *answer = redeem_all(&app, std::slice::from_ref(ask)).await.remove(0);
            }
        }
        check_each_redeemed_its_own(&app, &asks, &answers).await;
        assert_eq!(
            redemptions_per_transaction(&app)
                .await
                .iter()
                .sum::<usize>(),
            2 * OWNERS,
            "{command}"
        );
    }
}

/// Every commit of every batch applies but answers a write concern error, as often as it
/// is tried: no batch hears that it committed. A redemption that shared its batch tries
/// again alone and finds its own record: it is answered 201, the redemption it made, not
/// 200 as a replay of an earlier request. One that was alone in its batch answers the
/// failure (5xx), and its retry with the same reference is the replay; the first owner's
/// refused one, whose empty commit fails the same way, is refused on its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_commit_applied_unconfirmed_answers_each_of_its_redemptions_created() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, NO_REPAIR).await;
    let owners = stocked_owners(&app).await;
    let asks = two_each_and_one_too_many(&owners);
    let unconfirmed = Fault::WriteConcernError { code: 64 };
    let failpoint = FailPoint::always(&name, &["commitTransaction"], unconfirmed).await;
    let answers = redeem_all(&app, &asks).await;
    assert!(failpoint.off().await >= 4, "no commit was tried to the end");

    let records = app.db.collection::<RedemptionDoc>("redemptions");
    let (mut created, mut alone, mut refused, mut spent) = (0, 0, 0, 0);
    for (ask, (status, body)) in asks.iter().zip(&answers) {
        let (owner, reference, quantity) = ask;
        let (status, body) = match status {
            201 => {
                created += 1;
                (*status, body.clone())
            }
            500.. => {
                let retried = redeem_all(&app, std::slice::from_ref(ask)).await.remove(0);
                if retried.0 == 409 {
                    assert_eq!(owner, &owners[0], "{reference}: {}", retried.1);
                    assert_eq!(retried.1["code"], "insufficient_balance");
                    refused += 1;
                    continue;
                }
                alone += 1;
                assert_eq!(retried.0, 200, "the retry of {reference}: {}", retried.1);
                retried
            }
            _ => panic!("{reference} answered {status}: {body}"),
        };
        let record = records
            .find_one(doc! { "owner": ObjectId::parse_str(owner).unwrap(), "reference": reference })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{reference} answered {status} without a record"));
        let stored: Vec<String> = record.token_ids.iter().map(|id| id.to_hex()).collect();
        assert_eq!(token_ids(&body), stored, "{reference}");
        spent += *quantity as usize;
    }
    assert_eq!(refused, 1, "{answers:?}");
    // No commit was confirmed: a 201 can only be a redemption that shared its batch and
    // found its own record when it ran again alone.
    assert!(created > 0, "no redemption shared a batch: {answers:?}");
    assert_eq!(created + alone, 2 * OWNERS);
    assert_eq!(
        records.count_documents(doc! {}).await.unwrap() as usize,
        2 * OWNERS
    );
    let redeemed = all(&app, "tokens")
        .await
        .into_iter()
        .filter(|t| t.get_str("status").unwrap() == "redeemed")
        .count();
    assert_eq!(redeemed, spent, "only what was answered is redeemed");
}

/// One redemption's token update is refused by the database (a validator rejects its
/// reference): the batches it joins write nothing, and only it fails; every other
/// redemption, of every owner, goes through (alone, when it shared that batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redemption_the_database_refuses_fails_alone_not_its_batch() {
    let app = spawn_app_with(NO_REPAIR).await;
    let owners = stocked_owners(&app).await;
    app.db
        .run_command(doc! {
            "collMod": "tokens",
            "validator": { "$expr": { "$ne": ["$redemptionRef", "poison"] } },
        })
        .await
        .unwrap();
    let mut asks = two_each_and_one_too_many(&owners);
    asks.pop();
    // In the middle of the burst, so that it shares a batch with others.
    asks[OWNERS].1 = "poison".to_owned();
    let answers = redeem_all(&app, &asks).await;
    for ((_, reference, _), (status, body)) in asks.iter().zip(&answers) {
        let expected = if reference == "poison" { 500 } else { 201 };
        assert_eq!(*status, expected, "{reference}: {body}");
    }
    assert_eq!(all(&app, "redemptions").await.len(), 2 * OWNERS - 1);
    assert_eq!(
        redemptions_per_transaction(&app)
            .await
            .iter()
            .sum::<usize>(),
        2 * OWNERS - 1
    );
}

/// A redemption whose request is gone (it timed out while waiting for its owner's
/// previous redemption) is never started: nothing of it is written later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redemption_whose_request_timed_out_before_its_turn_is_never_written() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{NO_REPAIR}[server]\nrequest_timeout_ms = 1000\n"),
    )
    .await;
    let owners = stocked_owners(&app).await;
    // The first redemption's transaction hangs at its update past both requests' time;
    // the second, of the same owner, waits behind it.
    let failpoint = FailPoint::set(&name, &["update"], Fault::Block { millis: 3_000 }, 1).await;
    let asks = [
        (owners[0].clone(), "ahead".to_owned(), 1),
        (owners[0].clone(), "behind".to_owned(), 1),
    ];
    let first = redeem_all(&app, &asks[..1]);
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        redeem_all(&app, &asks[1..]).await
    };
    let (first, second) = tokio::join!(first, second);
    for (status, body) in first.iter().chain(&second) {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["code"], "request_timeout", "{body}");
    }
    assert_eq!(failpoint.off().await, 1, "the update never hung");
    // Long enough for the hung transaction to end and the writer to reach the second.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let references: Vec<String> = all(&app, "redemptions")
        .await
        .iter()
        .map(|r| r.get_str("reference").unwrap().to_owned())
        .collect();
    assert!(!references.contains(&"behind".to_owned()), "{references:?}");
}

/// The spends of one owner's `standard` tokens, oldest first by id, `limit` of them.
fn standard_of(owner: ObjectId, limit: i64) -> Spendable {
    Spendable {
        query: TokenQuery {
            owner: Some(Owner::from_object_id(owner)),
            token_type: Some(TokenType::parse("standard").unwrap()),
            status: Some(TokenStatus::Active),
            account: None,
            accounts: None,
            after: None,
        },
        order: doc! { "_id": 1 },
        limit,
    }
}

/// A spend of `reference` for `owner`, without an `Idempotency-Key`.
fn spend<'a>(owner: ObjectId, reference: &'a str, spendable: &'a Spendable) -> Spend<'a> {
    Spend {
        owner,
        reference,
        spendable,
        answered: None,
    }
}

/// The plan that redeems `ids` for `owner`'s redemption `reference`.
fn redeeming(owner: ObjectId, reference: &str, ids: Vec<ObjectId>) -> SpendPlan {
    SpendPlan {
        set: doc! { "status": "redeemed", "redemptionRef": reference },
        record: RedemptionDoc {
            id: ObjectId::new(),
            owner,
            reference: reference.to_owned(),
            token_type: "standard".to_owned(),
            quantity: ids.len() as i64,
            account_id: None,
            token_ids: ids,
            created_at: mongodb::bson::DateTime::now(),
            requested_by: "test".to_owned(),
        },
    }
}

/// Two owners of four `standard` tokens each, the first of whom redeemed three of them
/// as `first`: the two owners, and the ids of those three in the order they were chosen.
async fn a_redemption_to_retry(app: &TestApp) -> (ObjectId, ObjectId, Vec<String>) {
    let (retried, other) = (ObjectId::new(), ObjectId::new());
    for (i, owner) in [retried, other].iter().enumerate() {
        let mut body = issuance_body(&format!("pi_existing_{i}"), 4);
        body["owner"] = json!(owner.to_hex());
        assert_eq!(app.issue(ADMIN_KEY, &body).await.status(), 201);
    }
    let body = json!({
        "owner": retried.to_hex(), "tokenType": "standard", "quantity": 3, "reference": "first",
    });
    let first = redeem(app, ADMIN_KEY, &body).await;
    assert_eq!(first.status(), 201);
    (retried, other, token_ids(&json(first).await))
}

/// The ids of the tokens of an existing redemption the transaction answered from its
/// snapshot; panics when it was not.
fn answered_ids<R: std::fmt::Debug>(attempt: &RedemptionAttempt<R>) -> Vec<String> {
    let RedemptionAttempt::Exists(Some(existing)) = attempt else {
        panic!("the retry was not answered from the transaction: {attempt:?}");
    };
    assert!(
        existing
            .tokens
            .iter()
            .all(|t| t.status == TokenStatus::Redeemed)
    );
    existing.tokens.iter().map(|t| t.id.to_hex()).collect()
}

/// A transaction that did not commit: the existing redemption (first) is left to be
/// read again, the new one (second) to try again.
fn assert_read_again_and_tried_again<R: std::fmt::Debug>(attempts: &[RedemptionAttempt<R>]) {
    assert!(
        matches!(attempts[0], RedemptionAttempt::Exists(None)),
        "{:?}",
        attempts[0]
    );
    assert!(
        matches!(attempts[1], RedemptionAttempt::Conflict),
        "{:?}",
        attempts[1]
    );
}

/// A transaction that committed beside a retry: the retry (first) answered with the ids
/// of its first attempt, the other (second) committed; 2 records and 5 tokens redeemed.
async fn assert_answered_beside_a_commit<R: std::fmt::Debug>(
    app: &TestApp,
    attempts: &[RedemptionAttempt<R>],
    first_ids: &[String],
) {
    assert_eq!(
        answered_ids(&attempts[0]),
        first_ids,
        "its tokens, in the order they were chosen"
    );
    assert!(
        matches!(attempts[1], RedemptionAttempt::Committed(_)),
        "{:?}",
        attempts[1]
    );
    assert_eq!(all(app, "redemptions").await.len(), 2);
    assert_eq!(redeemed_count(app).await, 5);
}

/// How many tokens are redeemed.
async fn redeemed_count(app: &TestApp) -> usize {
    all(app, "tokens")
        .await
        .iter()
        .filter(|t| t.get_str("status") == Ok("redeemed"))
        .count()
}

/// A retried redemption that shares a transaction with one that writes, or with a
/// refusal, is answered from that transaction's snapshot, which its commit confirmed
/// with the majority: the record and its tokens as the first attempt left them, nothing
/// read after it. One that has the transaction to itself, or shares one that does not
/// commit, is left to be read again.
#[tokio::test]
async fn an_existing_redemption_is_answered_from_a_transaction_that_commits() {
    let app = spawn_app_with(NO_REPAIR).await;
    let (retried, other, first_ids) = a_redemption_to_retry(&app).await;
    let store = app.store().await;
    let (retried_spend, other_spend) = (standard_of(retried, 3), standard_of(other, 2));

    // Beside a redemption that writes.
    let spends = [
        spend(retried, "first", &retried_spend),
        spend(other, "other", &other_spend),
    ];
    let attempts = store
        .redeem_in_transaction::<u64>(&spends, |index, found| {
            assert_eq!(index, 1, "only the new redemption is planned");
            Ok(redeeming(
                other,
                "other",
                found.iter().map(|t| t.id).collect(),
            ))
        })
        .await
        .unwrap();
    assert_answered_beside_a_commit(&app, &attempts, &first_ids).await;

    // Alone, nothing is committed: the snapshot is not confirmed, so it is read again.
    let attempts = store
        .redeem_in_transaction::<u64>(&spends[..1], |_, _| panic!("nothing to plan"))
        .await
        .unwrap();
    assert!(
        matches!(attempts[0], RedemptionAttempt::Exists(None)),
        "{:?}",
        attempts[0]
    );

    // Beside a refusal, the empty transaction is committed to confirm it: both answered
    // from the snapshot.
    let third = [
        spend(retried, "first", &retried_spend),
        spend(other, "third", &other_spend),
    ];
    let attempts = store
        .redeem_in_transaction::<u64>(&third, |_, found| Err(found.len() as u64))
        .await
        .unwrap();
    assert_eq!(answered_ids(&attempts[0]), first_ids);
    assert!(
        matches!(attempts[1], RedemptionAttempt::Refused(2)),
        "{:?}",
        attempts[1]
    );

    // Beside a redemption that cannot be written (its chosen tokens are spent already),
    // nothing commits: the existing one is read again, the other tries again.
    let spent: Vec<ObjectId> = first_ids
        .iter()
        .map(|id| ObjectId::parse_str(id).unwrap())
        .collect();
    let attempts = store
        .redeem_in_transaction::<u64>(&third, |_, _| Ok(redeeming(other, "third", spent.clone())))
        .await
        .unwrap();
    assert_read_again_and_tried_again(&attempts);
    assert_eq!(all(&app, "redemptions").await.len(), 2);
    assert_eq!(redeemed_count(&app).await, 5);
}

/// A read of tokens fails inside a transaction that would have written, after the
/// retried redemption's record was found (a transient error, as a failover gives): the
/// first read of tokens (the other owner's oldest), then the second (the retry's own, to
/// answer it from the snapshot). Either way nothing is written, the retry is left to be
/// read again (a replay, not a conflict to try again), and the other redemption tries
/// again, then redeems.
#[tokio::test]
async fn a_read_failing_after_a_retry_was_found_writes_nothing_and_leaves_it_a_replay() {
    let transient = Fault::Error {
        code: 251,
        labels: vec!["TransientTransactionError".to_owned()],
    };
    for fails_second_read in [false, true] {
        let app = spawn_app_with(NO_REPAIR).await;
        let (retried, other, first_ids) = a_redemption_to_retry(&app).await;
        let name = unique_app_name();
        let store = connect_store(&mongo_uri_named(&name), &app.db_name).await;
        let (retried_spend, other_spend) = (standard_of(retried, 3), standard_of(other, 2));
        let spends = [
            spend(retried, "first", &retried_spend),
            spend(other, "other", &other_spend),
        ];
        let plan = |_: usize, found: &[TokenDoc]| -> Result<SpendPlan, u64> {
            Ok(redeeming(
                other,
                "other",
                found.iter().map(|t| t.id).collect(),
            ))
        };

        // The references' read passes (another collection).
        let tokens = format!("{}.tokens", app.db_name);
        let fault = transient.clone();
        let failing = if fails_second_read {
            FailPoint::after_first_on(&name, &["find"], &tokens, fault).await
        } else {
            FailPoint::set_on(&name, &["find"], &tokens, fault, 1).await
        };
        let attempts = store.redeem_in_transaction(&spends, plan).await.unwrap();
        assert_eq!(failing.off().await, 1, "second read: {fails_second_read}");
        assert_read_again_and_tried_again(&attempts);
        assert_eq!(all(&app, "redemptions").await.len(), 1);
        assert_eq!(redeemed_count(&app).await, 3);

        // Tried again, the other redemption goes through, and the retry is answered.
        let attempts = store.redeem_in_transaction(&spends, plan).await.unwrap();
        assert_answered_beside_a_commit(&app, &attempts, &first_ids).await;
    }
}
