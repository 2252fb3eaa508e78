//! A loopback TCP proxy in front of Redis for tests of what a client cannot see from its side:
//! a failover behind a stable address (new connections go to another server while the old
//! ones stay where they were), and half-open connections (a connection that stays open but
//! carries nothing more, either way).
//!
//! Connections are told apart by what their client sent first (the first 4 KiB): e.g. the
//! tail's reader names itself `agui-fanout-tail`, the subscriber sends `SUBSCRIBE`.
#![allow(dead_code)]

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Bytes of each connection's client data kept to tell connections apart.
const HEAD: usize = 4096;

struct Conn {
    head: Mutex<Vec<u8>>,
    /// Nothing is forwarded any more, either way; the sockets stay open.
    frozen: AtomicBool,
    closed: CancellationToken,
}

struct Shared {
    upstream: AtomicU16,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Connections whose client sends this are frozen as soon as it is seen.
    freeze: Mutex<Option<Vec<u8>>>,
}

/// The proxy; stops (closing every connection) on drop.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

impl Proxy {
    /// Listens on a free loopback port and forwards each new connection to
    /// `127.0.0.1:<upstream>`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            conns: Mutex::new(Vec::new()),
            freeze: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        Proxy { port, shared, stop }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `127.0.0.1:<port>`; open ones stay where they are.
    pub fn set_upstream(&self, port: u16) {
        self.shared.upstream.store(port, Ordering::SeqCst);
    }

    /// Closes the open connections whose client data so far satisfies `pick`; returns how
    /// many.
    pub fn close_where(&self, pick: impl Fn(&[u8]) -> bool) -> usize {
        let conns = self.shared.conns.lock();
        let mut n = 0;
        for conn in conns.iter() {
            if !conn.closed.is_cancelled() && pick(&conn.head.lock()) {
                conn.closed.cancel();
                n += 1;
            }
        }
        n
    }

    /// Freezes every connection, open or new, whose client sends `marker`: it stays open and
    /// carries nothing more (a half-open connection). Returns how many open ones it froze.
    pub fn freeze_matching(&self, marker: &[u8]) -> usize {
        *self.shared.freeze.lock() = Some(marker.to_vec());
        let conns = self.shared.conns.lock();
        let mut n = 0;
        for conn in conns.iter() {
            if !conn.closed.is_cancelled() && contains(&conn.head.lock(), marker) {
                conn.frozen.store(true, Ordering::SeqCst);
                n += 1;
            }
        }
        n
    }

    /// Freezes nothing new, and closes the frozen connections (their clients see them end).
    pub fn heal(&self) {
        *self.shared.freeze.lock() = None;
        for conn in self.shared.conns.lock().iter() {
            if conn.frozen.load(Ordering::SeqCst) {
                conn.closed.cancel();
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        for conn in self.shared.conns.lock().iter() {
            conn.closed.cancel();
        }
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        let upstream = shared.upstream.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            // Like a refused connection: the client sees it close.
            continue;
        };
        let conn = Arc::new(Conn {
            head: Mutex::new(Vec::new()),
            frozen: AtomicBool::new(false),
            closed: CancellationToken::new(),
        });
        {
            let mut conns = shared.conns.lock();
            conns.retain(|c| !c.closed.is_cancelled());
            conns.push(conn.clone());
        }
        tokio::spawn(forward(client, server, conn, shared.clone()));
    }
}

async fn forward(client: TcpStream, server: TcpStream, conn: Arc<Conn>, shared: Arc<Shared>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let upward = {
        let conn = conn.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                {
                    let mut head = conn.head.lock();
                    if head.len() < HEAD {
                        let take = n.min(HEAD - head.len());
                        head.extend_from_slice(&buf[..take]);
                    }
                    if let Some(marker) = shared.freeze.lock().as_deref()
                        && (contains(&head, marker) || contains(&buf[..n], marker))
                    {
                        conn.frozen.store(true, Ordering::SeqCst);
                    }
                }
                if conn.frozen.load(Ordering::SeqCst) {
                    continue;
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let downward = {
        let conn = conn.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if conn.frozen.load(Ordering::SeqCst) {
                    continue;
                }
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = conn.closed.cancelled() => {}
        _ = upward => {}
        _ = downward => {}
    }
    conn.closed.cancel();
}
