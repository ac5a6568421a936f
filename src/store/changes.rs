//! The change stream that tells every instance which payments a provider event was just
//! applied to, wherever it was applied. `issuing` wakes the checkouts waiting on those
//! payments; what they then answer is decided there.
//!
//! It watches inserts into `webhook_events`: an event's record is written only after its
//! effects (the issuance, the take-over of a pending request, the settle), so its insert
//! is the moment "this event has been applied" — and it names its payment in the inserted
//! document itself, so no update lookup is needed. Everything else is filtered out by
//! the server. A change stream reports majority-committed writes only: nothing it wakes a
//! waiter for can be rolled back by a failover.
//!
//! The other stream here reports nothing at all (`Store::wait_on_oplog`): it is held for
//! its cursor, which waits on the oplog; `issuing` says when.

use futures::{Stream, StreamExt};
use mongodb::bson::{Document, doc};
use mongodb::change_stream::event::ChangeStreamEvent;
use serde::Deserialize;

use super::documents::stored_key;
use super::error::StoreError;
use super::{Store, WEBHOOK_EVENTS};
use crate::domain::PaymentKey;

/// The collection `wait_on_oplog` watches, which nothing writes: its stream reports
/// nothing, and names itself in `$currentOp` and mongod's log.
const OPLOG_WAITER: &str = "oplog_waiter";

/// The payment a recorded webhook event names.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventPayment {
    provider: String,
    account_id: String,
    payment_intent_id: String,
}

impl Store {
    /// Opens the stream of payments that webhook events are applied to, from now on.
    /// The driver resumes it by itself after one resumable error (no event is lost then);
    /// an error it yields ends it, and the caller opens a new one. The stream owns what
    /// it needs (`use<>`): it outlives this borrow of the store.
    pub async fn applied_payment_events(
        &self,
    ) -> Result<impl Stream<Item = Result<PaymentKey, StoreError>> + Send + Unpin + use<>, StoreError>
    {
        let pipeline = [
            doc! { "$match": {
                "operationType": "insert",
                // Events that name no payment (ignored types) wake nobody.
                "fullDocument.paymentIntentId": { "$exists": true },
            } },
            // Only what names the payment travels; the driver needs `_id` (the resume
            // token), `operationType` and `ns`.
            doc! { "$project": {
                "operationType": 1,
                "ns": 1,
                "fullDocument.provider": 1,
                "fullDocument.accountId": 1,
                "fullDocument.paymentIntentId": 1,
            } },
        ];
        let stream = self
            .db
            .collection::<EventPayment>(WEBHOOK_EVENTS)
            .watch()
            .pipeline(pipeline)
            .await?;
        Ok(stream.map(|event| payment_of(event?)))
    }

    /// Opens a change stream on `OPLOG_WAITER`, a collection nothing writes, and returns
    /// the future that holds it: the future ends only when the stream does (its error, if
    /// any), and dropping it closes the cursor. While it is polled, one of its `getMore`s
    /// is always waiting on the oplog, as a secondary's reader would.
    pub async fn wait_on_oplog(
        &self,
    ) -> Result<impl Future<Output = Result<(), StoreError>> + Send + use<>, StoreError> {
        let mut stream = self.db.collection::<Document>(OPLOG_WAITER).watch().await?;
        Ok(async move {
            while let Some(change) = stream.next().await {
                change?;
            }
            Ok(())
        })
    }
}

/// The payment key of one change, as stored (validated when it was written).
fn payment_of(event: ChangeStreamEvent<EventPayment>) -> Result<PaymentKey, StoreError> {
    let payment = event.full_document.ok_or_else(|| {
        StoreError::Internal("webhook event insert without its document".to_owned())
    })?;
    stored_key(
        &payment.provider,
        &payment.account_id,
        &payment.payment_intent_id,
    )
}
