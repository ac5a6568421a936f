//! The invariant checker (`Store::verify`, `tokenmint verify`) finds each kind of violation
//! and nothing on a healthy database ([`reports`]); the command's exit codes and its
//! `--repair` ([`command`]).

mod command;
mod reports;

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};

use crate::helpers::*;

/// A token as the service writes it (stripe, acct_1, OWNER, standard, active).
fn token(payment: &str, index: i64) -> Document {
    doc! {
        "owner": ObjectId::parse_str(OWNER).unwrap(), "type": "standard", "tokenIndex": index,
        "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment, "date": DateTime::now() },
        "status": "active", "_version": 0, "createdAt": DateTime::now(), "updatedAt": DateTime::now(),
    }
}

/// Runs the real binary's `verify` with `args` on the app's database.
async fn run_verify(app: &TestApp, args: &[&str]) -> std::process::Output {
    let args = [&["verify"][..], args].concat();
    run_command(&mongo_uri(), &app.db_name, &args, &[]).await
}
