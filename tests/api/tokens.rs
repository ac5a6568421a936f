//! The token lifecycle through the `_version` gate.

use futures::future::join_all;
use mongodb::bson::{Document, doc, oid::ObjectId};
use serde_json::{Value, json};

use crate::helpers::*;

/// Issues `quantity` tokens for `payment` (account acct_1) and returns their ids.
async fn issue_tokens(app: &TestApp, payment: &str, quantity: i64) -> Vec<String> {
    let response = app
        .issue(ADMIN_KEY, &issuance_body(payment, quantity))
        .await;
    assert_eq!(response.status(), 201);
    token_ids(&json(response).await)
}

async fn post(
    app: &TestApp,
    key: &str,
    path: impl Into<String>,
    if_match: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app.http.post(app.url(&path.into())).bearer_auth(key);
    if let Some(version) = if_match {
        request = request.header("if-match", version);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

async fn stored(app: &TestApp, id: &str) -> Document {
    app.db
        .collection::<Document>("tokens")
        .find_one(doc! { "_id": ObjectId::parse_str(id).unwrap() })
        .await
        .unwrap()
        .unwrap()
}

fn version_of(token: &Document) -> i64 {
    let v = token.get("_version").unwrap();
    v.as_i64().or(v.as_i32().map(i64::from)).unwrap()
}

#[tokio::test]
async fn read_a_token_with_its_etag() {
    let app = spawn_app().await;
    let id = issue_tokens(&app, "pi_read_token", 1).await.remove(0);
    let response = app.get(READER_KEY, &format!("/v1/tokens/{id}")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["etag"], "\"0\"");
    let token = json(response).await;
    assert_eq!(token["id"], id.as_str());
    assert_eq!(token["owner"], OWNER);
    assert_eq!(token["tokenType"], "standard");
    assert_eq!(token["tokenIndex"], 0);
    assert_eq!(token["status"], "active");
    assert_eq!(token["version"], 0);
    assert_eq!(token["origin"]["paymentIntentId"], "pi_read_token");

    assert_problem(
        app.get(READER_KEY, "/v1/tokens/nothex").await,
        422,
        "validation_failed",
    )
    .await;
    assert_problem(
        app.get(
            READER_KEY,
            &format!("/v1/tokens/{}", ObjectId::new().to_hex()),
        )
        .await,
        404,
        "not_found",
    )
    .await;
    assert_problem(
        app.get(WRITER_KEY, &format!("/v1/tokens/{id}")).await,
        403,
        "forbidden",
    )
    .await;
}

#[tokio::test]
async fn keys_limited_to_an_account_see_only_its_tokens() {
    let app = spawn_app().await;
    let mine = issue_tokens(&app, "pi_mine", 1).await.remove(0);
    let mut other = issuance_body("pi_theirs", 1);
    other["accountId"] = json!("acct_2");
    let theirs = token_ids(&json(app.issue(ADMIN_KEY, &other).await).await).remove(0);

    assert_eq!(
        app.get(ACCOUNT1_KEY, &format!("/v1/tokens/{mine}"))
            .await
            .status(),
        200
    );
    assert_problem(
        app.get(ACCOUNT1_KEY, &format!("/v1/tokens/{theirs}")).await,
        404,
        "not_found",
    )
    .await;
    let redeem = post(
        &app,
        ACCOUNT1_KEY,
        format!("/v1/tokens/{theirs}/redeem"),
        None,
        None,
    )
    .await;
    assert_problem(redeem, 404, "not_found").await;
    assert_eq!(
        stored(&app, &theirs).await.get_str("status").unwrap(),
        "active"
    );

    let page = json(app.get(ACCOUNT1_KEY, "/v1/tokens").await).await;
    let ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [mine.as_str()]);
}

#[tokio::test]
async fn redeem_then_the_state_rules() {
    let app = spawn_app().await;
    let ids = issue_tokens(&app, "pi_rules", 3).await;
    let (a, b, c) = (&ids[0], &ids[1], &ids[2]);

    // Redeem with a reference; the answer carries the new ETag.
    let response = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{a}/redeem"),
        Some("\"0\""),
        Some(json!({"reference": "order-7"})),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["etag"], "\"1\"");
    let token = json(response).await;
    assert_eq!(token["status"], "redeemed");
    assert_eq!(token["redemptionRef"], "order-7");
    let db = stored(&app, a).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(version_of(&db), 1);
    assert!(db.get_datetime("redeemedAt").is_ok());

    // Redeem / transfer / revoke of a redeemed token: 409, nothing changes.
    assert_problem(
        post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{a}/redeem"),
            None,
            None,
        )
        .await,
        409,
        "state_conflict",
    )
    .await;
    let transfer = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{a}/transfer"),
        Some("\"1\""),
        Some(json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_problem(transfer, 409, "state_conflict").await;
    let revoke = assert_problem(
        post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{a}/revoke"),
            None,
            None,
        )
        .await,
        409,
        "state_conflict",
    )
    .await;
    assert_eq!(revoke["currentStatus"], "redeemed");
    assert_eq!(version_of(&stored(&app, a).await), 1);

    // Revoke (empty body) then revoke again: 200 both times, version bumped once.
    let first = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{b}/revoke"),
        None,
        None,
    )
    .await;
    assert_eq!(first.status(), 200);
    let second = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{b}/revoke"),
        None,
        Some(json!({})),
    )
    .await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["etag"], "\"1\"");
    assert_eq!(version_of(&stored(&app, b).await), 1);
    // Redeem / transfer of a revoked token: 409.
    assert_problem(
        post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{b}/redeem"),
            None,
            None,
        )
        .await,
        409,
        "state_conflict",
    )
    .await;
    let transfer = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{b}/transfer"),
        Some("\"1\""),
        Some(json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_problem(transfer, 409, "state_conflict").await;

    // Transfer: If-Match required, then moves the owner and bumps the version.
    let missing = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{c}/transfer"),
        None,
        Some(json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_problem(missing, 428, "precondition_required").await;
    let bad_owner = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{c}/transfer"),
        Some("\"0\""),
        Some(json!({"newOwner": "nope"})),
    )
    .await;
    assert_eq!(
        assert_problem(bad_owner, 422, "validation_failed").await["errors"][0]["field"],
        "newOwner"
    );
    let moved = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{c}/transfer"),
        Some("\"0\""),
        Some(json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_eq!(moved.status(), 200);
    let db = stored(&app, c).await;
    assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OTHER_OWNER);
    assert_eq!(version_of(&db), 1);
}

