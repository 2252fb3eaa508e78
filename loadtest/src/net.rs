//! Sockets and the HTTP client used for publishing: the target broker, the spread of client
//! connections over several source addresses in 127.0.0.0/8 (each loopback address has its
//! own ephemeral ports, so tens of thousands of connections do not exhaust them), and a
//! keep-alive HTTP/1.1 connection (hyper) for `POST`s.

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream};

/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker under test.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its socket address.
    pub addr: SocketAddr,
    /// The `Host` header value.
    pub host: String,
    /// A path prefix from the URL (empty or `/something`, no trailing slash).
    pub prefix: String,
    /// A bearer token sent with every request (`--bearer`), for a broker with authentication.
    pub bearer: Option<String>,
}

impl Target {
    /// Parses `http://host[:port][/prefix]` and resolves the host.
    ///
    /// # Errors
    /// Not a plain-`http` URL, or the host does not resolve.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("--url must start with http:// (got {url:?})"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("--url has no host: {url:?}");
        }
        let with_port = if authority.rsplit_once(':').is_some_and(|(_, p)| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !authority.ends_with(']')
        }) {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .with_context(|| format!("resolving {authority}"))?
            .next()
            .ok_or_else(|| anyhow!("{authority} resolves to nothing"))?;
        Ok(Target {
            addr,
            host: authority.to_string(),
            prefix: path.trim_end_matches('/').to_string(),
            bearer: None,
        })
    }

    /// `prefix + template` with `{thread}` replaced.
    pub fn path(&self, template: &str, thread: &str) -> String {
        format!("{}{}", self.prefix, template.replace("{thread}", thread))
    }
}

/// Source addresses that client sockets are bound to, used in turn.
#[derive(Debug)]
pub struct Sources {
    addrs: Vec<IpAddr>,
    next: AtomicUsize,
}

impl Sources {
    /// `count` addresses 127.0.0.1, 127.0.0.2, … when the target is an IPv4 loopback address
    /// (and `count` > 0); otherwise none (the kernel chooses).
    pub fn new(target: &SocketAddr, count: usize) -> Self {
        let addrs = match target.ip() {
            IpAddr::V4(v4) if v4.is_loopback() && count > 0 => (1..=count.min(254))
                .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i as u8)))
                .collect(),
            _ => Vec::new(),
        };
        Sources {
            addrs,
            next: AtomicUsize::new(0),
        }
    }

    /// The addresses in use.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// The next source address, round-robin.
    pub fn pick(&self) -> Option<IpAddr> {
        if self.addrs.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        Some(self.addrs[i % self.addrs.len()])
    }
}

/// Connects to `target`, the socket bound to `source` first when given.
///
/// # Errors
/// Bind, connect or timeout errors.
pub async fn connect(target: SocketAddr, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(src) = source {
        bind_address_no_port(&socket);
        socket.bind(SocketAddr::new(src, 0))?;
    }
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `IP_BIND_ADDRESS_NO_PORT`: the port is chosen at connect time for the whole 4-tuple, so a
/// bound source address does not reserve a port per socket (Linux ≥ 4.2; ignored elsewhere).
fn bind_address_no_port(socket: &TcpSocket) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let one: libc::c_int = 1;
        // SAFETY: a valid socket fd and a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

/// A keep-alive HTTP/1.1 client connection (one request at a time).
pub struct HttpConn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    /// `Authorization` header value, if any.
    authorization: Option<String>,
}

/// A response: status and whole body.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

impl HttpConn {
    /// Opens a connection to `target` from `source`.
    ///
    /// # Errors
    /// Connect or handshake errors.
    pub async fn open(target: &Target, source: Option<IpAddr>) -> Result<Self> {
        let stream = connect(target.addr, source)
            .await
            .with_context(|| format!("connecting to {}", target.addr))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(HttpConn {
            sender,
            host: target.host.clone(),
            authorization: target.bearer.as_ref().map(|t| format!("Bearer {t}")),
        })
    }

    /// Sends one request and reads the whole response.
    ///
    /// # Errors
    /// Transport errors (the connection is then unusable).
    pub async fn request(
        &mut self,
        method: hyper::Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Reply> {
        self.sender.ready().await?;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.host);
        if let Some(ct) = content_type {
            req = req.header(hyper::header::CONTENT_TYPE, ct);
        }
        if let Some(a) = &self.authorization {
            req = req.header(hyper::header::AUTHORIZATION, a);
        }
        let resp = self.sender.send_request(req.body(Full::new(body))?).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Reply { status, body })
    }

    /// `POST path` with a JSON body.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn post_json(&mut self, path: &str, body: Bytes) -> Result<Reply> {
        self.request(hyper::Method::POST, path, Some("application/json"), body)
            .await
    }

    /// `GET path`.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn get(&mut self, path: &str) -> Result<Reply> {
        self.request(hyper::Method::GET, path, None, Bytes::new())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_sources() {
        let t = Target::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:8080");
        assert_eq!(
            t.path("/v1/threads/{thread}/events", "a"),
            "/v1/threads/a/events"
        );
        let t = Target::parse("http://127.0.0.1:9/base/").unwrap();
        assert_eq!(t.path("/x/{thread}", "b"), "/base/x/b");
        assert!(Target::parse("https://127.0.0.1").is_err());
        let s = Sources::new(&t.addr, 3);
        let picked: Vec<_> = (0..4).map(|_| s.pick().unwrap().to_string()).collect();
        assert_eq!(picked, ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1"]);
        let none = Sources::new(&"[::1]:80".parse().unwrap(), 3);
        assert!(none.pick().is_none());
    }
}
