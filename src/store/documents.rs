//! The shapes of stored documents, as read back from MongoDB.

use mongodb::bson::{self, Bson, DateTime, Document, RawDocumentBuf, doc, oid::ObjectId};
use serde::{Deserialize, Serialize};

use crate::domain::{
    Actor, IssuanceMode, IssuanceParams, IssuanceStatus, NewIssuance, Owner, PaymentKey, Quantity,
    RevocationReason, TokenStatus, TokenType,
};
use crate::telemetry::metric;

/// Where a token came from: its payment's unique key and date.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub date: DateTime,
}

/// One document of `tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub owner: ObjectId,
    #[serde(rename = "type")]
    pub token_type: String,
    pub token_index: i64,
    pub origin: Origin,
    pub status: TokenStatus,
    /// Missing only on documents written before the `_version` backfill ran.
    #[serde(rename = "_version", default)]
    pub version: i64,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    pub redeemed_at: Option<DateTime>,
    pub redemption_ref: Option<String>,
    pub revoked_at: Option<DateTime>,
    pub revocation_reason: Option<String>,
    /// The [`Actor`] of the last change; absent until the token first changes.
    pub last_changed_by: Option<String>,
}

/// What a `$set` of top-level token fields writes, read once from that `$set` so that it
/// can be applied to tokens in memory, as the server applies it to their documents
/// (without a round trip through BSON per token). A field it does not know is refused,
/// and so is a null, which the server writes but an absent field here would leave as it
/// was: what is applied must be exactly what was written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenChange {
    owner: Option<ObjectId>,
    status: Option<TokenStatus>,
    updated_at: Option<DateTime>,
    redeemed_at: Option<DateTime>,
    redemption_ref: Option<String>,
    revoked_at: Option<DateTime>,
    revocation_reason: Option<String>,
    last_changed_by: Option<String>,
}

impl TokenChange {
    /// The change `set` makes.
    pub fn of(set: &Document) -> Result<Self, bson::de::Error> {
        if let Some((field, _)) = set.iter().find(|(_, value)| matches!(value, Bson::Null)) {
            return Err(serde::de::Error::custom(format!(
                "`{field}` set to null, which an in-memory change cannot apply"
            )));
        }
        bson::from_document(set.clone())
    }

    /// `token` as the change leaves it (`_version` aside).
    pub fn applied_to(&self, token: &TokenDoc) -> TokenDoc {
        let mut token = token.clone();
        let Self {
            owner,
            status,
            updated_at,
            redeemed_at,
            redemption_ref,
            revoked_at,
            revocation_reason,
            last_changed_by,
        } = self;
        token.owner = owner.unwrap_or(token.owner);
        token.status = status.unwrap_or(token.status);
        token.updated_at = updated_at.unwrap_or(token.updated_at);
        token.redeemed_at = redeemed_at.or(token.redeemed_at);
        token.redemption_ref = redemption_ref.clone().or(token.redemption_ref);
        token.revoked_at = revoked_at.or(token.revoked_at);
        token.revocation_reason = revocation_reason.clone().or(token.revocation_reason);
        token.last_changed_by = last_changed_by.clone().or(token.last_changed_by);
        token
    }
}

/// The part of a token an issuance answer lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenSummary {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    #[serde(rename = "tokenIndex")]
    pub token_index: i64,
    pub status: TokenStatus,
    #[serde(rename = "_version", default)]
    pub version: i64,
}

/// The projection that reads a `TokenSummary`.
pub fn token_summary_projection() -> Document {
    doc! { "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1 }
}

/// One document of `issuances`: the record that arbitrates a payment's parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub owner: ObjectId,
    pub token_type: String,
    pub quantity: i64,
    pub payment_date: DateTime,
    pub mode: IssuanceMode,
    pub status: IssuanceStatus,
    pub created_at: DateTime,
    /// Who asked for this record ([`Actor`]); absent on records older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// When a `pending` record expires (a TTL index removes it); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime>,
    /// An `issuing` record a group-commit batch inserted while its read of the payment
    /// was still on the way: the payment may yet turn out not to stand, and the batch
    /// then takes the record back. Anyone else who acts on it confirms it first
    /// (`Store::confirm_record`), which the batch's take-back then leaves alone; the
    /// batch's mark clears it. Absent (false) on every other record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unconfirmed: bool,
}

