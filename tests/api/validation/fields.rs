//! Wrong fields: each bad value or missing field is a 422 naming it, all of a request's
//! bad fields are listed in one answer (at most 20, the rest counted), a repeated field is
//! refused, and the quantity's limit is the configured one.

use mongodb::bson::doc;
use serde_json::{Value, json};

use super::{assert_nothing_written, with};
use crate::helpers::*;

/// A valid body without `field`.
fn without(field: &str) -> Value {
    let mut body = issuance_body("pi_validation", 2);
    body.as_object_mut().unwrap().remove(field);
    body
}

#[tokio::test]
async fn each_bad_field_is_rejected_and_named() {
    let app = spawn_app().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "provider with capitals",
            with("provider", json!("Stripe")),
            "provider",
        ),
        (
            "provider starting with a digit",
            with("provider", json!("1abc")),
            "provider",
        ),
        (
            "provider of 33 chars",
            with("provider", json!("a".repeat(33))),
            "provider",
        ),
        (
            "provider operator",
            with("provider", json!("$where")),
            "provider",
        ),
        (
            "provider not a string",
            with("provider", json!(7)),
            "provider",
        ),
        (
            "accountId of 65 chars",
            with("accountId", json!("a".repeat(65))),
            "accountId",
        ),
        (
            "accountId with a space",
            with("accountId", json!("a b")),
            "accountId",
        ),
        (
            "accountId as an operator object",
            with("accountId", json!({"$gt": ""})),
            "accountId",
        ),
        (
            "empty paymentIntentId",
            with("paymentIntentId", json!("")),
            "paymentIntentId",
        ),
        (
            "paymentIntentId of 129 chars",
            with("paymentIntentId", json!("p".repeat(129))),
            "paymentIntentId",
        ),
        (
            "paymentIntentId with a slash",
            with("paymentIntentId", json!("a/b")),
            "paymentIntentId",
        ),
        (
            "paymentIntentId operator object",
            with("paymentIntentId", json!({"$ne": null})),
            "paymentIntentId",
        ),
        (
            "owner of 23 hex chars",
            with("owner", json!("65f1a0c2b3d4e5f60123456")),
            "owner",
        ),
        (
            "owner of 25 hex chars",
            with("owner", json!("65f1a0c2b3d4e5f6012345678")),
            "owner",
        ),
        (
            "owner not hex",
            with("owner", json!("zzf1a0c2b3d4e5f601234567")),
            "owner",
        ),
        ("owner a number", with("owner", json!(1234)), "owner"),
        (
            "tokenType with capitals",
            with("tokenType", json!("Gold")),
            "tokenType",
        ),
        (
            "tokenType of 65 chars",
            with("tokenType", json!("t".repeat(65))),
            "tokenType",
        ),
        (
            "tokenType operator",
            with("tokenType", json!("$x")),
            "tokenType",
        ),
        (
            "fractional quantity",
            with("quantity", json!(4.5)),
            "quantity",
        ),
        ("quantity 4.0", with("quantity", json!(4.0)), "quantity"),
        (
            "quantity as a string",
            with("quantity", json!("4")),
            "quantity",
        ),
        ("quantity 0", with("quantity", json!(0)), "quantity"),
        ("quantity -1", with("quantity", json!(-1)), "quantity"),
        (
            "quantity over max_quantity",
            with("quantity", json!(1001)),
            "quantity",
        ),
        (
            "quantity huge",
            with("quantity", json!(u64::MAX)),
            "quantity",
        ),
        ("quantity null", with("quantity", Value::Null), "quantity"),
        (
            "paymentDate not RFC 3339",
            with("paymentDate", json!("yesterday")),
            "paymentDate",
        ),
        (
            "paymentDate without zone",
            with("paymentDate", json!("2026-09-01T00:00:00")),
            "paymentDate",
        ),
        ("unknown mode", with("mode", json!("fast")), "mode"),
        ("missing provider", without("provider"), "provider"),
        (
            "missing paymentIntentId",
            without("paymentIntentId"),
            "paymentIntentId",
        ),
        ("missing owner", without("owner"), "owner"),
        ("missing tokenType", without("tokenType"), "tokenType"),
        ("missing quantity", without("quantity"), "quantity"),
        ("unknown field (typo)", with("quanity", json!(2)), "quanity"),
    ];
    for (description, body, field) in cases {
        let response = app.issue(WRITER_KEY, &body).await;
        assert_eq!(response.status(), 422, "{description}: {body}");
        let problem = assert_problem(response, 422, "validation_failed").await;
        assert_eq!(error_fields(&problem), [field], "{description}: {problem}");
    }
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn every_bad_field_is_listed_in_one_answer() {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_many_bad", 2);
    body["provider"] = json!("Stripe");
    body["owner"] = json!("not-an-object-id");
    body["quantity"] = json!(0);
    let problem =
        assert_problem(app.issue(WRITER_KEY, &body).await, 422, "validation_failed").await;
    let mut fields = error_fields(&problem);
    fields.sort();
    assert_eq!(fields, ["owner", "provider", "quantity"], "{problem}");

    // Everything wrong at once (all fields present, all strings): all of them listed.
    let body = json!({
        "provider": "Stripe",
        "accountId": "a b",
        "paymentIntentId": "a/b",
        "owner": "xyz",
        "tokenType": "Gold",
        "quantity": -1,
        "paymentDate": "yesterday",
        "mode": "fast",
    });
    let problem =
        assert_problem(app.issue(WRITER_KEY, &body).await, 422, "validation_failed").await;
    let mut fields = error_fields(&problem);
    fields.sort();
    assert_eq!(
        fields,
        [
            "accountId",
            "mode",
            "owner",
            "paymentDate",
            "paymentIntentId",
            "provider",
            "quantity",
            "tokenType"
        ],
        "{problem}"
    );
    assert_nothing_written(&app).await;
}

