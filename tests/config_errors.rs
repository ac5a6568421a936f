//! The real binary with a bad configuration: it stops with exit status 2 and one error
//! that names the key and the kind of problem, and never the value — which may be a
//! secret. No database is needed: the configuration is refused before anything connects.

use std::process::{Command, Output};

/// Looks like a signing secret, and must never appear in any output.
const SECRET: &str = "whsec_N3verPrintMeN3verPrintMe0123456789";

/// Runs `tokenmint <args>` in an empty directory with only `env` set.
fn tokenmint(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "config-errors-{}-{}",
        std::process::id(),
        args.join("-").replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenmint"));
    command.args(args).current_dir(&dir).env_clear();
    // If a configuration were (wrongly) accepted, fail fast rather than start a mongod.
    command.env(
        "TOKENMINT__MONGO__URI",
        "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200",
    );
    command.env("TOKENMINT__MONGO__SERVER_SELECTION_TIMEOUT_MS", "200");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("tokenmint runs")
}

/// Runs `tokenmint` as [`tokenmint`] does, for a start whose configuration passes, and
/// asserts that it ended on the database the helper points it at, which is not there:
/// within seconds (a database that never answered is waited for about as long as an
/// election takes), not after the five minutes a lease another instance renews is
/// waited for. Returns stderr.
fn accepted_then_no_database(args: &[&str], env: &[(&str, &str)]) -> String {
    let started = std::time::Instant::now();
    let output = tokenmint(args, env);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!stderr.contains("invalid configuration"), "{stderr}");
    assert!(stderr.contains("error: database unavailable"), "{stderr}");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        took < std::time::Duration::from_secs(120),
        "took {took:?} to give up on a database that never answered"
    );
    stderr
}

/// Asserts exit status 2 and one error naming every one of `names`, without the secret
/// in either stream; returns stderr.
fn refused(output: &Output, names: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    for name in names {
        assert!(stderr.contains(name), "{name:?} not named in: {stderr}");
    }
    for stream in [&stderr[..], &stdout[..]] {
        assert!(!stream.contains(SECRET), "the secret was printed: {stream}");
        assert!(
            !stream.contains("N3verPrintMe"),
            "part of the secret was printed: {stream}"
        );
    }
    assert_eq!(
        stderr.matches("invalid configuration").count(),
        1,
        "said once: {stderr}"
    );
    stderr
}

