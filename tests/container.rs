//! The container: `tokenmint healthcheck` against a real running service (ready → 0,
//! unreachable or answering 503 → 1), and a guard on the properties of `Dockerfile` and
//! `docker-compose.yml` that no image build here can check (no container engine runs in
//! the test environment).

use std::process::{Command, Output, Stdio};

use tokenmint_test_support::{ScratchDatabase, Service};

/// Runs `tokenmint healthcheck` with `args` and only `env` as configuration.
fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenmint"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TOKENMINT") {
            command.env_remove(name);
        }
    }
    command
        .arg("healthcheck")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("tokenmint runs")
}

fn described(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_when_ready_and_1_when_unreachable() {
    let scratch = ScratchDatabase::create("healthcheck").await;
    let service = Service::start(scratch.name());
    let address = service.base.strip_prefix("http://").unwrap().to_owned();

    // Run off the async runtime: the child waits on a service this runtime drives.
    let ready = tokio::task::spawn_blocking(move || {
        let by_url = healthcheck(&["--url", &format!("http://{address}/readyz")], &[]);
        // Without --url: /readyz on server.bind, as in the image.
        let by_bind = healthcheck(&[], &[("TOKENMINT__SERVER__BIND", &address)]);
        // The rest of the configuration is `serve`'s: a provider whose scheme only
        // `serve`'s own file names does not fail the check.
        let half_configured = healthcheck(
            &[],
            &[
                ("TOKENMINT__SERVER__BIND", &address),
                (
                    "TOKENMINT__PROVIDERS__STRIPE__SECRETS",
                    "[\"whsec_0123456789abcdefghij\"]",
                ),
            ],
        );
        (by_url, by_bind, half_configured)
    })
    .await
    .unwrap();
    for output in [&ready.0, &ready.1, &ready.2] {
        assert_eq!(output.status.code(), Some(0), "{}", described(output));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "ready");
    }

    // Nothing listens on a port just released.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let unreachable = tokio::task::spawn_blocking(move || {
        healthcheck(&["--url", &format!("http://127.0.0.1:{port}/readyz")], &[])
    })
    .await
    .unwrap();
    assert_eq!(
        unreachable.status.code(),
        Some(1),
        "{}",
        described(&unreachable)
    );
    assert_eq!(
        String::from_utf8_lossy(&unreachable.stdout).trim(),
        "not ready"
    );

    // Reachable but answering 503, as /readyz does while shutting down or without its
    // database: not ready either.
    let unready = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unready_url = format!("http://{}/readyz", unready.local_addr().unwrap());
    let answering = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut connection, _) = unready.accept().unwrap();
        let mut request = [0u8; 1024];
        let _ = connection.read(&mut request).unwrap();
        connection
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        String::from_utf8_lossy(&request).into_owned()
    });
    let output = healthcheck(&["--url", &unready_url], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", described(&output));
    assert!(
        answering
            .join()
            .unwrap()
            .starts_with("GET /readyz HTTP/1.1\r\n")
    );

    // A URL it cannot use is a usage error (2), not "not ready".
    for url in ["https://127.0.0.1/readyz", "http://127.0.0.1:1/re adyz"] {
        let bad = healthcheck(&["--url", url], &[]);
        assert_eq!(bad.status.code(), Some(2), "{url}: {}", described(&bad));
    }
    drop(service);
}

fn repository_file(name: &str) -> String {
    let path = format!("{}/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_dockerfile_is_pinned_unprivileged_minimal_and_checks_itself() {
    let dockerfile = repository_file("Dockerfile");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let last_user = instructions
        .iter()
        .rev()
        .find(|l| l.starts_with("USER "))
        .expect("a USER instruction");
    assert_eq!(*last_user, "USER 10001:10001", "numeric, non-root");
    let healthcheck = dockerfile
        .split("HEALTHCHECK")
        .nth(1)
        .expect("a HEALTHCHECK");
    let command = healthcheck.split("CMD").nth(1).expect("HEALTHCHECK CMD");
    let command = command.lines().next().unwrap();
    assert!(
        command.contains("\"tokenmint\", \"healthcheck\""),
        "the binary checks itself: {command}"
    );
    for tool in ["curl", "wget"] {
        assert!(
            !instructions.iter().any(|l| l.contains(tool)),
            "no {tool} needed in the image"
        );
    }
    // Builds reuse the registry and the build directory through BuildKit cache mounts.
    let build = instructions
        .iter()
        .position(|l| l.contains("--mount=type=cache,target=/src/target"))
        .expect("the build directory is a cache mount");
    assert!(
        instructions[build..]
            .iter()
            .take(3)
            .any(|l| l.contains("cargo build --release --locked"))
    );
    // Pinned: the build image to an exact Rust release; the runtime is distroless, with
    // no shell or package manager (so no RUN in its stage), and a stripped binary.
    let rust = instructions
        .iter()
        .find_map(|l| l.strip_prefix("ARG RUST=rust:"))
        .expect("the build image as an ARG");
    let release = rust.split('-').next().unwrap();
    assert_eq!(release.split('.').count(), 3, "an exact release: {rust}");
    assert!(
        release.split('.').all(|n| n.parse::<u32>().is_ok()),
        "{rust}"
    );
    assert!(instructions.contains(&"ARG RUNTIME=gcr.io/distroless/cc-debian12:nonroot"));
    let runtime_stage = dockerfile.rsplit("FROM ${RUNTIME}").next().unwrap();
    assert!(
        !runtime_stage.contains("RUN "),
        "nothing runs in the runtime stage"
    );
    assert!(dockerfile.contains("CARGO_PROFILE_RELEASE_STRIP=symbols"));
    // The bind is an environment variable: the health check, given none of `serve`'s
    // flags, reads the same one.
    assert!(
        runtime_stage.contains("TOKENMINT__SERVER__BIND=0.0.0.0:8080"),
        "{runtime_stage}"
    );
    for label in ["title", "description", "licenses", "version"] {
        assert!(
            dockerfile.contains(&format!("org.opencontainers.image.{label}=")),
            "OCI label {label}"
        );
    }
}

#[test]
fn compose_waits_for_a_writable_primary_and_restarts_on_failure() {
    let compose = repository_file("docker-compose.yml");
    assert!(
        compose.contains("image: mongo:8.0") || compose.contains("image: mongo:7.0"),
        "a MongoDB release still supported: {compose}"
    );
    assert!(
        compose.contains("db.hello().isWritablePrimary"),
        "mongo is healthy only with a writable primary"
    );
    let tokenmint = compose
        .split("\n  tokenmint:")
        .nth(1)
        .expect("a tokenmint service");
    assert!(tokenmint.contains("restart: on-failure"), "{tokenmint}");
    assert!(
        tokenmint.contains("condition: service_healthy"),
        "{tokenmint}"
    );
}
