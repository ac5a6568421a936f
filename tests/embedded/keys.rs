//! API keys in embedded mode: the development key survives a restart, and `keys new`
//! prints a key once with an entry to paste into the configuration.

use std::time::Duration;

use tokenmint::domain::{AccountGrant, Scope};
use tokenmint::http::auth::{ApiKeys, key_hash};
use tokenmint::settings::Settings;

use super::data_dir::{assert_mongod_stopped, write_config_with};
use super::server::{Server, printed_dev_key, run, tokenmint};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_key_survives_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "", false);
    let http = tokenmint_test_support::http_client_builder()
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
        "acct_1,stripe/acct_2",
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
    assert_eq!(entry.scopes, [Scope::Read, Scope::IssuancesWrite]);
    let grant = |entry: &str| AccountGrant::parse(entry).unwrap();
    assert_eq!(
        entry.accounts.as_deref(),
        Some(&[grant("acct_1"), grant("stripe/acct_2")][..])
    );
    let principal = ApiKeys::from_settings(&settings.auth.keys)
        .authenticate(&key)
        .expect("the printed key matches its entry");
    assert!(principal.can_see("paddle", "acct_1") && principal.can_see("stripe", "acct_2"));
    assert!(!principal.can_see("paddle", "acct_2") && !principal.can_see("stripe", "acct_3"));

    // Defaults: a generated id, admin; a fresh key every time.
    let (code, again, stderr) = run(tokenmint(&config, dir.path(), &["keys", "new"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("admin"), "{stderr}");
    let settings = Settings::with_overrides(&[&again]).unwrap();
    assert_eq!(settings.auth.keys[0].scopes, [Scope::Admin]);
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
