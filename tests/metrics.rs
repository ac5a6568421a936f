//! `/metrics` after a created, a replayed and a conflicting issuance. Its own test binary:
//! the metrics recorder is process-wide, so no other test may issue concurrently.

#[path = "api/helpers.rs"]
mod helpers;

use helpers::*;
use serde_json::json;

#[tokio::test]
async fn issuance_outcomes_are_counted_and_the_text_parses() {
    let app = spawn_app().await;
    let body = issuance_body("pi_metrics", 2);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 200);
    let mut conflicting = body.clone();
    conflicting["quantity"] = json!(3);
    assert_eq!(app.issue(WRITER_KEY, &conflicting).await.status(), 409);

    let response = app.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = response.text().await.unwrap();
    let samples = parse_prometheus(&text);

    let value = |name: &str, labels: &str| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l == labels)
            .map(|(_, _, v)| *v)
            .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in:\n{text}"))
    };
    assert_eq!(
        value("tokenmint_issuances_total", "outcome=\"created\""),
        1.0
    );
    assert_eq!(
        value("tokenmint_issuances_total", "outcome=\"replayed\""),
        1.0
    );
    assert_eq!(
        value("tokenmint_issuances_total", "outcome=\"conflict\""),
        1.0
    );
    assert_eq!(value("tokenmint_tokens_created_total", ""), 2.0);
    let requests = samples
        .iter()
        .filter(|(n, l, _)| {
            n == "tokenmint_http_requests_total" && l.contains("route=\"/v1/issuances\"")
        })
        .map(|(_, _, v)| v)
        .sum::<f64>();
    assert_eq!(requests, 3.0);
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n == "tokenmint_http_request_duration_seconds_bucket")
    );
}

/// A strict reading of the text exposition format: every line is a comment (`# HELP`,
/// `# TYPE`) or `name{labels} value`. Returns (name, labels, value) per sample.
fn parse_prometheus(text: &str) -> Vec<(String, String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                "bad comment: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (
                name,
                rest.strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels: {line}")),
            ),
            None => (series, ""),
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        samples.push((name.to_owned(), labels.to_owned(), value));
    }
    samples
}
