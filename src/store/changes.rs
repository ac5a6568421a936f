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

use futures::{Stream, StreamExt};
use mongodb::bson::doc;
use mongodb::change_stream::event::ChangeStreamEvent;
use serde::Deserialize;

use super::documents::stored_key;
use super::error::StoreError;
use super::{Store, WEBHOOK_EVENTS};
use crate::domain::PaymentKey;

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
