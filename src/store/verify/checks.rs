//! The checks `verify` runs, each an aggregation that finds one kind of violation, and
//! the pipeline pieces they share with the repair scans.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::{Finding, SAMPLES, key_text};
use crate::domain::{PaymentStatus, TokenStatus, entitlement, share_taken};
use crate::store::documents::from_document;
use crate::store::payments::{PAYMENTS, PaymentDoc, token_index};
use crate::store::placeholder::PLACEHOLDER;
use crate::store::{ISSUANCES, REDEMPTIONS, Store, StoreError, TOKENS};

impl Store {
    pub(super) async fn wrong_token_sets(&self) -> Result<Finding, StoreError> {
        let pipeline = wrong_token_sets_pipeline();
        self.collect_finding(ISSUANCES, pipeline, |row| {
            let found = row.get_array("indexes").map(|a| a.len()).unwrap_or(0);
            format!(
                "{} ({}, quantity {}): {found} token(s)",
                key_text(row),
                row.get_str("status").unwrap_or("?"),
                row.get("quantity")
                    .map(|q| q.to_string())
                    .unwrap_or_default()
            )
        })
        .await
    }

    pub(super) async fn foreign_tokens(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![
            doc! { "$match": { "status": { "$nin": ["pending", PLACEHOLDER] } } },
            same_payment(
                TOKENS,
                "",
                doc! { "owner": "$owner", "type": "$tokenType" },
                vec![doc! { "$or": [
                    { "$ne": ["$type", "$$type"] },
                    { "$and": [
                        { "$ne": ["$owner", "$$owner"] },
                        { "$eq": [ { "$type": "$transferredAt" }, "missing" ] },
                    ] },
                ] }],
                doc! { "_id": 1 },
                "foreign",
            ),
            doc! { "$match": { "foreign": { "$ne": [] } } },
        ];
        self.collect_finding(ISSUANCES, pipeline, |row| {
            let n = row.get_array("foreign").map(|a| a.len()).unwrap_or(0);
            format!("{}: {n} token(s)", key_text(row))
        })
        .await
    }

    /// Checks 7 and 8 in one scan of the payments whose money moved or whose state
    /// takes tokens back: active tokens beyond what the payment is entitled to, and, once
    /// a record is `issued` (settled), tokens a withdrawal revoked that the payment is
    /// entitled to again. The entitlement is `domain::entitlement`, the rule every settle
    /// goes by, computed here on each payment as read: the check cannot drift from it.
    /// Both draw the share as the settle does (`domain::share_taken`: counted from the
    /// highest tokenIndex down, past the spent tokens). Together with check 1 (every set
    /// complete) they say: after quiescence, no token from the share's boundary up is
    /// active, and below it every token stands but those an operator revoked.
    ///
    /// Check 9 comes with them: a payment of theirs that is not readable as a payment (a
    /// field of another type) is reported as such, and the scan goes on.
    pub(super) async fn entitlement_findings(
        &self,
    ) -> Result<(Finding, Finding, Finding), StoreError> {
        let pipeline = vec![
            doc! { "$match": { "$or": [
                taking_back_filter(),
                { "reversals.0": { "$exists": true } },
            ] } },
            same_payment(
                ISSUANCES,
                "",
                doc! {},
                vec![],
                doc! { "quantity": 1, "status": 1 },
                "issuance",
            ),
            same_payment(
                TOKENS,
                "",
                doc! {},
                vec![doc! { "$in": ["$status", ["active", "revoked", "redeemed"]] }],
                doc! { "_id": 0, "tokenIndex": 1, "status": 1, "lastChangedBy": 1 },
                "tokens",
            ),
        ];
        let mut rows = self
            .collection(PAYMENTS)
            .aggregate(pipeline)
            .allow_disk_use(true)
            .await?;
        let (mut unbacked, mut unrestored) = (Finding::default(), Finding::default());
        let mut unreadable = Finding::default();
        while let Some(row) = rows.try_next().await? {
            let Ok(payment) = from_document::<PaymentDoc>(row.clone()) else {
                add(&mut unreadable, 1, || key_text(&row));
                continue;
            };
            let record = row
                .get_array("issuance")
                .ok()
                .and_then(|r| r.first())
                .and_then(Bson::as_document);
            let quantity = record
                .and_then(|r| r.get("quantity"))
                .and_then(|q| q.as_i64().or(q.as_i32().map(i64::from)))
                .unwrap_or(0);
            let settled = record.and_then(|r| r.get_str("status").ok()) == Some("issued");
            let keep = entitlement(payment.status, &payment.money(), quantity).kept(quantity);
            let by = format!("provider:{}", payment.provider);
            let tokens: Vec<&Document> = row
                .get_array("tokens")
                .into_iter()
                .flatten()
                .filter_map(Bson::as_document)
                .collect();
            let index = |token: &Document| token_index(token).unwrap_or(0);
            let spent: Vec<i64> = tokens
                .iter()
                .filter(|t| t.get_str("status") == Ok("redeemed") && index(t) < quantity)
                .map(|t| index(t))
                .collect();
            let from = share_taken(quantity, keep, &spent).from;
            let (mut active, mut revoked) = (0, 0);
            for token in tokens {
                match token.get_str("status") {
                    Ok("active") if index(token) >= from => active += 1,
                    Ok("revoked")
                        if settled
                            && index(token) < from
                            && token.get_str("lastChangedBy") == Ok(by.as_str()) =>
                    {
                        revoked += 1
                    }
                    _ => {}
                }
            }
            let name = key_text(&row);
            let status = payment.status.as_str();
            add(&mut unbacked, active, || {
                format!(
                    "{name} ({status}): {active} active token(s) beyond the {keep} it stands for"
                )
            });
            add(&mut unrestored, revoked, || {
                format!(
                    "{name} ({status}): {revoked} token(s) revoked by a withdrawal below the share it takes back, from tokenIndex {from}"
                )
            });
        }
        Ok((unbacked, unrestored, unreadable))
    }
}

