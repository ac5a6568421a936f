//! `/metrics`: issuance outcomes counted (in-process, its own test binary: the metrics
//! recorder is process-wide, so no other test may issue concurrently), and a fresh
//! `tokenmint serve` process: every family described, the known counters at 0 from the
//! start, process metrics, the build, the database probe, forged webhooks per provider.

use std::time::{Duration, Instant};

use tokenmint::telemetry::metric;
use tokenmint_test_support as helpers;

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
    // Each batch's mark came from the term of its token insert: none settled again (a
    // reply whose `opTime` went unread would send every batch down the slow path).
    assert_eq!(value(metric::BATCH_TERM_CHANGES_TOTAL, ""), 0.0);
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

/// Two providers, so the webhook counters of each are checked apart.
const PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = ["whsec_test_old_secret_0123456789"]

[providers.acme]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;

async fn scrape(http: &reqwest::Client, base: &str) -> (String, Vec<(String, String, f64)>) {
    let text = tokenmint_test_support::metrics_text(http, base).await;
    let samples = parse_prometheus(&text);
    (text, samples)
}

/// How many documents of `collection` in `db` match `filter`.
async fn count(db: &mongodb::Database, collection: &str, filter: mongodb::bson::Document) -> u64 {
    db.collection::<mongodb::bson::Document>(collection)
        .count_documents(filter)
        .await
        .unwrap()
}

fn sample(samples: &[(String, String, f64)], name: &str, labels: &str) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && l == labels)
        .map(|(_, _, v)| *v)
}

#[tokio::test]
async fn a_fresh_process_describes_every_family_and_counts_from_zero() {
    let scratch = ScratchDatabase::create("metrics_fresh").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.toml");
    std::fs::write(&config, PROVIDERS).unwrap();
    let service = Service::start_with(
        scratch.name(),
        &[("TOKENMINT_CONFIG", config.to_str().unwrap())],
    );
    let http = reqwest::Client::new();
    let (text, samples) = scrape(&http, &service.base).await;

    // Every family has HELP and TYPE, and every sample belongs to a described family.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|rest| rest.split(' ').next().unwrap())
        .collect();
    for family in &families {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no HELP for {family}:\n{text}"
        );
    }
    for (name, _, _) in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|f| families.contains(f)))
            .unwrap_or(name);
        assert!(families.contains(&family), "{name} has no TYPE:\n{text}");
    }

    // The counters whose labels are known are there at 0 before anything happened.
    let mut expected: Vec<(&str, String)> = vec![
        (metric::TOKENS_CREATED_TOTAL, String::new()),
        (metric::DUPLICATE_KEY_RETRIES_TOTAL, String::new()),
        (metric::BATCH_TERM_CHANGES_TOTAL, String::new()),
        (metric::TRANSACTION_RETRIES_TOTAL, String::new()),
    ];
    for limiter in metric::RATE_LIMITERS {
        expected.push((metric::RATE_LIMITED_TOTAL, format!("limiter=\"{limiter}\"")));
    }
    for outcome in metric::ISSUANCE_OUTCOMES {
        expected.push((metric::ISSUANCES_TOTAL, format!("outcome=\"{outcome}\"")));
    }
    // Today's names, written out: they are the stored `revocationReason`s too.
    for reason in ["refunded", "canceled", "failed", "partial_refund"] {
        expected.push((metric::TOKENS_REVOKED_TOTAL, format!("reason=\"{reason}\"")));
    }
    for outcome in metric::REPAIR_OUTCOMES {
        expected.push((metric::REPAIRS_TOTAL, format!("outcome=\"{outcome}\"")));
    }
    for operation in metric::TOKEN_OPERATIONS {
        expected.push((
            metric::VERSION_GATE_REJECTIONS_TOTAL,
            format!("collection=\"tokens\",operation=\"{operation}\""),
        ));
    }
    for provider in ["stripe", "acme"] {
        for outcome in metric::WEBHOOK_OUTCOMES {
            expected.push((
                metric::WEBHOOK_EVENTS_TOTAL,
                format!("provider=\"{provider}\",outcome=\"{outcome}\""),
            ));
        }
    }
    for (name, labels) in &expected {
        assert_eq!(
            sample(&samples, name, labels),
            Some(0.0),
            "{name}{{{labels}}} at 0 in:\n{text}"
        );
    }

    // MongoDB command latency is off by default (it costs a copy of every command).
    assert!(
        !text.contains(metric::MONGODB_COMMAND_DURATION_SECONDS),
        "{text}"
    );

    // The process, and the build.
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        let value = sample(&samples, name, "").unwrap_or_else(|| panic!("no {name}:\n{text}"));
        assert!(value >= 0.0, "{name} = {value}");
    }
    assert!(sample(&samples, "process_resident_memory_bytes", "").unwrap() > 0.0);
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        sample(&samples, metric::BUILD_INFO, &version),
        Some(1.0),
        "{text}"
    );

    // The database probe reports without any /readyz call.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, samples) = scrape(&http, &service.base).await;
        if sample(&samples, metric::MONGODB_UP, "") == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "tokenmint_mongodb_up never 1");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A forged delivery is counted for the provider it claimed to come from.
    let forged = http
        .post(format!("{}/v1/webhooks/stripe", service.base))
        .header("stripe-signature", "t=1,v1=00")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let (text, samples) = scrape(&http, &service.base).await;
    let rejected = |provider: &str| {
        sample(
            &samples,
            metric::WEBHOOK_EVENTS_TOTAL,
            &format!("provider=\"{provider}\",outcome=\"signature_rejected\""),
        )
    };
    assert_eq!(rejected("stripe"), Some(1.0), "{text}");
    assert_eq!(rejected("acme"), Some(0.0), "{text}");
    drop(service);
}

