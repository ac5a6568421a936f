//! `tokenmint healthcheck`: asks a running service's `/readyz` whether it is ready, so
//! a container's `HEALTHCHECK` needs no curl or wget in the image. One HTTP/1.1 GET with
//! hyper's client is all it takes, bounded in time.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use axum::http::{Request, header};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How long the whole check may take: connect, request, status line.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Where to ask: `http://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port`, the URL's authority.
    host: String,
    path: String,
}

impl Target {
    /// `/readyz` on the address the service binds: a wildcard bind (`0.0.0.0`, `::`) is
    /// reached on the loopback address of its family.
    pub fn readyz_at(bind: SocketAddr) -> Self {
        let ip = match bind.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Self {
            host: SocketAddr::new(ip, bind.port()).to_string(),
            path: "/readyz".to_owned(),
        }
    }

    /// The URI the request goes to.
    fn uri(&self) -> String {
        format!("http://{}{}", self.host, self.path)
    }

    /// Parses `http://host[:port][/path]` (no TLS: the check runs beside the service).
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("--url must start with http:// (got {url})"))?;
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, "/readyz"),
        };
        if authority.is_empty() {
            anyhow::bail!("--url has no host: {url}");
        }
        // A port follows the last colon, unless that colon is inside an IPv6 literal.
        let port = authority
            .rsplit_once(':')
            .filter(|(host, _)| !authority.starts_with('[') || host.ends_with(']'));
        let host = match port {
            Some((_, port)) => {
                port.parse::<u16>()
                    .with_context(|| format!("--url has an invalid port: {url}"))?;
                authority.to_owned()
            }
            None => format!("{authority}:80"),
        };
        let target = Self {
            host,
            path: path.to_owned(),
        };
        // What the request is built from must be a URI (no space in the path, a host
        // that is one): a URL that is not one is the caller's mistake, said now, never
        // a "not ready" the request's failure would look like.
        target
            .uri()
            .parse::<axum::http::Uri>()
            .with_context(|| format!("--url is not a valid URL: {url}"))?;
        Ok(target)
    }
}

/// `true` when the service answers 200; `false` when it answers anything else or cannot
/// be reached within `TIMEOUT`.
pub async fn check(target: &Target) -> bool {
    matches!(
        tokio::time::timeout(TIMEOUT, status(target)).await,
        Ok(Ok(200))
    )
}

/// The status code of `GET path`; the body is not read.
async fn status(target: &Target) -> anyhow::Result<u16> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let request = Request::get(target.uri())
        .header(header::USER_AGENT, "tokenmint-healthcheck")
        .body(Body::empty())?;
    let response = client.request(request).await?;
    Ok(response.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_bind_is_checked_on_loopback() {
        let target = Target::readyz_at("0.0.0.0:8080".parse().unwrap());
        assert_eq!(target.host, "127.0.0.1:8080");
        assert_eq!(target.path, "/readyz");
        let target = Target::readyz_at("[::]:9000".parse().unwrap());
        assert_eq!(target.host, "[::1]:9000");
        let target = Target::readyz_at("10.1.2.3:81".parse().unwrap());
        assert_eq!(target.host, "10.1.2.3:81");
    }

    #[test]
    fn urls_parse() {
        let target = Target::parse("http://127.0.0.1:9/readyz").unwrap();
        assert_eq!(
            (target.host.as_str(), target.path.as_str()),
            ("127.0.0.1:9", "/readyz")
        );
        let target = Target::parse("http://localhost").unwrap();
        assert_eq!(
            (target.host.as_str(), target.path.as_str()),
            ("localhost:80", "/readyz")
        );
        assert!(Target::parse("https://x/readyz").is_err());
        assert!(Target::parse("http://x:notaport/").is_err());
        assert!(Target::parse("http:///readyz").is_err());
        assert!(Target::parse("http://127.0.0.1:8080/re adyz").is_err());
        assert!(Target::parse("http://local host/").is_err());
    }
}