/// Counts a payment with `n` violations in `finding`, with its sample while there is room.
fn add(finding: &mut Finding, n: u64, describe: impl FnOnce() -> String) {
    if n == 0 {
        return;
    }
    finding.count += 1;
    if finding.samples.len() < SAMPLES as usize {
        finding.samples.push(describe());
    }
}

/// A `$lookup` into `into` of the documents of `from` that belong to the input row's
/// payment (its key fields under `prefix`: `""` for records and payments, `"_id."` for
/// grouped rows) and meet `conditions`, which may use the extra `vars`; each projected to
/// `project`. Tokens keep their payment key under `origin.`.
pub(super) fn same_payment(
    from: &str,
    prefix: &str,
    vars: Document,
    conditions: Vec<Document>,
    project: Document,
    into: &str,
) -> Document {
    let foreign = if from == TOKENS { "origin." } else { "" };
    let mut variables = doc! {
        "p": format!("${prefix}provider"),
        "a": format!("${prefix}accountId"),
        "i": format!("${prefix}paymentIntentId"),
    };
    variables.extend(vars);
    let mut all = vec![
        doc! { "$eq": [format!("${foreign}provider"), "$$p"] },
        doc! { "$eq": [format!("${foreign}accountId"), "$$a"] },
        doc! { "$eq": [format!("${foreign}paymentIntentId"), "$$i"] },
    ];
    all.extend(conditions);
    doc! { "$lookup": {
        "from": from,
        "let": variables,
        "pipeline": [ { "$match": { "$expr": { "$and": all } } }, { "$project": project } ],
        "as": into,
    } }
}

/// The statuses whose payments keep no token (`PaymentStatus::ENTITLED_TO_NOTHING`).
fn entitled_to_nothing() -> Vec<&'static str> {
    PaymentStatus::ENTITLED_TO_NOTHING
        .iter()
        .map(|s| s.as_str())
        .collect()
}

/// Payments whose state takes tokens back: also a payment captured for less than was
/// authorised (`PaymentDoc::money`), and one captured in parts, whose later parts bring
/// back the tokens they pay for.
pub(super) fn taking_back_filter() -> Document {
    doc! { "$or": [
        { "status": { "$in": entitled_to_nothing() } },
        { "amountRefunded": { "$gt": 0 } },
        {
            "captures.0": { "$exists": true },
            "$expr": { "$lt": [{ "$sum": "$captures.amount" }, "$authorisedAmount"] },
        },
        { "captures.1": { "$exists": true } },
    ] }
}

/// Issuance records whose tokens are not exactly tokenIndex 0..quantity-1 (none for a
/// pending one or a refund's placeholder), with the indexes found in `indexes`.
pub(super) fn wrong_token_sets_pipeline() -> Vec<Document> {
    vec![
        same_payment(
            TOKENS,
            "",
            doc! {},
            vec![],
            doc! { "_id": 0, "tokenIndex": 1 },
            "tokens",
        ),
        doc! { "$project": {
            "provider": 1, "accountId": 1, "paymentIntentId": 1, "status": 1, "quantity": 1,
            "indexes": { "$sortArray": { "input": "$tokens.tokenIndex", "sortBy": 1 } },
        } },
        doc! { "$match": { "$expr": { "$ne": [
            "$indexes",
            { "$cond": [
                { "$in": ["$status", ["pending", PLACEHOLDER]] },
                [],
                // A quantity that is not a number (a record written by hand) matches no
                // set: the record is reported, and the check goes on.
                { "$cond": [
                    { "$isNumber": "$quantity" },
                    { "$range": [0, { "$toInt": "$quantity" }] },
                    Bson::Null,
                ] },
            ] },
        ] } } },
    ]
}

