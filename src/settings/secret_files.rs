//! Secrets from files: every secret setting also accepted as `<key>_file`, a path.
//!
//! Kubernetes and Docker mount secrets as files, and a file holds a list (a provider's
//! rotated secrets, one per line) without JSON written inside an environment variable.
//! The files are read once, at load, into the settings they stand for, before
//! validation: from then on nothing can tell a secret read from a file from one given
//! inline, and the secret's own checks (a Stripe secret's shape, …) apply to both. An
//! error names the key and the file, never what the file holds.

use std::path::Path;

use secrecy::SecretString;

use super::errors::invalid;
use super::{Settings, SettingsError};

impl Settings {
    /// Reads every `<key>_file` into `<key>`; giving both is refused, naming both.
    pub(super) fn read_secret_files(&mut self) -> Result<(), SettingsError> {
        if let Some(path) = self.mongo.uri_file.take() {
            let given = self.mongo.configured_uri().is_some();
            self.mongo.uri = read_one("mongo.uri", given, &path)?.into();
        }
        for (name, provider) in &mut self.providers {
            let at = format!("providers.{name}");
            if let Some(path) = provider.secrets_file.take() {
                let given = !provider.secrets.is_empty();
                let key = format!("{at}.secrets");
                provider.secrets = read_lines(&key, given, &path)?;
            }
            if let Some(path) = provider.basic_auth_password_file.take() {
                let given = provider.basic_auth_password.is_some();
                let key = format!("{at}.basic_auth_password");
                provider.basic_auth_password = Some(read_one(&key, given, &path)?.into());
            }
        }
        Ok(())
    }
}

/// A single secret: the file's text without its trailing line break (editors and
/// `echo` add one; no secret ends with one).
fn read_one(key: &str, given: bool, path: &Path) -> Result<String, SettingsError> {
    let text = read(key, given, path)?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// A list of secrets: one per line, blank lines skipped.
fn read_lines(key: &str, given: bool, path: &Path) -> Result<Vec<SecretString>, SettingsError> {
    let text = read(key, given, path)?;
    Ok(text
        .lines()
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.trim().is_empty())
        .map(|line| SecretString::from(line.to_owned()))
        .collect())
}

fn read(key: &str, given: bool, path: &Path) -> Result<String, SettingsError> {
    let file_key = format!("{key}_file");
    if given {
        return Err(invalid(
            file_key,
            format!("is given together with `{key}`: set one of them"),
        ));
    }
    // The I/O error's own text names only the kind of failure, never the content.
    std::fs::read_to_string(path).map_err(|error| {
        invalid(
            &file_key,
            format!(
                "names a file that cannot be read ({}: {error})",
                path.display()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn write(dir: &Path, name: &str, content: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    }

    #[test]
    fn each_secret_setting_is_read_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let uri = write(
            dir.path(),
            "uri",
            "mongodb://db.internal:27017/?replicaSet=rs\n",
        );
        let key = write(
            dir.path(),
            "key",
            &format!("{}\r\n{}\n\n", "0a".repeat(32), "1b".repeat(32)),
        );
        let password = write(dir.path(), "password", "s3cret word\n");
        let settings = Settings::with_overrides(&[&format!(
            "[mongo]\nuri_file = {uri:?}\n\
             [providers.pay]\nscheme = \"adyen\"\nsecrets_file = {key:?}\n\
             basic_auth_username = \"notifier\"\nbasic_auth_password_file = {password:?}\n"
        )])
        .unwrap();
        assert_eq!(
            settings.mongo.configured_uri(),
            Some("mongodb://db.internal:27017/?replicaSet=rs")
        );
        let pay = &settings.providers["pay"];
        let secrets: Vec<&str> = pay.secrets.iter().map(|s| s.expose_secret()).collect();
        assert_eq!(secrets, ["0a".repeat(32), "1b".repeat(32)]);
        let password = pay.basic_auth_password.as_ref().unwrap().expose_secret();
        assert_eq!(password, "s3cret word");
        assert!(settings.mongo.uri_file.is_none() && pay.secrets_file.is_none());
    }

    #[test]
    fn an_empty_file_of_secrets_is_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let empty = write(dir.path(), "empty", "\n");
        let err = Settings::with_overrides(&[&format!(
            "[providers.stripe]\nscheme = \"stripe\"\nsecrets_file = {empty:?}\n"
        )])
        .unwrap_err();
        assert!(
            err.to_string().contains("`providers.stripe.secrets`"),
            "{err}"
        );
    }
}
