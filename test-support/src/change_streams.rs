//! Counting an app's change streams in mongod's `$currentOp`: which of its collections
//! an instance watches, and when.

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::Client;
use mongodb::bson::{Document, doc};

use crate::app::TestApp;

/// The change streams open on `collection` of `app`'s database (each test has its own),
/// waiting for more or idle between two reads.
pub async fn change_streams(app: &TestApp, collection: &str) -> usize {
    change_streams_on(app.db.client(), &app.db_name, collection).await
}

/// [`change_streams`] of any client's `database` (a service binary's, say), read through
/// `client`.
pub async fn change_streams_on(client: &Client, database: &str, collection: &str) -> usize {
    let ops: Vec<Document> = client
        .database("admin")
        .aggregate([
            doc! { "$currentOp": { "idleCursors": true, "allUsers": true } },
            doc! { "$match": {
                "ns": format!("{database}.{collection}"),
                "cursor.originatingCommand.aggregate": collection,
            } },
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    ops.len()
}

/// Polls until `app` has `expected` change streams open on `collection`, for at most
/// `within`. One reading of `$currentOp` may miss a stream between its waits for more
/// (its `getMore` neither running nor idle at that instant), so the count must hold on a
/// second reading more than a `getMore`'s wait (1 s) later.
pub async fn until_change_streams(
    app: &TestApp,
    collection: &str,
    expected: usize,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let open = change_streams(app, collection).await;
        if open == expected {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            if change_streams(app, collection).await == expected {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{open} change streams open on {collection}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `app` opens no change stream on `collection` within `during`.
pub async fn no_change_stream_during(
    app: &TestApp,
    collection: &str,
    during: Duration,
    what: &str,
) {
    let until = Instant::now() + during;
    while Instant::now() < until {
        assert_eq!(change_streams(app, collection).await, 0, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
