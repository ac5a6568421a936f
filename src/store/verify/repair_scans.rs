//! The scans `verify --repair` and self-repair start from: issued sets that came out
//! short, and payments whose state takes tokens back.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::checks::{taking_back_filter, wrong_token_sets_pipeline};
use crate::domain::PaymentKey;
use crate::store::documents::stored_key;
use crate::store::payments::PAYMENTS;
use crate::store::{ISSUANCES, Store, StoreError};

impl Store {
    /// Marks `issued` records whose token set is short as `issuing` again, so self-repair
    /// completes them (sets left short by versions before the `issuing` status, or
    /// tokens removed by hand). Returns how many.
    pub async fn reopen_short_sets(&self) -> Result<u64, StoreError> {
        let mut pipeline = wrong_token_sets_pipeline();
        // A quantity that is not a number reopens nothing: no set can be completed to it.
        pipeline.push(doc! { "$match": { "status": "issued", "$expr": {
        "$lt": [ { "$size": "$indexes" }, { "$convert": {
            "input": "$quantity", "to": "int", "onError": 0, "onNull": 0 } } ] } } });
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

    /// The keys of the payments whose state takes tokens back: refunded, canceled,
    /// partly refunded, captured in part (or in parts). Keys alone: the settle reads each
    /// payment afresh, and a payment whose key cannot be read comes back as `Err` in its
    /// place, so that one document of another shape does not stop the scan.
    pub async fn payments_taking_back(
        &self,
    ) -> Result<Vec<Result<PaymentKey, StoreError>>, StoreError> {
        self.payment_keys(taking_back_filter()).await
    }

    /// The keys of the payments whose state takes tokens back and that changed at or
    /// after `since`, as `payments_taking_back` lists them.
    pub async fn payments_taking_back_since(
        &self,
        since: mongodb::bson::DateTime,
    ) -> Result<Vec<Result<PaymentKey, StoreError>>, StoreError> {
        let mut filter = taking_back_filter();
        filter.insert("updatedAt", doc! { "$gte": since });
        self.payment_keys(filter).await
    }

    async fn payment_keys(
        &self,
        filter: Document,
    ) -> Result<Vec<Result<PaymentKey, StoreError>>, StoreError> {
        let rows: Vec<Document> = self
            .collection(PAYMENTS)
            .find(filter)
            .projection(doc! { "_id": 0, "provider": 1, "accountId": 1, "paymentIntentId": 1 })
            .await?
            .try_collect()
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let part = |name: &str| row.get_str(name).unwrap_or_default();
                stored_key(part("provider"), part("accountId"), part("paymentIntentId"))
            })
            .collect())
    }
}