#[tokio::test]
async fn with_a_metrics_listener_the_public_port_serves_no_metrics() {
    let scratch = ScratchDatabase::create("metrics_listener").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.toml");
    std::fs::write(&config, PROVIDERS).unwrap();
    let service = Service::start_with(
        scratch.name(),
        &[
            ("TOKENMINT_CONFIG", config.to_str().unwrap()),
            ("TOKENMINT__SERVER__METRICS_BIND", "127.0.0.1:0"),
            ("TOKENMINT__TELEMETRY__MONGODB_COMMAND_METRICS", "true"),
        ],
    );
    // The metrics listener's address is logged right after the public one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics_base = loop {
        let log = service.recent_log();
        if let Some(at) = log.find("metrics on http://") {
            let rest = &log[at + "metrics on ".len()..];
            break rest[..rest.find("/metrics").unwrap()].to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address logged:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let http = reqwest::Client::new();
    let public = http
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 404);
    let other = http
        .get(format!("{metrics_base}/v1/tokens"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        404,
        "the metrics listener serves /metrics only"
    );

    // One issuance and one signed webhook, then their histograms, with their buckets.
    let issued = http
        .post(format!("{}/v1/issuances", service.base))
        .bearer_auth(SERVICE_KEY)
        .json(&issuance_body("pi_metrics_listener", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status(), 201);
    let event = json!({
        "id": "evt_metrics_listener", "type": "payment_intent.processing",
        "created": chrono::Utc::now().timestamp(),
        "data": { "object": { "id": "pi_metrics_webhook", "object": "payment_intent",
            "status": "processing", "amount": 100, "currency": "eur", "metadata": {} } }
    })
    .to_string();
    let signature = tokenmint::webhooks::signature::sign_stripe(
        "whsec_test_old_secret_0123456789",
        chrono::Utc::now().timestamp(),
        event.as_bytes(),
    );
    let delivered = http
        .post(format!("{}/v1/webhooks/stripe", service.base))
        .header("stripe-signature", signature)
        .header("content-type", "application/json")
        .body(event)
        .send()
        .await
        .unwrap();
    assert_eq!(
        delivered.status(),
        200,
        "{}",
        delivered.text().await.unwrap()
    );

    let (text, samples) = scrape(&http, &metrics_base).await;
    let bucket = |name: &str, labels: &str| sample(&samples, name, labels);
    assert_eq!(
        bucket(
            &format!("{}_bucket", metric::ISSUANCE_BATCH_SIZE),
            "le=\"256\""
        ),
        Some(1.0),
        "batch sizes in buckets:\n{text}"
    );
    // The issuance's wait for a writer, by its mode, in the latency buckets.
    assert_eq!(
        bucket(
            &format!("{}_bucket", metric::ISSUANCE_QUEUE_WAIT_SECONDS),
            "mode=\"upsert\",le=\"60\""
        ),
        Some(1.0),
        "queue waits in buckets:\n{text}"
    );
    assert_eq!(
        bucket(
            &format!("{}_bucket", metric::WEBHOOK_PROCESSING_DURATION_SECONDS),
            "provider=\"stripe\",le=\"60\""
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        samples.iter().any(|(name, labels, _)| {
            name == "tokenmint_http_request_duration_seconds_bucket"
                && labels.ends_with("le=\"60\"")
        }),
        "latency buckets up to 60 s:\n{text}"
    );
    // The issuance inserted its record and tokens: MongoDB command latency, by command.
    let inserts = bucket(
        &format!("{}_bucket", metric::MONGODB_COMMAND_DURATION_SECONDS),
        "command=\"insert\",outcome=\"ok\",le=\"60\"",
    );
    assert!(inserts.is_some_and(|n| n >= 1.0), "{text}");
    drop(service);
}

/// Tokens a write inserted are counted although its reply then failed: a completion of a
/// short set whose `update` applied but answered a write concern error (the majority did
/// not confirm it) still wrote its two tokens, and they are counted once, not again when
/// the retry finds them. A separate process: its counters are its own.
#[tokio::test]
async fn tokens_a_failed_reply_still_inserted_are_counted_once() {
    let scratch = ScratchDatabase::create("metrics_failed_reply").await;
    let app_name = unique_app_name();
    let service = Service::start_named(scratch.name(), &app_name, &[]);
    let http = reqwest::Client::new();
    let issue = || {
        http.post(format!("{}/v1/issuances", service.base))
            .bearer_auth(SERVICE_KEY)
            .json(&issuance_body("pi_counted_once", 3))
            .send()
    };
    assert_eq!(issue().await.unwrap().status(), 201);
    let created = |samples: &[(String, String, f64)]| {
        sample(samples, metric::TOKENS_CREATED_TOTAL, "").expect("the counter")
    };
    assert_eq!(created(&scrape(&http, &service.base).await.1), 3.0);

    // The failpoint's turn first: waiting for it (another test may hold it for a minute)
    // between the crash and the retry would let self-repair finish the set meanwhile.
    let turn = FailPointTurn::take().await;
    // A crash between the record and its last two tokens, as it leaves the set.
    let db = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .unwrap()
        .database(scratch.name());
    let tokens = db.collection::<mongodb::bson::Document>("tokens");
    let deleted = tokens
        .delete_many(mongodb::bson::doc! { "tokenIndex": { "$gte": 1 } })
        .await
        .unwrap();
    assert_eq!(deleted.deleted_count, 2);
    db.collection::<mongodb::bson::Document>("issuances")
        .update_one(
            mongodb::bson::doc! { "paymentIntentId": "pi_counted_once" },
            mongodb::bson::doc! { "$set": { "status": "issuing" } },
        )
        .await
        .unwrap();

    // The retry completes the set; its token upsert applies and answers a write concern
    // error, so the retry is not answered 2xx.
    let failed = turn
        .set(
            &app_name,
            &["update"],
            Fault::WriteConcernError { code: 64 },
            1,
        )
        .await;
    let answer = issue().await.unwrap();
    assert!(!answer.status().is_success(), "{}", answer.status());
    assert_eq!(failed.off().await, 1);
    assert_eq!(count(&db, "tokens", mongodb::bson::doc! {}).await, 3);
    assert_eq!(created(&scrape(&http, &service.base).await.1), 5.0);

    // The next retry finds the set whole: a replay, nothing more counted.
    assert_eq!(issue().await.unwrap().status(), 200);
    assert_eq!(count(&db, "tokens", mongodb::bson::doc! {}).await, 3);
    assert_eq!(created(&scrape(&http, &service.base).await.1), 5.0);
}

/// Where a batch's time is round trips the database spends no CPU on (every command of
/// the service held 10 ms, as a database far away makes it), more batches in flight
/// answer sooner, and the writers find it: the limit on batches in flight is kept above
/// two (a gauge of 4 means 3 was measured and kept, then 4 tried). Every issuance answered
/// 201 has its record issued and its token. A separate process: the gauge is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_round_trips_dominate_more_batches_go_in_flight() {
    const CLIENTS: usize = 8;
    let scratch = ScratchDatabase::create("metrics_in_flight").await;
    let app_name = unique_app_name();
    let service = Service::start_named(
        scratch.name(),
        &app_name,
        &[("TOKENMINT__ISSUANCE__MAX_BATCHES_IN_FLIGHT", "8")],
    );
    let http = reqwest::Client::new();
    let held = FailPoint::set(
        &app_name,
        &["find", "insert", "update"],
        Fault::Block { millis: 10 },
        i64::from(i32::MAX),
    )
    .await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (http, base, stop) = (http.clone(), service.base.clone(), stop.clone());
            tokio::spawn(async move {
                let mut issued = Vec::new();
                for n in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let payment = format!("pi_in_flight_{client}_{n}");
                    let answer = http
                        .post(format!("{base}/v1/issuances"))
                        .bearer_auth(SERVICE_KEY)
                        .json(&issuance_body(&payment, 1))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(answer.status(), 201, "{payment}");
                    issued.push(payment);
                }
                issued
            })
        })
        .collect();

    let gauge = |samples: &[(String, String, f64)]| {
        sample(
            samples,
            metric::ISSUANCE_BATCHES_IN_FLIGHT,
            "mode=\"upsert\"",
        )
        .unwrap_or(0.0)
    };
    // About 40 s on a quiet machine: four trials, two of them of one more to be won.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut highest = 0.0f64;
    while highest < 4.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        highest = highest.max(gauge(&scrape(&http, &service.base).await.1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut issued = Vec::new();
    for client in clients {
        issued.extend(client.await.unwrap());
    }
    held.off().await;
    assert!(highest >= 4.0, "the limit never passed 3: {highest}");

    let db = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .unwrap()
        .database(scratch.name());
    let answered = issued.len() as u64;
    assert_eq!(count(&db, "tokens", mongodb::bson::doc! {}).await, answered);
    assert_eq!(
        count(&db, "issuances", mongodb::bson::doc! { "status": "issued" }).await,
        answered
    );
    assert_eq!(
        count(&db, "issuances", mongodb::bson::doc! {}).await,
        answered
    );
}

/// Group commit writes a batch's tokens in one `insert`, whatever the batch's size: new
/// payments issued together cost two inserts per batch (its records', then its tokens'),
/// never one per payment. Counted by the command metrics of a fresh process, the first
/// inserts held a while so that the payments sent meanwhile queue and share batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_inserts_all_its_tokens_in_one_command() {
    const PAYMENTS: usize = 24;
    const QUANTITY: i64 = 3;
    let scratch = ScratchDatabase::create("metrics_token_insert").await;
    let app_name = unique_app_name();
    let service = Service::start_named(
        scratch.name(),
        &app_name,
        &[("TOKENMINT__TELEMETRY__MONGODB_COMMAND_METRICS", "true")],
    );
    let http = reqwest::Client::new();
    let (_, before) = scrape(&http, &service.base).await;
    let held = FailPoint::set(&app_name, &["insert"], Fault::Block { millis: 300 }, 2).await;
    let answers = futures::future::join_all((0..PAYMENTS).map(|n| {
        http.post(format!("{}/v1/issuances", service.base))
            .bearer_auth(SERVICE_KEY)
            .json(&issuance_body(&format!("pi_one_insert_{n}"), QUANTITY))
            .send()
    }))
    .await;
    for answer in answers {
        assert_eq!(answer.unwrap().status(), 201);
    }
    held.off().await;

    let (text, after) = scrape(&http, &service.base).await;
    let grown = |name: &str, labels: &str| {
        sample(&after, name, labels).unwrap_or(0.0) - sample(&before, name, labels).unwrap_or(0.0)
    };
    let batch_size = metric::ISSUANCE_BATCH_SIZE;
    let batches = grown(&format!("{batch_size}_count"), "");
    assert_eq!(
        grown(&format!("{batch_size}_sum"), ""),
        PAYMENTS as f64,
        "{text}"
    );
    assert!(
        batches < PAYMENTS as f64,
        "no batch held two payments:\n{text}"
    );
    let inserts = grown(
        &format!("{}_count", metric::MONGODB_COMMAND_DURATION_SECONDS),
        "command=\"insert\",outcome=\"ok\"",
    );
    assert_eq!(inserts, 2.0 * batches, "{batches} batches:\n{text}");

    let db = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .unwrap()
        .database(scratch.name());
    let issued = PAYMENTS as u64;
    assert_eq!(
        count(&db, "tokens", mongodb::bson::doc! {}).await,
        issued * QUANTITY as u64
    );
    assert_eq!(
        count(&db, "issuances", mongodb::bson::doc! { "status": "issued" }).await,
        issued
    );
}
