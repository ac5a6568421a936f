//! Stripe and Standard Webhooks signatures: a signed body verifies under its secret, among
//! rotated ones, within the tolerance, and under nothing else; arbitrary headers never
//! panic the verifier.

use proptest::prelude::*;

use tokenmint::settings::WebhookScheme;

use tokenmint::webhooks::signature::{
    SignatureError, SignatureHeaders, sign_standard, sign_stripe,
};

use crate::secrets::{standard_secret, stripe_secret};
use crate::{TOLERANCE, bytes, out_of_tolerance, signed_at, verify};

/// Verifies a Stripe delivery with `Stripe-Signature: header` under `keys` at `now`.
fn stripe(header: &str, body: &[u8], keys: &[&str], now: i64) -> Result<(), SignatureError> {
    let headers = SignatureHeaders {
        stripe_signature: Some(header),
        ..Default::default()
    };
    verify(WebhookScheme::Stripe, &headers, body, keys, TOLERANCE, now)
}

/// Verifies a Standard Webhooks delivery with these headers under `keys` at `now`.
fn standard(
    id: &str,
    timestamp: i64,
    signature: &str,
    body: &[u8],
    keys: &[&str],
    now: i64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp.to_string();
    let headers = SignatureHeaders {
        webhook_id: Some(id),
        webhook_timestamp: Some(&timestamp),
        webhook_signature: Some(signature),
        ..Default::default()
    };
    verify(
        WebhookScheme::StandardWebhooks,
        &headers,
        body,
        keys,
        TOLERANCE,
        now,
    )
}

proptest! {
    #[test]
    fn stripe_verify_never_panics(
        header in any::<String>(),
        body in bytes(256),
        key in any::<String>(),
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let headers = SignatureHeaders { stripe_signature: Some(&header), ..Default::default() };
        let _ = verify(WebhookScheme::Stripe, &headers, &body, &[&key], tolerance, now);
    }

    #[test]
    fn stripe_verify_never_panics_on_header_like_input(
        header in "(t=-?[0-9]{0,20}|v1=[0-9a-f]{0,66}|v0=[0-9a-f]{0,8}|[=, ]|.){0,8}",
        body in bytes(64),
        now in any::<i64>(),
    ) {
        let _ = stripe(&header, &body, &["whsec_0123456789abcdef"], now);
    }

    #[test]
    fn standard_verify_never_panics(
        id in prop::option::of(any::<String>()),
        timestamp in prop::option::of(prop_oneof![any::<String>(), any::<i64>().prop_map(|t| t.to_string())]),
        signature in prop::option::of(prop_oneof![any::<String>(), "(v1,[A-Za-z0-9+/=]{0,50}| |v2,.{0,4}){0,4}"]),
        body in bytes(256),
        key in prop_oneof![any::<String>(), standard_secret()],
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let headers = SignatureHeaders {
            webhook_id: id.as_deref(),
            webhook_timestamp: timestamp.as_deref(),
            webhook_signature: signature.as_deref(),
            ..Default::default()
        };
        let _ = verify(WebhookScheme::StandardWebhooks, &headers, &body, &[&key], tolerance, now);
    }

    #[test]
    fn stripe_signature_verifies_only_its_own_body_secret_and_time(
        secret in stripe_secret(),
        other_secret in stripe_secret(),
        body in bytes(512),
        other_body in bytes(512),
        (timestamp, skew) in signed_at(),
        late in out_of_tolerance(),
    ) {
        let header = sign_stripe(&secret, timestamp, &body);
        prop_assert_eq!(stripe(&header, &body, &[&secret], timestamp + skew), Ok(()));
        // Among rotated secrets, in any position.
        prop_assert_eq!(stripe(&header, &body, &[&other_secret, &secret], timestamp + skew), Ok(()));
        if other_body != body {
            prop_assert_eq!(
                stripe(&header, &other_body, &[&secret], timestamp + skew),
                Err(SignatureError::Invalid)
            );
        }
        if other_secret != secret {
            prop_assert_eq!(
                stripe(&header, &body, &[&other_secret], timestamp + skew),
                Err(SignatureError::Invalid)
            );
        }
        prop_assert_eq!(
            stripe(&header, &body, &[&secret], timestamp + late),
            Err(SignatureError::OutOfTolerance)
        );
    }

    #[test]
    fn standard_signature_verifies_only_its_own_body_secret_id_and_time(
        secret in standard_secret(),
        other_secret in standard_secret(),
        id in "[A-Za-z0-9_-]{1,40}",
        other_id in "[A-Za-z0-9_-]{1,40}",
        body in bytes(512),
        other_body in bytes(512),
        (timestamp, skew) in signed_at(),
        late in out_of_tolerance(),
    ) {
        let signature = sign_standard(&secret, &id, timestamp, &body);
        let now = timestamp + skew;
        prop_assert_eq!(standard(&id, timestamp, &signature, &body, &[&secret], now), Ok(()));
        let with_others = format!("v1,AAAA {signature} v2,xyz");
        prop_assert_eq!(
            standard(&id, timestamp, &with_others, &body, &[&other_secret, &secret], now),
            Ok(())
        );
        if other_body != body {
            prop_assert_eq!(
                standard(&id, timestamp, &signature, &other_body, &[&secret], now),
                Err(SignatureError::Invalid)
            );
        }
        if other_secret != secret {
            prop_assert_eq!(
                standard(&id, timestamp, &signature, &body, &[&other_secret], now),
                Err(SignatureError::Invalid)
            );
        }
        if other_id != id {
            prop_assert_eq!(
                standard(&other_id, timestamp, &signature, &body, &[&secret], now),
                Err(SignatureError::Invalid)
            );
        }
        prop_assert_eq!(
            standard(&id, timestamp, &signature, &body, &[&secret], timestamp + late),
            Err(SignatureError::OutOfTolerance)
        );
    }
}
