//! The invariant checker (`Store::verify`, `tokenmint verify`) finds each kind of violation
//! and nothing on a healthy database.

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use tokenmint::store::{Store, StoreConfig};

use crate::helpers::*;

async fn store_for(app: &TestApp) -> Store {
    Store::connect(
        &mongo_uri(),
        &app.db_name,
        std::time::Duration::from_secs(5),
        4,
        StoreConfig::default(),
    )
    .await
    .unwrap()
}

fn token(payment: &str, index: i64) -> Document {
    doc! {
        "owner": ObjectId::parse_str(OWNER).unwrap(), "type": "standard", "tokenIndex": index,
        "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment, "date": DateTime::now() },
        "status": "active", "_version": 0, "createdAt": DateTime::now(), "updatedAt": DateTime::now(),
    }
}

#[tokio::test]
async fn verify_is_clean_after_normal_traffic_and_names_each_violation() {
    let app = spawn_app().await;
    for (payment, quantity, mode) in [("pi_a", 3, "upsert"), ("pi_b", 2, "atomic")] {
        let mut body = issuance_body(payment, quantity);
        body["mode"] = serde_json::json!(mode);
        assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    }
    let store = store_for(&app).await;
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.issuances_checked, 2);
    assert_eq!(report.tokens_checked, 5);

    let tokens = app.db.collection::<Document>("tokens");
    // A partial set: pi_a loses its last token.
    tokens
        .delete_one(doc! { "origin.paymentIntentId": "pi_a", "tokenIndex": 2 })
        .await
        .unwrap();
    // An orphan token (no issuance record) that also lacks _version.
    let mut orphan = token("pi_orphan", 0);
    orphan.remove("_version");
    tokens.insert_one(orphan).await.unwrap();
    // A pending issuance whose payment is known to have succeeded.
    app.db.collection::<Document>("issuances").insert_one(doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_pending", "owner": ObjectId::new(),
        "tokenType": "standard", "quantity": 1, "paymentDate": DateTime::now(), "mode": "upsert",
        "status": "pending", "createdAt": DateTime::now(),
    }).await.unwrap();
    app.db.collection::<Document>("payments").insert_one(doc! {
        "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_pending", "status": "succeeded", "version": 1,
    }).await.unwrap();

    let report = store.verify().await.unwrap();
    assert!(!report.is_clean());
    assert_eq!(report.wrong_token_sets.count, 1, "{report}");
    assert!(
        report.wrong_token_sets.samples[0].contains("stripe/acct_1/pi_a"),
        "{report}"
    );
    assert_eq!(report.orphan_tokens.count, 1, "{report}");
    assert_eq!(report.tokens_without_version.count, 1, "{report}");
    assert_eq!(report.stranded_pending.count, 1, "{report}");
    assert_eq!(
        report.duplicate_tokens.count, 0,
        "the unique index makes duplicates impossible"
    );
    assert_eq!(report.violations(), 4);

    // The CLI prints the same and exits non-zero.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmint"))
        .arg("verify")
        .env("TOKENMINT__MONGO__URI", mongo_uri())
        .env("TOKENMINT__MONGO__DATABASE", &app.db_name)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("4 violation(s)"), "{stdout}");
    assert!(stdout.contains("pi_orphan"), "{stdout}");

    // The retry repairs the partial set; the report shrinks accordingly.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_a", 3))
            .await
            .status(),
        200
    );
    assert_eq!(store.verify().await.unwrap().wrong_token_sets.count, 0);
}
