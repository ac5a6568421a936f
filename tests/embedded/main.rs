//! The embedded mode end to end, with the real binary: `tokenmint serve` with no
//! `mongo.uri` starts its own mongod on a data directory, serves, stops it on SIGTERM,
//! and a second start on the same directory finds the data again. Operator commands run
//! beside it use its mongod and leave it running; the development key survives restarts;
//! `keys new` prints a usable entry; production refuses the embedded mongod; a failed
//! start stops mongod cleanly; slow clients are cut off; `/readyz` turns 503 as soon as
//! shutdown begins.
//!
//! The tests are here; the binary as they run it is in `server.rs`, the data directory's
//! configuration and checks in `data_dir.rs`.

mod data_dir;
mod server;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokenmint::http::auth::{ApiKeys, key_hash};
use tokenmint::settings::Settings;
use tokenmint::startup::Application;
use tokenmint_test_support::token_ids;

use self::data_dir::{
    alive, assert_mongod_stopped, config_text, lock_pid, mongod_port, processes_naming,
    write_config, write_config_with,
};
use self::server::{
    Server, issuance, post_issuance, printed_dev_key, readyz, run, tokenmint, unpooled_client,
};

const KEY: &str = "embedded-test-admin-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_embedded_mongod_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path(), &data_dir);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    // First start: a fresh data directory.
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    assert!(
        processes_naming(&data_dir)
            .iter()
            .any(|cmdline| cmdline.contains("mongod")),
        "the embedded mongod runs on {data_dir:?}"
    );
    let (status, first) = post_issuance(&http, &server).await;
    assert_eq!(status, 201, "{first}\n{}", server.logs());
    assert_eq!(first["created"], 3);
    let ids = token_ids(&first);
    assert_eq!(ids.len(), 3);
    server.stop();
    assert_mongod_stopped(&data_dir);
    let port = mongod_port(&data_dir);
    server.assert_plain_logs();
    let first_logs = server.logs();
    assert!(
        first_logs.contains("embedded mongod stopped"),
        "mongod was stopped, not killed:\n{first_logs}"
    );
    drop(server);

    // Second start on the same data: the issuance is still there and replays.
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    let (status, replay) = post_issuance(&http, &server).await;
    assert_eq!(status, 200, "{replay}\n{}", server.logs());
    assert_eq!(replay["created"], 0);
    assert_eq!(token_ids(&replay), ids, "the same tokens");
    assert_eq!(replay["issuance"]["id"], first["issuance"]["id"]);
    assert_eq!(mongod_port(&data_dir), port, "mongod came back on its port");
    let read = http
        .get(server.url("/v1/issuances/stripe/acct_1/pi_embedded"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let read: Value = read.json().await.unwrap();
    assert_eq!(token_ids(&read), ids);
    server.stop();
    assert_mongod_stopped(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_use_the_running_mongod_and_leave_it_running() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "header_read_timeout_ms = 1000", true);
    let http = unpooled_client();
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    let (status, body) = post_issuance(&http, &server).await;
    assert_eq!(status, 201, "{body}\n{}", server.logs());
    let pid = lock_pid(&data_dir).expect("the service's mongod holds the data directory");

    for args in [
        &["verify"][..],
        &["migrate", "--dry-run"],
        &["duplicates"],
        &["verify", "--repair"],
    ] {
        let (code, stdout, stderr) =
            tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), args)));
        assert_eq!(code, 0, "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("using the embedded mongod already running"),
            "{args:?} did not use the running mongod:\n{stderr}"
        );
        assert!(
            !stderr.contains("started embedded mongod"),
            "{args:?} started a second mongod:\n{stderr}"
        );
        assert_eq!(lock_pid(&data_dir), Some(pid), "{args:?} replaced mongod");
        assert!(alive(pid), "{args:?} stopped the service's mongod");
        assert_eq!(
            readyz(&http, &server).await,
            200,
            "{args:?} took the database away:\n{}",
            server.logs()
        );
    }

    // A second `serve` on the same data is refused, and the first keeps its mongod.
    let (code, _, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["serve"])));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("already runs on"), "{stderr}");
    assert_eq!(lock_pid(&data_dir), Some(pid));
    assert_eq!(readyz(&http, &server).await, 200);

    // A client that sends half a request line is cut off after the header-read timeout.
    let address = server.address.trim_start_matches("http://").to_owned();
    let took = tokio::task::block_in_place(|| {
        // Timed from before the connection exists, so never shorter than the server's.
        let started = Instant::now();
        let mut slow = std::net::TcpStream::connect(&address).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        slow.write_all(b"GET /hea").unwrap();
        let mut rest = Vec::new();
        // EOF (or a reset) once the server closes it; a read timeout would be an error.
        match slow.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}"),
        }
        started.elapsed()
    });
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(15),
        "closed after {took:?}"
    );
    assert_eq!(readyz(&http, &server).await, 200);

    server.stop();
    assert_mongod_stopped(&data_dir);

    // With no service running, a command starts its own mongod and stops it after.
    let (code, stdout, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["verify"])));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("started embedded mongod"), "{stderr}");
    assert!(stderr.contains("embedded mongod stopped"), "{stderr}");
    assert_mongod_stopped(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_key_survives_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "", false);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let authorized = |server: &Server, key: &str| {
        let request = http
            .get(server.url("/v1/issuances/stripe/acct_1/pi_nothing"))
            .bearer_auth(key);
        async move { request.send().await.unwrap().status().as_u16() }
    };

    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    let key = printed_dev_key(&server.logs());
    let file = data_dir.join("tokenmint-dev-key");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{file:?} has mode {mode:o}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), key);
    assert_eq!(authorized(&server, &key).await, 404, "{}", server.logs());
    assert_eq!(authorized(&server, "tm_dev_wrong").await, 401);
    server.stop();
    drop(server);

    let (code, stdout, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["keys", "dev"])));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), key);

    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(
        printed_dev_key(&server.logs()),
        key,
        "a new key after a restart"
    );
    assert_eq!(authorized(&server, &key).await, 404, "{}", server.logs());
    server.stop();
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), key);
    assert_mongod_stopped(&data_dir);
}

