//! HTTP Basic credentials a provider sends with every delivery (Adyen's webhook "Basic
//! authentication", `basic_auth_username` and `basic_auth_password`). Adyen's HMAC leaves
//! part of an item unsigned (`eventDate`, `additionalData`), so a captured item could be
//! sent again changed; the credentials, which travel only between Adyen and tokenmint,
//! are a second factor a replayer must also hold. Only SHA-256 digests of them are kept,
//! and both are compared in constant time, so neither the length nor the first
//! differing byte of a guess shows in the answer's timing.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The credentials a provider's deliveries must carry.
pub struct BasicCredentials {
    username: [u8; 32],
    password: [u8; 32],
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl BasicCredentials {
    pub fn new(username: &str, password: &SecretString) -> Self {
        Self {
            username: digest(username.as_bytes()),
            password: digest(password.expose_secret().as_bytes()),
        }
    }

    /// Whether `authorization`, an `Authorization` header's value, is `Basic` (the scheme
    /// name in any case, RFC 7617) with these credentials.
    pub fn admit(&self, authorization: Option<&str>) -> bool {
        let Some((scheme, encoded)) = authorization.and_then(|value| value.trim().split_once(' '))
        else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            return false;
        }
        let Ok(decoded) = BASE64.decode(encoded.trim()) else {
            return false;
        };
        // The user-id cannot contain a colon (RFC 7617 §2); the password may.
        let Some(colon) = decoded.iter().position(|b| *b == b':') else {
            return false;
        };
        let (username, password) = (&decoded[..colon], &decoded[colon + 1..]);
        let matches =
            self.username.ct_eq(&digest(username)) & self.password.ct_eq(&digest(password));
        matches.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(credentials: &str) -> String {
        format!("Basic {}", BASE64.encode(credentials))
    }

    #[test]
    fn only_the_exact_pair_is_admitted() {
        let credentials = BasicCredentials::new("adyen", &SecretString::from("pa:ss"));
        assert!(credentials.admit(Some(&header("adyen:pa:ss"))));
        assert!(credentials.admit(Some(&header("adyen:pa:ss").replace("Basic", "BASIC"))));
        for refused in [
            header("adyen:pa:s"),
            header("adyen:pa:ssx"),
            header("Adyen:pa:ss"),
            header("adyenpa:ss"),
            header("adyen"),
            format!("Bearer {}", BASE64.encode("adyen:pa:ss")),
            "Basic".to_owned(),
            "Basic !!!".to_owned(),
        ] {
            assert!(!credentials.admit(Some(&refused)), "{refused}");
        }
        assert!(!credentials.admit(None));
    }
}
