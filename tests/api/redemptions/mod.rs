//! Spending by amount: `POST /v1/redemptions` redeems an owner's oldest active tokens of a
//! type, all or nothing, named by a reference unique per owner; `GET` reads it back.
//! [`requests`] is one request at a time, [`races`] many at once and a refund racing one.

mod batches;
mod races;
mod requests;
mod spending_race;

use mongodb::bson::{Document, doc, oid::ObjectId};
use serde_json::{Value, json};

use crate::helpers::*;

/// A redemption body for `OWNER`'s standard tokens.
fn redemption(quantity: i64, reference: &str) -> Value {
    json!({ "owner": OWNER, "tokenType": "standard", "quantity": quantity, "reference": reference })
}

/// POSTs `body` to `/v1/redemptions` as `key`.
async fn redeem(app: &TestApp, key: &str, body: &Value) -> reqwest::Response {
    app.http
        .post(app.url("/v1/redemptions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("request sent")
}

/// `OWNER`'s balance of standard tokens as `GET /v1/balances` answers the reader key (the
/// answer's one entry): what a client is told, to hold against what is stored.
async fn standard_balance(app: &TestApp) -> Value {
    let path = format!("/v1/balances/{OWNER}?tokenType=standard");
    let balance = json(app.get(READER_KEY, &path).await).await;
    balance["balances"][0].clone()
}

/// Every token of `OWNER` as stored.
async fn owner_tokens(app: &TestApp) -> Vec<Document> {
    use futures::TryStreamExt;
    app.db
        .collection::<Document>("tokens")
        .find(doc! { "owner": ObjectId::parse_str(OWNER).unwrap() })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// How many of `OWNER`'s tokens are `status`.
async fn count_status(app: &TestApp, status: &str) -> u64 {
    let owner = ObjectId::parse_str(OWNER).unwrap();
    app.count("tokens", doc! { "owner": owner, "status": status })
        .await
}
