//! TCP options that free a connection whose peer vanished without closing it (no FIN, no RST:
//! a laptop lid closed, a NAT or load balancer entry dropped, a pod's network cut).

use socket2::{SockRef, TcpKeepalive};
use std::time::Duration;
use tokio::net::TcpStream;

/// TCP keepalive after `limit / 2` (`sse.write_timeout / 2`) idle, then a probe every
/// `limit / 6`, three unanswered probes ending the connection: one with nothing in flight (an
/// idle publisher's kept-alive connection) whose peer vanished goes within ~`limit`, instead of
/// never. A stream with bytes in flight is not idle and is not probed: its writer notices a
/// peer that acknowledges nothing at its heartbeats (`stream::socket`).
///
/// Failures are ignored: the option only shortens how long a dead connection is held.
pub(super) fn set_liveness(stream: &TcpStream, limit: Duration) {
    let keepalive = TcpKeepalive::new()
        .with_time((limit / 2).max(Duration::from_secs(1)))
        .with_interval((limit / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    let _ = SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_accepted_connection_gets_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        set_liveness(&server, Duration::from_secs(60));
        let socket = SockRef::from(&server);
        assert!(socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            Duration::from_secs(30)
        );
        assert_eq!(
            socket.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            Duration::from_secs(10)
        );
        assert_eq!(socket.tcp_keepalive_retries().expect("TCP_KEEPCNT"), 3);
    }
}
