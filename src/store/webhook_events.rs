//! `webhook_events`: every accepted webhook event, unique on (provider, eventId), with its
//! outcome; expired after `webhooks.retention_days` by a TTL index on `receivedAt`.

use mongodb::IndexModel;
use mongodb::bson::{DateTime, Document, doc, rawdoc};
use mongodb::options::IndexOptions;

use super::Store;
use super::durability::pinned_command_writes;
use super::error::{StoreError, duplicate_key_index};
use super::indexes::WEBHOOK_EVENTS_TTL_INDEX;
use crate::domain::EventOutcome;

pub const WEBHOOK_EVENTS: &str = "webhook_events";

impl Store {
    /// Whether (provider, event id) was already processed to an outcome.
    pub async fn webhook_event_seen(
        &self,
        provider: &str,
        event_id: &str,
    ) -> Result<bool, StoreError> {
        let found = self
            .collection(WEBHOOK_EVENTS)
            .find_one(doc! { "provider": provider, "eventId": event_id })
            .projection(doc! { "_id": 1 })
            .await?;
        Ok(found.is_some())
    }

    /// Records a processed event. Written after its effects, so a crash in between makes
    /// the provider's retry process it again (effects are idempotent) rather than lose it.
    pub async fn record_webhook_event(
        &self,
        provider: &str,
        event_id: &str,
        event_type: &str,
        payment: Option<(&str, &str)>,
        outcome: &EventOutcome,
    ) -> Result<(), StoreError> {
        let mut record = doc! {
            "provider": provider,
            "eventId": event_id,
            "type": event_type,
            "outcome": &outcome.outcome,
            "receivedAt": DateTime::now(),
        };
        if let Some((account, payment)) = payment {
            record.insert("accountId", account);
            record.insert("paymentIntentId", payment);
        }
        let extras: Document = mongodb::bson::to_document(outcome)
            .map_err(|e| StoreError::Internal(format!("cannot encode outcome: {e}")))?;
        for (field, value) in extras {
            record.entry(field).or_insert(value);
        }
        let result = self
            .collection(WEBHOOK_EVENTS)
            .update_one(
                doc! { "provider": provider, "eventId": event_id },
                doc! { "$setOnInsert": record },
            )
            .upsert(true)
            .await;
        match result {
            // A concurrent delivery of the same event recorded it first: same outcome.
            Err(err) if duplicate_key_index(&err).is_some() => Ok(()),
            other => other.map(|_| ()).map_err(Into::into),
        }
    }

    /// How many days the TTL index keeps events now (`None`: no such index yet; a
    /// retention not in whole days reads as its whole days).
    pub async fn webhook_retention_days(&self) -> Result<Option<u64>, StoreError> {
        use futures::TryStreamExt;
        let indexes = match self.collection(WEBHOOK_EVENTS).list_indexes().await {
            Ok(indexes) => indexes,
            // No collection, so no index either.
            Err(err) if super::is_namespace_not_found(&err) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let indexes: Vec<IndexModel> = indexes.try_collect().await?;
        Ok(indexes
            .into_iter()
            .filter_map(|index| index.options)
            .find(|options| options.name.as_deref() == Some(WEBHOOK_EVENTS_TTL_INDEX))
            .and_then(|options| options.expire_after)
            .map(|after| after.as_secs() / 86_400))
    }

    /// Makes the TTL index expire events after `days` (creates it, or changes its
    /// `expireAfterSeconds` when the setting changed): schema work, which `tokenmint
    /// migrate` does, and a start that applies migrations.
    pub async fn ensure_webhook_retention(&self, days: u32) -> Result<(), StoreError> {
        let seconds = u64::from(days) * 86_400;
        let index = IndexModel::builder()
            .keys(doc! { "receivedAt": 1 })
            .options(
                IndexOptions::builder()
                    .name(WEBHOOK_EVENTS_TTL_INDEX.to_owned())
                    .expire_after(std::time::Duration::from_secs(seconds))
                    .build(),
            )
            .build();
        match self.collection(WEBHOOK_EVENTS).create_index(index).await {
            Ok(_) => Ok(()),
            // IndexOptionsConflict / IndexKeySpecsConflict: same index, other TTL.
            Err(err) if matches!(err.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 85 || c.code == 86) =>
            {
                self.database()
                    .run_raw_command(rawdoc! {
                        "collMod": WEBHOOK_EVENTS,
                        "index": { "name": WEBHOOK_EVENTS_TTL_INDEX, "expireAfterSeconds": seconds as i64 },
                        // A command is sent as written: the pinned concern is not added.
                        "writeConcern": pinned_command_writes(self.database()),
                    })
                    .await?;
                Ok(())
            }
            Err(err) => Err(err.into()),
        }
    }
}
