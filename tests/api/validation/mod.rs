//! Bad input to `POST /v1/issuances`: every rejected request names the field(s) at fault,
//! answers problem+json, and writes nothing. [`fields`] is a body whose fields are wrong,
//! [`bodies`] a body that is not JSON, not an object, or too large.

mod bodies;
mod fields;

use mongodb::bson::doc;
use serde_json::Value;

use crate::helpers::*;

/// A valid body with `field` set to `value`.
fn with(field: &str, value: Value) -> Value {
    let mut body = issuance_body("pi_validation", 2);
    body[field] = value;
    body
}

/// Asserts that no token and no issuance record was written.
async fn assert_nothing_written(app: &TestApp) {
    assert_eq!(app.count("tokens", doc! {}).await, 0, "no token written");
    assert_eq!(
        app.count("issuances", doc! {}).await,
        0,
        "no issuance written"
    );
}