#[test]
fn keys_new_prints_a_key_once_and_a_pasteable_entry() {
    let dir = tempfile::tempdir().unwrap();
    // `keys new` needs no configuration: a broken one does not stop it.
    let config = dir.path().join("broken.toml");
    std::fs::write(&config, "[server\n").unwrap();
    let args = [
        "keys",
        "new",
        "--id",
        "billing \"backend\"",
        "--scopes",
        "read,issuances:write",
        "--accounts",
        "acct_1,acct_2",
    ];
    let (code, stdout, stderr) = run(tokenmint(&config, dir.path(), &args));
    assert_eq!(code, 0, "{stderr}");
    let key = stderr
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("tm_"))
        .unwrap_or_else(|| panic!("no key on stderr:\n{stderr}"))
        .to_owned();
    assert!(
        !stdout.contains(&key),
        "the key itself must not go into the config"
    );
    // The entry loads as configuration, and the key authenticates against it.
    let settings = Settings::with_overrides(&[&stdout]).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    let entry = &settings.auth.keys[0];
    assert_eq!(entry.id, "billing \"backend\"");
    assert_eq!(entry.sha256, key_hash(&key));
    assert_eq!(entry.scopes, ["read", "issuances:write"]);
    assert_eq!(
        entry.accounts.as_deref(),
        Some(&["acct_1".to_owned(), "acct_2".to_owned()][..])
    );
    let principal = ApiKeys::from_settings(&settings.auth.keys)
        .authenticate(&key)
        .expect("the printed key matches its entry");
    assert!(principal.can_see("acct_2") && !principal.can_see("acct_3"));

    // Defaults: a generated id, admin; a fresh key every time.
    let (code, again, stderr) = run(tokenmint(&config, dir.path(), &["keys", "new"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("admin"), "{stderr}");
    let settings = Settings::with_overrides(&[&again]).unwrap();
    assert_eq!(settings.auth.keys[0].scopes, ["admin"]);
    assert!(settings.auth.keys[0].id.starts_with("key-"));
    assert_ne!(settings.auth.keys[0].sha256, entry.sha256);

    let (code, stdout, stderr) = run(tokenmint(
        &config,
        dir.path(),
        &["keys", "new", "--scopes", "read,tokens:burn"],
    ));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("unknown scope `tokens:burn`"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn production_refuses_the_embedded_mongod_before_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path(), &data_dir);
    for args in [&["serve"][..], &["verify"], &["migrate"]] {
        let mut command = tokenmint(&config, dir.path(), args);
        command.env("TOKENMINT_ENV", "production");
        let (code, _, stderr) = run(command);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains("TOKENMINT_ENV=production requires mongo.uri"),
            "{args:?}: {stderr}"
        );
        assert!(!data_dir.exists(), "{args:?} touched the data directory");
    }
    // No keys in production: refused before the database is contacted (the URI names a
    // port where nothing listens, so trying would fail differently, and later).
    let bare = dir.path().join("bare.toml");
    std::fs::write(
        &bare,
        "[mongo]\nuri = \"mongodb://127.0.0.1:9/?directConnection=true\"\n",
    )
    .unwrap();
    let mut command = tokenmint(&bare, dir.path(), &["serve"]);
    command.env("TOKENMINT_ENV", "production");
    let (code, _, stderr) = run(command);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("requires at least one [[auth.keys]]"),
        "{stderr}"
    );
    // `keys dev` has nothing to show in production.
    let mut command = tokenmint(&config, dir.path(), &["keys", "dev"]);
    command.env("TOKENMINT_ENV", "production");
    let (code, _, stderr) = run(command);
    assert_eq!(code, 2, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_stops_mongod_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // The listener is bound last, after mongod started and migrations ran: hold its port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = dir.path().join("taken.toml");
    let text = config_text(&data_dir, "", true).replace(
        "bind = \"127.0.0.1:0\"",
        &format!("bind = \"{}\"", taken.local_addr().unwrap()),
    );
    std::fs::write(&config, text).unwrap();
    let (code, _, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["serve"])));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot bind server.bind"), "{stderr}");
    assert!(stderr.contains("started embedded mongod"), "{stderr}");
    assert!(
        stderr.contains("embedded mongod stopped"),
        "not stopped cleanly:\n{stderr}"
    );
    assert!(!stderr.contains("SIGTERM"), "{stderr}");
    assert_mongod_stopped(&data_dir);
}

/// In process: `/readyz` reads the shutting-down flag, and `run_until_stopped` sets it
/// the moment shutdown begins, while an in-flight request is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_as_soon_as_shutdown_begins() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let settings =
        Settings::with_overrides(&[&config_text(&data_dir, "shutdown_grace_ms = 30000", true)])
            .unwrap();
    let http = unpooled_client();

    // The flag, set by hand: readyz answers 503 with the reason.
    let app = Application::build(&settings).await.expect("app builds");
    let base = format!("http://{}", app.local_addr());
    let flag = app.shutting_down();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    flag.begin();
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["reason"], "shutting down", "{body}");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The real thing: shutdown begins while a request is in flight.
    let app = Application::build(&settings)
        .await
        .expect("app builds again");
    let address = app.local_addr();
    let flag = app.shutting_down();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));
    let body = issuance().to_string();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!flag.is_set());
    stop_tx.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !flag.is_set() {
        assert!(
            Instant::now() < deadline,
            "shutdown began but the flag is not set"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !server.is_finished(),
        "the in-flight request was not waited for"
    );
    stream.write_all(rest.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        stream.read_to_string(&mut response),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_mongod_stopped(&data_dir);
}
