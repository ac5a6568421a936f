//! Upsert mode, where the two floor designs differ: the per-request design claims an
//! issuance record before its token bulk, the reference design writes the tokens alone and
//! reads them back only when the bulk did not insert them all.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{RawDocumentBuf, doc};
use mongodb::options::ReturnDocument;
use tokenmint::domain::{IssuanceStatus, NewIssuance};
use tokenmint::store::builders::{RECORD_RACE_RETRIES, issuance_filter, payment_tokens_filter};
use tokenmint::store::{
    ISSUANCES_PAYMENT_INDEX, IssuanceDoc, TOKENS, duplicate_key_index, fresh_tokens,
};

use super::Floor;
use crate::op_times::{Op, OpTimes};
use crate::workload::Outcome;

impl Floor {
    /// The per-request design: claim the record (a `findOneAndUpdate` upsert), then the
    /// token bulk; a record that existed already makes it a replay.
    pub(super) async fn issue_upsert(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let record = IssuanceDoc::new(request, IssuanceStatus::Issuing);
        let mut attempt = 0;
        let existing = loop {
            let started = Instant::now();
            let result = self
                .records()
                .find_one_and_update(
                    issuance_filter(&request.key),
                    doc! { "$setOnInsert": mongodb::bson::to_document(&record)? },
                )
                .upsert(true)
                .return_document(ReturnDocument::Before)
                .await;
            times.record(Op::ClaimRecord, started);
            match result {
                Ok(existing) => break existing,
                Err(err)
                    if attempt < RECORD_RACE_RETRIES
                        && duplicate_key_index(&err).as_deref()
                            == Some(ISSUANCES_PAYMENT_INDEX) =>
                {
                    attempt += 1
                }
                Err(err) => return Err(err.into()),
            }
        };
        match existing {
            None => {
                let inserted = self.upsert_tokens(request, times).await?;
                let created = inserted.len() as u32;
                // Built as the service builds its answer, though only the count is used.
                let _tokens = if created == request.params.quantity.get() {
                    fresh_tokens(inserted, None)
                } else {
                    self.payment_tokens(request, times).await?
                };
                Ok(Outcome::ok(201, created))
            }
            Some(existing) => self.replay(request, existing, times).await,
        }
    }

    /// The reference design: the tokens alone, one unordered bulk of `$setOnInsert`
    /// upserts whose filter is the token unique key (re-run on a duplicate key of that
    /// index). When it upserted every token the answer names them without a read;
    /// otherwise the payment was issued before (a replay, or a race) and its tokens are
    /// read back and verified: all of them there, with this owner and type, or 409.
    pub(super) async fn issue_reference_upsert(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let inserted = self.upsert_tokens(request, times).await?;
        let created = inserted.len() as u32;
        let quantity = request.params.quantity.get();
        if created == quantity {
            let _tokens = fresh_tokens(inserted, None);
            return Ok(Outcome::ok(201, created));
        }
        let started = Instant::now();
        let tokens: Vec<RawDocumentBuf> = self
            .db
            .collection::<RawDocumentBuf>(TOKENS)
            .find(payment_tokens_filter(&request.key))
            .projection(doc! {
                "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1, "owner": 1, "type": 1,
            })
            .sort(doc! { "tokenIndex": 1 })
            .await?
            .try_collect()
            .await?;
        times.record(Op::VerifyTokens, started);
        let owner = request.params.owner.object_id();
        let matches = tokens.len() == quantity as usize
            && tokens.iter().all(|token| {
                token.get_object_id("owner").ok() == Some(owner)
                    && token.get_str("type").ok() == Some(request.params.token_type.as_str())
            });
        Ok(Outcome::ok(if matches { 200 } else { 409 }, created))
    }
}