impl Store {
    /// Check 10: redemptions whose tokens do not all stand redeemed under them, each of
    /// `tokenIds` `redeemed` with the record's reference, owner and type, as many as its
    /// quantity. A redemption commits its record and its tokens together and a redeemed
    /// token changes no more, so a record found here was half undone by hand, by another
    /// tool, or by a fault in that all-or-nothing write.
    pub(super) async fn incomplete_redemptions(&self) -> Result<Finding, StoreError> {
        let named = doc! { "$size": { "$ifNull": ["$tokenIds", []] } };
        let pipeline = vec![
            doc! { "$lookup": {
                "from": TOKENS,
                "localField": "tokenIds",
                "foreignField": "_id",
                "let": { "owner": "$owner", "reference": "$reference", "type": "$tokenType" },
                "pipeline": [
                    { "$match": { "$expr": { "$and": [
                        { "$eq": ["$status", TokenStatus::Redeemed.as_str()] },
                        { "$eq": ["$redemptionRef", "$$reference"] },
                        { "$eq": ["$owner", "$$owner"] },
                        { "$eq": ["$type", "$$type"] },
                    ] } } },
                    { "$project": { "_id": 1 } },
                ],
                "as": "spent",
            } },
            doc! { "$project": {
                "owner": 1, "reference": 1, "quantity": 1,
                "named": named.clone(), "spent": { "$size": "$spent" },
            } },
            doc! { "$match": { "$expr": { "$or": [
                { "$ne": ["$spent", "$named"] },
                { "$ne": ["$named", "$quantity"] },
            ] } } },
        ];
        self.collect_finding(REDEMPTIONS, pipeline, |row| {
            let field = |name: &str| row.get(name).map(|v| v.to_string()).unwrap_or_default();
            format!(
                "{}/{} (quantity {}): {} of {} token(s) redeemed under it",
                row.get_object_id("owner")
                    .map(|o| o.to_hex())
                    .unwrap_or_else(|_| "?".to_owned()),
                row.get_str("reference").unwrap_or("?"),
                field("quantity"),
                field("spent"),
                field("named"),
            )
        })
        .await
    }

    pub(super) async fn duplicate_tokens(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![
            doc! { "$group": {
                "_id": { "provider": "$origin.provider", "accountId": "$origin.accountId",
                         "paymentIntentId": "$origin.paymentIntentId", "tokenIndex": "$tokenIndex" },
                "n": { "$sum": 1 },
            } },
            doc! { "$match": { "n": { "$gt": 1 } } },
        ];
        self.collect_finding(TOKENS, pipeline, |row| {
            let key = row.get_document("_id").cloned().unwrap_or_default();
            format!(
                "{} tokenIndex {}",
                key_text(&key),
                key.get("tokenIndex")
                    .map(|i| i.to_string())
                    .unwrap_or_default()
            )
        })
        .await
    }

    pub(super) async fn orphan_tokens(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![
            doc! { "$group": {
                "_id": { "provider": "$origin.provider", "accountId": "$origin.accountId", "paymentIntentId": "$origin.paymentIntentId" },
                "n": { "$sum": 1 },
            } },
            same_payment(
                ISSUANCES,
                "_id.",
                doc! {},
                vec![],
                doc! { "_id": 1 },
                "issuance",
            ),
            doc! { "$match": { "issuance": { "$size": 0 } } },
        ];
        self.collect_finding(TOKENS, pipeline, |row| {
            let key = row.get_document("_id").cloned().unwrap_or_default();
            format!(
                "{}: {} token(s)",
                key_text(&key),
                row.get("n").map(|n| n.to_string()).unwrap_or_default()
            )
        })
        .await
    }

    pub(super) async fn tokens_without_version(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![doc! { "$match": { "_version": { "$exists": false } } }];
        self.collect_finding(TOKENS, pipeline, |row| {
            row.get_object_id("_id")
                .map(|id| id.to_hex())
                .unwrap_or_default()
        })
        .await
    }

    pub(super) async fn stranded_pending(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![
            doc! { "$match": { "status": "pending" } },
            same_payment(
                PAYMENTS,
                "",
                doc! {},
                vec![doc! { "$eq": ["$status", "succeeded"] }],
                doc! { "_id": 1 },
                "payment",
            ),
            doc! { "$match": { "payment": { "$ne": [] } } },
        ];
        self.collect_finding(ISSUANCES, pipeline, key_text).await
    }
}
