//! Each write of an upsert batch fails in turn, after the writes before it succeeded: the
//! token insert (a failover code on both of its sends), and the mark (a failover code; or
//! applied and then answered a write concern error, after tokens only the primary
//! acknowledged), and the reopen of the records that follows a failed mark; the records'
//! insert applies, then answers a write concern error (its second send finds its own
//! records: 201), and so does the token insert (503: a write concern error fails it as a
//! whole). Whatever the first answer, once the request is sent again the payment has
//! exactly its tokens, the ones every 2xx named, a first 201 counts all four as created,
//! and its record is `issued`.

use mongodb::bson::doc;

use super::NO_SWEEPS;
use crate::helpers::*;

/// Where the fault goes, and what the first answer must be.
struct Case {
    name: &'static str,
    payment: &'static str,
    first_status: u16,
}

const CASES: [Case; 6] = [
    Case {
        name: "the token insert fails with a failover code on both sends",
        payment: "pi_bw_tokens_fail",
        first_status: 503,
    },
    Case {
        name: "the mark fails with a failover code",
        payment: "pi_bw_mark_fails",
        first_status: 201,
    },
    Case {
        name: "the mark applies, then answers a write concern error",
        payment: "pi_bw_mark_unconfirmed",
        first_status: 201,
    },
    Case {
        name: "the mark fails, then the reopen after it on both of its sends",
        payment: "pi_bw_reopen_fails",
        first_status: 201,
    },
    Case {
        name: "the records' insert applies, then answers a write concern error",
        payment: "pi_bw_records_unconfirmed",
        first_status: 201,
    },
    Case {
        name: "the token insert applies, then answers a write concern error",
        payment: "pi_bw_tokens_unconfirmed",
        first_status: 503,
    },
];

#[tokio::test]
async fn each_write_of_an_upsert_batch_failing_after_the_ones_before_leaves_exactly_its_tokens() {
    for (case_index, case) in CASES.iter().enumerate() {
        let name = unique_app_name();
        let app = spawn_app_named(&name, NO_SWEEPS).await;
        let body = issuance_body(case.payment, 4);
        let turn = FailPointTurn::take().await;
        let (first, entered) = match case_index {
            0 => {
                drop(turn);
                let failing = FailPoint::after_first(&name, &["insert"], Fault::error(91)).await;
                let first = app.issue(WRITER_KEY, &body).await;
                (first, failing.off().await)
            }
            1 => {
                let failing = turn.set(&name, &["update"], Fault::error(91), 1).await;
                let first = app.issue(WRITER_KEY, &body).await;
                (first, failing.off().await)
            }
            2 => {
                let failing = turn
                    .set(&name, &["update"], Fault::WriteConcernError { code: 64 }, 1)
                    .await;
                let first = app.issue(WRITER_KEY, &body).await;
                (first, failing.off().await)
            }
            3 => {
                // The mark (sent once), then the reopen and the driver's retry of it.
                let failing = turn.set(&name, &["update"], Fault::error(91), 3).await;
                let first = app.issue(WRITER_KEY, &body).await;
                let entered = failing.off().await;
                assert_eq!(entered, 3, "{}: the reopen did not fail", case.name);
                (first, entered)
            }
            _ => {
                drop(turn);
                let collection = if case_index == 4 {
                    "issuances"
                } else {
                    "tokens"
                };
                let namespace = format!("{}.{collection}", app.db_name);
                let unconfirmed = Fault::WriteConcernError { code: 64 };
                let failing =
                    FailPoint::set_on(&name, &["insert"], &namespace, unconfirmed, 1).await;
                let first = app.issue(WRITER_KEY, &body).await;
                (first, failing.off().await)
            }
        };
        assert!(entered >= 1, "{}: the fault never happened", case.name);
        let first_status = first.status().as_u16();
        let first_body: serde_json::Value = first.json().await.unwrap();
        assert_eq!(
            first_status, case.first_status,
            "{}: {first_body}",
            case.name
        );
        if first_status == 201 {
            assert_eq!(first_body["created"], 4, "{}: {first_body}", case.name);
        }

        // Sent again, with nothing failing: a replay of a complete set, or its completion.
        let again = app.issue(WRITER_KEY, &body).await;
        assert!(again.status().is_success(), "{}", case.name);
        let again: serde_json::Value = again.json().await.unwrap();
        let stored = app.stored_token_ids(case.payment).await;
        assert_eq!(stored.len(), 4, "{}: {stored:?}", case.name);
        for answer in [&first_body, &again] {
            if answer["tokens"].is_array() {
                let named: Vec<String> = indexed_token_ids(answer)
                    .into_iter()
                    .map(|(_, id)| id)
                    .collect();
                assert_eq!(named, stored, "{}: an answer named other tokens", case.name);
            }
        }
        let record = app
            .find_stored("issuances", doc! { "paymentIntentId": case.payment })
            .await;
        assert_eq!(
            record.get_str("status"),
            Ok("issued"),
            "{}: {record}",
            case.name
        );
        app.db.drop().await.unwrap();
    }
}
