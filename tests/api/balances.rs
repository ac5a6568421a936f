//! `GET /v1/balances/{owner}`: counts per token type and state from one aggregation,
//! scoped to the key's accounts, served by an index (its explain plan has no
//! collection scan).

use mongodb::bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;

/// Issues `quantity` tokens of `token_type` for `payment` at `account`, as the admin.
async fn issue(
    app: &TestApp,
    payment: &str,
    account: &str,
    token_type: &str,
    quantity: i64,
) -> Vec<String> {
    let mut body = issuance_body(payment, quantity);
    body["accountId"] = json!(account);
    body["tokenType"] = json!(token_type);
    let response = app.issue(ADMIN_KEY, &body).await;
    assert_eq!(response.status(), 201);
    token_ids(&json(response).await)
}

async fn balances(app: &TestApp, key: &str, query: &str) -> Value {
    let response = app.get(key, &format!("/v1/balances/{OWNER}{query}")).await;
    assert_eq!(response.status(), 200, "{query}");
    json(response).await
}

async fn change(app: &TestApp, id: &str, operation: &str) {
    let response = app
        .http
        .post(app.url(&format!("/v1/tokens/{id}/{operation}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{operation}");
}

#[tokio::test]
async fn balances_count_each_type_by_state() {
    let app = spawn_app().await;
    let standard = issue(&app, "pi_bal_1", "acct_1", "standard", 4).await;
    issue(&app, "pi_bal_2", "acct_1", "premium", 2).await;
    change(&app, &standard[0], "redeem").await;
    change(&app, &standard[1], "revoke").await;

    let all = balances(&app, READER_KEY, "").await;
    assert_eq!(
        all,
        json!({ "owner": OWNER, "balances": [
            { "tokenType": "premium", "active": 2, "redeemed": 0, "revoked": 0 },
            { "tokenType": "standard", "active": 2, "redeemed": 1, "revoked": 1 },
        ] })
    );
    // The counts are the database's.
    let owner = mongodb::bson::oid::ObjectId::parse_str(OWNER).unwrap();
    let active = app
        .count(
            "tokens",
            doc! { "owner": owner, "type": "standard", "status": "active" },
        )
        .await;
    assert_eq!(all["balances"][1]["active"], active);

    let one = balances(&app, READER_KEY, "?tokenType=standard").await;
    assert_eq!(
        one["balances"],
        json!([{ "tokenType": "standard", "active": 2, "redeemed": 1, "revoked": 1 }])
    );
    // A type the owner has none of: zeros, not an empty answer.
    let none = balances(&app, READER_KEY, "?tokenType=gold").await;
    assert_eq!(
        none["balances"],
        json!([{ "tokenType": "gold", "active": 0, "redeemed": 0, "revoked": 0 }])
    );
    let stranger = app
        .get(READER_KEY, &format!("/v1/balances/{OTHER_OWNER}"))
        .await;
    assert_eq!(
        json(stranger).await,
        json!({ "owner": OTHER_OWNER, "balances": [] })
    );
}

#[tokio::test]
async fn balances_cover_only_the_keys_accounts() {
    let app = spawn_app().await;
    issue(&app, "pi_bal_a1", "acct_1", "standard", 3).await;
    issue(&app, "pi_bal_a2", "acct_2", "standard", 5).await;
    let everything = balances(&app, READER_KEY, "?tokenType=standard").await;
    assert_eq!(everything["balances"][0]["active"], 8);
    let scoped = balances(&app, ACCOUNT1_KEY, "?tokenType=standard").await;
    assert_eq!(
        scoped["balances"][0]["active"], 3,
        "acct_2's tokens are not this key's"
    );
    let scoped_all = balances(&app, ACCOUNT1_KEY, "").await;
    assert_eq!(
        scoped_all["balances"],
        json!([{ "tokenType": "standard", "active": 3, "redeemed": 0, "revoked": 0 }])
    );
}

#[tokio::test]
async fn bad_balance_requests_name_the_field() {
    let app = spawn_app().await;
    for (path, field) in [
        ("/v1/balances/nope".to_owned(), "owner"),
        (
            format!("/v1/balances/{OWNER}?tokenType=Bad%20Type"),
            "tokenType",
        ),
        (format!("/v1/balances/{OWNER}?status=active"), "status"),
        (
            format!("/v1/balances/{OWNER}?tokenType=a&tokenType=b"),
            "tokenType",
        ),
    ] {
        let problem =
            assert_problem(app.get(READER_KEY, &path).await, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["field"], field, "{path}");
    }
    let forbidden = app.get(WRITER_KEY, &format!("/v1/balances/{OWNER}")).await;
    assert_problem(forbidden, 403, "forbidden").await;
}

/// Every `winningPlan` in an explain answer, as text.
fn winning_plans(value: &Bson, found: &mut Vec<String>) {
    match value {
        Bson::Document(document) => {
            for (key, inner) in document {
                if key == "winningPlan" {
                    found.push(inner.to_string());
                }
                winning_plans(inner, found);
            }
        }
        Bson::Array(items) => items.iter().for_each(|item| winning_plans(item, found)),
        _ => {}
    }
}

#[tokio::test]
async fn the_balance_aggregation_is_served_by_an_index() {
    let app = spawn_app().await;
    issue(&app, "pi_bal_plan_1", "acct_1", "standard", 20).await;
    issue(&app, "pi_bal_plan_2", "acct_2", "premium", 20).await;
    // Record the commands the app sends, then explain the aggregations it ran.
    app.db.run_command(doc! { "profile": 2 }).await.unwrap();
    balances(&app, READER_KEY, "").await;
    balances(&app, READER_KEY, "?tokenType=standard").await;
    balances(&app, ACCOUNT1_KEY, "?tokenType=standard").await;
    app.db.run_command(doc! { "profile": 0 }).await.unwrap();

    let profiled: Vec<Document> = {
        use futures::TryStreamExt;
        app.db
            .collection::<Document>("system.profile")
            .find(doc! { "command.aggregate": "tokens" })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    assert_eq!(
        profiled.len(),
        3,
        "one aggregation per request: {profiled:?}"
    );
    for entry in profiled {
        let command = entry.get_document("command").unwrap();
        let explain = app
            .db
            .run_command(doc! {
                "explain": {
                    "aggregate": "tokens",
                    "pipeline": command.get_array("pipeline").unwrap().clone(),
                    "cursor": {},
                },
                "verbosity": "queryPlanner",
            })
            .await
            .unwrap();
        let mut plans = Vec::new();
        winning_plans(&Bson::Document(explain.clone()), &mut plans);
        assert!(!plans.is_empty(), "{explain}");
        for plan in plans {
            assert!(!plan.contains("COLLSCAN"), "a collection scan: {plan}");
            assert!(plan.contains("IXSCAN"), "no index scan: {plan}");
        }
    }
}
