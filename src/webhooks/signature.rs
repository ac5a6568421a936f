//! The webhook signature schemes as one surface: every scheme's signers and verifiers,
//! under the path tests and tools have always used, and the startup check of a secret
//! against its scheme's rule, which is in the scheme's own module (`stripe`, `standard`,
//! `paddle`, `adyen`). The pieces the schemes share are `signing`'s; arrows run one way,
//! from here to the schemes to `signing`.

pub use super::signing::{SignatureError, SignatureHeaders, Verification};
pub use super::standard::{STANDARD_KEY_BYTES, sign_standard, standard_key};
pub use super::stripe::{STRIPE_SECRET_MIN_CHARS, sign_stripe};
use super::{adyen, paddle, standard, stripe};
use crate::settings::WebhookScheme;

/// Verifies a delivery's signature over the raw `body` per `scheme`: `Ok` only when a
/// signature the scheme reads from `headers` (or, for Adyen, from every item of the
/// body) is the HMAC under one of the configured secrets, signed within the tolerance.
pub fn verify(
    scheme: WebhookScheme,
    headers: &SignatureHeaders<'_>,
    body: &[u8],
    check: &Verification<'_>,
) -> Result<(), SignatureError> {
    match scheme {
        WebhookScheme::Stripe => stripe::SCHEME.verify(headers.stripe_signature, body, check),
        WebhookScheme::StandardWebhooks => standard::verify_standard(headers, body, check),
        WebhookScheme::Paddle => paddle::SCHEME.verify(headers.paddle_signature, body, check),
        WebhookScheme::Adyen => adyen::verify_adyen(body, check.secrets),
    }
}

/// Whether `secret` is usable with `scheme`; the `Err` says what is wrong without
/// quoting the secret. `Providers::from_settings` runs it on every configured secret, so a
/// secret that could never verify anything stops the start instead of being ignored.
pub fn check_secret(scheme: WebhookScheme, secret: &str) -> Result<(), &'static str> {
    match scheme {
        WebhookScheme::Stripe => stripe::SCHEME.secret.check(secret),
        WebhookScheme::StandardWebhooks => standard::check_secret(secret),
        WebhookScheme::Paddle => paddle::SCHEME.secret.check(secret),
        WebhookScheme::Adyen => adyen::check_secret(secret),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;

    use super::*;

    #[test]
    fn secrets_are_checked_per_scheme_without_quoting_them() {
        use WebhookScheme::{StandardWebhooks, Stripe};
        let standard = |bytes: usize| format!("whsec_{}", BASE64.encode(vec![7u8; bytes]));
        assert_eq!(
            check_secret(StandardWebhooks, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Ok(())
        );
        assert_eq!(check_secret(StandardWebhooks, &standard(24)), Ok(()));
        assert_eq!(check_secret(StandardWebhooks, &standard(64)), Ok(()));
        let refused = [
            standard(23),
            standard(65),
            standard(32).replace("whsec_", ""),
            "whsec_not base64!".to_owned(),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS".to_owned(),
            String::new(),
        ];
        for secret in &refused {
            let problem = check_secret(StandardWebhooks, secret).unwrap_err();
            assert!(secret.is_empty() || !problem.contains(secret.as_str()));
        }

        let sixteen = "whsec_0123456789abcdef";
        assert_eq!(check_secret(Stripe, sixteen), Ok(()));
        for secret in [
            "whsec_0123456789abcde",
            "0123456789abcdef0123",
            "whsec_0123456789abcdef\n",
            "whsec_0123456789 abcdef",
            "",
        ] {
            assert!(check_secret(Stripe, secret).is_err(), "{secret:?}");
        }
    }
}
