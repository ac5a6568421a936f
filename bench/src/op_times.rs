//! The database operations a floor issuance is made of, and their latencies.

use std::time::Instant;

use hdrhistogram::Histogram;

/// The database operations a floor issuance is made of, timed separately so that the
/// report can say where the database spends its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    ClaimRecord,
    TokenBulk,
    ReadTokens,
    VerifyTokens,
    StartSession,
    TxnInsertRecord,
    TxnInsertTokens,
    TxnCommit,
    ReadRecord,
}

impl Op {
    pub const ALL: [Op; 9] = [
        Op::ClaimRecord,
        Op::TokenBulk,
        Op::ReadTokens,
        Op::VerifyTokens,
        Op::StartSession,
        Op::TxnInsertRecord,
        Op::TxnInsertTokens,
        Op::TxnCommit,
        Op::ReadRecord,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::ClaimRecord => "findOneAndUpdate issuances (upsert, $setOnInsert)",
            Op::TokenBulk => "update tokens (N upserts, unordered, w:majority)",
            Op::ReadTokens => "find tokens (sorted, projected)",
            Op::VerifyTokens => "find tokens (sorted, with owner and type to verify a replay)",
            Op::StartSession => "startSession",
            Op::TxnInsertRecord => "txn insert issuances",
            Op::TxnInsertTokens => "txn insertMany tokens",
            Op::TxnCommit => "commitTransaction (w:majority)",
            Op::ReadRecord => "findOne issuances",
        }
    }
}

/// Latency of each database operation, in microseconds.
pub struct OpTimes {
    pub hists: Vec<Histogram<u64>>,
}

impl Default for OpTimes {
    fn default() -> Self {
        Self {
            hists: Op::ALL
                .iter()
                .map(|_| crate::workload::new_histogram())
                .collect(),
        }
    }
}

impl OpTimes {
    /// Records that `op` took from `started` until now.
    pub fn record(&mut self, op: Op, started: Instant) {
        let index = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        let _ = self.hists[index].record(crate::workload::micros(started.elapsed()));
    }

    pub fn add(&mut self, other: &OpTimes) {
        for (mine, theirs) in self.hists.iter_mut().zip(&other.hists) {
            let _ = mine.add(theirs);
        }
    }
}
