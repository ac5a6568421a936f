//! Payment providers as webhook senders: signature verification and event parsing into
//! domain events, one module per scheme (`stripe`, `standard`, `paddle`, `adyen`) over the
//! shared pieces of `signing` and `events`, the schemes' common surface (`signature`), and
//! the HTTP Basic credentials a provider may send besides (`basic_auth`). What an event
//! does is `issuing`'s to decide.

pub mod adyen;
mod basic_auth;
mod events;
pub mod paddle;
pub mod signature;
mod signing;
mod standard;
mod stripe;

use std::collections::{BTreeMap, HashMap};

use secrecy::{ExposeSecret, SecretString};

use basic_auth::BasicCredentials;
pub use events::EventError;
pub use signature::{SignatureError, SignatureHeaders, Verification, sign_standard, sign_stripe};
pub use standard::parse_standard;
pub use stripe::parse_stripe;

use crate::domain::{AccountId, ParsedEvent, Provider, TokenPacks};
use crate::settings::{Capture, ProviderSettings, SettingsError, WebhookScheme};

/// One configured provider.
pub struct ProviderConfig {
    pub name: Provider,
    pub scheme: WebhookScheme,
    secrets: Vec<SecretString>,
    tolerance_secs: u64,
    /// The HTTP Basic credentials every delivery must carry, when configured.
    basic_auth: Option<BasicCredentials>,
    /// The mode whose events count (`true` live, `false` test); `None`: both.
    livemode: Option<bool>,
    /// When an Adyen payment is paid.
    capture: Capture,
    /// The tokens each of the provider's prices sells (Paddle).
    token_packs: TokenPacks,
    /// The accounts whose payments may issue (`Delivery::within`); `None`: every
    /// account's.
    accounts: Option<Vec<AccountId>>,
}

/// The configured providers, by name.
#[derive(Default)]
pub struct Providers(HashMap<Provider, ProviderConfig>);

impl Providers {
    /// From validated settings (Basic credentials come as a pair, `Settings::validate`),
    /// checking each secret against its scheme's rule ([`signature::check_secret`]): a
    /// secret that could never verify a delivery stops the start, its key named as any
    /// other bad setting's, the secret never quoted.
    pub fn from_settings(
        providers: &BTreeMap<Provider, ProviderSettings>,
    ) -> Result<Self, SettingsError> {
        providers
            .iter()
            .map(|(name, settings)| Ok((name.clone(), ProviderConfig::new(name, settings)?)))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn contains(&self, provider: &str) -> bool {
        self.0.contains_key(provider)
    }

    /// The provider configured as `provider`, if any.
    pub fn get(&self, provider: &str) -> Option<&ProviderConfig> {
        self.0.get(provider)
    }
}

/// What a verified delivery holds.
#[derive(Debug)]
pub enum Delivery {
    /// One event (Stripe, Standard Webhooks, Paddle), answered with a JSON receipt.
    Single(Box<ParsedEvent>),
    /// A batch of events (Adyen), each processed on its own, answered `[accepted]`.
    Batch(Vec<ParsedEvent>),
}

impl Delivery {
    /// Every event of the delivery, ignored for `reason`. When the reason rests on
    /// `unsigned`, a field the signature does not cover, an event that may issue keeps
    /// its own id: a copy of an ignored success with the field altered back is then a
    /// duplicate, not a payment of the other mode issued. Any other (a withdrawal, money
    /// coming back) is recorded apart ([`ParsedEvent::ignored_apart`]): a copy
    /// with the field altered must not make the genuine event a duplicate, and applied
    /// in the other mode it names a payment unknown there.
    fn ignored(self, reason: &str, unsigned: Option<&str>) -> Self {
        let ignore = |event: ParsedEvent| match unsigned {
            Some(field) if !event.may_issue() => event.ignored_apart(field, reason),
            _ => event.ignored(reason),
        };
        self.map(ignore)
    }

    /// The events of accounts other than `accounts` that may issue, ignored,
    /// `account_not_allowed`, and recorded apart (`#account`): the provider's resend
    /// once the account is listed is applied. A withdrawal or money coming back still
    /// applies, whatever the account: a payment made while its account could issue
    /// (or issued by a trusted key) keeps following its money, and an account's events
    /// only ever move its own payments' tokens.
    fn within(self, accounts: &[AccountId]) -> Self {
        self.map(|event| match &event {
            ParsedEvent::Payment(payment)
                if event.may_issue() && !accounts.contains(&payment.key.account_id) =>
            {
                event.ignored_apart("account", ACCOUNT_NOT_ALLOWED)
            }
            _ => event,
        })
    }

