//! Coalesced payment reads: concurrent requests that each need their payment's state
//! share one query. Used by atomic-mode issuances, which keep one transaction each and
//! so must not wait for one another's transactions (as they would inside a group-commit
//! batch), yet read the payment before and after writing like every issuer.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};

use crate::domain::PaymentKey;
use crate::store::{PaymentDoc, Store, StoreError};

/// Reader tasks. One: while its query is in flight, the next batch gathers. A second
/// reader split the same reads into nearly twice as many queries (atomic mode, c=32:
/// 0.36 against 0.20 queries per issuance, about 3 % fewer issuances/s), and each query
/// costs mongod about as much whatever the number of payments it names.
const READERS: usize = 1;
/// Most payments per query.
const MAX_READ: usize = 256;

type Answer = oneshot::Sender<Result<Option<PaymentDoc>, StoreError>>;

/// The queue into the reader tasks.
pub(super) struct PaymentReads {
    queue: mpsc::Sender<(PaymentKey, Answer)>,
}

impl PaymentReads {
    /// Starts the reader tasks on `store` (on the current runtime).
    pub(super) fn start(store: Store) -> Self {
        let (queue, receiver) = mpsc::channel::<(PaymentKey, Answer)>(4096);
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 0..READERS {
            let (store, receiver) = (store.clone(), receiver.clone());
            tokio::spawn(async move {
                loop {
                    let mut batch = Vec::new();
                    {
                        let mut receiver = receiver.lock().await;
                        let Some(first) = receiver.recv().await else {
                            return;
                        };
                        batch.push(first);
                        while batch.len() < MAX_READ {
                            let Ok(next) = receiver.try_recv() else {
                                break;
                            };
                            batch.push(next);
                        }
                    }
                    read(&store, batch).await;
                }
            });
        }
        Self { queue }
    }

    /// The payment's state as stored now (read after this call began).
    pub(super) async fn get(&self, key: &PaymentKey) -> Result<Option<PaymentDoc>, StoreError> {
        let gone = || StoreError::Internal("the payment readers stopped".to_owned());
        let (answer, answered) = oneshot::channel();
        self.queue
            .send((key.clone(), answer))
            .await
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// One query for the whole batch; each asker gets its own payment.
async fn read(store: &Store, batch: Vec<(PaymentKey, Answer)>) {
    let keys: Vec<&PaymentKey> = batch.iter().map(|(key, _)| key).collect();
    let found: Result<HashMap<PaymentKey, PaymentDoc>, StoreError> =
        store.find_payments(&keys).await;
    match found {
        Ok(payments) => {
            for (key, answer) in batch {
                // Several askers may name the same payment: each gets its own copy.
                let _ = answer.send(Ok(payments.get(&key).cloned()));
            }
        }
        Err(err) => {
            for (_, answer) in batch {
                let _ = answer.send(Err(err.clone()));
            }
        }
    }
}
