//! Reading tokens: one by id with its ETag, only the accounts a key may see, and the
//! listing's filters and pages.

use mongodb::bson::{Document, doc, oid::ObjectId};
use serde_json::{Value, json};

use super::change;
use crate::helpers::*;

#[tokio::test]
async fn read_a_token_with_its_etag() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_read_token", 1).await.remove(0);
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
    let mine = app.issue_tokens("pi_mine", 1).await.remove(0);
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
    let redeem = change(&app, ACCOUNT1_KEY, &theirs, "redeem", None, None).await;
    assert_problem(redeem, 404, "not_found").await;
    assert_eq!(
        app.stored_token(&theirs).await.get_str("status").unwrap(),
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
    let ids = app.issue_tokens("pi_list", 3).await;
    let mut other = issuance_body("pi_list_gold", 2);
    other["tokenType"] = json!("gold");
    other["owner"] = json!(OTHER_OWNER);
    app.issue(ADMIN_KEY, &other).await;
    change(&app, ADMIN_KEY, &ids[0], "redeem", None, None).await;

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

/// A listing limited to a key's accounts (`origin.accountId`, at every provider or at one)
/// is served by `tokens_account_id` (migration `0013`): its explain plan has no
/// collection scan.
#[tokio::test]
async fn an_account_limited_listing_is_served_by_an_index() {
    // The extra `[[auth.keys]]` replace the test keys: the ones this test uses again.
    let mixed = "test-mixed-accounts-key";
    let hash = tokenmint::http::auth::key_hash;
    let app = spawn_app_with(&format!(
        "[[auth.keys]]\nid = \"admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n\
         [[auth.keys]]\nid = \"acct1\"\nsha256 = \"{}\"\nscopes = [\"read\"]\naccounts = [\"acct_1\"]\n\
         [[auth.keys]]\nid = \"mixed\"\nsha256 = \"{}\"\nscopes = [\"read\"]\naccounts = [\"acct_1\", \"stripe/acct_2\"]\n",
        hash(ADMIN_KEY),
        hash(ACCOUNT1_KEY),
        hash(mixed),
    ))
    .await;
    for (payment, account) in [("pi_acct_plan_1", "acct_1"), ("pi_acct_plan_2", "acct_2")] {
        let mut body = issuance_body(payment, 3);
        body["accountId"] = json!(account);
        assert_eq!(app.issue(ADMIN_KEY, &body).await.status(), 201);
    }
    app.db.run_command(doc! { "profile": 2 }).await.unwrap();
    for (key, query) in [
        (ACCOUNT1_KEY, ""),
        (ACCOUNT1_KEY, "?tokenType=standard&limit=2"),
        (mixed, ""),
    ] {
        let response = app.get(key, &format!("/v1/tokens{query}")).await;
        assert_eq!(response.status(), 200, "{query}");
    }
    app.db.run_command(doc! { "profile": 0 }).await.unwrap();

    let profiled: Vec<Document> = {
        use futures::TryStreamExt;
        app.db
            .collection::<Document>("system.profile")
            .find(doc! { "command.find": "tokens", "command.filter.$or": { "$exists": true } })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    assert_eq!(profiled.len(), 3, "one find per listing: {profiled:?}");
    for entry in profiled {
        let command = entry.get_document("command").unwrap();
        let mut find = doc! { "find": "tokens" };
        for field in ["filter", "sort", "limit"] {
            if let Some(value) = command.get(field) {
                find.insert(field, value.clone());
            }
        }
        let explain = app
            .db
            .run_command(doc! { "explain": find, "verbosity": "queryPlanner" })
            .await
            .unwrap();
        let plan = explain
            .get_document("queryPlanner")
            .and_then(|p| p.get_document("winningPlan"))
            .map(|p| p.to_string())
            .unwrap_or_else(|_| panic!("no winning plan: {explain}"));
        assert!(!plan.contains("COLLSCAN"), "a collection scan: {plan}");
        // Without the index the planner shows no COLLSCAN either: it walks all of `_id_`
        // for the sort and filters every token, which is the same scan by another name.
        assert!(
            plan.contains("tokens_account_id"),
            "not the account index: {plan}"
        );
    }
}
