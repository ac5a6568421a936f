//! An owner's balances: one aggregation over `tokens`, matched on the owner (and type)
//! through the first keys of `tokens_owner_type_status_age` (owner, type, status), grouped
//! by token type with a count per status.

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use serde::Deserialize;

use super::tokens::accounts_filter;
use super::{Store, StoreError, TOKENS};
use crate::domain::{AccountGrant, Owner, TokenType};

/// How many of an owner's tokens of one type are in each state.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BalanceRow {
    #[serde(rename = "_id")]
    pub token_type: String,
    pub active: i64,
    pub redeemed: i64,
    pub revoked: i64,
}

impl Store {
    /// `owner`'s token counts per type and status, in type order; only `token_type`
    /// when given, only the tokens of `accounts` when given. Types the owner has no token
    /// of have no row.
    pub async fn balances(
        &self,
        owner: Owner,
        token_type: Option<&TokenType>,
        accounts: Option<&[AccountGrant]>,
    ) -> Result<Vec<BalanceRow>, StoreError> {
        let mut filter = doc! { "owner": owner.object_id() };
        if let Some(token_type) = token_type {
            filter.insert("type", token_type.as_str());
        }
        if let Some(grants) = accounts {
            filter.insert("$or", accounts_filter(grants));
        }
        let count =
            |status: &str| doc! { "$sum": { "$cond": [{ "$eq": ["$status", status] }, 1, 0] } };
        let pipeline = [
            doc! { "$match": filter },
            doc! { "$group": {
                "_id": "$type",
                "active": count("active"),
                "redeemed": count("redeemed"),
                "revoked": count("revoked"),
            } },
            doc! { "$sort": { "_id": 1 } },
        ];
        let rows: Vec<Document> = self
            .collection(TOKENS)
            .aggregate(pipeline)
            .await?
            .try_collect()
            .await?;
        rows.into_iter()
            .map(super::documents::from_document)
            .collect()
    }
}
