//! What every webhook signature scheme is built from: the HMAC, the timestamp tolerance,
//! the constant-time comparison against several secrets (rotation), the shape of a
//! prefixed secret, and the timestamped header Stripe and Paddle share. Every scheme is
//! HMAC-SHA256 checked before any parsing, with constant-time comparison
//! (`Mac::verify_slice`); those that sign a timestamp check it both ways, so a captured
//! request cannot be replayed later. The schemes (`stripe`, `standard`, `paddle`,
//! `adyen`) build on this module and nothing here knows them.

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// Why a signature was refused. Each maps to its own 401 `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// A required signature header is absent.
    Missing,
    /// Present but malformed, or no signature matches any configured secret.
    Invalid,
    /// Signed too long ago or too far in the future.
    OutOfTolerance,
}

/// The refusal's problem `code`, as the 401 answer carries it.
impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Missing => "signature_missing",
            Self::Invalid => "signature_invalid",
            Self::OutOfTolerance => "signature_timestamp_out_of_tolerance",
        })
    }
}

/// Header values a scheme reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct SignatureHeaders<'a> {
    pub stripe_signature: Option<&'a str>,
    pub webhook_id: Option<&'a str>,
    pub webhook_timestamp: Option<&'a str>,
    pub webhook_signature: Option<&'a str>,
    pub paddle_signature: Option<&'a str>,
}

pub(super) fn mac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether any presented signature is the HMAC of `parts` under any of `keys` (several
/// during a secret rotation). Each comparison is constant-time (`verify_slice`).
pub(super) fn any_signature_matches(
    keys: impl Iterator<Item = Vec<u8>>,
    parts: &[&[u8]],
    signatures: &[Vec<u8>],
) -> Result<(), SignatureError> {
    for key in keys {
        let expected = mac(&key, parts);
        if signatures
            .iter()
            .any(|candidate| expected.clone().verify_slice(candidate).is_ok())
        {
            return Ok(());
        }
    }
    Err(SignatureError::Invalid)
}

/// The shape of Stripe's and Paddle's secrets, whose whole text is the HMAC key: a
/// `prefix` followed by at least `min_chars` visible ASCII characters. `problem` is the
/// scheme's own words for a secret that does not fit; they never quote the secret.
pub(super) struct PrefixedSecret {
    pub prefix: &'static str,
    pub min_chars: usize,
    pub problem: &'static str,
}

impl PrefixedSecret {
    /// `Ok` when `secret` has the shape, else `Err(problem)`.
    pub fn check(&self, secret: &str) -> Result<(), &'static str> {
        let fits = secret.strip_prefix(self.prefix).is_some_and(|rest| {
            rest.len() >= self.min_chars && rest.bytes().all(|b| b.is_ascii_graphic())
        });
        if fits { Ok(()) } else { Err(self.problem) }
    }
}

/// What a delivery's signature is checked against: the configured secrets (several
/// during a rotation), how far from `now` a signed timestamp may be, and `now` (Unix
/// seconds). Schemes that sign no timestamp read only the secrets.
#[derive(Debug, Clone, Copy)]
pub struct Verification<'a> {
    pub secrets: &'a [SecretString],
    pub tolerance_secs: u64,
    pub now: i64,
}

impl Verification<'_> {
    /// `Ok` when a signed `timestamp` is within the tolerance of now, either way: a
    /// captured delivery cannot be replayed later, nor one dated ahead used then.
    pub(super) fn within(&self, timestamp: i64) -> Result<(), SignatureError> {
        if self.now.abs_diff(timestamp) <= self.tolerance_secs {
            Ok(())
        } else {
            Err(SignatureError::OutOfTolerance)
        }
    }
}

/// A scheme that sends one header of `name=value` items — a timestamp and one or more
/// hex signatures — and signs `"{timestamp}{separator}{raw body}"` with HMAC-SHA256 keyed
/// by the secret exactly as written: Stripe (`t=…,v1=…`, `.`) and Paddle (`ts=…;h1=…`,
/// `:`) differ only in these names.
pub(super) struct TimestampedHeader {
    pub timestamp: &'static str,
    pub signature: &'static str,
    pub items: char,
    pub separator: &'static [u8],
    /// The shape every configured secret of the scheme has.
    pub secret: PrefixedSecret,
}

impl TimestampedHeader {
    /// The timestamp within the tolerance of now, then any signature that is the HMAC
    /// under any configured secret (several during a rotation). Items of other names
    /// (Stripe's `v0`, say) are ignored. The signed timestamp is the text as sent, not a
    /// re-rendering of the number.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        check: &Verification<'_>,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for item in header.split(self.items) {
            match item.trim().split_once('=') {
                Some((name, value)) if name == self.timestamp => timestamp = Some(value),
                Some((name, value)) if name == self.signature => {
                    signatures.extend(hex::decode(value).ok());
                }
                _ => {}
            }
        }
        let signed_timestamp = timestamp.ok_or(SignatureError::Invalid)?;
        let timestamp = signed_timestamp
            .parse::<i64>()
            .map_err(|_| SignatureError::Invalid)?;
        if signatures.is_empty() {
            return Err(SignatureError::Invalid);
        }
        check.within(timestamp)?;
        let keys = check
            .secrets
            .iter()
            .map(|s| s.expose_secret().as_bytes().to_vec());
        any_signature_matches(
            keys,
            &[signed_timestamp.as_bytes(), self.separator, body],
            &signatures,
        )
    }

    /// The header's value as the provider would send it at `timestamp`; for tests and
    /// `tokenmint webhooks sign`.
    pub fn sign(&self, secret: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = mac(
            secret.as_bytes(),
            &[timestamp.to_string().as_bytes(), self.separator, body],
        )
        .finalize()
        .into_bytes();
        format!(
            "{}={timestamp}{}{}={}",
            self.timestamp,
            self.items,
            self.signature,
            hex::encode(tag)
        )
    }
}

/// What `verify` answers under secrets from their texts, `tolerance_secs` and `now`, for
/// the schemes' unit tests.
#[cfg(test)]
pub(super) fn verify_with(
    keys: &[&str],
    tolerance_secs: u64,
    now: i64,
    verify: impl FnOnce(&Verification<'_>) -> Result<(), SignatureError>,
) -> Result<(), SignatureError> {
    let secrets: Vec<SecretString> = keys.iter().map(|k| (*k).into()).collect();
    verify(&Verification {
        secrets: &secrets,
        tolerance_secs,
        now,
    })
}
