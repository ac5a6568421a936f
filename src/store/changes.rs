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

/// Whether `hello` describes a replica set of one member: its only host is itself, and
/// it lists no passive member and no arbiter (hidden members are not listed, but a hidden
/// member reads the oplog like any secondary).
pub(super) fn single_member(hello: &Document) -> bool {
    let listed = |field| hello.get_array(field).map_or(0, Vec::len);
    hello.get_str("setName").is_ok()
        && listed("hosts") == 1
        && listed("passives") == 0
        && listed("arbiters") == 0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_set_whose_one_host_is_its_only_member_counts_as_one() {
        let one = doc! { "setName": "rs", "hosts": ["a:27017"] };
        assert!(single_member(&one));
        let three = doc! { "setName": "rs", "hosts": ["a:27017", "b:27017", "c:27017"] };
        assert!(!single_member(&three));
        let passive = doc! { "setName": "rs", "hosts": ["a:27017"], "passives": ["b:27017"] };
        assert!(!single_member(&passive));
        let arbiter = doc! { "setName": "rs", "hosts": ["a:27017"], "arbiters": ["c:27017"] };
        assert!(!single_member(&arbiter));
        // A mongos and a standalone name no set.
        let mongos = doc! { "msg": "isdbgrid" };
        assert!(!single_member(&mongos));
        assert!(!single_member(&doc! { "isWritablePrimary": true }));
    }
}
