//! The `Idempotency-Key` header on redeem, revoke, transfer and redemptions: a layer
//! around those handlers that reads the caller and the body first, asks the issuing
//! service whether this attempt runs, and either runs the handler and hands its answer
//! back to be kept, or answers from the key's first request (`Idempotent-Replayed:
//! true`). The rules are `issuing::idempotency`'s; this only translates. The attempt
//! travels to the handler in the request's extensions, so that an action that writes
//! commits its answer with its write; the handler marks an answer a retry may see
//! differently (`transient`).

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::{UtoipaMethodRouter, UtoipaMethodRouterExt};

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::extract::read_body;
use crate::domain::{IdempotencyKey, Scope};
use crate::issuing::{Answer, Begun, Finality, IdempotentRequest};

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header of an answer that repeats an earlier one.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The headers of an answer that are kept with it and replayed: what describes the body
/// and the resource, nothing about this connection or this request (`x-request-id`).
const KEPT_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::ETAG,
    header::LOCATION,
    IDEMPOTENT_REPLAYED,
];

/// `route` behind the layer that answers its retries, when it is served (`state`); the
/// document alone (`None`) has no state to give the layer, and needs none. `scope` is the
/// one the route's handler requires: the layer refuses a key without it first, as the
/// handler would, before it reads the body or claims the key (a caller that may not run
/// the action writes nothing, and hears 403 whatever it sent).
pub fn answering_retries(
    route: UtoipaMethodRouter<AppState>,
    state: Option<&AppState>,
    scope: Scope,
) -> UtoipaMethodRouter<AppState> {
    match state {
        Some(state) => route.layer(from_fn_with_state((state.clone(), scope), idempotent)),
        None => route,
    }
}

/// The layer: requests without the header pass straight through.
async fn idempotent(
    State((state, scope)): State<(AppState, Scope)>,
    req: Request,
    next: Next,
) -> Response {
    if !req.headers().contains_key(&IDEMPOTENCY_KEY) {
        return next.run(req).await;
    }
    run(&state, scope, req, next)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn run(
    state: &AppState,
    scope: Scope,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // The caller first: 401, then 403, whatever else the request says.
    let (mut parts, body) = req.into_parts();
    let principal = Arc::<Principal>::from_request_parts(&mut parts, state).await?;
    principal.require(scope)?;
    let key =
        parse_key(&parts.headers).map_err(|rule| ApiError::validation("Idempotency-Key", rule))?;
    parts.extensions.insert(principal.clone());
    // Read with the route's body limit, which travels in the extensions.
    let mut reading = Request::new(body);
    *reading.extensions_mut() = parts.extensions.clone();
    let bytes = read_body(reading, state).await?;
    let method = parts.method.to_string();
    let path = parts.uri.path().to_owned();
    let request = IdempotentRequest {
        key_id: &principal.key_id,
        key: &key,
        method: &method,
        path: &path,
        body: &bytes,
    };
    let attempt = match state.issuer.begin_idempotent(&request).await? {
        Begun::Proceed(attempt) => Arc::new(attempt),
        Begun::Replay(answer) => return Ok(replay(answer)),
        Begun::Reused => return Err(ApiError::IdempotencyKeyReused),
        Begun::InProgress => return Err(ApiError::RequestInProgress),
    };
    parts.extensions.insert(attempt.clone());
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let (parts, body) = response.into_parts();
    let finality = if parts.extensions.get::<Transient>().is_some() {
        Finality::Transient
    } else {
        Finality::Final
    };
    let body = to_bytes(body, usize::MAX)
        .await
        .map_err(|_| ApiError::Internal)?;
    let answer = Answer {
        status: parts.status.as_u16(),
        headers: KEPT_HEADERS
            .iter()
            .filter_map(|name| {
                let value = parts.headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), value.to_owned()))
            })
            .collect(),
        body: body.to_vec(),
    };
    // An answer the key could not keep is not given: its retry would run the action again.
    if let Err(err) = state
        .issuer
        .finish_idempotent(&attempt, &answer, finality)
        .await
    {
        tracing::warn!(error = %err, "could not keep the answer of an idempotency key");
        return Err(err.into());
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// The one `Idempotency-Key` of the request, valid.
/// The request's key, or the rule its header breaks.
fn parse_key(headers: &HeaderMap) -> Result<IdempotencyKey, String> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err("must be given at most once".to_owned());
    };
    value
        .to_str()
        .map_err(|_| IdempotencyKey::RULE.to_owned())
        .and_then(IdempotencyKey::parse)
}

/// Marks an answer the same request may see differently on a retry (`Finality::Transient`).
#[derive(Debug, Clone, Copy)]
struct Transient;

/// `response`, marked as an answer that a retry with the key may see differently: it is
/// not kept.
pub(super) fn transient(response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response.extensions_mut().insert(Transient);
    response
}

/// The response an answer describes: its status, its kept headers and its body.
pub(super) fn respond(answer: Answer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_TYPE);
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
    response
}

/// The kept answer, marked as a replay.
fn replay(answer: Answer) -> Response {
    let mut response = respond(answer);
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// An answer to be kept: `status`, a JSON `body`, and `headers` besides its
/// `Content-Type`.
pub(super) fn json_answer(
    status: StatusCode,
    headers: &[(HeaderName, String)],
    body: &impl serde::Serialize,
) -> Answer {
    let mut kept = vec![(
        header::CONTENT_TYPE.as_str().to_owned(),
        "application/json".to_owned(),
    )];
    kept.extend(
        headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.clone())),
    );
    Answer {
        status: status.as_u16(),
        headers: kept,
        // A view serializes whole; an empty body would only ever mean a bug.
        body: serde_json::to_vec(body).unwrap_or_default(),
    }
}
