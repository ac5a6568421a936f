//! A `findAndModify` that applied and then ran out of time waiting for the majority.
//!
//! The writes that may meet a document another transaction holds carry a `maxTimeMS`
//! (`HELD_PATIENCE`): without it they would wait for a transaction a dead instance left
//! open until the server ends it. The server counts the wait for the write concern inside
//! that time too, so a majority a second behind (secondaries catching up, a slow journal)
//! ends such a write with a write concern error `MaxTimeMSExpired` after it applied on
//! the primary. That bound was meant for the lock, not for durability: here the write's
//! reply tells what it did, and the wait for the majority goes on as long as any other
//! write waits for it (the URI's `wtimeoutMS`, or the caller's own timeout).

use std::time::{Duration, Instant};

use mongodb::bson::Document;
use mongodb::error::{Error, ErrorKind, WriteFailure};

use super::error::MAX_TIME_EXPIRED;
use super::token_bulk::bson_integer;
use super::{Store, StoreError};

/// What a `findAndModify` whose time ran out while it waited for the majority did on the
/// primary, as its reply tells. A `findAndModify` that changes nothing waits for the
/// majority too (up to the primary's latest write), and its reply is `Wrote` as well,
/// with the document as the primary has it.
pub(super) enum Unconfirmed {
    /// Its filter matched nothing: nothing was written, nothing waits for durability.
    Nothing,
    /// It wrote, and this is the document as it left it (`returnDocument: after`).
    Wrote(Document),
}

/// The outcome of a `findAndModify` (sent with `returnDocument: after`) that failed only
/// because its `maxTimeMS` ran out while it waited for the majority; `None` for any other
/// error, or a reply that does not tell.
pub(super) fn unconfirmed_find_and_modify(err: &Error) -> Option<Unconfirmed> {
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteConcernError(wce)) if wce.code == MAX_TIME_EXPIRED => {}
        _ => return None,
    }
    let reply = err.server_response()?.to_document().ok()?;
    let matched = reply.get_document("lastErrorObject").ok()?.get("n")?;
    if bson_integer(matched) == Some(0) {
        return Some(Unconfirmed::Nothing);
    }
    reply
        .get_document("value")
        .ok()
        .cloned()
        .map(Unconfirmed::Wrote)
}

/// The longest pause between two looks at the majority.
const LOOK_AGAIN_AT_MOST: Duration = Duration::from_millis(200);

impl Store {
    /// Waits until a majority read of `collection` shows `written` exactly as the write
    /// begun at `since` left it: then the write is as durable as a `w: majority` one.
    /// Until then the majority shows it as it was before, or not at all (an insert).
    /// Unavailable once the URI's `wtimeoutMS` has passed since `since`, as the driver's
    /// own wait would end. Without `wtimeoutMS` it waits as long as its caller does (a
    /// request's timeout), as every other write waits for the majority. A write a
    /// failover rolled back is never shown, and ends at that bound (503); one the
    /// majority shows a later `_version` of ends at once, unavailable. Either way a
    /// retry tells what became of it.
    pub(super) async fn await_majority(
        &self,
        collection: &str,
        written: &Document,
        since: Instant,
    ) -> Result<(), StoreError> {
        // A standalone's majority read shows a write before its journal has it: there
        // nothing but the write's own wait for the journal, which ran out, says durable.
        if !self.supports_transactions().await? {
            return Err(StoreError::unavailable(
                "a standalone's write was not journaled in time",
            ));
        }
        let id = written
            .get("_id")
            .ok_or_else(|| StoreError::Internal("a written document without _id".into()))?;
        let deadline = self
            .db
            .write_concern()
            .and_then(|concern| concern.w_timeout)
            .map(|wtimeout| since + wtimeout);
        let mut pause = Duration::from_millis(10);
        loop {
            // Reads are pinned to the majority: this shows the write once it is durable. A
            // read the database cannot answer (an election, an outage) ends the wait as
            // unavailable: an outage fails fast, and the retry finds what became of it.
            let shown = self
                .collection(collection)
                .find_one(mongodb::bson::doc! { "_id": id })
                .await?;
            if shown.as_ref() == Some(written) {
                return Ok(());
            }
            // A versioned document the majority shows past this write's version was
            // changed again on the primary before the majority showed this write (a
            // refund revoking the token just transferred): it will never show it, and
            // a later version proves nothing (a failover may have rolled this write
            // back). The retry reads what became of it.
            let version = |document: &Document| document.get("_version").and_then(bson_integer);
            if let (Some(written_version), Some(shown_version)) =
                (version(written), shown.as_ref().and_then(version))
                && shown_version > written_version
            {
                return Err(StoreError::unavailable(
                    "the document changed again before the majority showed this write",
                ));
            }
            if deadline.is_some_and(|deadline| Instant::now() + pause >= deadline) {
                return Err(StoreError::unavailable(
                    "a write applied on the primary was not the majority's in time",
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LOOK_AGAIN_AT_MOST);
        }
    }
}
