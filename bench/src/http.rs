//! A lean HTTP/1.1 client: one keep-alive connection per virtual client, hyper's
//! connection-level API (no pool, no redirects, no TLS), so the load generator spends
//! as little of the machine's two cores as possible.

use std::net::SocketAddr;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One keep-alive connection to the service.
pub struct Conn {
    addr: SocketAddr,
    authorization: HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// A response: status and body.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Conn {
    pub fn new(addr: SocketAddr, api_key: &str) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            authorization: HeaderValue::from_str(&format!("Bearer {api_key}"))
                .context("API key is not a header value")?,
            sender: None,
        })
    }

    async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the sender is dropped or the server closes the connection.
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// POSTs a JSON body; reconnects once if the kept-alive connection was closed.
    pub async fn post_json(&mut self, path: &'static str, body: Bytes) -> anyhow::Result<Reply> {
        for attempt in 0..2 {
            if let Some(sender) = self.sender.as_mut()
                && sender.ready().await.is_err()
            {
                self.sender = None;
            }
            let sender = match self.sender.as_mut() {
                Some(sender) => sender,
                None => self.sender.insert(Self::connect(self.addr).await?),
            };
            let request = Request::builder()
                .method(Method::POST)
                .uri(path)
                .header(HOST, "127.0.0.1")
                .header(CONTENT_TYPE, "application/json")
                .header(AUTHORIZATION, self.authorization.clone())
                .body(Full::new(body.clone()))?;
            match sender.send_request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let body = response.into_body().collect().await?.to_bytes();
                    return Ok(Reply { status, body });
                }
                // A request that never reached the server (connection closed between
                // requests) is safe to resend; POST /v1/issuances is idempotent anyway.
                Err(err) if attempt == 0 && err.is_canceled() => self.sender = None,
                Err(err) => return Err(err.into()),
            }
        }
        unreachable!("the second attempt returns")
    }
}

/// One GET on a fresh connection (readiness polling); the status, or an error.
pub async fn get_status(addr: SocketAddr, path: &str) -> anyhow::Result<u16> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(connection);
    let request = Request::builder()
        .uri(path)
        .header(HOST, "127.0.0.1")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    drop(sender);
    let _ = driver.await;
    Ok(status)
}
