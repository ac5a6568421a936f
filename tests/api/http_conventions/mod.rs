//! HTTP conventions every operation shares: `WWW-Authenticate` on every 401 and 405 with
//! `Allow` for a known path's unsupported method ([`challenges`]), RFC 9110 strong
//! `If-Match` ([`if_match`]), and problem types that resolve, a self-contained `/docs` and
//! whole-second `Retry-After` ([`documents`]).

mod challenges;
mod documents;
mod if_match;

/// The value of header `name`, if any.
fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}