impl IssuanceDoc {
    /// This record under `id`, the `_id` of the record it replaces in place (a
    /// placeholder or a pending record it takes over).
    pub fn with_id(&self, id: ObjectId) -> Self {
        Self { id, ..self.clone() }
    }

    /// The record `request` inserts, in `status`, with a fresh `_id`: also the answer, so
    /// nothing is read back.
    pub fn new(request: &NewIssuance, status: IssuanceStatus) -> Self {
        Self {
            id: ObjectId::new(),
            provider: request.key.provider.to_string(),
            account_id: request.key.account_id.to_string(),
            payment_intent_id: request.key.payment_intent_id.to_string(),
            owner: request.params.owner.object_id(),
            token_type: request.params.token_type.to_string(),
            quantity: i64::from(request.params.quantity.get()),
            payment_date: bson_time(request.payment_date),
            mode: request.mode,
            status,
            created_at: DateTime::now(),
            requested_by: Some(request.requested_by.to_string()),
            expires_at: None,
            unconfirmed: false,
        }
    }

    /// The recorded parameters (stored values were validated when written).
    pub fn params(&self) -> Result<IssuanceParams, super::StoreError> {
        let invalid = |what: &str| {
            super::StoreError::Internal(format!(
                "issuance record {} has an invalid {what}",
                self.id
            ))
        };
        Ok(IssuanceParams {
            owner: Owner::from_object_id(self.owner),
            token_type: TokenType::parse(&self.token_type).map_err(|_| invalid("tokenType"))?,
            quantity: Quantity::from_i64(self.quantity, u32::MAX)
                .map_err(|_| invalid("quantity"))?,
        })
    }

    /// The payment's unique key, as recorded.
    pub fn key(&self) -> Result<PaymentKey, super::StoreError> {
        stored_key(&self.provider, &self.account_id, &self.payment_intent_id)
    }

    /// The token set this record describes: its key, parameters, date, mode and author
    /// (records older than `requestedBy` name the self-repair, the only writer that
    /// rebuilds a set from its record without a request of its own).
    pub fn token_set(&self) -> Result<NewIssuance, super::StoreError> {
        Ok(NewIssuance {
            key: self.key()?,
            params: self.params()?,
            payment_date: chrono_time(self.payment_date),
            mode: self.mode,
            requested_by: self
                .requested_by
                .clone()
                .map_or_else(Actor::repair, Actor::from_stored),
        })
    }
}

/// A payment key read back from a document (validated when it was written).
pub fn stored_key(
    provider: &str,
    account_id: &str,
    payment_intent_id: &str,
) -> Result<PaymentKey, super::StoreError> {
    let invalid = || {
        super::StoreError::Internal(format!(
            "stored payment key {provider}/{account_id}/{payment_intent_id} is invalid"
        ))
    };
    Ok(PaymentKey {
        provider: crate::domain::Provider::parse(provider).map_err(|_| invalid())?,
        account_id: crate::domain::AccountId::parse(account_id).map_err(|_| invalid())?,
        payment_intent_id: crate::domain::PaymentIntentId::parse(payment_intent_id)
            .map_err(|_| invalid())?,
    })
}

/// Tokens a write just inserted, (tokenIndex, _id), as summaries in tokenIndex order;
/// those of `revoked` were written revoked.
pub fn fresh_tokens(
    mut inserted: Vec<(i64, ObjectId)>,
    revoked: Option<&RevokedShare>,
) -> Vec<TokenSummary> {
    inserted.sort_unstable_by_key(|(index, _)| *index);
    inserted
        .into_iter()
        .map(|(token_index, id)| TokenSummary {
            id,
            token_index,
            status: RevokedShare::status_written(revoked, token_index),
            version: 0,
        })
        .collect()
}

