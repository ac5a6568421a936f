//! The invariant checker behind `tokenmint verify`: scans the database for anything that
//! breaks "exactly N tokens per payment" or "tokens stand exactly while their payment
//! stands". Used by operators and by the fault-injection suites after every crash,
//! failover and soak. Also the two scans `verify --repair` starts from.

use std::fmt;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::documents::from_document;
use super::payments::{PAYMENTS, PaymentDoc};
use super::{ISSUANCES, Store, StoreError, TOKENS};

/// How many examples each kind of violation lists.
const SAMPLES: i64 = 20;

/// One kind of violation: how many, and a few examples (payment keys or token ids).
#[derive(Debug, Default, Clone)]
pub struct Finding {
    pub count: u64,
    pub samples: Vec<String>,
}

/// Everything `verify` found. Clean when every finding is empty.
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    pub issuances_checked: u64,
    pub tokens_checked: u64,
    /// Issued payments whose tokens are not exactly tokenIndex 0..quantity-1 (gaps,
    /// extras, or a partial set a crashed upsert left and no retry completed yet), and
    /// pending ones that already have tokens.
    pub wrong_token_sets: Finding,
    /// Two tokens with the same payment and tokenIndex.
    pub duplicate_tokens: Finding,
    /// Tokens of a payment that has no issuance record.
    pub orphan_tokens: Finding,
    /// Tokens written before the version gate and never backfilled.
    pub tokens_without_version: Finding,
    /// Pending issuances whose payment is known to have succeeded.
    pub stranded_pending: Finding,
    /// Tokens whose type, or owner (unless transferred), differs from their record.
    pub foreign_tokens: Finding,
    /// Active tokens a refunded, canceled or partly refunded payment no longer stands for.
    pub unbacked_active_tokens: Finding,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.violations() == 0
    }

    pub fn violations(&self) -> u64 {
        self.findings().iter().map(|(_, f)| f.count).sum()
    }

    fn findings(&self) -> [(&'static str, &Finding); 7] {
        [
            (
                "payments whose tokens are not exactly 0..quantity-1",
                &self.wrong_token_sets,
            ),
            (
                "duplicate tokens (same payment and tokenIndex)",
                &self.duplicate_tokens,
            ),
            ("orphan tokens (no issuance record)", &self.orphan_tokens),
            ("tokens without _version", &self.tokens_without_version),
            (
                "pending issuances whose payment succeeded",
                &self.stranded_pending,
            ),
            (
                "payments with tokens whose owner or type differ from the issuance",
                &self.foreign_tokens,
            ),
            (
                "payments refunded or canceled (in whole or part) with active tokens",
                &self.unbacked_active_tokens,
            ),
        ]
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "checked {} issuances and {} tokens",
            self.issuances_checked, self.tokens_checked
        )?;
        for (what, finding) in self.findings() {
            writeln!(f, "{:>8}  {what}", finding.count)?;
            for sample in &finding.samples {
                writeln!(f, "          {sample}")?;
            }
        }
        if self.is_clean() {
            write!(f, "no violations")
        } else {
            write!(f, "{} violation(s)", self.violations())
        }
    }
}

/// The payment key of a grouped row, for reports.
fn key_text(key: &Document) -> String {
    let part = |name: &str| key.get_str(name).unwrap_or("?").to_owned();
    format!(
        "{}/{}/{}",
        part("provider"),
        part("accountId"),
        part("paymentIntentId")
    )
}

impl Store {
    /// Scans issuances, tokens and payments for violations of the issuance invariants.
    pub async fn verify(&self) -> Result<VerifyReport, StoreError> {
        let mut report = VerifyReport {
            issuances_checked: self.collection(ISSUANCES).count_documents(doc! {}).await?,
            tokens_checked: self.collection(TOKENS).count_documents(doc! {}).await?,
            ..VerifyReport::default()
        };
        report.wrong_token_sets = self.wrong_token_sets().await?;
        report.duplicate_tokens = self.duplicate_tokens().await?;
        report.orphan_tokens = self.orphan_tokens().await?;
        report.tokens_without_version = self.tokens_without_version().await?;
        report.stranded_pending = self.stranded_pending().await?;
        report.foreign_tokens = self.foreign_tokens().await?;
        report.unbacked_active_tokens = self.unbacked_active_tokens().await?;
        Ok(report)
    }

    /// Runs `pipeline` on `collection`, returning the count of rows and a few `describe`d.
    async fn collect_finding(
        &self,
        collection: &str,
        pipeline: Vec<Document>,
        describe: impl Fn(&Document) -> String,
    ) -> Result<Finding, StoreError> {
        let mut counted = pipeline;
        counted.push(doc! { "$facet": {
            "total": [ { "$count": "n" } ],
            "samples": [ { "$limit": SAMPLES } ],
        } });
        let rows: Vec<Document> = self
            .collection(collection)
            .aggregate(counted)
            .allow_disk_use(true)
            .await?
            .try_collect()
            .await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(Finding::default());
        };
        let count = row
            .get_array("total")
            .ok()
            .and_then(|t| t.first())
            .and_then(Bson::as_document)
            .and_then(|d| d.get("n"))
            .and_then(|n| n.as_i32().map(i64::from).or(n.as_i64()))
            .unwrap_or(0) as u64;
        let samples = row
            .get_array("samples")
            .map(|s| {
                s.iter()
                    .filter_map(Bson::as_document)
                    .map(&describe)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Finding { count, samples })
    }