#[tokio::test]
async fn bad_requests_to_state_changes() {
    let app = spawn_app().await;
    let id = issue_tokens(&app, "pi_bad", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    assert_problem(
        post(&app, ADMIN_KEY, "/v1/tokens/xyz/redeem", None, None).await,
        422,
        "validation_failed",
    )
    .await;
    let bad_match = assert_problem(
        post(&app, ADMIN_KEY, &path, Some("\"abc\""), None).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(bad_match["errors"][0]["field"], "If-Match");
    let unknown = assert_problem(
        post(
            &app,
            ADMIN_KEY,
            &path,
            None,
            Some(json!({"referense": "x"})),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(unknown["errors"][0]["field"], "referense");
    let long = post(
        &app,
        ADMIN_KEY,
        &path,
        None,
        Some(json!({"reference": "x".repeat(257)})),
    )
    .await;
    assert_problem(long, 422, "validation_failed").await;
    assert_problem(
        post(&app, READER_KEY, &path, None, None).await,
        403,
        "forbidden",
    )
    .await;
    assert_problem(
        post(
            &app,
            WRITER_KEY,
            format!("/v1/tokens/{id}/revoke"),
            None,
            None,
        )
        .await,
        403,
        "forbidden",
    )
    .await;
    assert_problem(
        post(
            &app,
            READER_KEY,
            format!("/v1/tokens/{id}/transfer"),
            Some("\"0\""),
            Some(json!({"newOwner": OTHER_OWNER})),
        )
        .await,
        403,
        "forbidden",
    )
    .await;
    let db = stored(&app, &id).await;
    assert_eq!(db.get_str("status").unwrap(), "active");
    assert_eq!(version_of(&db), 0);
}

#[tokio::test]
async fn a_stale_if_match_is_412_and_changes_nothing() {
    let app = spawn_app().await;
    let id = issue_tokens(&app, "pi_stale", 1).await.remove(0);
    let moved = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{id}/transfer"),
        Some("\"0\""),
        Some(json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_eq!(moved.status(), 200);

    let stale = post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{id}/redeem"),
        Some("\"0\""),
        None,
    )
    .await;
    let problem = assert_problem(stale, 412, "version_conflict").await;
    assert_eq!(problem["currentVersion"], 1);
    assert_eq!(problem["currentStatus"], "active");
    let db = stored(&app, &id).await;
    assert_eq!(db.get_str("status").unwrap(), "active");
    assert_eq!(version_of(&db), 1);

    let metrics = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "tokenmint_version_gate_rejections_total{collection=\"tokens\",operation=\"redeem\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_redeems_redeem_once() {
    let app = spawn_app().await;
    let ids = issue_tokens(&app, "pi_redeem_race", 2).await;
    // Without If-Match: one 200, the others re-read, see `redeemed`, and get 409.
    let plain = join_all((0..20).map(|_| {
        post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{}/redeem", ids[0]),
            None,
            None,
        )
    }))
    .await;
    // With the same If-Match: one 200, the others 412 (stale) or 409.
    let gated = join_all((0..20).map(|_| {
        post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{}/redeem", ids[1]),
            Some("\"0\""),
            None,
        )
    }))
    .await;
    for (id, answers) in [(&ids[0], plain), (&ids[1], gated)] {
        let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            1,
            "{statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| [200, 409, 412].contains(s)),
            "{statuses:?}"
        );
        let db = stored(&app, id).await;
        assert_eq!(db.get_str("status").unwrap(), "redeemed");
        assert_eq!(version_of(&db), 1, "_version incremented exactly once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transfer_and_redeem_one_wins() {
    let app = spawn_app().await;
    for round in 0..10 {
        let id = issue_tokens(&app, &format!("pi_tr_{round}"), 1)
            .await
            .remove(0);
        let transfer = post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{id}/transfer"),
            Some("\"0\""),
            Some(json!({"newOwner": OTHER_OWNER})),
        );
        let redeem = post(
            &app,
            ADMIN_KEY,
            format!("/v1/tokens/{id}/redeem"),
            Some("\"0\""),
            None,
        );
        let (transfer, redeem) = tokio::join!(transfer, redeem);
        let (t, r) = (transfer.status().as_u16(), redeem.status().as_u16());
        assert!(
            (t == 200) ^ (r == 200),
            "exactly one wins: transfer {t}, redeem {r}"
        );
        assert!([200, 409, 412].contains(&t) && [200, 409, 412].contains(&r));
        let db = stored(&app, &id).await;
        assert_eq!(version_of(&db), 1);
        if t == 200 {
            assert_eq!(db.get_str("status").unwrap(), "active");
            assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OTHER_OWNER);
        } else {
            assert_eq!(db.get_str("status").unwrap(), "redeemed");
            assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OWNER);
        }
    }
}

