//! Issuing a payment's tokens exactly once, in either repository mode (PRODUCT.md §2).
//!
//! The issuance record is the arbiter: its unique index on the payment key decides which
//! parameters (owner, token type, quantity) a payment has, and every later request is
//! verified against it. Tokens are then written by the mode's own path.
//!
//! Round trips, upsert mode: a new payment costs two (record upsert, token bulk); a replay
//! of a complete payment costs two (record upsert, token read); only a replay that finds
//! a partial set (a crash between the two writes) pays for the completing bulk.

use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::options::{CollectionOptions, ReadConcern, ReturnDocument};
use serde::Serialize;

use super::documents::{
    IssuanceDoc, TokenSummary, bson_time, chrono_time, issuance_filter, payment_tokens_filter,
    token_summary_projection,
};
use super::error::{ISSUANCES_PAYMENT_INDEX, StoreError, duplicate_key_index};
use super::{ISSUANCES, Store, TOKENS};
use crate::domain::TokenStatus;
use crate::domain::{IssuanceMode, IssuanceParams, IssuanceStatus, NewIssuance, PaymentKey};

/// One parameter in which a retry differs from the recorded issuance.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Mismatch {
    pub field: String,
    /// The recorded value (a string or an integer, as the field is).
    #[schema(value_type = Value)]
    pub existing: serde_json::Value,
    /// The value this request asked for.
    #[schema(value_type = Value)]
    pub requested: serde_json::Value,
}

/// A payment's issuance record and its tokens, in tokenIndex order.
#[derive(Debug, Clone)]
pub struct IssuedTokens {
    pub issuance: IssuanceDoc,
    pub tokens: Vec<TokenSummary>,
    /// How many tokens this call inserted.
    pub created: u32,
}

/// What `Store::issue` did.
#[derive(Debug)]
pub enum IssueOutcome {
    /// First write for this payment.
    Created(IssuedTokens),
    /// The payment already had this issuance; a partial set was completed if needed.
    Replayed(IssuedTokens),
    /// The payment already has an issuance with other parameters; nothing was written.
    Conflict(Vec<Mismatch>),
    /// Recorded as requested; the tokens follow when the payment is known to have
    /// succeeded (checkout-frontend trust flow).
    Pending(IssuedTokens),
}

/// Bounded retries when a concurrent first insert of the issuance record races ours.
const RECORD_RACE_RETRIES: u32 = 3;

impl Store {
    /// Issues `request`'s tokens exactly once, in the request's mode.
    pub async fn issue(&self, request: &NewIssuance) -> Result<IssueOutcome, StoreError> {
        match request.mode {
            IssuanceMode::Upsert => self.issue_upsert(request).await,
            IssuanceMode::Atomic => self.issue_atomic(request).await,
        }
    }

    /// Upsert mode: claim or read the record in one `findOneAndUpdate`, then converge.
    async fn issue_upsert(&self, request: &NewIssuance) -> Result<IssueOutcome, StoreError> {
        let issuance = new_record_view(request);
        match self.claim_record(&request.key, &issuance).await? {
            None => {
                let bulk = self.upsert_tokens(request).await?;
                let quantity = request.params.quantity.get() as usize;
                let created = bulk.inserted.len() as u32;
                // When this request inserted every token, the reply already names them all:
                // no read-back. Otherwise a concurrent replay inserted some; read them.
                let tokens = if bulk.inserted.len() == quantity {
                    fresh_tokens(bulk.inserted)
                } else {
                    self.payment_tokens(&request.key).await?
                };
                Ok(IssueOutcome::Created(IssuedTokens {
                    issuance,
                    tokens,
                    created,
                }))
            }
            Some(existing) => self.replay(request, existing).await,
        }
    }

