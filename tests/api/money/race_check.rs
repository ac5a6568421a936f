//! The checks of the seeded races: what one payment's HTTP answers and stored state must
//! be after its round, whatever the interleaving (and, in the fault race, whatever
//! MongoDB failed meanwhile), and the environment knobs both races read.

use mongodb::bson::{Document, doc, oid::ObjectId};

use super::race_scenario::{Action, Answer, Refund, Reversal, Scenario};
use super::stored;
use crate::helpers::*;

/// Whether a round ran with MongoDB failing commands: then any request may have answered
/// a 5xx (one that names no driver detail), and been retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Faults {
    None,
    Injected,
}

/// `var` (a u64), or a new random seed.
pub(crate) fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| panic!("{var} is a u64")))
        .unwrap_or_else(rand::random)
}

/// `var` (a number of rounds), or `default`.
pub(crate) fn rounds(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| panic!("{var} is a number")))
        .unwrap_or(default)
}

/// Everything wrong with one payment after its round: its HTTP answers and its stored
/// state. The payment's events must all have been delivered (answered 200) by then.
pub(super) async fn check_payment(
    app: &TestApp,
    mode: &str,
    scenario: &Scenario,
    answers: &[&Answer],
    faults: Faults,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let owner = ObjectId::parse_str(OWNER).unwrap();
    // Withdrawn whole at the end, or for a while (then issuances may be refused, and a
    // checkout's request left pending: money coming back issues nothing it did not ask).
    let fully_refunded = scenario.ends_refunded();
    let refused_for_a_while = scenario.may_be_refunded();
    let reversed = scenario.reversal != Reversal::None;

    // The HTTP answers.
    for answer in answers {
        let acceptable = match answer.action {
            // An outage may fail any request; its answer still tells nothing of the driver.
            _ if answer.status >= 500 && faults == Faults::Injected => {
                is_generic_server_error(&answer.body)
            }
            action if action.is_event() => answer.status == 200,
            Action::Writer | Action::Checkout => match answer.status {
                200 | 201 => true,
                // A trusted key never waits for the payment.
                202 => answer.action == Action::Checkout,
                // Every request names the parameters of the payment's metadata, so the only
                // refusal is the payment's: and only a full refund withdraws it.
                409 => {
                    refused_for_a_while && answer.code.as_deref() == Some("payment_not_succeeded")
                }
                _ => false,
            },
            // Spent, or too few tokens left, or it kept losing races for its tokens to
            // the round's other writers for its whole budget (answered "retry later").
            Action::Redemption => match (answer.status, answer.code.as_deref()) {
                (201, _) => true,
                // A resend after a 5xx whose commit had applied: a replay by reference.
                (200, _) => faults == Faults::Injected,
                (409, Some("insufficient_balance")) => true,
                (503, Some("database_unavailable")) => is_generic_server_error(&answer.body),
                _ => false,
            },
            _ => false,
        };
        if !acceptable {
            wrong.push(format!(
                "{:?} (after {} ms) answered {} {}",
                answer.action, answer.delay_ms, answer.status, answer.body
            ));
        }
    }
    wrong.extend(named_tokens_missing(app, scenario, answers).await);
    let created = answers
        .iter()
        .filter(|a| matches!(a.action, Action::Writer | Action::Checkout) && a.status == 201)
        .count();
    if created > 1 {
        wrong.push(format!("{created} answers 201 Created for one payment"));
    }

    // The payment's state.
    let payment = app
        .db
        .collection::<Document>("payments")
        .find_one(doc! { "paymentIntentId": &scenario.payment })
        .await
        .unwrap();
    let payment_state = payment
        .as_ref()
        .map(|p| p.get_str("status").unwrap_or("?").to_owned());
    // A partial refund is no state change: without a success event the payment has
    // only its refunded amount, no status ("?").
    let expected_state = match scenario.refund {
        _ if fully_refunded => Some("refunded"),
        _ if scenario.succeeds() => Some("succeeded"),
        Refund::None if !reversed => None,
        _ => Some("?"),
    };
    // A payment refunded whole for a while and given back stands again as `succeeded`,
    // even when no success was delivered (a refund says it was paid).
    let also_fine =
        refused_for_a_while && !fully_refunded && payment_state.as_deref() == Some("succeeded");
    if payment_state.as_deref() != expected_state && !also_fine {
        wrong.push(format!(
            "payment state {payment_state:?}, expected {expected_state:?}"
        ));
    }
    if matches!(scenario.refund, Refund::Partial(_)) || reversed {
        let refunded = scenario.amount_refunded();
        let recorded = payment
            .as_ref()
            .and_then(|p| stored_int(p, "amountRefunded"));
        // A full refund is recorded as at least the amount.
        let right = match scenario.refund {
            Refund::Full => recorded.is_some_and(|r| r >= refunded),
            _ => recorded == Some(refunded),
        };
        if !right {
            wrong.push(format!("amountRefunded {recorded:?}, expected {refunded}"));
        }
    }

    // The issuance record and its tokens.
    let (records, tokens) = stored(app, &scenario.payment).await;
    let active: Vec<i64> = tokens
        .iter()
        .filter(|t| t.status == "active")
        .map(|t| t.index)
        .collect();
    match records.as_slice() {
        [] => {
            // Only a full refund can keep every writer out (a backend retry always runs).
            if !refused_for_a_while {
                wrong.push("no issuance record for a payment that stands".to_owned());
            }
            if !tokens.is_empty() {
                wrong.push(format!("{} tokens without a record", tokens.len()));
            }
        }
        [record] => {
            let status = record.get_str("status").unwrap_or("?");
            let quantity = stored_int(record, "quantity");
            let record_owner = record.get_object_id("owner").ok();
            let record_type = record.get_str("tokenType").unwrap_or("?");
            if quantity != Some(scenario.quantity)
                || record_owner != Some(owner)
                || record_type != "standard"
            {
                wrong.push(format!(
                    "record has quantity {quantity:?}, owner {record_owner:?}, type {record_type}"
                ));
            }
            match status {
                "issued" => {
                    let record_mode = record.get_str("mode").unwrap_or("?");
                    if record_mode != mode {
                        wrong.push(format!("issued in {record_mode} mode, not {mode}"));
                    }
                    let indexes: Vec<i64> = tokens.iter().map(|t| t.index).collect();
                    if indexes != (0..scenario.quantity).collect::<Vec<_>>() {
                        wrong.push(format!(
                            "issued record of quantity {} has tokenIndexes {indexes:?}",
                            scenario.quantity
                        ));
                    }
                    if let Some(t) = tokens
                        .iter()
                        .find(|t| t.owner != record_owner || t.token_type != record_type)
                    {
                        wrong.push(format!("token not of the record's owner/type: {t:?}"));
                    }
                    // Nothing but the refund revokes here, and only the share the payment no
                    // longer stands for, counted from the highest tokenIndex down past the
                    // spent tokens (the rule every settle goes by): from its boundary up a
                    // token is revoked or was spent before the refund took it (counted
                    // short), below it a token stands. Never both: a token has one state.
                    let keep = scenario.keep();
                    let spent: Vec<i64> = tokens
                        .iter()
                        .filter(|t| t.status == "redeemed")
                        .map(|t| t.index)
                        .collect();
                    let from = tokenmint::domain::share_taken(scenario.quantity, keep, &spent).from;
                    if let Some(t) = tokens.iter().find(|t| {
                        let allowed: &[&str] = if t.index < from {
                            &["active", "redeemed"]
                        } else {
                            &["revoked", "redeemed"]
                        };
                        !allowed.contains(&t.status.as_str())
                    }) {
                        wrong.push(format!(
                            "token {t:?} of a payment standing for {keep} of {}, its share taken from {from} (refund {:?}, {:?})",
                            scenario.quantity, scenario.refund, scenario.reversal
                        ));
                    }
                }
                // A checkout's request recorded before a full refund, which then kept every
                // writer out: it never issues, and expires.
                "pending" if refused_for_a_while => {
                    if !tokens.is_empty() {
                        wrong.push(format!("pending record with {} tokens", tokens.len()));
                    }
                }
                other => wrong.push(format!("record left {other}")),
            }
        }
        more => wrong.push(format!("{} issuance records", more.len())),
    }
    // The invariant itself, whatever the record says: no active token while the tokens
    // that stand (active or spent) are more than the payment stands for.
    let keep = scenario.keep();
    let redeemed = tokens.iter().filter(|t| t.status == "redeemed").count() as i64;
    if !active.is_empty() && active.len() as i64 + redeemed > keep {
        wrong.push(format!(
            "{} tokens active and {redeemed} redeemed, but the payment stands for {keep} only",
            active.len()
        ));
    }
    wrong
}