#[tokio::test]
async fn concurrent_writers_without_if_match_are_retried_not_lost() {
    // Revoke and redeem race without If-Match: the loser's retry re-reads and re-decides,
    // so the outcome is one terminal state and a consistent answer for the loser.
    let app = spawn_app().await;
    for round in 0..10 {
        let id = issue_tokens(&app, &format!("pi_rr_{round}"), 1)
            .await
            .remove(0);
        let (revoke, redeem) = tokio::join!(
            post(
                &app,
                ADMIN_KEY,
                format!("/v1/tokens/{id}/revoke"),
                None,
                None
            ),
            post(
                &app,
                ADMIN_KEY,
                format!("/v1/tokens/{id}/redeem"),
                None,
                None
            )
        );
        let db = stored(&app, &id).await;
        let status = db.get_str("status").unwrap();
        match status {
            "revoked" => {
                assert_eq!(revoke.status(), 200);
                assert_eq!(redeem.status(), 409);
            }
            "redeemed" => {
                assert_eq!(redeem.status(), 200);
                assert_eq!(revoke.status(), 409);
            }
            other => panic!("unexpected state {other}"),
        }
        assert_eq!(version_of(&db), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paging_visits_every_token_once_in_order_while_tokens_are_added() {
    let app = spawn_app().await;
    // 1,234 tokens for one owner, written directly (faster than 1,234 via HTTP).
    let owner = ObjectId::parse_str(OWNER).unwrap();
    let docs: Vec<Document> = (0..1234)
        .map(|i| doc! {
            "owner": owner, "type": "standard", "tokenIndex": i,
            "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_bulk", "date": mongodb::bson::DateTime::now() },
            "status": "active", "_version": 0,
            "createdAt": mongodb::bson::DateTime::now(), "updatedAt": mongodb::bson::DateTime::now(),
        })
        .collect();
    app.db
        .collection::<Document>("tokens")
        .insert_many(docs)
        .await
        .unwrap();
    let mut expected: Vec<String> = Vec::new();
    let all: Vec<Document> = {
        use futures::TryStreamExt;
        app.db
            .collection::<Document>("tokens")
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    expected.extend(all.iter().map(|d| d.get_object_id("_id").unwrap().to_hex()));

    // Meanwhile, issue more tokens for the same owner.
    let adder = async {
        for i in 0..10 {
            assert_eq!(
                app.issue(ADMIN_KEY, &issuance_body(&format!("pi_more_{i}"), 3))
                    .await
                    .status(),
                201
            );
        }
    };
    let walker = async {
        let mut seen: Vec<String> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut path = format!("/v1/tokens?owner={OWNER}&limit=100");
            if let Some(cursor) = &after {
                path.push_str(&format!("&after={cursor}"));
            }
            let page = json(app.get(READER_KEY, &path).await).await;
            seen.extend(
                page["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["id"].as_str().unwrap().to_owned()),
            );
            match page["nextAfter"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        seen
    };
    let ((), seen) = tokio::join!(adder, walker);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "no token repeated");
    assert_eq!(sorted, seen, "in _id order");
    for id in &expected {
        assert!(
            seen.contains(id),
            "token {id} that existed before the walk was skipped"
        );
    }
}

#[tokio::test]
async fn listing_filters_and_rejects_bad_parameters() {
    let app = spawn_app().await;
    let ids = issue_tokens(&app, "pi_list", 3).await;
    let mut other = issuance_body("pi_list_gold", 2);
    other["tokenType"] = json!("gold");
    other["owner"] = json!(OTHER_OWNER);
    app.issue(ADMIN_KEY, &other).await;
    post(
        &app,
        ADMIN_KEY,
        format!("/v1/tokens/{}/redeem", ids[0]),
        None,
        None,
    )
    .await;

    let count = |body: Value| body["items"].as_array().unwrap().len();
    assert_eq!(
        count(json(app.get(READER_KEY, "/v1/tokens").await).await),
        5
    );
    assert_eq!(
        count(
            json(
                app.get(READER_KEY, &format!("/v1/tokens?owner={OWNER}"))
                    .await
            )
            .await
        ),
        3
    );
    assert_eq!(
        count(json(app.get(READER_KEY, "/v1/tokens?tokenType=gold").await).await),
        2
    );
    assert_eq!(
        count(json(app.get(READER_KEY, "/v1/tokens?status=redeemed").await).await),
        1
    );
    let page = json(app.get(READER_KEY, "/v1/tokens?limit=2").await).await;
    assert_eq!(count(page.clone()), 2);
    assert!(page["nextAfter"].is_string());

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=x", "limit"),
        ("owner=zz", "owner"),
        ("status=gone", "status"),
        ("after=1", "after"),
        ("tokenType=$gt", "tokenType"),
        ("colour=red", "colour"),
    ] {
        let problem = assert_problem(
            app.get(READER_KEY, &format!("/v1/tokens?{query}")).await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(problem["errors"][0]["field"], field, "{query}");
    }
}
