//! The `--json` forms of `verify` and `duplicates`: one JSON document on stdout, for cron
//! jobs and alerts. Field names are part of the contract (docs/contract.md) and spelled
//! out here rather than derived from the store's types, so that renaming a Rust field
//! never renames a JSON one.

use mongodb::bson::Bson;
use serde_json::{Value, json};

use crate::issuing::RepairReport;
use crate::migrate::DuplicateReport;
use crate::store::{Finding, VerifyReport};

/// `verify --json`: the counts, every kind of finding by its stable name, and with
/// `--repair` what was repaired first (`null` without).
pub(super) fn verify(report: &VerifyReport, repair: Option<&RepairReport>) -> Value {
    let finding = |f: &Finding| json!({ "count": f.count, "samples": f.samples });
    json!({
        "clean": report.is_clean(),
        "violations": report.violations(),
        "issuancesChecked": report.issuances_checked,
        "tokensChecked": report.tokens_checked,
        "findings": {
            "wrongTokenSets": finding(&report.wrong_token_sets),
            "duplicateTokens": finding(&report.duplicate_tokens),
            "orphanTokens": finding(&report.orphan_tokens),
            "tokensWithoutVersion": finding(&report.tokens_without_version),
            "strandedPending": finding(&report.stranded_pending),
            "foreignTokens": finding(&report.foreign_tokens),
            "unbackedActiveTokens": finding(&report.unbacked_active_tokens),
            "unrestoredTokens": finding(&report.unrestored_tokens),
            "unreadablePayments": finding(&report.unreadable_payments),
            "incompleteRedemptions": finding(&report.incomplete_redemptions),
            "missingIndexes": finding(&report.missing_indexes),
        },
        "repair": repair.map(|r| json!({
            "recordsFinished": r.records_finished,
            "recordsReopened": r.records_reopened,
            "tokensCreated": r.tokens_created,
            "tokensRevoked": r.tokens_revoked,
            "failed": r.failed,
        })),
    })
}

/// `duplicates --json`: every unique index checked, each with its groups (the shared key
/// and a few `_id`s in MongoDB relaxed Extended JSON, so an ObjectId is `{"$oid": …}`).
pub(super) fn duplicates(reports: &[DuplicateReport]) -> Value {
    let groups: i64 = reports.iter().map(|r| r.total).sum();
    let indexes: Vec<Value> = reports
        .iter()
        .map(|report| {
            let groups: Vec<Value> = report
                .groups
                .iter()
                .map(|group| {
                    json!({
                        "key": Bson::Document(group.key.clone()).into_relaxed_extjson(),
                        "count": group.count,
                        "sampleIds": group
                            .sample_ids
                            .iter()
                            .cloned()
                            .map(Bson::into_relaxed_extjson)
                            .collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "collection": report.collection,
                "index": report.index,
                "groups": groups,
                "total": report.total,
            })
        })
        .collect();
    json!({
        "clean": groups == 0,
        "groups": groups,
        "indexes": indexes,
    })
}
