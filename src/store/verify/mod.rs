//! The invariant checker behind `tokenmint verify`: scans the database for anything that
//! breaks "exactly N tokens per payment", "tokens stand exactly while their payment
//! stands" or "a redemption is spent whole". Used by operators and by the fault-injection suites after every crash,
//! failover and soak. The report lives here, each check in `checks`, and the two scans
//! `verify --repair` starts from in `repair_scans`.

mod checks;
mod repair_scans;

use std::fmt;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

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
    /// Active tokens a refunded, canceled or partly refunded payment no longer stands for
    /// (from the boundary of the share it takes back up: `domain::share_taken`).
    pub unbacked_active_tokens: Finding,
    /// Tokens a withdrawal revoked below that boundary on an issued payment (money having
    /// come back) that were not made active.
    pub unrestored_tokens: Finding,
    /// Payments checks 7 and 8 look at that cannot be read as payments (a field of another
    /// type): neither check, nor a settle, can say what they stand for.
    pub unreadable_payments: Finding,
    /// Redemptions whose tokens do not all stand redeemed under them (a half-spent
    /// redemption).
    pub incomplete_redemptions: Finding,
    /// Indexes applied migrations built that the database lacks (filled in by the
    /// command, which knows the migrations; `tokenmint migrate` builds them again).
    pub missing_indexes: Finding,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.violations() == 0
    }

    pub fn violations(&self) -> u64 {
        self.findings().iter().map(|(_, f)| f.count).sum()
    }

    fn findings(&self) -> [(&'static str, &Finding); 11] {
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
            (
                "payments whose money came back with tokens still revoked by a withdrawal",
                &self.unrestored_tokens,
            ),
            (
                "refunded, canceled or reinstated payments that cannot be read",
                &self.unreadable_payments,
            ),
            (
                "redemptions whose tokens are not all redeemed under them",
                &self.incomplete_redemptions,
            ),
            (
                "indexes of applied migrations missing (`tokenmint migrate` builds them)",
                &self.missing_indexes,
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
            issuances_checked: self
                .collection(ISSUANCES)
                .count_documents(super::placeholder::records_only())
                .await?,
            tokens_checked: self.collection(TOKENS).count_documents(doc! {}).await?,
            ..VerifyReport::default()
        };
        report.wrong_token_sets = self.wrong_token_sets().await?;
        report.duplicate_tokens = self.duplicate_tokens().await?;
        report.orphan_tokens = self.orphan_tokens().await?;
        report.tokens_without_version = self.tokens_without_version().await?;
        report.stranded_pending = self.stranded_pending().await?;
        report.foreign_tokens = self.foreign_tokens().await?;
        (
            report.unbacked_active_tokens,
            report.unrestored_tokens,
            report.unreadable_payments,
        ) = self.entitlement_findings().await?;
        report.incomplete_redemptions = self.incomplete_redemptions().await?;
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
}
