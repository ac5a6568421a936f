//! `openapi.yaml` is generated from the code (`tokenmint openapi > openapi.yaml`); this
//! test fails when the committed file and the code disagree.

use utoipa::OpenApi;

#[test]
fn committed_openapi_matches_the_code() {
    let generated = tokenmint::http::ApiDoc::openapi()
        .to_yaml()
        .expect("renders");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml exists");
    assert!(
        generated == committed,
        "openapi.yaml is stale: regenerate it with `cargo run -q -- openapi > openapi.yaml`"
    );
}

#[test]
fn every_operation_documents_its_errors_as_problems() {
    let doc = tokenmint::http::ApiDoc::openapi();
    for (path, item) in doc
        .paths
        .paths
        .iter()
        .filter(|(p, _)| p.starts_with("/v1/"))
    {
        let operations = [&item.get, &item.post].into_iter().flatten();
        for operation in operations {
            let has_problem = operation
                .responses
                .responses
                .iter()
                .any(|(status, _)| status.starts_with('4'));
            assert!(has_problem, "{path} documents no 4xx answer");
        }
    }
}
