//! The group-commit scenario's checks: every payment of the database against every
//! answer its requests got (see the scenario's module doc).

use std::collections::BTreeMap;

use futures::TryStreamExt;
use mongodb::bson::doc;
use tokenmint::domain::{IssuanceStatus, TokenStatus};
use tokenmint::store::{IssuanceDoc, Store, TokenDoc};
use tokenmint_test_support::TokenIds;

use super::calls::{Call, Kind, Reply};
use super::{ACCOUNT, Counts};

/// The final answers each call got, with when ("before the kill", …).
pub(super) type Answers = Vec<Vec<(&'static str, Reply)>>;

/// Checks every payment of the database against `calls` and their `answers` (see the
/// module doc), adding to `counts` and returning the violations.
pub(super) async fn check_payments(
    store: &Store,
    calls: &[Call],
    answers: &Answers,
    counts: &mut Counts,
) -> Vec<String> {
    let mut violations = Vec::new();
    let records: Vec<IssuanceDoc> = read_all(store, "issuances").await;
    let mut tokens_of: BTreeMap<String, Vec<TokenDoc>> = BTreeMap::new();
    for token in read_all::<TokenDoc>(store, "tokens").await {
        counts.tokens += 1;
        let payment = token.origin.payment_intent_id.clone();
        tokens_of.entry(payment).or_default().push(token);
    }
    let mut calls_of: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, call) in calls.iter().enumerate() {
        calls_of.entry(&call.payment).or_default().push(index);
    }

    for record in &records {
        counts.payments += 1;
        let payment = record.payment_intent_id.as_str();
        let describe = format!(
            "{payment} (record {}, owner {}, {} {}, {:?})",
            record.id, record.owner, record.quantity, record.token_type, record.status
        );
        let Some(indexes) = calls_of
            .get(payment)
            .filter(|_| record.account_id == ACCOUNT)
        else {
            violations.push(format!("{describe}: a record no request asked for"));
            continue;
        };
        let mut tokens = tokens_of.remove(payment).unwrap_or_default();
        tokens.sort_by_key(|t| t.token_index);
        violations.extend(
            check_record(record, &tokens)
                .into_iter()
                .map(|v| format!("{describe}: {v}")),
        );
        let stored: TokenIds = tokens
            .iter()
            .map(|t| (t.token_index, t.id.to_hex()))
            .collect();
        if indexes
            .iter()
            .any(|&i| calls[i].kind == Kind::Conflicting && calls[i].matches(record))
        {
            counts.conflicting_won += 1;
        }
        let mut created = 0;
        for &index in indexes {
            let call = &calls[index];
            for (when, reply) in &answers[index] {
                let who = format!("{} answered {when}", call.describe(index));
                if let Reply::Issued(issued) = reply
                    && issued.status == 201
                {
                    created += 1;
                }
                violations.extend(
                    check_answer(call, reply, record, &stored)
                        .into_iter()
                        .map(|v| format!("{who} {v}; the record: {describe}")),
                );
            }
        }
        if created > 1 {
            violations.push(format!("{describe}: answered 201 {created} times"));
        }
    }
    for (payment, tokens) in tokens_of {
        violations.push(format!(
            "{payment}: {} token(s) without a record",
            tokens.len()
        ));
    }
    for payment in calls_of.keys() {
        if !records.iter().any(|r| r.payment_intent_id == *payment) {
            violations.push(format!(
                "{payment}: no record, although its requests were sent until answered"
            ));
        }
    }
    for (index, call) in calls.iter().enumerate() {
        for (_, reply) in &answers[index] {
            match reply {
                Reply::Issued(issued) if issued.status == 201 => counts.created += 1,
                Reply::Issued(_) => counts.replayed += 1,
                Reply::Conflict => counts.conflicts += 1,
                _ => {}
            }
        }
        if call.kind != Kind::Conflicting && answers[index].is_empty() {
            violations.push(format!("{}: no final answer", call.describe(index)));
        }
    }
    let report = store.verify().await.expect("verify");
    if !report.is_clean() {
        violations.push(format!("verify:\n{report}"));
    }
    violations
}

