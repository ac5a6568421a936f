//! Filters on a payment's unique key: one payment's record or tokens, one token, or the
//! records and tokens of many payments at once (group commit's reads).

use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};

use super::documents::{RECORD_KEY_FIELDS, key_values, raw_document};
use crate::domain::PaymentKey;

/// The payment key's fields (`RECORD_KEY_FIELDS`) as a token stores them, under `origin`
/// (a prefix of its unique index).
pub(super) const TOKEN_KEY_FIELDS: [&str; 3] = [
    "origin.provider",
    "origin.accountId",
    "origin.paymentIntentId",
];

/// `names` paired with the key's values as a filter. Values are validated identifiers,
/// never operators.
fn key_filter(key: &PaymentKey, names: [&str; 3]) -> Document {
    names
        .into_iter()
        .zip(key_values(key))
        .map(|(name, value)| (name.to_owned(), Bson::String(value.to_owned())))
        .collect()
}

/// The filter selecting a payment's issuance record (its unique key, nothing else).
pub fn issuance_filter(key: &PaymentKey) -> Document {
    key_filter(key, RECORD_KEY_FIELDS)
}

/// The filter selecting every token of a payment (a prefix of the unique token index).
pub fn payment_tokens_filter(key: &PaymentKey) -> Document {
    key_filter(key, TOKEN_KEY_FIELDS)
}

/// The still active tokens of `key`'s payment from tokenIndex `from` up: those a share
/// beginning there takes back.
pub fn active_from_filter(key: &PaymentKey, from: i64) -> Document {
    let mut filter = payment_tokens_filter(key);
    filter.insert("tokenIndex", doc! { "$gte": from });
    filter.insert("status", "active");
    filter
}

/// The filter selecting the issuance records (or payments) of every key in `keys`.
pub fn issuances_filter(keys: &[&PaymentKey]) -> Document {
    keys_filter(keys, RECORD_KEY_FIELDS)
}

/// The filter selecting every token of every payment in `keys`.
pub fn payments_tokens_filter(keys: &[&PaymentKey]) -> Document {
    keys_filter(keys, TOKEN_KEY_FIELDS)
}

/// One clause per (provider, account) with `$in` on the payment ids, under `$or` only
/// when there are several. Why not one clause per key: a batch's keys nearly always share
/// provider and account, and a single clause is one index scan over N point ranges of
/// the unique index, where an `$or` of N clauses makes mongod plan every clause.
fn keys_filter(keys: &[&PaymentKey], names: [&str; 3]) -> Document {
    let mut groups: Vec<([&str; 2], Vec<&str>)> = Vec::new();
    for key in keys {
        let [provider, account, payment] = key_values(key);
        match groups
            .iter_mut()
            .find(|(group, _)| *group == [provider, account])
        {
            Some((_, payments)) => payments.push(payment),
            None => groups.push(([provider, account], vec![payment])),
        }
    }
    let [provider_field, account_field, payment_field] = names;
    let mut clauses: Vec<Document> = groups
        .into_iter()
        .map(|([provider, account], payments)| {
            doc! {
                provider_field: provider,
                account_field: account,
                payment_field: { "$in": payments },
            }
        })
        .collect();
    if clauses.len() == 1 {
        clauses.remove(0)
    } else {
        doc! { "$or": clauses }
    }
}

/// The filter selecting one token: exactly its unique key. Raw BSON because it is built
/// per token on the issuance hot path (see `new_token`).
pub fn token_filter(key: &PaymentKey, token_index: i64) -> RawDocumentBuf {
    let mut filter = raw_document(192);
    for (name, value) in TOKEN_KEY_FIELDS.into_iter().zip(key_values(key)) {
        filter.append_ref(name, value);
    }
    filter.append_ref("tokenIndex", token_index);
    filter
}
