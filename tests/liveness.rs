//! A connection whose peer vanishes without closing it (no FIN, no RST) must not be held
//! forever: every accepted connection carries TCP keepalive (`src/http/liveness.rs`), read back
//! here from the broker's own socket (an in-process broker: its descriptors are this
//! process's). A stream with bytes in flight is judged by its writer instead
//! (`scripts/vanished-peer.sh` cuts a real one off).

mod common;

use common::broker;
use socket2::SockRef;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The options of the broker's end of the connection from `client` to `server`, as
/// `(keepalive, keepalive idle time)`, found among this process's descriptors.
fn server_end(server: SocketAddr, client: SocketAddr) -> (bool, Duration) {
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Some(fd) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor is only borrowed for the calls below, while the broker's
        // connection (whose end it is, once matched) is held open by the client's socket;
        // a descriptor that is not a socket, or another one, only fails or does not match.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = SockRef::from(&fd);
        let (Ok(local), Ok(peer)) = (socket.local_addr(), socket.peer_addr()) else {
            continue;
        };
        if local.as_socket() == Some(server) && peer.as_socket() == Some(client) {
            return (
                socket.keepalive().expect("SO_KEEPALIVE"),
                socket.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            );
        }
    }
    panic!("the broker's end of {client} → {server} was not found");
}

#[tokio::test]
async fn subscribers_and_hyper_connections_get_keepalive() {
    let server = broker::start(|c| c.sse.write_timeout = Duration::from_secs(8)).await;
    let t = broker::thread_id("liveness");
    // A subscriber served by the connection front.
    let mut sub = TcpStream::connect(server.addr).await.expect("connect");
    sub.write_all(format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut buf = [0u8; 1024];
    let n = sub.read(&mut buf).await.expect("the stream's head");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // A kept-alive connection served by hyper.
    let mut ops = TcpStream::connect(server.addr).await.expect("connect");
    ops.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let n = ops.read(&mut buf).await.expect("an answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    for client in [&sub, &ops] {
        let (keepalive, idle) = server_end(server.addr, client.local_addr().expect("address"));
        assert!(keepalive, "SO_KEEPALIVE");
        assert_eq!(
            idle,
            Duration::from_secs(4),
            "keepalive after write_timeout / 2"
        );
    }
}