/// The share of a new set that is written revoked: its tokens from `from` up, which the
/// payment no longer stood for when the set was written (a refund known before). The
/// issuing layer decides which; they are written as a settle would revoke them, for
/// `reason` by `by` (the provider), so money coming back brings them back the same way.
/// Written so, no token of the share is ever active, not even between the write and the
/// settle that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedShare {
    pub from: i64,
    pub reason: RevocationReason,
    pub by: Actor,
}

impl RevokedShare {
    /// The status token `token_index` of a new set is written with.
    pub fn status_written(share: Option<&Self>, token_index: i64) -> TokenStatus {
        match share {
            Some(share) if token_index >= share.from => TokenStatus::Revoked,
            _ => TokenStatus::Active,
        }
    }

    /// Counts `written` tokens of the share written revoked, as a settle counts those it
    /// revokes (`tokenmint_tokens_revoked_total`, by reason).
    pub(super) fn count_written(&self, written: u64) {
        if written > 0 {
            metrics::counter!(metric::TOKENS_REVOKED_TOTAL, "reason" => self.reason.as_str())
                .increment(written);
        }
    }

    /// The update that revokes tokens as this share says, each a new version.
    pub(super) fn revoke(&self, now: DateTime) -> Document {
        let mut set = self.fields(now);
        set.insert("updatedAt", now);
        doc! { "$set": set, "$inc": { "_version": 1 } }
    }

    /// The update that makes tokens written at `now` in the same transaction what they
    /// would be had they been written revoked: the same fields, the same first version.
    pub(super) fn written_revoked(&self, now: DateTime) -> Document {
        doc! { "$set": self.fields(now) }
    }

    /// What a withdrawal's revoke writes on a token: one home for the settles' updates
    /// and the fields of a token written revoked.
    fn fields(&self, now: DateTime) -> Document {
        doc! {
            "status": TokenStatus::Revoked.as_str(),
            "revokedAt": now,
            "revocationReason": self.reason.as_str(),
            "lastChangedBy": self.by.as_str(),
        }
    }
}

/// Converts a chrono time to BSON, at MongoDB's millisecond precision.
pub fn bson_time(at: chrono::DateTime<chrono::Utc>) -> DateTime {
    DateTime::from_millis(at.timestamp_millis())
}

/// Deserializes a raw document into `T`, reporting a schema mismatch as an internal error.
pub fn from_document<T: serde::de::DeserializeOwned>(
    document: Document,
) -> Result<T, super::StoreError> {
    bson::from_document(document)
        .map_err(|e| super::StoreError::Internal(format!("unexpected document shape: {e}")))
}

/// A new token of `request` as first written (`_version: 0`, status `active`), without
/// `_id`: the upsert lets the server choose it, atomic mode appends its own.
///
/// Written straight to raw BSON: a `Document` would cost an allocation per key and value,
/// then a second pass to encode it, and it is built once per token of every issuance.
pub fn new_token(
    request: &crate::domain::NewIssuance,
    token_index: i64,
    revoked: Option<&RevokedShare>,
    now: DateTime,
) -> RawDocumentBuf {
    let mut origin = raw_document(160);
    for (name, value) in RECORD_KEY_FIELDS.into_iter().zip(key_values(&request.key)) {
        origin.append_ref(name, value);
    }
    origin.append_ref("date", bson_time(request.payment_date));
    let mut token = raw_document(320);
    token.append_ref("owner", request.params.owner.object_id());
    token.append_ref("type", request.params.token_type.as_str());
    token.append_ref("tokenIndex", token_index);
    token.append_ref("origin", &origin);
    match revoked.filter(|share| token_index >= share.from) {
        Some(share) => {
            for (name, value) in share.fields(now) {
                let value = bson::RawBson::try_from(value)
                    .expect("a revoke's fields are strings and times");
                token.append(name, value);
            }
        }
        None => token.append_ref("status", TokenStatus::Active.as_str()),
    }
    token.append_ref("_version", 0_i32);
    token.append_ref("createdAt", now);
    token.append_ref("updatedAt", now);
    token
}

