//! Who a request counts against when no key can tell callers apart: the client's
//! network address, as one host holds it.

use std::net::IpAddr;

/// The address a public (checkout) caller is counted under, for its rate limit and its
/// waiters: an IPv4 address as itself (also when it arrives IPv4-mapped in IPv6, as on
/// a dual-stack listener), an IPv6 address by its /64 — what one host is usually given,
/// so that a host cannot take a fresh allowance from each of its 2^64 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddress(IpAddr);

impl ClientAddress {
    /// The bucket `address` belongs to.
    pub fn of(address: IpAddr) -> Self {
        Self(match address.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        })
    }
}

impl std::fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => v4.fmt(f),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(address: &str) -> ClientAddress {
        ClientAddress::of(address.parse().unwrap())
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(of("2001:db8:1:2:aaaa::1"), of("2001:db8:1:2:bbbb::2"));
        assert_ne!(of("2001:db8:1:2::1"), of("2001:db8:1:3::1"));
        assert_eq!(of("::ffff:192.0.2.1"), of("192.0.2.1"));
        assert_ne!(of("192.0.2.1"), of("192.0.2.2"));
        assert_eq!(of("2001:db8:1:2:aaaa::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(of("::ffff:192.0.2.1").to_string(), "192.0.2.1");
    }
}