    fn map(self, each: impl Fn(ParsedEvent) -> ParsedEvent) -> Self {
        match self {
            Self::Single(event) => Self::Single(Box::new(each(*event))),
            Self::Batch(events) => Self::Batch(events.into_iter().map(each).collect()),
        }
    }
}

/// Why the events of a delivery of the other mode than the provider's are ignored.
pub const LIVEMODE_MISMATCH: &str = "livemode_mismatch";
/// Why an event of an account the provider does not list (`accounts`) is ignored.
pub const ACCOUNT_NOT_ALLOWED: &str = "account_not_allowed";

/// A test delivery signed with a provider's secret: the headers to send, and the body
/// (the one given, except for Adyen, whose signatures go inside it).
#[derive(Debug)]
pub struct SignedDelivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl ProviderConfig {
    fn new(name: &Provider, settings: &ProviderSettings) -> Result<Self, SettingsError> {
        let scheme = settings.scheme;
        for (i, secret) in settings.secrets.iter().enumerate() {
            if let Err(problem) = signature::check_secret(scheme, secret.expose_secret()) {
                return Err(SettingsError::Invalid {
                    key: format!("providers.{name}.secrets[{i}]"),
                    message: format!("(provider `{name}`, scheme `{scheme}`) {problem}"),
                });
            }
        }
        Ok(Self {
            name: name.clone(),
            scheme,
            secrets: settings.secrets.clone(),
            tolerance_secs: settings.tolerance_secs,
            basic_auth: settings
                .basic_auth_username
                .as_deref()
                .zip(settings.basic_auth_password.as_ref())
                .map(|(user, password)| BasicCredentials::new(user, password)),
            livemode: settings.livemode,
            capture: settings.capture.unwrap_or_default(),
            token_packs: settings.token_packs.clone(),
            accounts: settings.accounts.clone(),
        })
    }

    /// Whether a delivery with this `Authorization` header value may be read at all: it
    /// carries the provider's Basic credentials, or none are configured.
    pub fn admits(&self, authorization: Option<&str>) -> bool {
        self.basic_auth
            .as_ref()
            .is_none_or(|credentials| credentials.admit(authorization))
    }

    /// Verifies the delivery's signature over the raw `body`, per the provider's scheme.
    pub fn verify(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let check = Verification {
            secrets: &self.secrets,
            tolerance_secs: self.tolerance_secs,
            now,
        };
        signature::verify(self.scheme, headers, body, &check)
    }

    /// Parses a delivery whose signature [`verify`](Self::verify) accepted; nothing is
    /// parsed before that. `Err` is a body that is not an event (400). A delivery of the
    /// other mode than the provider's `livemode` (or one that does not say its mode, when
    /// a mode is configured) is read as its events ignored, `livemode_mismatch`: signed
    /// alike, a test payment must not mint tokens on a live endpoint. Such a delivery is
    /// the other mode's even when this mode cannot read it: a Stripe event that names
    /// itself (`id`, `type`) is then ignored too, rather than answered 400 and retried.
    /// An event that may issue, of an account the provider does not list, is ignored,
    /// `account_not_allowed` (`Delivery::within`): its account is inside what the
    /// provider signs (Stripe's `account`, Adyen's `merchantAccountCode`, Standard
    /// Webhooks' `accountId`).
    pub fn parse(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        max_quantity: u32,
    ) -> Result<Delivery, EventError> {
        let delivery = self.parse_checking_mode(headers, body, max_quantity)?;
        Ok(match &self.accounts {
            Some(accounts) => delivery.within(accounts),
            None => delivery,
        })
    }

    /// `parse` before the accounts are looked at: the events, those of the other mode
    /// ignored (schemes that mark it).
    fn parse_checking_mode(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        max_quantity: u32,
    ) -> Result<Delivery, EventError> {
        let mode = match self.scheme {
            WebhookScheme::Stripe => events::delivery_mode(body, "livemode"),
            WebhookScheme::Adyen => events::delivery_mode(body, "live"),
            WebhookScheme::StandardWebhooks | WebhookScheme::Paddle => {
                return self.parse_events(headers, body, max_quantity);
            }
        };
        let mismatch = self.livemode.is_some_and(|expected| mode != Some(expected));
        // Stripe signs its `livemode` with the rest of the body; Adyen signs no `live`.
        let unsigned_mode = (self.scheme == WebhookScheme::Adyen).then_some("live");
        match self.parse_events(headers, body, max_quantity) {
            Ok(delivery) if mismatch => Ok(delivery.ignored(LIVEMODE_MISMATCH, unsigned_mode)),
            Err(unreadable) if mismatch && self.scheme == WebhookScheme::Stripe => {
                let (event_id, event_type) = events::named_event(body).ok_or(unreadable)?;
                Ok(Delivery::Single(Box::new(ParsedEvent::Ignored {
                    event_id,
                    event_type,
                    reason: LIVEMODE_MISMATCH.to_owned(),
                })))
            }
            parsed => parsed,
        }
    }

