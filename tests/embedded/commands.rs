//! Operator commands: beside a running service they use its mongod and leave it running
//! (while a client that sends half a request is cut off), without one they start and stop
//! their own; in production, nothing starts an embedded mongod.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use super::data_dir::{alive, assert_mongod_stopped, lock_pid, write_config, write_config_with};
use super::server::{Server, post_issuance, readyz, run, tokenmint, unpooled_client};

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
        // A ready answer stands for a second: the probe must see a check made after the
        // command.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
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
