//! A batch's tokens in `insert` commands written by hand, their `_id`s chosen here so that
//! the answers name them without a read-back.
//!
//! On a replica set the primary alone acknowledges them (`w: 1`, as it does the records
//! before them), and each reply tells where in the primary's history it did (`opTime`).
//! The batch's mark, which waits for the majority, then makes them durable if the same
//! primary acknowledged it in the same term (`TokensAck::covered_by`): a batch waits for
//! the majority once, at the last write it answers on, instead of at the tokens and again
//! at the mark. If an election came between the two, the mark says nothing of the tokens,
//! and the caller must not answer from them. Off a replica set the tokens are written with
//! the client's majority: on a sharded cluster they and the mark may live on different
//! shards, and a standalone has no history to compare.

use mongodb::bson::{RawArrayBuf, RawDocumentBuf, oid::ObjectId, rawdoc};
use mongodb::error::ErrorKind;

use super::{TokenInsert, WriteReply, code_error, write_concern_failure};
use crate::domain::{NewIssuance, TokenStatus};
use crate::store::documents::{RevokedShare, TokenSummary, new_token};
use crate::store::durability::{OpTime, pinned_command_writes};
use crate::store::error::{StoreError, TOKENS_PAYMENT_INDEX, index_in_message, is_unavailable};
use crate::store::{Store, TOKENS};
use crate::telemetry::metric;

/// Most bytes of documents in one `insert` command: well under the 16 MiB a command may
/// carry, whatever the rest of it weighs.
const MAX_COMMAND_BYTES: usize = 8 * 1024 * 1024;
/// Most documents in one `insert` command (the server's `maxWriteBatchSize`).
const MAX_COMMAND_DOCUMENTS: usize = 100_000;

/// How a batch's token insert was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokensAck {
    /// By a majority: durable as it is.
    Majority,
    /// By the primary alone, at these points, one per command (`None`: the reply did not
    /// say, so no later write can be shown to cover it).
    Primary(Vec<Option<OpTime>>),
}

impl TokensAck {
    /// Whether the tokens are durable once `mark`, a `w: majority` write acknowledged at
    /// that point after them, is (`OpTime::covered_by`).
    pub fn covered_by(&self, mark: Option<&OpTime>) -> bool {
        match self {
            TokensAck::Majority => true,
            TokensAck::Primary(points) => mark.is_some_and(|mark| {
                points
                    .iter()
                    .all(|point| point.is_some_and(|point| point.covered_by(mark)))
            }),
        }
    }
}

impl Store {
    /// Inserts the tokens of every set, unordered, each with the share it writes revoked;
    /// returns each set's result and how the insert was acknowledged. A command that
    /// fails as a whole fails them all (`Err`).
    pub async fn insert_token_sets(
        &self,
        sets: &[(&NewIssuance, Option<RevokedShare>)],
    ) -> Result<(Vec<TokenInsert>, TokensAck), StoreError> {
        let now = mongodb::bson::DateTime::now();
        let mut documents: Vec<RawDocumentBuf> = Vec::new();
        // Which set each document belongs to, and each set's summaries.
        let mut owner_of: Vec<usize> = Vec::new();
        // Whether each document is written revoked (its set's share).
        let mut revoked_at: Vec<bool> = Vec::new();
        let mut summaries: Vec<Vec<TokenSummary>> = Vec::with_capacity(sets.len());
        for (set_index, (set, revoked)) in sets.iter().enumerate() {
            let quantity = i64::from(set.params.quantity.get());
            let mut tokens = Vec::with_capacity(quantity as usize);
            for token_index in 0..quantity {
                let id = ObjectId::new();
                let mut document = new_token(set, token_index, revoked.as_ref(), now);
                document.append_ref("_id", id);
                documents.push(document);
                owner_of.push(set_index);
                let status = RevokedShare::status_written(revoked.as_ref(), token_index);
                revoked_at.push(status == TokenStatus::Revoked);
                tokens.push(TokenSummary {
                    id,
                    token_index,
                    status,
                    version: 0,
                });
            }
            summaries.push(tokens);
        }
        let primary_alone = self.is_replica_set().await?;
        let (write_concern, mut ack) = if primary_alone {
            (
                rawdoc! { "w": 1, "j": false },
                TokensAck::Primary(Vec::new()),
            )
        } else {
            (pinned_command_writes(&self.db), TokensAck::Majority)
        };
        let mut failures: Vec<Option<TokenInsert>> = sets.iter().map(|_| None).collect();
        // Each set's documents the insert refused: the rest it wrote.
        let mut refused_of: Vec<u32> = vec![0; sets.len()];
        let mut start = 0;
        while start < documents.len() {
            let end = command_end(&documents, start);
            let reply = self
                .tokens_command(&documents[start..end], &write_concern)
                .await?;
            if let TokensAck::Primary(points) = &mut ack {
                points.push(reply.op_time);
            }
            let mut refused = 0;
            let mut written_revoked = vec![0_u64; sets.len()];
            for (index, _) in revoked_at[start..end]
                .iter()
                .enumerate()
                .filter(|(_, r)| **r)
            {
                written_revoked[owner_of[start + index]] += 1;
            }
            for error in reply.write_errors {
                let Some(&set_index) = owner_of.get(start + error.index) else {
                    continue;
                };
                let failure = match (error.code == 11000)
                    .then(|| index_in_message(&error.errmsg))
                    .flatten()
                    .as_deref()
                {
                    // Its `_id` is new, chosen here: the first of two sends wrote it.
                    Some("_id_") => continue,
                    Some(TOKENS_PAYMENT_INDEX) => TokenInsert::Raced { inserted: 0 },
                    _ => TokenInsert::Failed(code_error(error.code)),
                };
                refused += 1;
                refused_of[set_index] += 1;
                if revoked_at[start + error.index] {
                    written_revoked[set_index] -= 1;
                }
                // A real failure outranks a race for the same set.
                if !matches!(failures[set_index], Some(TokenInsert::Failed(_))) {
                    failures[set_index] = Some(failure);
                }
            }
            // Counted per command: its tokens stand even when a later command fails.
            metrics::counter!(metric::TOKENS_CREATED_TOTAL)
                .increment((end - start - refused) as u64);
            for ((_, revoked), written) in sets.iter().zip(written_revoked) {
                if let Some(share) = revoked {
                    share.count_written(written);
                }
            }
            start = end;
        }
        let results = summaries
            .into_iter()
            .zip(failures)
            .zip(refused_of)
            .map(|((tokens, failure), refused)| match failure {
                None => TokenInsert::Inserted(tokens),
                Some(TokenInsert::Raced { .. }) => TokenInsert::Raced {
                    inserted: tokens.len() as u32 - refused,
                },
                Some(failure) => failure,
            })
            .collect();
        Ok((results, ack))
    }