/// The README's bad-input example, byte for byte: an unknown field (`quanity`) does not
/// hide the other faults. One 422 names all four, each with its message, and nothing is
/// written.
#[tokio::test]
async fn an_unknown_field_is_listed_with_every_other_fault() {
    let app = spawn_app().await;
    let body = r#"{"provider":"Stripe","paymentIntentId":"pi_1","owner":"nope","tokenType":"standard","quanity":4}"#;
    let response = app.issue_raw("application/json", body).await;
    let problem = assert_problem(response, 422, "validation_failed").await;
    let errors: Vec<(&str, &str)> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["field"].as_str().unwrap(), e["message"].as_str().unwrap()))
        .collect();
    assert_eq!(errors.len(), 4, "{problem}");
    assert_eq!(errors[0], ("quanity", "is not a known field"), "{problem}");
    assert_eq!(errors[3], ("quantity", "is required"), "{problem}");
    let fields: Vec<&str> = errors.iter().map(|(field, _)| *field).collect();
    assert_eq!(
        fields,
        ["quanity", "provider", "owner", "quantity"],
        "{problem}"
    );
    assert_nothing_written(&app).await;
}

#[tokio::test]
async fn a_repeated_field_is_rejected_not_last_one_wins() {
    // `{"quantity": 1, "quantity": 3}` must not silently issue 3 (or 1): whatever
    // validated the body upstream may have read the other one.
    let app = spawn_app().await;
    let valid = serde_json::to_string(&issuance_body("pi_repeat", 1)).unwrap();
    let cases = [
        ("quantity", valid.replacen('{', "{\"quantity\": 3, ", 1)),
        ("quantity", valid.replacen('{', "{\"quantity\": 1, ", 1)),
        (
            "owner",
            valid.replacen('{', &format!("{{\"owner\": \"{OTHER_OWNER}\", "), 1),
        ),
    ];
    for (field, raw) in cases {
        let problem = assert_problem(
            app.issue_raw("application/json", raw.clone()).await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(error_fields(&problem), [field], "{raw}: {problem}");
    }
    assert_nothing_written(&app).await;
    // The same body without the repetition is fine.
    assert_eq!(app.issue_raw("application/json", valid).await.status(), 201);
    assert_eq!(app.token_indexes("pi_repeat").await, vec![0]);
}

#[tokio::test]
async fn max_quantity_is_configurable() {
    let app = spawn_app_with("[issuance]\nmax_quantity = 5\n").await;
    let problem = assert_problem(
        app.issue(WRITER_KEY, &issuance_body("pi_max", 6)).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&problem), ["quantity"]);
    assert!(
        problem["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("1 to 5"),
        "the message names the configured maximum: {problem}"
    );
    assert_nothing_written(&app).await;

    let response = app.issue(WRITER_KEY, &issuance_body("pi_max", 5)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(json(response).await["created"], 5);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.token_indexes("pi_max").await, vec![0, 1, 2, 3, 4]);
}

/// A query of repeated parameters names one bad field per parameter: the answer lists
/// the first 20 and counts the rest, so its size does not grow with the query.
#[tokio::test]
async fn a_query_of_repeated_parameters_gets_a_capped_error_list() {
    let app = spawn_app().await;
    let query = vec!["zz=1"; 8 * 1024 / 5].join("&");
    assert!(query.len() >= 8000);
    let response = app.get(READER_KEY, &format!("/v1/tokens?{query}")).await;
    let body = response.bytes().await.unwrap();
    assert!(body.len() < 4 * 1024, "a {} byte 422", body.len());
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 422);
    assert_eq!(problem["code"], "validation_failed");
    assert_eq!(problem["errors"].as_array().unwrap().len(), 20, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "zz");
    let total = 8 * 1024 / 5;
    assert_eq!(problem["errorsOmitted"], total - 20, "{problem}");
}

/// A body of thousands of made-up keys beside a large known field: the answer names the
/// first 20 unknown ones, says more are wrong, and writes nothing. (Each unknown key
/// costs a parse of the whole body, so the service stops looking one past what it lists.)
#[tokio::test]
async fn a_body_of_thousands_of_unknown_fields_is_answered_with_the_first_ones() {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_many_unknown", 1);
    body["owner"] = json!(vec![0; 8 * 1024]);
    for i in 0..3000 {
        body[format!("z{i:04}")] = json!(0);
    }
    let response = app.issue(REQUEST_KEY, &body).await;
    let problem = assert_problem(response, 422, "validation_failed").await;
    let listed = problem["errors"].as_array().unwrap();
    assert_eq!(listed.len(), 20, "{problem}");
    assert!(
        listed
            .iter()
            .all(|e| e["message"] == "is not a known field"),
        "{problem}"
    );
    // It stopped looking one past the 20 it lists (each look parses the whole body):
    // the count is a lower bound, not the 3 000.
    assert_eq!(problem["errorsOmitted"], 1, "{problem}");
    assert_nothing_written(&app).await;
}
