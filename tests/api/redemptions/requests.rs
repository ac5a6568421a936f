//! One redemption request at a time: oldest first, replays, conflicts, the balance, the
//! key's accounts, bad input.

use mongodb::bson::doc;
use serde_json::{Value, json};

use super::{count_status, redeem, redemption, standard_balance};
use crate::helpers::*;

/// Issues `quantity` standard tokens of `OWNER` for `payment`, the issuance body's `field`
/// set to `value` (the account, the payment date: what decides who may spend them and
/// which are the oldest), and answers their ids.
async fn issue_with(
    app: &TestApp,
    payment: &str,
    quantity: i64,
    field: &str,
    value: Value,
) -> Vec<String> {
    let mut body = issuance_body(payment, quantity);
    body[field] = value;
    let response = app.issue(ADMIN_KEY, &body).await;
    assert_eq!(response.status(), 201);
    token_ids(&json(response).await)
}

#[tokio::test]
async fn a_redemption_redeems_the_oldest_tokens_and_a_retry_replays_it() {
    let app = spawn_app().await;
    let older = app.issue_tokens("pi_red_old", 2).await;
    let newer = app.issue_tokens("pi_red_new", 3).await;

    let response = redeem(&app, ADMIN_KEY, &redemption(3, "order-1")).await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()["location"],
        format!("/v1/redemptions/{OWNER}/order-1")
    );
    let first = json(response).await;
    assert_eq!(
        token_ids(&first),
        [older[0].clone(), older[1].clone(), newer[0].clone()]
    );
    assert_eq!(first["redemption"]["quantity"], 3);
    assert_eq!(first["redemption"]["reference"], "order-1");
    for token in first["tokens"].as_array().unwrap() {
        assert_eq!(token["status"], "redeemed");
        assert_eq!(token["version"], 1);
        let stored = app.stored_token(token["id"].as_str().unwrap()).await;
        assert_eq!(stored.get_str("status").unwrap(), "redeemed");
        assert_eq!(stored.get_str("redemptionRef").unwrap(), "order-1");
        assert_eq!(stored_int(&stored, "_version"), Some(1));
    }
    for id in &newer[1..] {
        assert_eq!(
            app.stored_token(id).await.get_str("status").unwrap(),
            "active"
        );
    }
    let record = app
        .find_stored("redemptions", doc! { "reference": "order-1" })
        .await;
    assert_eq!(record.get_array("tokenIds").unwrap().len(), 3);

    // The answer was lost: the same request again is the same redemption, nothing new.
    let retry = redeem(&app, ADMIN_KEY, &redemption(3, "order-1")).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let replay = json(retry).await;
    assert_eq!(replay, first, "the same redemption, the same tokens");
    assert_eq!(count_status(&app, "redeemed").await, 3);
    assert_eq!(app.count("redemptions", doc! {}).await, 1);

    let read = app
        .get(READER_KEY, &format!("/v1/redemptions/{OWNER}/order-1"))
        .await;
    assert_eq!(read.status(), 200);
    assert_eq!(json(read).await, first);
    let balance = standard_balance(&app).await;
    assert_eq!(balance["active"], 2);
    assert_eq!(balance["redeemed"], 3);
}

#[tokio::test]
async fn the_reference_with_other_parameters_is_a_conflict_and_writes_nothing() {
    let app = spawn_app().await;
    app.issue_tokens("pi_red_conflict", 5).await;
    assert_eq!(
        redeem(&app, ADMIN_KEY, &redemption(2, "order-2"))
            .await
            .status(),
        201
    );

    let more = redeem(&app, ADMIN_KEY, &redemption(3, "order-2")).await;
    let problem = assert_problem(more, 409, "idempotency_conflict").await;
    assert_eq!(
        problem["mismatches"],
        json!([{ "field": "quantity", "existing": 2, "requested": 3 }])
    );
    let mut other_type = redemption(2, "order-2");
    other_type["tokenType"] = json!("premium");
    let problem = assert_problem(
        redeem(&app, ADMIN_KEY, &other_type).await,
        409,
        "idempotency_conflict",
    )
    .await;
    assert_eq!(problem["mismatches"][0]["field"], "tokenType");
    assert_eq!(count_status(&app, "redeemed").await, 2);
    assert_eq!(app.count("redemptions", doc! {}).await, 1);
}

