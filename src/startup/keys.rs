//! The API keys a start serves with: the configured ones, or in development a key made
//! for the run — on the embedded database kept beside its data (readable by its owner
//! only), so it survives restarts.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::http::auth::{ApiKeys, DEV_KEY_PREFIX, dev_key_settings, is_dev_key, random_key};
use crate::settings::Settings;

/// The file in the embedded data directory that keeps the development admin key.
pub const DEV_KEY_FILE: &str = "tokenmint-dev-key";

/// The configured keys. With none, production refuses to start, and a development start
/// gets an admin key: on the embedded database the one kept in its data directory
/// (created on first use, readable by its owner only), so it survives restarts; on a
/// configured `mongo.uri`, a random one for this run. The key is printed to the terminal,
/// never logged: log pipelines must not carry keys.
pub(super) fn api_keys(settings: &Settings) -> anyhow::Result<ApiKeys> {
    if !settings.auth.keys.is_empty() {
        return Ok(ApiKeys::from_settings(&settings.auth.keys));
    }
    settings.require_api_keys()?;
    let key = if settings.mongo.configured_uri().is_none() {
        let path = dev_key_path(settings);
        let (key, created) = load_or_create_dev_key(&path)?;
        let origin = if created {
            "generated an admin key, kept"
        } else {
            "uses the admin key kept"
        };
        eprintln!(
            "\nNo API key is configured, so this development start {origin} in {} (readable by you only; `tokenmint keys dev` prints it again):\n\n    {key}\n\nUse it as: Authorization: Bearer {key}\n",
            path.display()
        );
        key
    } else {
        let key = random_key(DEV_KEY_PREFIX);
        eprintln!(
            "\nNo API key is configured, so this development start generated an admin key (shown once, valid until it stops):\n\n    {key}\n\nUse it as: Authorization: Bearer {key}\n"
        );
        key
    };
    Ok(ApiKeys::from_settings(&[dev_key_settings(&key)]))
}

/// Where the development key of the embedded database is kept.
pub fn dev_key_path(settings: &Settings) -> PathBuf {
    settings.mongo.embedded.data_dir.join(DEV_KEY_FILE)
}

/// The development key kept in `path`, or `None` when there is none yet. A file others
/// can read is tightened to 0600; a damaged one is an error naming it.
pub fn read_dev_key(path: &Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(err).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot restrict {} to mode 0600", path.display()))?;
            tracing::warn!(file = %path.display(), "the development key file was readable by others; now mode 0600");
        }
    }
    let key = text.trim();
    if !is_dev_key(key) {
        anyhow::bail!(
            "{} does not hold a development key ({DEV_KEY_PREFIX} and 48 hex digits); delete it to get a new one",
            path.display()
        );
    }
    Ok(Some(key.to_owned()))
}

/// The development key kept in `path`, created (mode 0600) when missing; `true` when
/// created now. Written to a temporary file first and linked into place, so a concurrent
/// reader never sees half a key and two concurrent starts agree on one.
fn load_or_create_dev_key(path: &Path) -> anyhow::Result<(String, bool)> {
    if let Some(key) = read_dev_key(path)? {
        return Ok((key, false));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let key = random_key(DEV_KEY_PREFIX);
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let written = write_private(&temporary, &format!("{key}\n"));
    let linked = written.and_then(|()| std::fs::hard_link(&temporary, path));
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok((key, true)),
        // Another start created it first: use theirs.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            let key = read_dev_key(path)?
                .with_context(|| format!("{} vanished while being read", path.display()))?;
            Ok((key, false))
        }
        Err(err) => Err(err).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// Writes `text` to a new file `path` that only its owner can read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    #[cfg(unix)]
    {
        // The mode above only applies to a file created now.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(text.as_bytes())?;
    file.sync_all()
}