#[test]
fn a_secret_given_as_a_bare_string_is_named_by_key_and_never_printed() {
    for command in ["verify", "serve"] {
        let output = tokenmint(
            &[command],
            &[
                ("TOKENMINT__PROVIDERS__STRIPE__SCHEME", "stripe"),
                ("TOKENMINT__PROVIDERS__STRIPE__SECRETS", SECRET),
            ],
        );
        let stderr = refused(
            &output,
            &[
                "`providers.stripe.secrets`",
                "TOKENMINT__PROVIDERS__STRIPE__SECRETS",
                "not a string",
            ],
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}

#[test]
fn an_unusable_secret_names_its_provider_and_is_never_printed() {
    let short = "whsec_N3verPrintMe";
    let undecodable = "whsec_N3verPrintMe!!not-base64";
    // A provider, its scheme and secrets, and what the refusal names: the secret's place
    // in the list and the provider, never the secret.
    let cases = [
        (
            "BILLING",
            "stripe",
            format!("[\"{SECRET}\", \"{short}\"]"),
            ["providers.billing.secrets[1]", "provider `billing`"],
        ),
        (
            "ACME",
            "standard-webhooks",
            format!("[\"{undecodable}\"]"),
            ["providers.acme.secrets[0]", "provider `acme`"],
        ),
    ];
    for (name, scheme, secrets, named) in cases {
        let scheme_key = format!("TOKENMINT__PROVIDERS__{name}__SCHEME");
        let secrets_key = format!("TOKENMINT__PROVIDERS__{name}__SECRETS");
        let output = tokenmint(
            &["verify"],
            &[(&scheme_key, scheme), (&secrets_key, &secrets)],
        );
        refused(&output, &named);
    }
}

#[test]
fn other_bad_values_are_named_by_key_without_their_value() {
    let origins = format!("[\"{SECRET}\"]");
    // A command, the one variable it runs with, and what the refusal names.
    let cases: [(&str, &str, &str, &[&str]); 5] = [
        (
            "serve",
            "TOKENMINT__SERVER__CORS_ORIGINS",
            &origins,
            &["`server.cors_origins[0]`"],
        ),
        (
            "verify",
            "TOKENMINT__ISSUANCE__MAX_QUANTITY",
            "20000",
            &["`issuance.max_quantity`", "at most 10000"],
        ),
        (
            "verify",
            "TOKENMINT__ISSUANCE__MAX_BATCHES_IN_FLIGHT",
            "17",
            &["`issuance.max_batches_in_flight`", "from 2 to 16"],
        ),
        (
            "verify",
            "TOKENMINT__ISSUANCE__DEFAULT_MODE",
            SECRET,
            &["`issuance.default_mode`", "`upsert`, `atomic`"],
        ),
        (
            "verify",
            "TOKENMINT__LOG__FORMAT",
            SECRET,
            &["`log.format`", "TOKENMINT__LOG__FORMAT"],
        ),
    ];
    for (command, name, value, named) in cases {
        refused(&tokenmint(&[command], &[(name, value)]), named);
    }
}

#[test]
fn public_key_limits_that_cannot_hold_stop_the_start_naming_the_key() {
    // A proxy list entry that is no network: named by its index, never quoted.
    let output = tokenmint(
        &["serve"],
        &[(
            "TOKENMINT__SERVER__TRUSTED_PROXIES",
            &format!("[\"10.0.0.0/8\", \"{SECRET}/8\"]"),
        )],
    );
    refused(
        &output,
        &["`server.trusted_proxies`", "entry 1 is not a CIDR"],
    );

    // Waiters that would leave no connection for webhooks, trusted keys and probes.
    let output = tokenmint(
        &["serve"],
        &[
            ("TOKENMINT__SERVER__MAX_CONNECTIONS", "100"),
            ("TOKENMINT__ISSUANCE__MAX_WAITERS", "90"),
        ],
    );
    refused(
        &output,
        &[
            "`issuance.max_waiters`",
            "must leave 25 of server.max_connections (100)",
            "at most 75",
        ],
    );

    let output = tokenmint(
        &["serve"],
        &[("TOKENMINT__RATE_LIMIT__PER_ADDRESS_PER_SECOND", "0")],
    );
    refused(&output, &["`rate_limit.per_address_per_second`"]);
}

#[test]
fn a_config_file_that_does_not_parse_is_located_without_quoting_it() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-errors-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"\n"),
    )
    .unwrap();
    let output = tokenmint(&["verify", "--config", file.to_str().unwrap()], &[]);
    refused(&output, &["TOML parse error at line", "bad.toml"]);
}

/// A misspelt production would start with development's rules (a random admin key
/// printed, no keys needed): refused, naming the variable.
#[test]
fn a_misspelt_environment_is_refused() {
    for name in ["Production", "production ", "prod", "Staging"] {
        let output = tokenmint(&["serve"], &[("TOKENMINT_ENV", name)]);
        refused(&output, &["`TOKENMINT_ENV`"]);
    }
}