    /// One `insert` command of `documents`, sent again once when it fails for
    /// unavailability: unlike the driver's own writes a command is not retried by the
    /// driver, and sending it again is safe (a token the first send wrote comes back as a
    /// duplicate of its own `_id`). A write concern error fails the command as a whole.
    async fn tokens_command(
        &self,
        documents: &[RawDocumentBuf],
        write_concern: &RawDocumentBuf,
    ) -> Result<WriteReply, StoreError> {
        // Built for each send, not cloned ahead of one that is rarely needed: a batch's
        // command carries all its tokens.
        let command = || {
            let mut command = rawdoc! {
                "insert": TOKENS,
                "ordered": false,
                "writeConcern": write_concern.clone(),
            };
            command.append(
                "documents",
                documents.iter().cloned().collect::<RawArrayBuf>(),
            );
            command
        };
        let reply = match self.db.run_raw_command(command()).await {
            // Not after a server selection that timed out: nothing was sent, and a second
            // one would only hold the batch as long again.
            Err(err)
                if is_unavailable(&err)
                    && !matches!(*err.kind, ErrorKind::ServerSelection { .. }) =>
            {
                self.db.run_raw_command(command()).await?
            }
            reply => reply?,
        };
        let reply: WriteReply = mongodb::bson::from_document(reply)
            .map_err(|err| StoreError::Internal(format!("unexpected insert reply: {err}")))?;
        if let Some(wce) = &reply.write_concern_error {
            return Err(write_concern_failure(wce.code));
        }
        Ok(reply)
    }
}

/// Where the command that starts at `documents[start]` ends: before the document that
/// would take it past `MAX_COMMAND_BYTES` or `MAX_COMMAND_DOCUMENTS`, and never before
/// carrying at least one.
fn command_end(documents: &[RawDocumentBuf], start: usize) -> usize {
    let mut bytes = 0;
    let mut end = start;
    while end < documents.len() && end - start < MAX_COMMAND_DOCUMENTS {
        bytes += documents[end].as_bytes().len();
        if bytes > MAX_COMMAND_BYTES && end > start {
            break;
        }
        end += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{Timestamp, rawdoc};

    use super::*;

    fn at(term: i64, time: u32) -> OpTime {
        OpTime {
            term,
            ts: Timestamp { time, increment: 1 },
        }
    }

    #[test]
    fn tokens_the_primary_acknowledged_are_covered_only_by_a_mark_of_the_same_term_after_them() {
        let tokens = TokensAck::Primary(vec![Some(at(3, 100)), Some(at(3, 101))]);
        assert!(tokens.covered_by(Some(&at(3, 101))));
        assert!(tokens.covered_by(Some(&at(3, 150))));
        // An election between the insert and the mark: the mark says nothing of the tokens.
        assert!(!tokens.covered_by(Some(&at(4, 150))));
        // Before the last command's point (cannot happen on one primary; not trusted).
        assert!(!tokens.covered_by(Some(&at(3, 100))));
        // A mark that told no point, or a command that told none.
        assert!(!tokens.covered_by(None));
        assert!(!TokensAck::Primary(vec![None]).covered_by(Some(&at(3, 150))));
        assert!(TokensAck::Majority.covered_by(None));
    }

    #[test]
    fn commands_are_cut_by_bytes_and_by_count_and_carry_at_least_one_document() {
        let small = rawdoc! { "a": 1 };
        let documents = vec![small.clone(); 5];
        assert_eq!(command_end(&documents, 0), 5);
        assert_eq!(command_end(&documents, 3), 5);
        let big = rawdoc! { "blob": "x".repeat(MAX_COMMAND_BYTES / 2) };
        let documents = vec![big.clone(), big.clone(), big.clone(), small];
        assert_eq!(command_end(&documents, 0), 1);
        assert_eq!(command_end(&documents, 1), 2);
        assert_eq!(command_end(&documents, 2), 4);
        let huge = vec![rawdoc! { "blob": "x".repeat(MAX_COMMAND_BYTES + 1) }];
        assert_eq!(command_end(&huge, 0), 1);
        let many = vec![rawdoc! {}; MAX_COMMAND_DOCUMENTS + 3];
        assert_eq!(command_end(&many, 0), MAX_COMMAND_DOCUMENTS);
        assert_eq!(
            command_end(&many, MAX_COMMAND_DOCUMENTS),
            MAX_COMMAND_DOCUMENTS + 3
        );
    }
}