/// Every document of `collection`.
async fn read_all<T>(store: &Store, collection: &str) -> Vec<T>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    let cursor = store
        .database()
        .collection::<T>(collection)
        .find(doc! {})
        .await
        .unwrap_or_else(|err| panic!("read {collection}: {err}"));
    cursor
        .try_collect()
        .await
        .unwrap_or_else(|err| panic!("read {collection}: {err}"))
}

/// A record and its tokens (in tokenIndex order): issued, exactly tokenIndex
/// 0..quantity-1, all active with the record's owner and type.
fn check_record(record: &IssuanceDoc, tokens: &[TokenDoc]) -> Vec<String> {
    let mut violations = Vec::new();
    if record.status != IssuanceStatus::Issued {
        violations.push("not issued".to_owned());
    }
    let indexes: Vec<i64> = tokens.iter().map(|t| t.token_index).collect();
    if indexes != (0..record.quantity).collect::<Vec<_>>() {
        violations.push(format!(
            "{} tokens, not exactly tokenIndex 0..{}: {}",
            tokens.len(),
            record.quantity - 1,
            index_ranges(&indexes)
        ));
    }
    let foreign = tokens
        .iter()
        .filter(|t| {
            t.owner != record.owner
                || t.token_type != record.token_type
                || t.status != TokenStatus::Active
        })
        .count();
    if foreign > 0 {
        violations.push(format!(
            "{foreign} token(s) with another owner or type, or not active"
        ));
    }
    violations
}

/// One final answer to `call` against the payment's record and stored token ids: a 2xx
/// only for the record's parameters, naming the record and exactly the stored ids; a 409
/// only for other parameters; nothing else.
fn check_answer(
    call: &Call,
    reply: &Reply,
    record: &IssuanceDoc,
    stored: &TokenIds,
) -> Vec<String> {
    let mut violations = Vec::new();
    match reply {
        Reply::Issued(issued) => {
            if !call.matches(record) {
                violations.push(format!("{}, but asks for other parameters", issued.status));
            }
            if issued.record != record.id.to_hex()
                || issued.owner != record.owner.to_hex()
                || issued.token_type != record.token_type
                || issued.quantity != record.quantity
            {
                violations.push(format!(
                    "{} naming issuance {} (owner {}, {} {})",
                    issued.status, issued.record, issued.owner, issued.quantity, issued.token_type
                ));
            }
            if issued.ids != *stored {
                let differ = issued
                    .ids
                    .iter()
                    .zip(stored)
                    .filter(|(a, b)| a != b)
                    .count();
                violations.push(format!(
                    "{} naming {} tokens, {} stored, {differ} of the common ones differ",
                    issued.status,
                    issued.ids.len(),
                    stored.len()
                ));
            }
        }
        Reply::Conflict if call.matches(record) => violations
            .push("409 idempotency_conflict, but asks for what the record holds".to_owned()),
        Reply::Unexpected(status, body) => violations.push(format!("{status}: {body}")),
        Reply::Conflict | Reply::NoAnswer(_) => {}
    }
    violations
}

/// `0..99, 101..199` for a list of token indexes, to show a gap or an extra compactly.
fn index_ranges(indexes: &[i64]) -> String {
    let mut ranges: Vec<String> = Vec::new();
    let mut start = None;
    for (at, &index) in indexes.iter().enumerate() {
        let first = *start.get_or_insert(index);
        if indexes.get(at + 1) != Some(&(index + 1)) {
            ranges.push(if first == index {
                index.to_string()
            } else {
                format!("{first}..{index}")
            });
            start = None;
        }
    }
    ranges.join(", ")
}

/// The final answers: the first reply if final, then the one after the restart.
pub(super) fn final_answers(
    first: Vec<Reply>,
    resent: Vec<Option<Reply>>,
    before: &'static str,
) -> Answers {
    first
        .into_iter()
        .zip(resent)
        .map(|(first, resent)| {
            [(before, Some(first)), ("after the restart", resent)]
                .into_iter()
                .filter_map(|(when, reply)| reply.map(|reply| (when, reply)))
                .filter(|(_, reply)| reply.is_final())
                .collect()
        })
        .collect()
}