#[test]
fn production_refuses_an_adyen_provider_without_basic_credentials() {
    // An Adyen HMAC key: it must not be printed either.
    let key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    let secrets = format!("[\"{key}\"]");
    let adyen_in_production = |extra: &[(&str, &str)]| {
        let mut env = vec![
            ("TOKENMINT_ENV", "production"),
            ("TOKENMINT__PROVIDERS__PAY__SCHEME", "adyen"),
            ("TOKENMINT__PROVIDERS__PAY__SECRETS", secrets.as_str()),
        ];
        env.extend_from_slice(extra);
        tokenmint(&["serve"], &env)
    };
    let stderr = refused(
        &adyen_in_production(&[]),
        &[
            "`providers.pay.basic_auth_username`",
            "provider `pay`",
            "required in production",
        ],
    );
    assert!(!stderr.contains(key), "{stderr}");

    // The password alone is refused as well, and never printed.
    let stderr = refused(
        &adyen_in_production(&[("TOKENMINT__PROVIDERS__PAY__BASIC_AUTH_PASSWORD", SECRET)]),
        &["`providers.pay.basic_auth_username`", "provider `pay`"],
    );
    assert!(!stderr.contains(key), "{stderr}");
}

/// A password of digits alone, given in the environment, reads as a number: refused,
/// naming the key and how to keep it a string (double quotes), never printing it; quoted,
/// it is taken.
#[test]
fn a_secret_of_digits_in_the_environment_is_refused_with_how_to_quote_it() {
    let adyen = |password| {
        let secrets = "[\"44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056\"]";
        [
            ("TOKENMINT__PROVIDERS__PAY__SCHEME", "adyen"),
            ("TOKENMINT__PROVIDERS__PAY__SECRETS", secrets),
            (
                "TOKENMINT__PROVIDERS__PAY__BASIC_AUTH_USERNAME",
                "ws_tokenmint",
            ),
            ("TOKENMINT__PROVIDERS__PAY__BASIC_AUTH_PASSWORD", password),
        ]
    };
    let stderr = refused(
        &tokenmint(&["serve"], &adyen("20261207")),
        &["`providers.pay.basic_auth_password`", "double quotes"],
    );
    assert!(!stderr.contains("20261207"), "{stderr}");
    // Quoted: the configuration passes (the start then fails on the unreachable
    // database the helper points it at, not on the password).
    let stderr = accepted_then_no_database(&["serve"], &adyen("\"20261207\""));
    assert!(!stderr.contains("basic_auth_password"), "{stderr}");
}

#[test]
fn a_mongo_uri_asking_for_less_durability_is_refused_naming_the_option() {
    for (option, needed) in [
        ("w=1", "w=majority"),
        ("w=0", "w=majority"),
        ("journal=false", "journaled writes"),
        (
            "readPreference=secondaryPreferred",
            "readPreference=primary",
        ),
        ("readConcernLevel=local", "readConcernLevel=majority"),
    ] {
        // The credentials are the secret: never printed, nor is any part of the URI.
        let uri = format!("mongodb://tokenmint:{SECRET}@127.0.0.1:1/?{option}");
        for command in ["serve", "verify"] {
            let output = tokenmint(&[command], &[("TOKENMINT__MONGO__URI", uri.as_str())]);
            let stderr = refused(&output, &["`mongo.uri`", option, needed]);
            assert!(!stderr.contains("127.0.0.1"), "{stderr}");
        }
    }
}

/// A URI option that a setting sets (or tokenmint itself) to another value is refused,
/// naming the option and where to give it, rather than silently overridden; the same
/// value passes.
#[test]
fn a_mongo_uri_option_a_setting_overrides_is_refused_naming_both() {
    for (option, named) in [
        ("maxPoolSize=200", "`mongo.max_pool_size`"),
        (
            "serverSelectionTimeoutMS=30000",
            "`mongo.server_selection_timeout_ms`",
        ),
        (
            "connectTimeoutMS=9000",
            "`mongo.server_selection_timeout_ms`",
        ),
        ("heartbeatFrequencyMS=10000", "remove the option"),
    ] {
        let uri = format!("mongodb://tokenmint:{SECRET}@127.0.0.1:1/?{option}");
        let output = tokenmint(&["serve"], &[("TOKENMINT__MONGO__URI", uri.as_str())]);
        let stderr = refused(&output, &["`mongo.uri`", option, named]);
        assert!(!stderr.contains("127.0.0.1"), "{stderr}");
    }
    // As the settings say (the helper's selection timeout is 200 ms): not refused.
    let uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&maxPoolSize=64";
    accepted_then_no_database(&["serve"], &[("TOKENMINT__MONGO__URI", uri)]);
}

