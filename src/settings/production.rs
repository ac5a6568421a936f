//! What production asks of a configuration beyond each value's own rules: the ones that
//! depend on what a command does with it. They are not part of `Settings::validate`,
//! since a development start, or an operator command that needs no API key, may run
//! without them; each command asks for those it needs, before it starts anything.

use super::{Settings, SettingsError};

impl Settings {
    /// The embedded mongod is for development: production needs `mongo.uri`. Asked by
    /// every command that opens the database, before any mongod start.
    pub fn require_database_uri(&self) -> Result<(), SettingsError> {
        if self.is_production() && self.mongo.configured_uri().is_none() {
            return Err(SettingsError::Production(
                "TOKENMINT_ENV=production requires mongo.uri (TOKENMINT__MONGO__URI): the \
                 embedded mongod is for development only",
            ));
        }
        Ok(())
    }

    /// Serving needs API keys: with none configured, development makes one for the run,
    /// production refuses to start.
    pub fn require_api_keys(&self) -> Result<(), SettingsError> {
        if self.is_production() && self.auth.keys.is_empty() {
            return Err(SettingsError::Production(
                "TOKENMINT_ENV=production requires at least one [[auth.keys]] entry",
            ));
        }
        Ok(())
    }

    /// A development key is never what production uses, even to print one kept earlier.
    pub fn refuse_development_key(&self) -> Result<(), SettingsError> {
        if self.is_production() {
            return Err(SettingsError::Production(
                "TOKENMINT_ENV=production never uses a development key",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use figment::Figment;
    use figment::providers::{Format, Toml};

    use super::*;
    use crate::settings::{DEFAULT_TOML, Environment};

    fn load(environment: Environment, layer: &str) -> Settings {
        let figment = Figment::new()
            .merge(Toml::string(DEFAULT_TOML))
            .merge(Toml::string(layer));
        Settings::from_figment(figment, environment).unwrap()
    }

    #[test]
    fn production_needs_a_database_uri_and_keys_and_never_a_development_key() {
        let bare = load(Environment::Production, "");
        let refusal = |rule: Result<(), SettingsError>| rule.unwrap_err().to_string();
        assert!(refusal(bare.require_database_uri()).contains("requires mongo.uri"));
        assert!(refusal(bare.require_api_keys()).contains("at least one [[auth.keys]]"));
        assert!(refusal(bare.refuse_development_key()).contains("never uses a development key"));

        let configured = load(
            Environment::Production,
            &format!(
                "[mongo]\nuri = \"mongodb://db.internal/\"\n[[auth.keys]]\nid = \"a\"\nsha256 = \"{}\"\nscopes = [\"read\"]",
                "a".repeat(64)
            ),
        );
        configured.require_database_uri().expect("a URI");
        configured.require_api_keys().expect("a key");

        let development = load(Environment::Development, "");
        development
            .require_database_uri()
            .expect("the embedded mongod");
        development
            .require_api_keys()
            .expect("a key made for the run");
        development
            .refuse_development_key()
            .expect("development keys");
    }
}