    async fn wrong_token_sets(&self) -> Result<Finding, StoreError> {
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

    /// Marks `issued` records whose token set is short as `issuing` again, so self-repair
    /// completes them (sets left short by versions before the `issuing` status, or
    /// tokens removed by hand). Returns how many.
    pub async fn reopen_short_sets(&self) -> Result<u64, StoreError> {
        let mut pipeline = wrong_token_sets_pipeline();
        pipeline.push(doc! { "$match": { "status": "issued", "$expr": {
        "$lt": [ { "$size": "$indexes" }, { "$toInt": "$quantity" } ] } } });
        pipeline.push(doc! { "$project": { "_id": 1 } });
        let ids: Vec<Bson> = self
            .collection(ISSUANCES)
            .aggregate(pipeline)
            .allow_disk_use(true)
            .await?
            .try_collect::<Vec<Document>>()
            .await?
            .into_iter()
            .filter_map(|row| row.get("_id").cloned())
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let result = self
            .collection(ISSUANCES)
            .update_many(
                doc! { "_id": { "$in": ids }, "status": "issued" },
                doc! { "$set": { "status": "issuing" } },
            )
            .await?;
        Ok(result.modified_count)
    }

    /// Payments whose state takes tokens back: refunded, canceled, or partly refunded.
    pub async fn payments_taking_back(&self) -> Result<Vec<PaymentDoc>, StoreError> {
        let cursor = self.collection(PAYMENTS).find(taking_back_filter()).await?;
        let rows: Vec<Document> = cursor.try_collect().await?;
        rows.into_iter().map(from_document).collect()
    }

    /// Payments whose state takes tokens back and that changed at or after `since`.
    pub async fn payments_taking_back_since(
        &self,
        since: mongodb::bson::DateTime,
    ) -> Result<Vec<PaymentDoc>, StoreError> {
        let mut filter = taking_back_filter();
        filter.insert("updatedAt", doc! { "$gte": since });
        let rows: Vec<Document> = self
            .collection(PAYMENTS)
            .find(filter)
            .await?
            .try_collect()
            .await?;
        rows.into_iter().map(from_document).collect()
    }

    async fn foreign_tokens(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![
            doc! { "$match": { "status": { "$ne": "pending" } } },
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

    async fn unbacked_active_tokens(&self) -> Result<Finding, StoreError> {
        // The entitlement rule of `issuing::entitlement`, in the aggregation language:
        // keep = 0 when refunded or canceled (or refunded with no amount known), else
        // quantity - floor(quantity × min(refunded, amount) ÷ amount).
        let quantity = doc! { "$toLong": { "$ifNull": [ { "$first": "$issuance.quantity" }, 0 ] } };
        let keep = doc! { "$cond": [
            { "$or": [
                { "$in": ["$status", ["refunded", "canceled"]] },
                { "$lte": [ { "$ifNull": ["$amount", 0] }, 0 ] },
            ] },
            0,
            { "$subtract": [ quantity.clone(), { "$floor": { "$divide": [
                { "$multiply": [ quantity, { "$min": ["$amountRefunded", "$amount"] } ] },
                "$amount",
            ] } } ] },
        ] };
        let pipeline = vec![
            doc! { "$match": taking_back_filter() },
            same_payment(
                ISSUANCES,
                "",
                doc! {},
                vec![],
                doc! { "quantity": 1 },
                "issuance",
            ),
            doc! { "$set": { "keep": keep } },
            same_payment(
                TOKENS,
                "",
                doc! { "keep": "$keep" },
                vec![
                    doc! { "$eq": ["$status", "active"] },
                    doc! { "$gte": ["$tokenIndex", "$$keep"] },
                ],
                doc! { "_id": 1 },
                "active",
            ),
            doc! { "$match": { "active": { "$ne": [] } } },
        ];
        self.collect_finding(PAYMENTS, pipeline, |row| {
            let n = row.get_array("active").map(|a| a.len()).unwrap_or(0);
            format!(
                "{} ({}): {n} active token(s)",
                key_text(row),
                row.get_str("status").unwrap_or("?")
            )
        })
        .await
    }
}

/// A `$lookup` into `into` of the documents of `from` that belong to the input row's
/// payment (its key fields under `prefix`: `""` for records and payments, `"_id."` for
/// grouped rows) and meet `conditions`, which may use the extra `vars`; each projected to
/// `project`. Tokens keep their payment key under `origin.`.
fn same_payment(
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

/// Payments whose state takes tokens back.
fn taking_back_filter() -> Document {
    doc! { "$or": [
        { "status": { "$in": ["refunded", "canceled"] } },
        { "amountRefunded": { "$gt": 0 } },
    ] }
}

/// Issuance records whose tokens are not exactly tokenIndex 0..quantity-1 (none for a
/// pending one), with the indexes found in `indexes`.
fn wrong_token_sets_pipeline() -> Vec<Document> {
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
                { "$eq": ["$status", "pending"] },
                [],
                { "$range": [0, { "$toInt": "$quantity" }] },
            ] },
        ] } } },
    ]
}

impl Store {
    async fn duplicate_tokens(&self) -> Result<Finding, StoreError> {
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

    async fn orphan_tokens(&self) -> Result<Finding, StoreError> {
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

    async fn tokens_without_version(&self) -> Result<Finding, StoreError> {
        let pipeline = vec![doc! { "$match": { "_version": { "$exists": false } } }];
        self.collect_finding(TOKENS, pipeline, |row| {
            row.get_object_id("_id")
                .map(|id| id.to_hex())
                .unwrap_or_default()
        })
        .await
    }

    async fn stranded_pending(&self) -> Result<Finding, StoreError> {
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