    fn parse_events(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        max_quantity: u32,
    ) -> Result<Delivery, EventError> {
        let single = match self.scheme {
            WebhookScheme::Stripe => parse_stripe(&self.name, body, max_quantity)?,
            WebhookScheme::StandardWebhooks => {
                let id = headers.webhook_id.unwrap_or_default();
                parse_standard(&self.name, id, body, max_quantity)?
            }
            WebhookScheme::Paddle => {
                paddle::parse_paddle(&self.name, body, max_quantity, &self.token_packs)?
            }
            WebhookScheme::Adyen => {
                return adyen::parse_adyen(&self.name, body, max_quantity, self.capture)
                    .map(Delivery::Batch);
            }
        };
        Ok(Delivery::Single(Box::new(single)))
    }

    /// What `tokenmint webhooks sign` prints: the headers, one `Name: value` a line (for
    /// `curl -H @FILE`), or for Adyen the batch with its signatures filled in.
    pub fn signed_text(&self, body: &[u8], id: &str, now: i64) -> Result<String, EventError> {
        let signed = self.sign(body, id, now)?;
        Ok(match self.scheme {
            WebhookScheme::Adyen => format!("{}\n", String::from_utf8_lossy(&signed.body)),
            _ => signed
                .headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\n"))
                .collect(),
        })
    }

    /// Signs `body` with the provider's first secret as the provider would at `now`;
    /// `id` is the Standard Webhooks message id. For trying a set-up from the shell.
    pub fn sign(&self, body: &[u8], id: &str, now: i64) -> Result<SignedDelivery, EventError> {
        let secret = self
            .secrets
            .first()
            .map(|s| s.expose_secret())
            .unwrap_or_default();
        let header = |name: &str, value: String| (name.to_owned(), value);
        let headers = match self.scheme {
            WebhookScheme::Stripe => {
                vec![header("Stripe-Signature", sign_stripe(secret, now, body))]
            }
            WebhookScheme::StandardWebhooks => vec![
                header("webhook-id", id.to_owned()),
                header("webhook-timestamp", now.to_string()),
                header("webhook-signature", sign_standard(secret, id, now, body)),
            ],
            WebhookScheme::Paddle => {
                vec![header(
                    "Paddle-Signature",
                    paddle::sign_paddle(secret, now, body),
                )]
            }
            WebhookScheme::Adyen => {
                return Ok(SignedDelivery {
                    headers: vec![header("Content-Type", "application/json".to_owned())],
                    body: adyen::sign_adyen(secret, body)?,
                });
            }
        };
        let mut headers = headers;
        headers.insert(0, header("Content-Type", "application/json".to_owned()));
        Ok(SignedDelivery {
            headers,
            body: body.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Settings, assert_refusal_names_only};

    /// The providers of the defaults with `layer` on top.
    fn built(layer: &str) -> Result<Providers, SettingsError> {
        let settings = Settings::with_overrides(&[layer]).expect("the settings load");
        Providers::from_settings(&settings.providers)
    }

    /// Builds `layer`'s providers, expecting a refusal in one line, said once, that names
    /// `key` and quotes none of `values`.
    fn refused(layer: &str, key: &str, values: &[&str]) -> String {
        let Err(err) = built(layer) else {
            panic!("{key}: the providers were built");
        };
        let err = err.to_string();
        assert_refusal_names_only(&err, key, values);
        err
    }

    #[test]
    fn provider_secrets_must_fit_their_scheme_and_are_never_echoed() {
        let stripe = |secret: &str| {
            format!(
                "[providers.billing]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\", \"{secret}\"]"
            )
        };
        built(&stripe("whsec_0123456789abcdefXYZ")).expect("valid stripe");
        for secret in [
            "whsec_S3cretShort",
            "S3cretWithoutThePrefix0123",
            "whsec_S3cret with space!",
        ] {
            let err = refused(
                &stripe(secret),
                "providers.billing.secrets[1]",
                &[secret, "S3cret"],
            );
            assert!(err.contains("provider `billing`"), "{err}");
        }
        let standard = |secret: &str| {
            format!("[providers.acme]\nscheme = \"standard-webhooks\"\nsecrets = [\"{secret}\"]")
        };
        built(&standard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
            .expect("valid standard-webhooks");
        let undecodable = "whsec_S3cret-not*base64!";
        let short = "whsec_S3cretAAAAAAAAAAAAAAAA"; // decodes to 21 bytes
        let long = format!("whsec_S3cret{}", "A".repeat(84)); // 72 bytes
        for secret in [
            undecodable,
            short,
            &long,
            "S3cretMfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa",
        ] {
            let err = refused(
                &standard(secret),
                "providers.acme.secrets[0]",
                &[secret, "S3cret"],
            );
            assert!(err.contains("provider `acme`"), "{err}");
            assert!(err.contains("standard-webhooks"), "{err}");
        }
    }

    #[test]
    fn empty_provider_secret_is_rejected() {
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"\"]";
        refused(toml, "providers.stripe.secrets", &[]);
    }
}