#[tokio::test]
async fn fewer_active_tokens_than_asked_redeem_nothing() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_red_short", 5).await;
    // One is spent already: 4 remain.
    let spent = app.redeem_token(ADMIN_KEY, &ids[0]).await;
    assert_eq!(spent.status(), 200);

    let problem = assert_problem(
        redeem(&app, ADMIN_KEY, &redemption(5, "order-3")).await,
        409,
        "insufficient_balance",
    )
    .await;
    assert_eq!(problem["available"], 4);
    assert_eq!(count_status(&app, "active").await, 4, "nothing redeemed");
    assert_eq!(app.count("redemptions", doc! {}).await, 0);
    let missing = app
        .get(READER_KEY, &format!("/v1/redemptions/{OWNER}/order-3"))
        .await;
    assert_problem(missing, 404, "not_found").await;
    // The same reference may be used once the balance suffices.
    assert_eq!(
        redeem(&app, ADMIN_KEY, &redemption(4, "order-3"))
            .await
            .status(),
        201
    );
    assert_eq!(count_status(&app, "active").await, 0);
}

#[tokio::test]
async fn redemptions_spend_only_the_keys_accounts() {
    let app = spawn_app().await;
    // acct_2's tokens are the older ones, but not the acct_1 key's to spend.
    let foreign = issue_with(&app, "pi_red_acct2", 3, "accountId", json!("acct_2")).await;
    let own = issue_with(&app, "pi_red_acct1", 3, "accountId", json!("acct_1")).await;

    let scoped = redeem(&app, ACCOUNT1_KEY, &redemption(2, "scoped-1")).await;
    assert_eq!(scoped.status(), 201);
    assert_eq!(token_ids(&json(scoped).await), own[..2]);
    let problem = assert_problem(
        redeem(&app, ACCOUNT1_KEY, &redemption(2, "scoped-2")).await,
        409,
        "insufficient_balance",
    )
    .await;
    assert_eq!(problem["available"], 1, "acct_2's tokens are not counted");

    let mut elsewhere = redemption(1, "scoped-3");
    elsewhere["accountId"] = json!("acct_2");
    assert_problem(
        redeem(&app, ACCOUNT1_KEY, &elsewhere).await,
        403,
        "forbidden",
    )
    .await;
    // The admin may narrow a redemption to one account.
    let admin = redeem(&app, ADMIN_KEY, &elsewhere).await;
    assert_eq!(admin.status(), 201);
    let admin = json(admin).await;
    assert_eq!(token_ids(&admin), foreign[..1]);
    assert_eq!(admin["redemption"]["accountId"], "acct_2");

    // The admin's acct_2 redemption is not the acct_1 key's to see, nor to replay.
    let hidden = app
        .get(ACCOUNT1_KEY, &format!("/v1/redemptions/{OWNER}/scoped-3"))
        .await;
    assert_problem(hidden, 404, "not_found").await;
    let taken = redeem(&app, ACCOUNT1_KEY, &redemption(1, "scoped-3")).await;
    let problem = assert_problem(taken, 409, "idempotency_conflict").await;
    assert_eq!(
        problem["mismatches"],
        json!([{ "field": "reference", "requested": "scoped-3" }])
    );
    assert_eq!(count_status(&app, "redeemed").await, 3);
}

#[tokio::test]
async fn bad_redemptions_name_every_field_and_write_nothing() {
    let app = spawn_app().await;
    app.issue_tokens("pi_red_bad", 2).await;
    let bad =
        json!({ "owner": "nope", "tokenType": "Bad", "quantity": 0, "reference": "has space" });
    let problem = assert_problem(
        redeem(&app, ADMIN_KEY, &bad).await,
        422,
        "validation_failed",
    )
    .await;
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["owner", "tokenType", "quantity", "reference"]);
    for body in [
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": 1 }),
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": "1", "reference": "r" }),
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": 1.5, "reference": "r" }),
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": 1, "reference": "r", "quanity": 1 }),
    ] {
        assert_problem(
            redeem(&app, ADMIN_KEY, &body).await,
            422,
            "validation_failed",
        )
        .await;
    }
    // A reference that its URL (`Location`) would read as a directory.
    for dots in [".", ".."] {
        let problem = assert_problem(
            redeem(&app, ADMIN_KEY, &redemption(1, dots)).await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(problem["errors"][0]["field"], "reference", "{problem}");
        assert!(
            problem["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("`..`"),
            "{problem}"
        );
    }
    let no_scope = redeem(&app, READER_KEY, &redemption(1, "r")).await;
    assert_problem(no_scope, 403, "forbidden").await;
    let bad_read = app
        .get(READER_KEY, "/v1/redemptions/nope/has%20space")
        .await;
    let problem = assert_problem(bad_read, 422, "validation_failed").await;
    assert_eq!(problem["errors"].as_array().unwrap().len(), 2);
    assert_eq!(count_status(&app, "active").await, 2);
    assert_eq!(app.count("redemptions", doc! {}).await, 0);
}

#[tokio::test]
async fn an_idempotency_key_replays_a_redemption() {
    let app = spawn_app().await;
    app.issue_tokens("pi_red_key", 4).await;
    let send = || {
        app.http
            .post(app.url("/v1/redemptions"))
            .bearer_auth(ADMIN_KEY)
            .header("idempotency-key", "spend-1")
            .json(&redemption(2, "order-k"))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].clone();
    let first_body = first.bytes().await.unwrap();
    let retry = send().await.unwrap();
    // The first answer exactly, 201 included, marked as a replay.
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["location"], location);
    assert_eq!(retry.bytes().await.unwrap(), first_body);
    assert_eq!(count_status(&app, "redeemed").await, 2);
}

