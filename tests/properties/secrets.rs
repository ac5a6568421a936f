//! The secrets of every scheme: the strategies the signature properties draw them from
//! are secrets `Settings` accepts, and the check of a secret never panics nor quotes it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use proptest::prelude::*;

use tokenmint::settings::WebhookScheme;
use tokenmint::webhooks::signature::check_secret;

/// A Stripe signing secret, as `Settings` accepts it (`whsec_` and at least 16
/// characters). HMAC pads short keys with zero bytes, so "k" and "k\0" are the same key:
/// that is HMAC, not a flaw of ours, and secrets here have no NUL to avoid it.
pub fn stripe_secret() -> impl Strategy<Value = String> {
    "whsec_[A-Za-z0-9]{16,40}"
}

/// A Standard Webhooks secret as `Settings` accepts it, `whsec_<base64 of a 24–64 byte
/// key>`, with no zero byte in the key (same reason as above).
pub fn standard_secret() -> impl Strategy<Value = String> {
    prop::collection::vec(1u8..=255, 24..=64)
        .prop_map(|key| format!("whsec_{}", BASE64.encode(key)))
}

/// A Paddle secret key as `Settings` accepts it: `pdl_ntfset_` and at least 16 visible
/// characters (no NUL, as above).
pub fn paddle_secret() -> impl Strategy<Value = String> {
    "pdl_ntfset_[A-Za-z0-9_]{16,64}"
}

/// An Adyen HMAC key as `Settings` accepts it: 32 to 128 bytes in hex, none of them zero
/// (as above).
pub fn adyen_secret() -> impl Strategy<Value = String> {
    prop::collection::vec(1u8..=255, 32..=128).prop_map(hex::encode_upper)
}

const SCHEMES: [WebhookScheme; 4] = [
    WebhookScheme::Stripe,
    WebhookScheme::StandardWebhooks,
    WebhookScheme::Paddle,
    WebhookScheme::Adyen,
];

proptest! {
    #[test]
    fn generated_secrets_are_ones_settings_accept(
        stripe in stripe_secret(),
        standard in standard_secret(),
        paddle in paddle_secret(),
        adyen in adyen_secret(),
    ) {
        prop_assert_eq!(check_secret(WebhookScheme::Stripe, &stripe), Ok(()));
        prop_assert_eq!(check_secret(WebhookScheme::StandardWebhooks, &standard), Ok(()));
        prop_assert_eq!(check_secret(WebhookScheme::Paddle, &paddle), Ok(()));
        prop_assert_eq!(check_secret(WebhookScheme::Adyen, &adyen), Ok(()));
    }

    #[test]
    fn secret_check_never_panics_nor_quotes_the_secret(
        secret in prop_oneof![
            any::<String>(),
            "whsec_[A-Za-z0-9+/=]{0,100}",
            "whsec_.{0,30}",
            "pdl_ntfset_.{0,30}",
            "[0-9a-fA-F]{0,300}",
        ],
    ) {
        // The rules name the schemes' public prefixes: what follows one is the secret
        // proper, and a few characters of it may occur in a rule's text by chance.
        let proper = ["whsec_", "pdl_ntfset_"]
            .into_iter()
            .find_map(|prefix| secret.strip_prefix(prefix))
            .unwrap_or(&secret);
        for scheme in SCHEMES {
            if let Err(problem) = check_secret(scheme, &secret) {
                prop_assert!(proper.len() < 6 || !problem.contains(proper), "{}", problem);
            }
        }
    }
}
