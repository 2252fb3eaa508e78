//! The connections still in the listening socket's queue when a draining node stops accepting:
//! taken and answered, rather than reset when the listener closes.

use std::io::ErrorKind;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// Most connections taken from the queue at once (Linux's default backlog, `somaxconn`, is
/// 4096): the queue cannot hold more, and a bound keeps a flood from delaying the close.
const MOST: usize = 4096;

/// Takes every connection the kernel completed that nobody accepted yet, without waiting, and
/// closes `listener`. Closing a listening socket resets the connections in its queue (Linux):
/// a client that connected during the last moments of a drain would get a reset instead of an
/// answer (an `EventSource` retries either way, but a `fetch` publish sees a network error).
/// Taken here, they are served like any other, with a draining node's answers (`Connection:
/// close`, subscribes told to reconnect).
///
/// `accept(2)` is called on the socket itself, not through tokio: tokio tries `accept` only
/// once its reactor reported the listener readable, which it may not have yet for the last
/// connections. An error other than "nothing queued" (out of file descriptors, say) ends the
/// taking, logged; the rest are reset by the close as before.
pub(super) fn take_queued(listener: TcpListener) -> Vec<(TcpStream, SocketAddr)> {
    // Non-blocking, as tokio's sockets are (`TcpListener::into_std`).
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the queued connections at the end of the drain");
            return Vec::new();
        }
    };
    let mut taken = Vec::new();
    while taken.len() < MOST {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed at the end of the drain");
                break;
            }
        };
        // An accepted socket does not inherit the listener's `O_NONBLOCK`; tokio needs it.
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream));
        match stream {
            Ok(stream) => taken.push((stream, peer)),
            Err(e) => tracing::warn!(error = %e, %peer, "cannot serve a queued connection"),
        }
    }
    // Closed before anything else: a connection completed from here on is reset.
    drop(listener);
    if !taken.is_empty() {
        tracing::info!(
            connections = taken.len(),
            "answering the connections queued when the drain ended"
        );
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn queued_connections_are_taken_and_usable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // The handshake completes in the kernel's queue: nobody calls accept before the take.
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let taken = take_queued(listener);
        assert_eq!(taken.len(), 3);
        let mut peers: Vec<SocketAddr> = taken.iter().map(|(_, p)| *p).collect();
        let mut locals: Vec<SocketAddr> = clients
            .iter()
            .map(|c| c.local_addr().expect("local"))
            .collect();
        peers.sort();
        locals.sort();
        assert_eq!(peers, locals, "the taken connections are the clients'");
        // Each one works both ways through tokio.
        for (mut server, peer) in taken {
            server.write_all(b"bye").await.expect("write");
            let client = clients
                .iter_mut()
                .find(|c| c.local_addr().ok() == Some(peer))
                .expect("its client");
            let mut got = [0u8; 3];
            client.read_exact(&mut got).await.expect("read");
            assert_eq!(&got, b"bye");
            client.write_all(b"x").await.expect("client write");
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await.expect("server read");
        }
        // The listener is closed: a new connection is refused.
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn an_empty_queue_takes_nothing_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        assert!(take_queued(listener).is_empty());
    }
}