    /// Inserts the issuance record unless one exists; returns the existing one if so.
    async fn claim_record(
        &self,
        key: &PaymentKey,
        issuance: &IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        let mut attempt = 0;
        loop {
            // Built per attempt rather than cloned: a retry is rare, a first attempt is not.
            let result = self
                .records()
                .find_one_and_update(
                    issuance_filter(key),
                    doc! { "$setOnInsert": record_document(issuance)? },
                )
                .upsert(true)
                .return_document(ReturnDocument::Before)
                .await;
            match result {
                Ok(existing) => return Ok(existing),
                // Two first inserts raced; the loser's retry finds the winner's record.
                Err(err)
                    if attempt < RECORD_RACE_RETRIES
                        && duplicate_key_index(&err).as_deref()
                            == Some(ISSUANCES_PAYMENT_INDEX) =>
                {
                    attempt += 1;
                    metrics::counter!("tokenmint_duplicate_key_retries_total").increment(1);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Records a pending issuance for a payment not yet known to have succeeded, unless
    /// the payment already has a record (then: verify, and replay if it is issued).
    pub async fn request_issuance(
        &self,
        request: &NewIssuance,
    ) -> Result<IssueOutcome, StoreError> {
        let mut pending = new_record_view(request);
        pending.status = IssuanceStatus::Pending;
        let existing = match self.claim_record(&request.key, &pending).await? {
            None => {
                return Ok(IssueOutcome::Pending(IssuedTokens {
                    issuance: pending,
                    tokens: Vec::new(),
                    created: 0,
                }));
            }
            Some(existing) => existing,
        };
        let mismatches = verify(&existing, &request.params);
        if !mismatches.is_empty() {
            return Ok(IssueOutcome::Conflict(mismatches));
        }
        if existing.status == IssuanceStatus::Pending {
            let tokens = self.payment_tokens(&request.key).await?;
            return Ok(IssueOutcome::Pending(IssuedTokens {
                issuance: existing,
                tokens,
                created: 0,
            }));
        }
        self.replay(request, existing).await
    }

    /// A request for a payment that already has a record: verify, then answer from the
    /// tokens, completing a partial set first (the crash-between-writes case). A pending
    /// record is fulfilled: this request is entitled to issue, so it flips the record to
    /// `issued` (exactly one caller wins the flip and reports the first write).
    pub(super) async fn replay(
        &self,
        request: &NewIssuance,
        mut existing: IssuanceDoc,
    ) -> Result<IssueOutcome, StoreError> {
        let mismatches = verify(&existing, &request.params);
        if !mismatches.is_empty() {
            return Ok(IssueOutcome::Conflict(mismatches));
        }
        let mut first_write = false;
        if existing.status == IssuanceStatus::Pending {
            let flipped = self
                .collection(ISSUANCES)
                .update_one(
                    doc! { "_id": existing.id, "status": "pending" },
                    doc! { "$set": { "status": "issued", "mode": request.mode.as_str() } },
                )
                .await?;
            first_write = flipped.modified_count == 1;
            existing.status = IssuanceStatus::Issued;
            if first_write {
                existing.mode = request.mode;
            }
        }
        let quantity = existing.quantity as usize;
        let mut tokens = self.payment_tokens(&request.key).await?;
        let mut created = 0;
        if tokens.len() < quantity {
            // Complete with the recorded parameters (paymentDate included), not the retry's.
            let recorded = NewIssuance {
                payment_date: chrono_time(existing.payment_date),
                ..request.clone()
            };
            created = self.upsert_tokens(&recorded).await?.inserted.len() as u32;
            tokens = self.payment_tokens(&request.key).await?;
        }
        let issued = IssuedTokens {
            issuance: existing,
            tokens,
            created,
        };
        Ok(if first_write {
            IssueOutcome::Created(issued)
        } else {
            IssueOutcome::Replayed(issued)
        })
    }

    /// The payment's tokens in tokenIndex order (served by the unique index's prefix).
    pub(super) async fn payment_tokens(
        &self,
        key: &PaymentKey,
    ) -> Result<Vec<TokenSummary>, StoreError> {
        // Majority read: a replay must not acknowledge tokens a concurrent request wrote
        // but that are not yet replicated (a failover could still roll them back). Fewer
        // visible tokens send the replay through the completing bulk, whose `w: majority`
        // makes them durable before the answer.
        let majority = CollectionOptions::builder()
            .read_concern(ReadConcern::majority())
            .build();
        let cursor = self
            .db
            .collection_with_options::<TokenSummary>(TOKENS, majority)
            .find(payment_tokens_filter(key))
            .projection(token_summary_projection())
            .sort(doc! { "tokenIndex": 1 })
            .await?;
        Ok(cursor.try_collect().await?)
    }

    /// The issuance record of a payment and its tokens, if the payment has one.
    pub async fn find_issuance(
        &self,
        key: &PaymentKey,
    ) -> Result<Option<IssuedTokens>, StoreError> {
        let Some(issuance) = self.records().find_one(issuance_filter(key)).await? else {
            return Ok(None);
        };
        let tokens = self.payment_tokens(key).await?;
        Ok(Some(IssuedTokens {
            issuance,
            tokens,
            created: 0,
        }))
    }
}

/// The issuance record document for `view` (the record as a new request inserts it).
fn record_document(view: &IssuanceDoc) -> Result<Document, StoreError> {
    mongodb::bson::to_document(view)
        .map_err(|e| StoreError::Internal(format!("cannot encode issuance record: {e}")))
}

/// The record a new request inserts; also the answer, so nothing is read back.
pub(super) fn new_record_view(request: &NewIssuance) -> IssuanceDoc {
    IssuanceDoc {
        id: mongodb::bson::oid::ObjectId::new(),
        provider: request.key.provider.to_string(),
        account_id: request.key.account_id.to_string(),
        payment_intent_id: request.key.payment_intent_id.to_string(),
        owner: request.params.owner.object_id(),
        token_type: request.params.token_type.to_string(),
        quantity: i64::from(request.params.quantity.get()),
        payment_date: bson_time(request.payment_date),
        mode: request.mode,
        status: IssuanceStatus::Issued,
        created_at: DateTime::now(),
    }
}

/// Tokens this request just inserted, in tokenIndex order.
pub(super) fn fresh_tokens(
    mut inserted: Vec<(i64, mongodb::bson::oid::ObjectId)>,
) -> Vec<TokenSummary> {
    inserted.sort_unstable_by_key(|(index, _)| *index);
    inserted
        .into_iter()
        .map(|(token_index, id)| TokenSummary {
            id,
            token_index,
            status: TokenStatus::Active,
            version: 0,
        })
        .collect()
}

/// Retry verification: every parameter that differs from the record. paymentDate is set
/// on first insert only and is deliberately not compared.
pub fn verify(existing: &IssuanceDoc, requested: &IssuanceParams) -> Vec<Mismatch> {
    param_mismatches(
        &existing.owner.to_hex(),
        &existing.token_type,
        existing.quantity,
        requested,
    )
}

/// Every parameter in which `requested` differs from (owner, tokenType, quantity).
pub fn param_mismatches(
    owner: &str,
    token_type: &str,
    quantity: i64,
    requested: &IssuanceParams,
) -> Vec<Mismatch> {
    let fields: [(&str, serde_json::Value, serde_json::Value); 3] = [
        ("owner", owner.into(), requested.owner.to_string().into()),
        (
            "tokenType",
            token_type.into(),
            requested.token_type.as_str().into(),
        ),
        (
            "quantity",
            quantity.into(),
            i64::from(requested.quantity.get()).into(),
        ),
    ];
    fields
        .into_iter()
        .filter(|(_, existing, requested)| existing != requested)
        .map(|(field, existing, requested)| Mismatch {
            field: field.to_owned(),
            existing,
            requested,
        })
        .collect()
}
