//! What the service documents about itself: every problem type resolves to its page,
//! `/docs` loads nothing from another host, and `Retry-After` is whole seconds, rounded up.

use super::header;
use crate::helpers::*;

#[tokio::test]
async fn every_problem_type_resolves() {
    let app = spawn_app().await;
    // The codes the OpenAPI document enumerates: each resolves, to its own description.
    let doc =
        serde_json::to_value(<tokenmint::http::ApiDoc as utoipa::OpenApi>::openapi()).unwrap();
    let codes: Vec<String> = doc["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode is an enum in the OpenAPI document")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert!(codes.len() >= 20, "{codes:?}");
    for code in [
        "method_not_allowed",
        "version_conflict",
        "signature_invalid",
    ] {
        assert!(codes.iter().any(|c| c == code), "{code}");
    }
    for code in &codes {
        let response = app
            .http
            .get(app.url(&format!("/problems/{code}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(
            header(&response, "content-type").as_deref(),
            Some("application/json")
        );
        let described = json(response).await;
        assert_eq!(described["code"], code.as_str());
        assert!(described["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(
            described["description"]
                .as_str()
                .is_some_and(|t| t.len() > 20)
        );
        let status = described["status"].as_u64().unwrap();
        assert!((400..600).contains(&status), "{code}: {status}");
    }

    // Problems the service actually answers with: their `type` resolves to their code,
    // status and title.
    let answers = vec![
        app.http.get(app.url("/nowhere")).send().await.unwrap(),
        app.http.delete(app.url("/healthz")).send().await.unwrap(),
        app.get("nope", "/v1/tokens").await,
        app.issue(READER_KEY, &issuance_body("pi_types", 1)).await,
        app.get(READER_KEY, "/v1/tokens?limit=0").await,
        app.get(READER_KEY, "/v1/tokens/65f1a0c2b3d4e5f60123ffff")
            .await,
        app.issue_raw("application/json", "{").await,
        app.issue_raw("text/plain", "x").await,
    ];
    let mut seen = Vec::new();
    for response in answers {
        let status = response.status().as_u16();
        let problem = json(response).await;
        let problem_type = problem["type"].as_str().unwrap().to_owned();
        assert_eq!(
            problem_type,
            format!("/problems/{}", problem["code"].as_str().unwrap())
        );
        let described = json(app.http.get(app.url(&problem_type)).send().await.unwrap()).await;
        assert_eq!(described["code"], problem["code"]);
        assert_eq!(described["status"], status);
        assert_eq!(described["title"], problem["title"]);
        seen.push(status);
    }
    assert_eq!(seen, [404, 405, 401, 403, 422, 404, 400, 415]);

    // Unknown codes are a 404 problem (whose own type resolves).
    for unknown in ["no_such_code", "NOT_FOUND", "not_found%00", "%FF"] {
        let response = app
            .http
            .get(app.url(&format!("/problems/{unknown}")))
            .send()
            .await
            .unwrap();
        assert_problem(response, 404, "not_found").await;
    }
    let response = app.http.get(app.url("/problems/")).send().await.unwrap();
    assert_problem(response, 404, "not_found").await;
}

#[tokio::test]
async fn docs_request_nothing_from_another_host() {
    let app = spawn_app().await;
    let get = |path: &'static str| {
        let request = app.http.get(app.url(path));
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            response.text().await.unwrap()
        }
    };
    let html = get("/docs/").await;
    let initializer = get("/docs/swagger-initializer.js").await;
    // Swagger UI's online validator (validator.swagger.io) is off.
    assert!(
        initializer.contains("\"validatorUrl\": \"none\""),
        "{initializer}"
    );
    assert!(initializer.contains("/openapi.json"), "{initializer}");
    for (name, text) in [
        ("index.html", &html),
        ("swagger-initializer.js", &initializer),
    ] {
        for external in ["http://", "https://", "\"//", "'//", "=//"] {
            assert!(
                !text.contains(external),
                "{name} names another host ({external}):\n{text}"
            );
        }
    }
    // Every script, style and icon the page loads is relative, and served here.
    let mut loaded = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for (start, _) in html.match_indices(attribute) {
            let rest = &html[start + attribute.len()..];
            let target = &rest[..rest.find('"').unwrap()];
            loaded.push(target.to_owned());
        }
    }
    assert!(loaded.len() >= 3, "{loaded:?}");
    for target in loaded {
        let relative = target.strip_prefix("./").unwrap_or(&target);
        assert!(
            !relative.contains(':') && !relative.starts_with('/'),
            "{target}"
        );
        let response = app
            .http
            .get(app.url(&format!("/docs/{relative}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{target}");
        // Stylesheets load nothing from elsewhere either (fonts, images: inline only).
        if relative.ends_with(".css") {
            let css = response.text().await.unwrap();
            assert!(!css.contains("@import"), "{target}");
            for (start, _) in css.match_indices("url(") {
                let reference = css[start + 4..].trim_start_matches(['"', '\'']);
                assert!(
                    reference.starts_with("data:")
                        || !reference[..reference.len().min(12)].contains("//"),
                    "{target}: url({})",
                    &reference[..reference.len().min(40)]
                );
            }
        }
    }
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up() {
    // Three a second, no burst: the next request is allowed ~0.33 s later.
    let app = spawn_app_with("[rate_limit]\nper_key_per_second = 3\nburst = 1\n").await;
    let responses =
        futures::future::join_all((0..8).map(|_| app.get(READER_KEY, "/v1/tokens"))).await;
    let limited = responses
        .into_iter()
        .find(|r| r.status() == 429)
        .expect("a 429 among eight concurrent requests");
    // An integer, and 0.33 s rounds up to 1, never down to 0.
    assert_eq!(header(&limited, "retry-after").as_deref(), Some("1"));
    let problem = assert_problem(limited, 429, "rate_limited").await;
    assert_eq!(problem["detail"], "Rate limit exceeded; retry after 1 s.");
}

#[tokio::test]
async fn a_path_segment_that_does_not_decode_is_a_problem_naming_it() {
    let app = spawn_app().await;
    // %FF decodes to a byte that is not UTF-8: axum's own extractor answers text/plain.
    for (path, field) in [
        ("/v1/tokens/%FF", "tokenId"),
        ("/v1/balances/%C3%28", "owner"),
        ("/v1/webhooks/%FE", "provider"),
    ] {
        let request = if path.starts_with("/v1/webhooks") {
            app.http.post(app.url(path)).body("{}")
        } else {
            app.http.get(app.url(path)).bearer_auth(ADMIN_KEY)
        };
        let answer = request.send().await.unwrap();
        assert!(answer.headers().contains_key("x-request-id"), "{path}");
        let problem = assert_problem(answer, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["field"], field, "{path}: {problem}");
    }
}
