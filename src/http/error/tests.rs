//! Every failure's status, code and headers; nothing internal in a body.
use super::*;

/// One of every variant, so a new variant without a row in the table fails here.
fn every_error() -> Vec<ApiError> {
    let status = TokenStatus::Active;
    vec![
        ApiError::MalformedJson("x".to_owned()),
        ApiError::Unauthorized("Missing Authorization: Bearer <key> header."),
        ApiError::Unauthorized(UNKNOWN_API_KEY),
        ApiError::WebhookSignature(SignatureError::Missing),
        ApiError::WebhookSignature(SignatureError::Invalid),
        ApiError::WebhookSignature(SignatureError::OutOfTolerance),
        ApiError::WebhookCredentials,
        ApiError::Forbidden("x".to_owned()),
        ApiError::NotFound("x".to_owned()),
        ApiError::MethodNotAllowed,
        ApiError::IdempotencyConflict(Vec::new()),
        ApiError::RedemptionConflict(Vec::new()),
        ApiError::InsufficientBalance { available: 2 },
        ApiError::IdempotencyKeyReused,
        ApiError::RequestInProgress,
        ApiError::StateConflict {
            detail: "x".to_owned(),
            status: None,
        },
        ApiError::PaymentNotSucceeded(PaymentStatus::Refunded),
        ApiError::VersionConflict {
            current: Some((3, status)),
        },
        ApiError::VersionConflict { current: None },
        ApiError::PayloadTooLarge,
        ApiError::UnsupportedMediaType,
        ApiError::validation("x", "y"),
        ApiError::PreconditionRequired("x"),
        ApiError::RateLimited {
            retry_after_secs: 1,
            limit: LimitHeaders {
                policy: "\"key\";q=1;w=1".to_owned(),
                current: "\"key\";r=0;t=1".to_owned(),
            },
        },
        ApiError::DatabaseUnavailable,
        ApiError::TransactionsUnavailable,
        ApiError::Timeout,
        ApiError::Internal,
    ]
}

#[test]
fn the_table_is_consistent() {
    for (i, code) in ProblemCode::ALL.iter().enumerate() {
        assert_eq!(*code as usize, i, "ALL is in declaration order");
        assert_eq!(ProblemCode::parse(code.as_str()), Some(*code));
        // The OpenAPI enum (serde) and the table say the same string.
        assert_eq!(
            serde_json::to_value(code).unwrap(),
            serde_json::json!(code.as_str())
        );
        assert!(
            code.as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{code:?}"
        );
        assert!(!code.title().is_empty() && !code.description().is_empty());
        assert!(code.status().is_client_error() || code.status().is_server_error());
    }
    assert_eq!(ProblemCode::parse("no_such_code"), None);
    assert_eq!(ProblemCode::parse("NOT_FOUND"), None);
}

#[test]
fn the_openapi_enum_is_the_table() {
    use utoipa::OpenApi;
    let doc = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
    let documented = &doc["components"]["schemas"]["ProblemCode"]["enum"];
    let table: Vec<&str> = ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(*documented, serde_json::json!(table));
}

#[test]
fn every_error_answers_with_a_code_from_the_table() {
    let mut used = Vec::new();
    for error in every_error() {
        let problem = error.problem();
        let code = ProblemCode::parse(&problem.code).expect("a code from the table");
        assert_eq!(problem.problem_type, format!("/problems/{}", problem.code));
        assert_eq!(problem.status, code.status().as_u16());
        assert_eq!(problem.title, code.title());
        used.push(code);
    }
    // And every code in the table is one some error answers with.
    for code in ProblemCode::ALL {
        assert!(used.contains(code), "{code:?} is never used");
    }
}

#[test]
fn a_signature_refusal_is_told_by_its_own_code() {
    for refused in [
        SignatureError::Missing,
        SignatureError::Invalid,
        SignatureError::OutOfTolerance,
    ] {
        let error = ApiError::WebhookSignature(refused);
        assert_eq!(error.code().as_str(), refused.to_string());
        assert_eq!(
            error.to_string(),
            format!("webhook signature rejected: {refused}")
        );
    }
}

fn challenge(error: ApiError) -> Option<String> {
    error
        .into_response()
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[test]
fn every_401_carries_a_challenge_and_nothing_else_does() {
    for error in every_error() {
        let status = error.status();
        let has = challenge(error).is_some();
        assert_eq!(has, status == StatusCode::UNAUTHORIZED, "{status}");
    }
    assert_eq!(
        challenge(ApiError::Unauthorized("Missing header.")).unwrap(),
        "Bearer realm=\"tokenmint\""
    );
    assert_eq!(
        challenge(ApiError::Unauthorized(UNKNOWN_API_KEY)).unwrap(),
        "Bearer realm=\"tokenmint\", error=\"invalid_token\""
    );
    assert_eq!(
        challenge(ApiError::WebhookSignature(SignatureError::Invalid)).unwrap(),
        "Signature realm=\"webhooks\", error=\"signature_invalid\""
    );
    assert_eq!(
        challenge(ApiError::WebhookCredentials).unwrap(),
        "Basic realm=\"webhooks\", charset=\"UTF-8\""
    );
}

#[test]
fn a_long_error_list_is_capped_and_counts_what_it_leaves_out() {
    let errors = (0..500)
        .map(|i| crate::domain::FieldError::new(format!("f{i}"), "bad"))
        .collect();
    let problem = ApiError::Validation(errors).problem();
    let listed = problem.errors.unwrap();
    assert_eq!(listed.len(), MAX_LISTED_ERRORS);
    assert_eq!(listed[0].field, "f0");
    assert_eq!(problem.errors_omitted, Some(500 - MAX_LISTED_ERRORS as u64));
    assert!(problem.detail.contains("500"), "{}", problem.detail);

    let short = ApiError::validation("x", "y").problem();
    assert_eq!(short.errors.unwrap().len(), 1);
    assert_eq!(
        short.errors_omitted, None,
        "absent when nothing is left out"
    );
}
