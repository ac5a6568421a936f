//! The scans `verify --repair` and self-repair start from: issued sets that came out
//! short, and payments whose state takes tokens back.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::checks::{taking_back_filter, wrong_token_sets_pipeline};
use crate::store::documents::from_document;
use crate::store::payments::{PAYMENTS, PaymentDoc};
use crate::store::{ISSUANCES, Store, StoreError};

impl Store {
    /// Marks `issued` records whose token set is short as `issuing` again, so self-repair
    /// completes them (sets left short by versions before the `issuing` status, or
    /// tokens removed by hand). Returns how many.
    pub async fn reopen_short_sets(&self) -> Result<u64, StoreError> {
        let mut pipeline = wrong_token_sets_pipeline();
        pipeline.push(doc! { "$match": { "status": "issued", "$expr": {
        "$lt": [ { "$size": "$indexes" }, { "$toInt": "$quantity" } ] } } });
        pipeline.push(doc! { "$project": { "_id": 1 } });
        let ids: Vec<Bson> = self
            .collection(ISSUANCES)
            .aggregate(pipeline)
            .allow_disk_use(true)
            .await?
            .try_collect::<Vec<Document>>()
            .await?
            .into_iter()
            .filter_map(|row| row.get("_id").cloned())
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let result = self
            .collection(ISSUANCES)
            .update_many(
                doc! { "_id": { "$in": ids }, "status": "issued" },
                doc! { "$set": { "status": "issuing" } },
            )
            .await?;
        Ok(result.modified_count)
    }

    /// Payments whose state takes tokens back: refunded, canceled, or partly refunded.
    pub async fn payments_taking_back(&self) -> Result<Vec<PaymentDoc>, StoreError> {
        let cursor = self.collection(PAYMENTS).find(taking_back_filter()).await?;
        let rows: Vec<Document> = cursor.try_collect().await?;
        rows.into_iter().map(from_document).collect()
    }

    /// Payments whose state takes tokens back and that changed at or after `since`.
    pub async fn payments_taking_back_since(
        &self,
        since: mongodb::bson::DateTime,
    ) -> Result<Vec<PaymentDoc>, StoreError> {
        let mut filter = taking_back_filter();
        filter.insert("updatedAt", doc! { "$gte": since });
        let rows: Vec<Document> = self
            .collection(PAYMENTS)
            .find(filter)
            .await?
            .try_collect()
            .await?;
        rows.into_iter().map(from_document).collect()
    }
}