/// Oldest is earliest paid, not first written: a payment dated earlier but issued later
/// is spent first, its tokens in tokenIndex order.
#[tokio::test]
async fn the_oldest_tokens_are_those_paid_first_whenever_they_were_issued() {
    let app = spawn_app().await;
    // Issued first but paid a day later, then issued second but paid first.
    let (later_date, earlier_date) = (json!("2026-03-02T10:00:00Z"), json!("2026-03-01T10:00:00Z"));
    let later = issue_with(&app, "pi_red_paid_later", 2, "paymentDate", later_date).await;
    let earlier = issue_with(&app, "pi_red_paid_earlier", 2, "paymentDate", earlier_date).await;

    let response = redeem(&app, ADMIN_KEY, &redemption(3, "by-payment-date")).await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        token_ids(&json(response).await),
        [earlier[0].clone(), earlier[1].clone(), later[0].clone()]
    );
    for (id, status) in [
        (&earlier[0], "redeemed"),
        (&earlier[1], "redeemed"),
        (&later[0], "redeemed"),
        (&later[1], "active"),
    ] {
        assert_eq!(
            app.stored_token(id).await.get_str("status").unwrap(),
            status
        );
    }
}

#[tokio::test]
async fn the_oldest_tokens_are_found_through_an_index_without_sorting() {
    let app = spawn_app().await;
    app.issue_tokens("pi_red_plan_1", 30).await;
    app.issue_tokens("pi_red_plan_2", 30).await;
    app.db.run_command(doc! { "profile": 2 }).await.unwrap();
    assert_eq!(
        redeem(&app, ADMIN_KEY, &redemption(5, "plan-1"))
            .await
            .status(),
        201
    );
    assert_eq!(
        redeem(&app, ACCOUNT1_KEY, &redemption(5, "plan-2"))
            .await
            .status(),
        201
    );
    app.db.run_command(doc! { "profile": 0 }).await.unwrap();
    let finds: Vec<mongodb::bson::Document> = {
        use futures::TryStreamExt;
        app.db
            .collection::<mongodb::bson::Document>("system.profile")
            .find(doc! { "command.find": "tokens", "command.filter.status": "active" })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    assert_eq!(finds.len(), 2, "{finds:?}");
    for entry in finds {
        let command = entry.get_document("command").unwrap();
        let explain = app
            .db
            .run_command(doc! {
                "explain": {
                    "find": "tokens",
                    "filter": command.get_document("filter").unwrap().clone(),
                    "sort": command.get_document("sort").unwrap().clone(),
                    "limit": command.get("limit").unwrap().clone(),
                },
                "verbosity": "queryPlanner",
            })
            .await
            .unwrap();
        let plan = explain
            .get_document("queryPlanner")
            .unwrap()
            .get_document("winningPlan")
            .unwrap()
            .to_string();
        assert!(plan.contains("\"tokens_owner_type_status_age\""), "{plan}");
        assert!(
            !plan.contains("COLLSCAN") && !plan.contains("\"SORT\""),
            "{plan}"
        );
    }
}

/// A refusal is answered only once the majority has what it rests on: the transaction,
/// with nothing to write, is committed with the majority rather than aborted. When that
/// commit answers a write concern error (the majority did not confirm in time), the
/// refusal is not answered: 503 `database_unavailable`, nothing written; the retry, once
/// the commit goes through, is refused with `available`.
#[tokio::test]
async fn a_refusal_whose_commit_the_majority_did_not_confirm_is_not_answered() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    app.issue_tokens("pi_red_refusal_commit", 2).await;
    let failpoint = FailPoint::always(
        &name,
        &["commitTransaction"],
        Fault::WriteConcernError { code: 64 },
    )
    .await;
    let failed = redeem(&app, ADMIN_KEY, &redemption(3, "order-too-many")).await;
    assert!(
        failpoint.off().await >= 1,
        "the refusal's empty transaction was committed"
    );
    assert_problem(failed, 503, "database_unavailable").await;
    assert_eq!(count_status(&app, "active").await, 2, "nothing redeemed");
    assert_eq!(app.count("redemptions", doc! {}).await, 0);

    let problem = assert_problem(
        redeem(&app, ADMIN_KEY, &redemption(3, "order-too-many")).await,
        409,
        "insufficient_balance",
    )
    .await;
    assert_eq!(problem["available"], 2);
    assert_eq!(count_status(&app, "active").await, 2);
}