/// Field names of a payment's unique key in `issuances` and `payments`.
pub(super) const RECORD_KEY_FIELDS: [&str; 3] = ["provider", "accountId", "paymentIntentId"];
/// A payment key's values, in the order of `RECORD_KEY_FIELDS` (and of the
/// token's `origin` fields the filters name).
pub(super) fn key_values(key: &PaymentKey) -> [&str; 3] {
    [
        key.provider.as_str(),
        key.account_id.as_str(),
        key.payment_intent_id.as_str(),
    ]
}

/// An empty raw document with room for about `capacity` bytes. The builders above know
/// roughly how big their documents get; `RawDocumentBuf::new` starts at 5 bytes and
/// would reallocate at every doubling, for every token of every issuance.
pub(super) fn raw_document(capacity: usize) -> RawDocumentBuf {
    let mut bytes = Vec::with_capacity(capacity);
    bytes.extend_from_slice(&EMPTY_DOCUMENT);
    RawDocumentBuf::from_bytes(bytes).expect("the empty document is valid BSON")
}

/// `{}` in BSON: its length (5, little-endian) and the terminating zero.
const EMPTY_DOCUMENT: [u8; 5] = [5, 0, 0, 0, 0];

/// Converts a BSON time to chrono, for answers and for re-issuing with a recorded date.
pub fn chrono_time(at: DateTime) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{Bson, doc, oid::ObjectId};

    use super::*;
    use crate::domain::{
        AccountId, Actor, IssuanceParams, NewIssuance, Owner, PaymentIntentId, Provider, Quantity,
        TokenType,
    };
    use crate::store::filters::{payment_tokens_filter, token_filter};

    fn request() -> NewIssuance {
        NewIssuance {
            key: PaymentKey {
                provider: Provider::parse("stripe").unwrap(),
                account_id: AccountId::parse("acct_1").unwrap(),
                payment_intent_id: PaymentIntentId::parse("pi_1").unwrap(),
            },
            params: IssuanceParams {
                owner: Owner::from_object_id(ObjectId::from_bytes([7; 12])),
                token_type: TokenType::parse("ticket").unwrap(),
                quantity: Quantity::from_i64(2, 10).unwrap(),
            },
            payment_date: chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap(),
            mode: crate::domain::IssuanceMode::Upsert,
            requested_by: Actor::api_key("backend"),
        }
    }

    /// The token upsert is a command written by hand, which the driver sends without the
    /// client's write concern: it must carry it itself, the URI's `wtimeoutMS` included,
    /// or under a lagging majority it would wait until the request's timeout.
    #[tokio::test]
    async fn the_token_upsert_command_carries_the_clients_write_concern_and_wtimeout() {
        let mut options = mongodb::options::ClientOptions::default();
        options.write_concern = Some(crate::store::durability::durable_writes(Some(
            std::time::Duration::from_millis(2500),
        )));
        let db = mongodb::Client::with_options(options)
            .unwrap()
            .database("x");
        let command =
            crate::store::token_bulk::bulk_command(&request(), None, DateTime::now(), &db)
                .to_document()
                .unwrap();
        let concern = command.get_document("writeConcern").unwrap();
        assert_eq!(concern.get_str("w"), Ok("majority"), "{concern}");
        assert_eq!(concern.get_bool("j"), Ok(true), "{concern}");
        assert_eq!(
            concern
                .get("wtimeout")
                .and_then(Bson::as_i64)
                .or_else(|| concern
                    .get("wtimeout")
                    .and_then(Bson::as_i32)
                    .map(i64::from)),
            Some(2500),
            "{concern}"
        );
    }

    /// The raw builders must write exactly the documented shape (docs: the data model), with
    /// the same BSON types the rest of the store reads back.
    #[test]
    fn raw_token_documents_have_the_documented_shape() {
        let now = DateTime::from_millis(1_800_000_000_000);
        let token = new_token(&request(), 1, None, now).to_document().unwrap();
        assert_eq!(
            token,
            doc! {
                "owner": ObjectId::from_bytes([7; 12]),
                "type": "ticket",
                "tokenIndex": 1_i64,
                "origin": {
                    "provider": "stripe",
                    "accountId": "acct_1",
                    "paymentIntentId": "pi_1",
                    "date": DateTime::from_millis(1_700_000_000_000),
                },
                "status": "active",
                "_version": 0_i32,
                "createdAt": now,
                "updatedAt": now,
            }
        );
        // A token of a share written revoked carries what a settle's revoke writes, and
        // reads back as a revoked token; one below the share is written active.
        let share = RevokedShare {
            from: 1,
            reason: RevocationReason::PartialRefund,
            by: Actor::provider(&request().key.provider),
        };
        let mut revoked = new_token(&request(), 1, Some(&share), now)
            .to_document()
            .unwrap();
        assert_eq!(revoked.get_str("status"), Ok("revoked"));
        assert_eq!(revoked.get_datetime("revokedAt"), Ok(&now));
        assert_eq!(revoked.get_str("revocationReason"), Ok("partial_refund"));
        assert_eq!(revoked.get_str("lastChangedBy"), Ok("provider:stripe"));
        revoked.insert("_id", ObjectId::new());
        let read: TokenDoc = bson::from_document(revoked).unwrap();
        assert_eq!(read.status, TokenStatus::Revoked);
        let below = new_token(&request(), 0, Some(&share), now)
            .to_document()
            .unwrap();
        assert_eq!(below.get_str("status"), Ok("active"));
        assert!(below.get("revokedAt").is_none(), "{below}");
        let filter = token_filter(&request().key, 1).to_document().unwrap();
        let mut expected = payment_tokens_filter(&request().key);
        expected.insert("tokenIndex", Bson::Int64(1));
        assert_eq!(filter, expected);
    }

    #[test]
    fn a_change_applied_in_memory_is_what_the_set_writes_on_the_document() {
        let now = DateTime::from_millis(1_700_000_000_000);
        let token: TokenDoc = bson::from_document(doc! {
            "_id": ObjectId::new(), "owner": ObjectId::new(), "type": "standard",
            "tokenIndex": 2_i64, "status": "active", "_version": 0_i64,
            "origin": { "provider": "stripe", "accountId": "acct_1",
                        "paymentIntentId": "pi_1", "date": now },
            "createdAt": now, "updatedAt": now,
        })
        .unwrap();
        let set = doc! {
            "updatedAt": DateTime::from_millis(1_700_000_001_000),
            "lastChangedBy": "key:a", "status": "redeemed",
            "redeemedAt": DateTime::from_millis(1_700_000_001_000), "redemptionRef": "r-1",
        };
        let mut through_bson = bson::to_document(&token).unwrap();
        through_bson.extend(set.clone());
        let expected = bson::to_document(&bson::from_document::<TokenDoc>(through_bson).unwrap());
        let applied = TokenChange::of(&set).unwrap().applied_to(&token);
        assert_eq!(bson::to_document(&applied).unwrap(), expected.unwrap());

        let unknown = doc! { "status": "redeemed", "note": "x" };
        assert!(
            TokenChange::of(&unknown).is_err(),
            "a field it cannot apply"
        );
        let cleared = doc! { "status": "active", "redeemedAt": Bson::Null };
        assert!(
            TokenChange::of(&cleared).is_err(),
            "a null it would apply as 'unchanged'"
        );
    }
}