/// Everything wrong with the round's redemptions, whatever payments their tokens are of:
/// each record's tokens are redeemed with its reference (so none of them was revoked by a
/// refund as well), no token is in two records, and every redeemed token is in one (in
/// the races only redemptions redeem).
pub(super) async fn check_redemptions(app: &TestApp) -> Vec<String> {
    use futures::TryStreamExt;
    let mut wrong = Vec::new();
    let records: Vec<Document> = app
        .db
        .collection::<Document>("redemptions")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut named = std::collections::HashSet::new();
    for record in &records {
        let reference = record.get_str("reference").unwrap_or("?");
        let ids: Vec<ObjectId> = record
            .get_array("tokenIds")
            .map(|ids| ids.iter().filter_map(|id| id.as_object_id()).collect())
            .unwrap_or_default();
        if stored_int(record, "quantity") != Some(ids.len() as i64) {
            wrong.push(format!("redemption {reference} names {} tokens", ids.len()));
        }
        for id in &ids {
            if !named.insert(*id) {
                wrong.push(format!("token {id} is in two redemptions"));
            }
        }
        let redeemed = app
            .count(
                "tokens",
                doc! { "_id": { "$in": &ids }, "status": "redeemed", "redemptionRef": reference },
            )
            .await;
        if redeemed != ids.len() as u64 {
            wrong.push(format!(
                "redemption {reference}: {redeemed} of its {} tokens redeemed with its reference",
                ids.len()
            ));
        }
    }
    let redeemed = app.count("tokens", doc! { "status": "redeemed" }).await;
    if redeemed != named.len() as u64 {
        wrong.push(format!(
            "{redeemed} tokens redeemed, {} named by redemptions",
            named.len()
        ));
    }
    wrong
}

