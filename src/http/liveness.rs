//! TCP options that free a connection whose peer vanished without closing it (no FIN, no RST:
//! a laptop lid closed, a NAT or load balancer entry dropped, a pod's network cut).

use socket2::{SockRef, TcpKeepalive};
use std::time::Duration;
use tokio::net::TcpStream;

/// Sets the options that end a connection whose peer stopped answering within about `limit`
/// (`sse.write_timeout`), instead of the kernel's default of ~15 minutes of retransmissions
/// (`tcp_retries2`) or never (an idle connection without keepalive):
///
/// - `TCP_USER_TIMEOUT` (RFC 5482, Linux) = `limit`: written data that stays unacknowledged
///   that long ends the connection (`ETIMEDOUT`). A stream writes a heartbeat every
///   `sse.heartbeat`, so a subscriber that vanished is freed within heartbeat + `limit`. The
///   same bound applies while the peer's receive window stays closed, as `sse.write_timeout`
///   says for a client that stops reading.
/// - TCP keepalive after `limit / 2` idle, then a probe every `limit / 6`: a connection with
///   nothing in flight (an idle publisher's keep-alive connection) is probed, and ended by the
///   user timeout when the probes go unanswered.
///
/// Failures are ignored: the options only shorten what the write timeouts bound anyway.
pub(super) fn set_liveness(stream: &TcpStream, limit: Duration) {
    let socket = SockRef::from(stream);
    let keepalive = TcpKeepalive::new()
        .with_time((limit / 2).max(Duration::from_secs(1)))
        .with_interval((limit / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&keepalive);
    #[cfg(target_os = "linux")]
    let _ = socket.set_tcp_user_timeout(Some(limit));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_accepted_connection_gets_keepalive_and_the_user_timeout() {
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
        #[cfg(target_os = "linux")]
        assert_eq!(
            socket.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
            Some(Duration::from_secs(60))
        );
    }
}
