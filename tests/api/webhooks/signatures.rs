//! Signatures: a delivery signed with any configured Stripe secret verifies (rotation);
//! a missing, malformed, stale or tampered one is refused and writes nothing, as are
//! unknown providers and bad Standard Webhooks signatures.

use mongodb::bson::doc;
use tokenmint::webhooks::signature::sign_stripe;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn signatures_rotation_and_refusals() {
    let app = app().await;
    // Signed only with the second (rotated-in) secret: accepted.
    let ok = deliver_stripe(
        &app,
        &intent_event("evt_rot", "processing", "pi_rot", now(), "1"),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let ok = send_stripe(
        &app,
        &intent_event("evt_rot_old", "processing", "pi_rot", now(), "1"),
        STRIPE_OLD,
        now(),
    )
    .await;
    assert_eq!(ok.status(), 200);

    let event = intent_event("evt_bad", "succeeded", "pi_bad_sig", now(), "2");
    let body = event.to_string();
    let good_header = sign_stripe(STRIPE_NEW, now(), body.as_bytes());
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        (
            "wrong secret",
            Some(sign_stripe("whsec_other", now(), body.as_bytes())),
            "signature_invalid",
        ),
        ("missing header", None, "signature_missing"),
        (
            "v0 only",
            Some(good_header.replace("v1=", "v0=")),
            "signature_invalid",
        ),
        (
            // Well past the 300 s tolerance on either side: the server reads its own clock
            // after this one, so a margin of one second would flake when the second ticks.
            "330 s old",
            Some(sign_stripe(STRIPE_NEW, now() - 330, body.as_bytes())),
            "signature_timestamp_out_of_tolerance",
        ),
        (
            "330 s ahead",
            Some(sign_stripe(STRIPE_NEW, now() + 330, body.as_bytes())),
            "signature_timestamp_out_of_tolerance",
        ),
    ];
    for (case, header, code) in cases {
        let mut request = app
            .http
            .post(app.url("/v1/webhooks/stripe"))
            .body(body.clone());
        if let Some(header) = header {
            request = request.header("stripe-signature", header);
        }
        let problem = assert_problem(request.send().await.unwrap(), 401, code).await;
        assert!(problem["detail"].is_string(), "{case}");
    }
    // A tampered body with a once-valid signature.
    let tampered = app
        .http
        .post(app.url("/v1/webhooks/stripe"))
        .header("stripe-signature", good_header)
        .body(body.replace("\"2\"", "\"200\""))
        .send()
        .await
        .unwrap();
    assert_problem(tampered, 401, "signature_invalid").await;
    assert_eq!(
        app.count("payments", doc! { "paymentIntentId": "pi_bad_sig" })
            .await,
        0
    );
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "evt_bad" })
            .await,
        0
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Unknown provider: 404. Standard Webhooks with a bad signature: 401.
    assert_problem(
        app.http
            .post(app.url("/v1/webhooks/paypal"))
            .body("{}")
            .send()
            .await
            .unwrap(),
        404,
        "not_found",
    )
    .await;
    let bad = app
        .http
        .post(app.url("/v1/webhooks/acme"))
        .header("webhook-id", "msg_x")
        .header("webhook-timestamp", now().to_string())
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(bad, 401, "signature_invalid").await;
}

#[tokio::test]
async fn secrets_read_from_a_file_verify_like_inline_ones() {
    // As a mounted secret: one per line, the rotated-out one first, a trailing newline.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stripe-secrets");
    std::fs::write(&file, format!("{STRIPE_OLD}\n\n{STRIPE_NEW}\n")).unwrap();
    let providers = format!(
        "[providers.stripe]\nscheme = \"stripe\"\nsecrets_file = {:?}\n",
        file.display().to_string()
    );
    let app = spawn_app_with(&providers).await;
    for (secret, payment) in [(STRIPE_OLD, "pi_file_old"), (STRIPE_NEW, "pi_file_new")] {
        let event = intent_event(&format!("evt_{payment}"), "succeeded", payment, now(), "2");
        let answer = send_stripe(&app, &event, secret, now()).await;
        assert_eq!(answer.status(), 200, "{secret}");
        assert_eq!(app.token_states(payment).await.len(), 2, "{payment}");
    }
    let forged = intent_event("evt_forged", "succeeded", "pi_file_forged", now(), "2");
    let answer = send_stripe(&app, &forged, "whsec_not_in_the_file_0123456789", now()).await;
    assert_problem(answer, 401, "signature_invalid").await;
    assert_eq!(
        app.count("payments", doc! { "paymentIntentId": "pi_file_forged" })
            .await,
        0
    );
}
