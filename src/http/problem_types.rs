//! `GET /problems/{code}`: what each problem `type` a problem document carries means,
//! from the `problems` catalogue. No authentication: it describes the API, nothing about
//! payments or tokens.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;

use super::error::ApiError;
use super::problems::{ProblemCode, ProblemType};

/// Describe a problem type.
///
/// Every error answer is `application/problem+json` whose `type` is `/problems/{code}`;
/// this resolves it to the code's title, status and what a client should do about it.
#[utoipa::path(get, path = "/problems/{code}", tag = "problems",
    params(("code" = ProblemCode, Path, description = "A problem document's `code`")),
    responses(
        (status = 200, description = "The problem type", body = ProblemType),
        (status = 404, description = "`not_found`: no problem type of that code"),
    ))]
pub async fn problem_type(
    code: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<ProblemType>, ApiError> {
    code.ok()
        .and_then(|Path(code)| ProblemCode::parse(&code))
        .map(|code| axum::Json(code.describe()))
        .ok_or_else(|| ApiError::NotFound("No problem type of that code.".to_owned()))
}