/// Whether a 5xx body is one of the service's generic problems: a stable code, and none
/// of the driver's words (error names, codes, labels, addresses).
fn is_generic_server_error(body: &str) -> bool {
    const DRIVER_WORDS: [&str; 10] = [
        "ShutdownInProgress",
        "InterruptedAtShutdown",
        "NotWritablePrimary",
        "PrimarySteppedDown",
        "WriteConflict",
        "BadValue",
        "TransientTransactionError",
        "failCommand",
        "Kind:",
        "127.0.0.1",
    ];
    let generic = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned))
        .is_some_and(|code| {
            ["database_unavailable", "internal_error", "request_timeout"].contains(&code.as_str())
        });
    generic && !DRIVER_WORDS.iter().any(|word| body.contains(word))
}

/// The tokens a 200 or 201 issuance answer named that the database does not hold for the
/// payment: an acknowledgment must name stored tokens (they may have been revoked since).
async fn named_tokens_missing(
    app: &TestApp,
    scenario: &Scenario,
    answers: &[&Answer],
) -> Vec<String> {
    let mut wrong = Vec::new();
    for answer in answers {
        if !matches!(answer.action, Action::Writer | Action::Checkout)
            || !matches!(answer.status, 200 | 201)
        {
            continue;
        }
        let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
        for (index, id) in indexed_token_ids(&body) {
            let stored = match ObjectId::parse_str(&id) {
                Ok(id) => {
                    app.count(
                        "tokens",
                        doc! {
                            "_id": id, "tokenIndex": index,
                            "origin.paymentIntentId": &scenario.payment,
                        },
                    )
                    .await
                }
                Err(_) => 0,
            };
            if stored != 1 {
                wrong.push(format!(
                    "{:?} answered {} naming token {index} {id:?}, which is not stored",
                    answer.action, answer.status
                ));
            }
        }
    }
    wrong
}
