//! Configuration errors, told so that an operator can fix them and nothing secret leaks:
//! every message names the key and the kind of problem, never the value.

use figment::Figment;

use super::ENV_PREFIX;

/// A configuration that cannot be used. Every message names the key at fault and the
/// kind of problem, and never the value, which may be a secret.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Reading or deserializing failed (each problem found, separated by `; `).
    #[error("invalid configuration: {0}")]
    Load(String),
    #[error("invalid configuration: `{key}` {message}")]
    Invalid { key: String, message: String },
    /// A rule of `TOKENMINT_ENV=production` the configuration does not meet for what the
    /// command does (`production`); the message names the settings it needs.
    #[error("{0}")]
    Production(&'static str),
}

pub(super) fn invalid(key: impl Into<String>, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// A figment error as one line per problem, each naming the key, the kind of problem and
/// where the value came from, but never the value itself. (figment's own message quotes
/// the value: `TOKENMINT__PROVIDERS__STRIPE__SECRETS=whsec_…` given as a bare string
/// instead of a list would print the secret.)
pub(super) fn load_error(figment: &Figment, error: figment::Error) -> SettingsError {
    let lines: Vec<String> = error.into_iter().map(|e| describe(figment, &e)).collect();
    SettingsError::Load(lines.join("; "))
}

fn describe(figment: &Figment, error: &figment::Error) -> String {
    use figment::error::Kind;
    let mut path = error.path.clone();
    let problem = match &error.kind {
        // An environment variable's value is read as a number or a boolean when it looks
        // like one: a password of digits alone is no string. Quoting it keeps it one.
        Kind::InvalidType(actual, expected)
            if expected.contains("string")
                && !matches!(actual, figment::error::Actual::Str(_))
                && from_environment(error) =>
        {
            format!(
                "must be {expected}, not {}: an environment variable's value that reads as one is one; put it in double quotes (\"…\") to keep it a string",
                kind_of(actual)
            )
        }
        Kind::InvalidType(actual, expected) => {
            format!("must be {expected}, not {}", kind_of(actual))
        }
        Kind::InvalidValue(_, expected) => format!("has an invalid value (expected {expected})"),
        Kind::InvalidLength(_, expected) => {
            format!("has the wrong number of items (expected {expected})")
        }
        Kind::UnknownVariant(_, expected) => format!("must be one of {}", one_of(expected)),
        // figment's path may already end with the field's name.
        Kind::UnknownField(field, _) => {
            push_field(&mut path, field);
            "is not a known key".to_owned()
        }
        Kind::MissingField(field) => {
            push_field(&mut path, field);
            "is required".to_owned()
        }
        Kind::DuplicateField(field) => {
            push_field(&mut path, field);
            "is given more than once".to_owned()
        }
        Kind::ISizeOutOfRange(_) | Kind::USizeOutOfRange(_) => "is out of range".to_owned(),
        Kind::Unsupported(actual) => format!("has an unsupported type ({})", kind_of(actual)),
        Kind::UnsupportedKey(actual, expected) => {
            format!(
                "has a key of the wrong type ({}, expected {expected})",
                kind_of(actual)
            )
        }
        // A free-form message (a file that cannot be read or parsed, a value a type's
        // parser refused) may quote what it read. Only its first line is kept — a TOML
        // parse error's position, not the snippet below it — and for a key, only when
        // it quotes no part of the value.
        Kind::Message(message) => {
            let first = message.lines().next().unwrap_or_default();
            if path.is_empty() {
                first.to_owned()
            } else if quotes_no_value(first, value_at(figment, &path)) {
                format!("has an invalid value ({first})")
            } else {
                "has an invalid value".to_owned()
            }
        }
    };
    let key = if path.is_empty() {
        String::new()
    } else {
        format!("`{}` ", key_of(&path))
    };
    format!("{key}{problem}{}", origin_of(error, &path))
}

/// The value at a figment path, through tables by key and lists by index (figment's own
/// `find_value` only goes through tables).
fn value_at(figment: &Figment, path: &[String]) -> Option<figment::value::Value> {
    use figment::value::Value;
    let (first, rest) = path.split_first()?;
    let mut value = figment.find_value(first).ok()?;
    for segment in rest {
        value = match value {
            Value::Dict(_, mut dict) => dict.remove(segment)?,
            Value::Array(_, mut items) => {
                let index: usize = segment.parse().ok()?;
                (index < items.len()).then(|| items.swap_remove(index))?
            }
            _ => return None,
        };
    }
    Some(value)
}

/// A figment path as an operator writes the key: a list's item by its index in brackets
/// (`auth.keys[0].scopes[1]`), as the validation messages name them.
fn key_of(path: &[String]) -> String {
    let mut key = String::new();
    for segment in path {
        if !key.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            key.push_str(&format!("[{segment}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

fn push_field(path: &mut Vec<String>, field: &str) {
    if path.last().map(String::as_str) != Some(field) {
        path.push(field.to_owned());
    }
}

/// Whether `message` quotes none of `value`: neither a whole scalar in it nor any eight
/// characters in a row of one. Without a value to compare, it might.
fn quotes_no_value(message: &str, value: Option<figment::value::Value>) -> bool {
    use figment::value::Value;
    fn scalars(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(_, s) => out.push(s.clone()),
            Value::Char(_, c) => out.push(c.to_string()),
            Value::Bool(_, b) => out.push(b.to_string()),
            Value::Num(_, n) => out.push(match (n.to_u128(), n.to_i128()) {
                (Some(u), _) => u.to_string(),
                (None, Some(i)) => i.to_string(),
                (None, None) => n.to_f64().unwrap_or_default().to_string(),
            }),
            Value::Empty(..) => {}
            Value::Dict(_, dict) => dict.values().for_each(|v| scalars(v, out)),
            Value::Array(_, items) => items.iter().for_each(|v| scalars(v, out)),
        }
    }
    let Some(value) = value else {
        return false;
    };
    let mut found = Vec::new();
    scalars(&value, &mut found);
    found.iter().all(|scalar| {
        let chars: Vec<char> = scalar.chars().collect();
        !message.contains(scalar.as_str())
            && chars
                .windows(8)
                .all(|w| !message.contains(&w.iter().collect::<String>()))
    })
}

/// Whether the value `error` is about came from an environment variable.
fn from_environment(error: &figment::Error) -> bool {
    error
        .metadata
        .as_ref()
        .is_some_and(|metadata| metadata.name.contains("environment variable"))
}

/// Where a value came from: the environment variable, or the file.
fn origin_of(error: &figment::Error, path: &[String]) -> String {
    let Some(metadata) = &error.metadata else {
        return String::new();
    };
    if metadata.name.contains("environment variable") {
        if path.is_empty() {
            return " (environment)".to_owned();
        }
        let variable = format!("{ENV_PREFIX}{}", path.join("__").to_ascii_uppercase());
        return format!(" (environment variable {variable})");
    }
    match &metadata.source {
        Some(source) => format!(" (in {} {source})", metadata.name),
        None => format!(" (in {})", metadata.name),
    }
}

/// What kind of value was given, without the value.
fn kind_of(actual: &figment::error::Actual) -> &'static str {
    use figment::error::Actual;
    match actual {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a number",
        Actual::Char(_) => "a character",
        Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit | Actual::Option => "empty",
        Actual::Seq => "a list",
        Actual::Map => "a table",
        Actual::NewtypeStruct
        | Actual::Enum
        | Actual::UnitVariant
        | Actual::NewtypeVariant
        | Actual::TupleVariant
        | Actual::StructVariant
        | Actual::Other(_) => "another kind of value",
    }
}

fn one_of(expected: &[&str]) -> String {
    let names: Vec<String> = expected.iter().map(|e| format!("`{e}`")).collect();
    names.join(", ")
}

#[cfg(test)]
pub(super) mod tests {
    use figment::providers::{Format, Toml};

    use super::*;
    use crate::settings::{DEFAULT_TOML, Settings};

    /// Loads `layers`, expecting an error; asserts it is one line, said once, names
    /// `key`, and quotes none of `values`.
    pub(in crate::settings) fn refused(layers: &[&str], key: &str, values: &[&str]) -> String {
        let err = Settings::with_overrides(layers).unwrap_err().to_string();
        assert_refusal_names_only(&err, key, values);
        err
    }

    /// Asserts that a configuration refusal `err` is one line, said once, names `key`,
    /// and quotes none of `values`: what every refused setting must look like, wherever
    /// it is checked (the provider secrets are checked by `webhooks`).
    pub(crate) fn assert_refusal_names_only(err: &str, key: &str, values: &[&str]) {
        assert!(err.contains(key), "{err}");
        for value in values {
            assert!(!err.contains(value), "{value:?} echoed in: {err}");
        }
        assert_eq!(err.matches("invalid configuration").count(), 1, "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    const SECRET_LIKE: &str = "whsec_Sup3rS3cretValueThatMustNeverBePrinted";

    #[test]
    fn load_errors_name_the_key_and_never_the_value() {
        // A bare string where a list belongs (the `TOKENMINT__…__SECRETS=whsec_…` mistake).
        let bare = format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = \"{SECRET_LIKE}\"");
        let err = refused(
            &[&bare],
            "`providers.stripe.secrets`",
            &[SECRET_LIKE, "Sup3r"],
        );
        assert!(err.contains("must be a sequence, not a string"), "{err}");
        let list_of_numbers = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [73219]";
        refused(&[list_of_numbers], "providers.stripe.secrets", &["73219"]);
        let err = refused(
            &["[issuance]\ndefault_mode = \"s3cr3t-mode\""],
            "`issuance.default_mode`",
            &["s3cr3t-mode"],
        );
        assert!(err.contains("`upsert`, `atomic`"), "{err}");
        refused(
            &["[issuance]\nmax_quantity = 98765432109"],
            "`issuance.max_quantity`",
            &["98765432109"],
        );
        refused(
            &["[issuance]\nmax_quantity = -7654"],
            "`issuance.max_quantity`",
            &["7654"],
        );
        // A parser's own message is kept when it quotes nothing of the value...
        let err = refused(
            &["[server]\nbind = \"s3cr3t:host\""],
            "`server.bind`",
            &["s3cr3t"],
        );
        assert!(err.contains("invalid socket address syntax"), "{err}");
        // ...and dropped when it might.
        let value = Some(figment::value::Value::from("hunter2hunter2"));
        assert!(!quotes_no_value("bad value `hunter2hunt…`", value.clone()));
        assert!(!quotes_no_value(
            "bad value `hunter2hunter2`",
            value.clone()
        ));
        assert!(quotes_no_value("bad value", value));
        assert!(!quotes_no_value("bad value", None));
        let err = refused(&["[mongo]\nuri = 12345"], "`mongo.uri`", &["12345"]);
        assert!(err.contains("not an integer"), "{err}");
        // An unknown key is named (it is a key, not a value); its value is not.
        refused(
            &["[issuance]\nmax_quanity = \"hunter2-value\""],
            "`issuance.max_quanity`",
            &["hunter2-value"],
        );
        // A TOML syntax error: its position, never the line it quotes.
        let err = refused(
            &[&format!(
                "[providers.stripe]\nsecrets = [\"{SECRET_LIKE}\"\n"
            )],
            "TOML parse error at line",
            &[SECRET_LIKE, "Sup3r"],
        );
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn a_missing_key_is_named_once() {
        let err = Settings::from_figment(
            Figment::new(),
            super::super::Environment::Named("test".to_owned()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`server` is required"), "{err}");
        let figment = Figment::new()
            .merge(Toml::string(DEFAULT_TOML))
            .merge(Toml::string("[providers.stripe]\nscheme = \"stripe\""));
        let err =
            Settings::from_figment(figment, super::super::Environment::Named("test".to_owned()))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("`providers.stripe.secrets` must hold at least one secret"),
            "{err}"
        );
    }
}