#[test]
fn a_key_listed_twice_is_refused_naming_the_setting() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-errors-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hash = "ab".repeat(32);
    let key = |id: &str, hash: &str| {
        format!("[[auth.keys]]\nid = \"{id}\"\nsha256 = \"{hash}\"\nscopes = [\"read\"]\n")
    };
    let run = |name: &str, toml: String| {
        let file = dir.join(name);
        std::fs::write(&file, toml).unwrap();
        tokenmint(&["verify", "--config", file.to_str().unwrap()], &[])
    };

    let output = run(
        "same-id.toml",
        format!("{}{}", key("web", &hash), key("web", &"cd".repeat(32))),
    );
    refused(&output, &["`auth.keys[1].id`", "`auth.keys[0].id`"]);

    let output = run(
        "same-hash.toml",
        format!("{}{}", key("web", &hash), key("backend", &hash)),
    );
    let stderr = refused(&output, &["`auth.keys[1].sha256`", "`auth.keys[0].sha256`"]);
    assert!(!stderr.contains(&hash), "the hash was printed: {stderr}");
}

/// Writes `content` to a file of its own for one test and answers its path.
fn secret_file(name: &str, content: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("secret-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

#[test]
fn a_secret_from_a_file_is_checked_like_an_inline_one_and_never_printed() {
    // The second line is too short for a Stripe secret.
    let path = secret_file("short", "whsec_0123456789abcdefghij\nwhsec_N3verPrintMe\n");
    let output = tokenmint(
        &["verify"],
        &[
            ("TOKENMINT__PROVIDERS__STRIPE__SCHEME", "stripe"),
            ("TOKENMINT__PROVIDERS__STRIPE__SECRETS_FILE", &path),
        ],
    );
    refused(&output, &["`providers.stripe.secrets[1]`"]);
}

#[test]
fn a_secret_file_that_cannot_be_read_or_that_repeats_a_key_is_named() {
    let missing = secret_file("present", "x").replace("present", "absent");
    let output = tokenmint(
        &["verify"],
        &[
            ("TOKENMINT__PROVIDERS__STRIPE__SCHEME", "stripe"),
            ("TOKENMINT__PROVIDERS__STRIPE__SECRETS_FILE", &missing),
        ],
    );
    refused(
        &output,
        &[
            "`providers.stripe.secrets_file`",
            &missing,
            "cannot be read",
        ],
    );

    let uri = secret_file("uri", &format!("mongodb://u:{SECRET}@127.0.0.1:1/\n"));
    // The harness sets `TOKENMINT__MONGO__URI`: with the file as well, that is two.
    let output = tokenmint(&["verify"], &[("TOKENMINT__MONGO__URI_FILE", &uri)]);
    refused(&output, &["`mongo.uri_file`", "`mongo.uri`", "set one"]);

    let password = secret_file("password", SECRET);
    let output = tokenmint(
        &["verify"],
        &[
            ("TOKENMINT__PROVIDERS__PAY__SCHEME", "adyen"),
            ("TOKENMINT__PROVIDERS__PAY__SECRETS", "[\"0011\"]"),
            ("TOKENMINT__PROVIDERS__PAY__BASIC_AUTH_PASSWORD", SECRET),
            (
                "TOKENMINT__PROVIDERS__PAY__BASIC_AUTH_PASSWORD_FILE",
                &password,
            ),
        ],
    );
    refused(
        &output,
        &["`providers.pay.basic_auth_password_file`", "set one"],
    );
}
