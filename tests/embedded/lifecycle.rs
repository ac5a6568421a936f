//! Starting and stopping: the service survives a restart on its data directory (its mongod
//! keeping no snapshot history), a failed start stops its mongod cleanly, `/readyz` turns
//! 503 the moment shutdown begins, and a terminal's Ctrl-C (SIGINT to the whole foreground
//! process group) drains the service's in-flight requests before mongod is stopped.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokenmint::settings::Settings;
use tokenmint::startup::Application;
use tokenmint_test_support::token_ids;

use super::KEY;
use super::data_dir::{
    alive, assert_mongod_stopped, config_text, lock_pid, mongod_port, processes_naming,
    write_config, write_config_with,
};
use super::server::{
    HalfSentIssuance, Server, post_issuance, readyz, run, tokenmint, unpooled_client,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_embedded_mongod_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path(), &data_dir);
    let http = tokenmint_test_support::http_client_builder()
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
    // It keeps no snapshot history: the index keys redemptions delete must not stay in
    // the way of the next reads for MongoDB's default five minutes.
    let direct = format!(
        "mongodb://127.0.0.1:{}/?directConnection=true",
        mongod_port(&data_dir)
    );
    let window = mongodb::Client::with_uri_str(&direct)
        .await
        .unwrap()
        .database("admin")
        .run_command(
            mongodb::bson::doc! { "getParameter": 1, "minSnapshotHistoryWindowInSeconds": 1 },
        )
        .await
        .unwrap();
    assert_eq!(
        window.get_i32("minSnapshotHistoryWindowInSeconds"),
        Ok(0),
        "{window}"
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
    let in_flight = HalfSentIssuance::start(address).await;
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
    let response = in_flight.finish().await;
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_mongod_stopped(&data_dir);
}

/// Ctrl-C in a terminal signals the whole foreground process group. The real binary leads
/// its own group here, as a shell's foreground job does; SIGINT to that group while a
/// request is in flight must leave mongod running (it is in a group of its own) until the
/// request has finished, then both exit cleanly and no mongod is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_to_the_process_group_drains_before_mongod_stops() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "shutdown_grace_ms = 30000", true);
    let http = unpooled_client();
    let mut server =
        tokio::task::block_in_place(|| Server::start_in_own_group(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    let mongod = lock_pid(&data_dir).expect("mongod holds its data directory");
    assert!(alive(mongod));

    // An issuance in flight: its headers and half of its body sent.
    let address = server.address.trim_start_matches("http://").to_owned();
    let in_flight = HalfSentIssuance::start(address.as_str()).await;

    server.interrupt_group();
    // Shutdown has begun (the service logs it, and no longer reports ready)...
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.logs().contains("shutting down") {
        assert!(
            Instant::now() < deadline,
            "no shutdown began:\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and a second later, mongod still runs: the SIGINT did not reach it. A pid alone
    // would not show it (an exited, unreaped mongod still answers kill(pid, 0)): it still
    // holds its data directory and accepts connections.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        alive(mongod),
        "mongod got the terminal's SIGINT:\n{}",
        server.logs()
    );
    assert_eq!(
        lock_pid(&data_dir),
        Some(mongod),
        "mongod still holds its data"
    );
    let mongod_address = std::net::SocketAddr::from(([127, 0, 0, 1], mongod_port(&data_dir)));
    assert!(
        std::net::TcpStream::connect_timeout(&mongod_address, Duration::from_secs(2)).is_ok(),
        "mongod no longer accepts connections while tokenmint drains"
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "tokenmint waits for its request"
    );

    // The request completes against the still-running database.
    let response = in_flight.finish().await;
    assert!(
        response.starts_with("HTTP/1.1 201"),
        "{response}\n{}",
        server.logs()
    );

    // Then both exit cleanly, tokenmint stopping mongod itself.
    let status = tokio::task::block_in_place(|| server.wait_for_exit(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    assert!(
        server.logs().contains("embedded mongod stopped"),
        "mongod was not stopped by tokenmint:\n{}",
        server.logs()
    );
    assert!(!alive(mongod), "mongod {mongod} left running");
    assert_mongod_stopped(&data_dir);
}
