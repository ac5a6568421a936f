//! The client address of a request: the TCP peer's, or — only when the peer is one of
//! `server.trusted_proxies` — the nearest address in `X-Forwarded-For` that is not a
//! trusted proxy. Checkout keys are rate limited, and their waiters counted, by it
//! (`ClientAddress`, IPv6 by /64).
//!
//! Why right to left: each proxy appends the address it received the request from, so
//! the right-most entries are the only ones a trusted proxy vouches for; everything left
//! of the first untrusted one was written by the client and may be made up. From an
//! untrusted peer the header is ignored entirely — anyone can send it.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use ipnet::IpNet;

use super::AppState;
use super::error::ApiError;
use crate::domain::ClientAddress;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// The address the request came from, as far as the proxies in `trusted` vouch for it.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(&ip));
    let peer = peer.to_canonical();
    if !is_trusted(peer) {
        return peer;
    }
    // Several header lines are one list, in order (RFC 9110 §5.3): walk them backwards.
    // Split as bytes: a client's non-ASCII byte in its own entry must not spoil the line
    // a proxy appended the real address to.
    let hops = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|line| line.as_bytes().rsplit(|b| *b == b','));
    let mut nearest = peer;
    for hop in hops {
        let Some(hop) = parse_hop(hop) else {
            // A trusted proxy writes addresses; this one did not. Nothing further left
            // can be vouched for: count the request under the last hop that could.
            return nearest;
        };
        if !is_trusted(hop) {
            return hop;
        }
        nearest = hop;
    }
    // Every hop is a trusted proxy (or there is no header: the proxy's own request,
    // a probe say): the left-most is the client.
    nearest
}

/// One `X-Forwarded-For` entry: an address, which some proxies write with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?.trim();
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|socket| socket.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

impl FromRequestParts<AppState> for ClientAddress {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(client) = parts.extensions.get::<ClientAddress>() {
            return Ok(*client);
        }
        // `server::serve` gives every connection its peer address.
        let ConnectInfo(peer) = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .ok_or(ApiError::Internal)?;
        let client =
            ClientAddress::of(client_ip(peer.ip(), &parts.headers, &state.trusted_proxies));
        parts.extensions.insert(client);
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn resolve(peer: &str, forwarded: &[&str], trusted: &[&str]) -> String {
        let mut headers = HeaderMap::new();
        for line in forwarded {
            headers.append(X_FORWARDED_FOR, line.parse().unwrap());
        }
        client_ip(peer.parse().unwrap(), &headers, &nets(trusted)).to_string()
    }

    #[test]
    fn an_untrusted_peers_header_is_ignored() {
        assert_eq!(
            resolve("203.0.113.9", &["198.51.100.7"], &[]),
            "203.0.113.9"
        );
        assert_eq!(
            resolve("203.0.113.9", &["198.51.100.7"], &["10.0.0.0/8"]),
            "203.0.113.9"
        );
    }

    #[test]
    fn a_trusted_peer_names_the_right_most_untrusted_hop() {
        let trusted = ["10.0.0.0/8", "2001:db8:ffff::/48"];
        assert_eq!(
            resolve("10.0.0.1", &["198.51.100.7"], &trusted),
            "198.51.100.7"
        );
        // The client wrote the left entries itself: they are not believed.
        assert_eq!(
            resolve(
                "10.0.0.1",
                &["203.0.113.66, 198.51.100.7, 10.1.2.3"],
                &trusted
            ),
            "198.51.100.7"
        );
        // Several header lines are one list.
        assert_eq!(
            resolve(
                "10.0.0.1",
                &["203.0.113.66", "198.51.100.7", "10.1.2.3"],
                &trusted
            ),
            "198.51.100.7"
        );
        assert_eq!(
            resolve(
                "2001:db8:ffff::1",
                &["2001:db8:1:2::5, 2001:db8:ffff::2"],
                &trusted
            ),
            "2001:db8:1:2::5"
        );
        // Ports, as some proxies write them; IPv4-mapped peers and hops.
        assert_eq!(
            resolve("::ffff:10.0.0.1", &["198.51.100.7:4711"], &trusted),
            "198.51.100.7"
        );
        assert_eq!(
            resolve("10.0.0.1", &["[2001:db8:1:2::5]:4711"], &trusted),
            "2001:db8:1:2::5"
        );
    }

    #[test]
    fn a_clients_unreadable_entry_does_not_spoil_the_proxys() {
        let mut headers = HeaderMap::new();
        let line = HeaderValue::from_bytes(b"203.0.113.\xff\xfe, 198.51.100.7").unwrap();
        headers.append(X_FORWARDED_FOR, line);
        let trusted = nets(&["10.0.0.0/8"]);
        let client = client_ip("10.0.0.1".parse().unwrap(), &headers, &trusted);
        assert_eq!(client.to_string(), "198.51.100.7");
    }

    #[test]
    fn without_an_untrusted_hop_the_nearest_vouched_address_counts() {
        let trusted = ["10.0.0.0/8"];
        assert_eq!(resolve("10.0.0.1", &[], &trusted), "10.0.0.1");
        assert_eq!(
            resolve("10.0.0.1", &["10.0.0.2, 10.0.0.3"], &trusted),
            "10.0.0.2"
        );
        // Garbage behind a trusted hop is nobody's address: the hop that wrote it counts.
        assert_eq!(
            resolve("10.0.0.1", &["198.51.100.7, garbage, 10.0.0.3"], &trusted),
            "10.0.0.3"
        );
        assert_eq!(resolve("10.0.0.1", &["unknown"], &trusted), "10.0.0.1");
        assert_eq!(resolve("10.0.0.1", &[""], &trusted), "10.0.0.1");
    }
}
