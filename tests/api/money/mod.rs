//! The money invariant under races: tokens stand exactly while their payment stands.
//!
//! A payment the provider reported failed, canceled or refunded is issued by no key
//! ([`withdrawn`]); a refund, full or partial, that races the issuance (the success webhook,
//! backend retries, a checkout request, a redemption spending the owner's tokens) still
//! ends with exactly the tokens the payment stands for (a token spent first is the
//! refund's shortfall, never also revoked), in seeded random rounds ([`seeded_race`], drawing from [`race_scenario`] and
//! checked by [`race_check`]), in the same rounds while MongoDB fails commands or the
//! instance crashes ([`fault_race`]), and in a deterministic race ([`refund_race`]). Every
//! check reads the database, and `Store::verify()` must stay clean.

mod fault_race;
mod placeholders;
pub(crate) mod race_check;
mod race_scenario;
mod refund_race;
mod seeded_race;
mod withdrawn;

use futures::TryStreamExt;
use mongodb::bson::{Document, doc, oid::ObjectId};

use crate::helpers::*;

/// A token as stored: (tokenIndex, status, owner, type).
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredToken {
    index: i64,
    status: String,
    owner: Option<ObjectId>,
    token_type: String,
}

/// A payment's issuance records (a refund's placeholder is none) and tokens (tokenIndex
/// order), read from the database.
async fn stored(app: &TestApp, payment: &str) -> (Vec<Document>, Vec<StoredToken>) {
    let records: Vec<Document> = app
        .db
        .collection::<Document>("issuances")
        .find(doc! {
            "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
            "status": { "$ne": "placeholder" },
        })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tokens: Vec<Document> = app
        .db
        .collection::<Document>("tokens")
        .find(doc! {
            "origin.provider": "stripe", "origin.accountId": "acct_1",
            "origin.paymentIntentId": payment,
        })
        .sort(doc! { "tokenIndex": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tokens = tokens
        .iter()
        .map(|t| StoredToken {
            index: token_index(t),
            status: t.get_str("status").unwrap_or("?").to_owned(),
            owner: t.get_object_id("owner").ok(),
            token_type: t.get_str("type").unwrap_or("?").to_owned(),
        })
        .collect();
    (records, tokens)
}
