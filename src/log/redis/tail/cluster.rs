//! The tail's reads on a Redis Cluster: the slot map (`CLUSTER SLOTS`), one dedicated
//! connection per primary (never the shared cluster connection other calls use), and a
//! pipeline split by primary and put back in order.
//!
//! A cluster refuses a command whose keys lie in different slots (`CROSSSLOT`), even on one
//! primary, so every command the tail sends here names the keys of one thread (one slot,
//! the `{threadId}` hash tag) or one stream; the reader sends one pipeline per primary per
//! round trip. A reply `MOVED` (a slot that moved: resharding, failover) refreshes the slot map
//! and sends the command again to the new primary; `ASK` (a slot migrating) sends it to the
//! importing primary after `ASKING`. Connection errors fail the call: the reader reconnects
//! (and reads the slot map again).

use crate::log::LogError;
use crate::log::redis::resp::{Addr, parse_slots, unavailable};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, Script, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Rounds of redirections one call follows before it fails (the slot map keeps moving).
const REDIRECT_ROUNDS: usize = 4;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key, modulo 16384 (the Redis Cluster
/// specification, "Key distribution model").
pub(in crate::log::redis) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16384
}

/// The slot map and the dedicated connections of the tail's reader on a cluster.
pub(super) struct ClusterReads {
    /// The configured seeds: where the slot map is asked first, and the template of the
    /// primaries' connections (credentials, TLS).
    seeds: Vec<Client>,
    /// Slot ranges (first, last, primary), as last read.
    slots: Vec<(u16, u16, Addr)>,
    /// One dedicated connection per primary, opened when first needed.
    conns: HashMap<Addr, MultiplexedConnection>,
    /// Connecting and each reply.
    op_timeout: Duration,
}

impl ClusterReads {
    /// Reads the slot map (`CLUSTER SLOTS` on a seed that answers).
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when no seed answers with a slot map.
    pub(super) async fn open(seeds: Vec<Client>, op_timeout: Duration) -> Result<Self, LogError> {
        let mut reads = ClusterReads {
            seeds,
            slots: Vec::new(),
            conns: HashMap::new(),
            op_timeout,
        };
        reads.refresh().await?;
        Ok(reads)
    }

    /// Reads the slot map again, asking the primaries known so far, then the seeds; drops
    /// the connections of nodes that serve no slot any more.
    async fn refresh(&mut self) -> Result<(), LogError> {
        let mut candidates: Vec<Client> = Vec::new();
        for (_, _, addr) in &self.slots {
            if let Ok(client) = self.client_for(addr) {
                candidates.push(client);
            }
        }
        candidates.extend(self.seeds.iter().cloned());
        let mut last = String::from("no node to ask");
        for client in candidates {
            let ask = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
            };
            match tokio::time::timeout(self.op_timeout, ask).await {
                Ok(Ok(reply)) => match parse_slots(&reply, &asked_host(&client)) {
                    Some(slots) if !slots.is_empty() => {
                        self.conns
                            .retain(|addr, _| slots.iter().any(|(_, _, a)| a == addr));
                        self.slots = slots;
                        return Ok(());
                    }
                    _ => last = "an empty or malformed CLUSTER SLOTS reply".into(),
                },
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "timed out".into(),
            }
        }
        Err(LogError::Unavailable(format!(
            "redis cluster: no node gave the slot map ({last})"
        )))
    }

    /// The primary serving `slot`, per the slot map.
    fn owner(&self, slot: u16) -> Option<&Addr> {
        self.slots
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr)
    }

    /// A client for `addr` with the first seed's settings (credentials, database, TLS).
    fn client_for(&self, addr: &Addr) -> Result<Client, LogError> {
        let seed = self
            .seeds
            .first()
            .ok_or_else(|| LogError::Unavailable("no redis seed".into()))?;
        let info = seed.get_connection_info().clone();
        let (host, port) = addr.clone();
        let target = match info.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        Client::open(info.set_addr(target)).map_err(unavailable)
    }

    /// The dedicated connection to `addr`, opened if needed: named `agui-fanout-tail`, the
    /// read script loaded.
    async fn conn(
        &mut self,
        addr: &Addr,
        read: &Script,
    ) -> Result<MultiplexedConnection, LogError> {
        if let Some(conn) = self.conns.get(addr) {
            return Ok(conn.clone());
        }
        let client = self.client_for(addr)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.op_timeout))
            .set_response_timeout(Some(self.op_timeout));
        let open = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            // Denied by some ACLs: only a name for operators.
            let _ = redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg("agui-fanout-tail")
                .query_async::<()>(&mut conn)
                .await;
            read.prepare_invoke().load_async(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        };
        let conn = match tokio::time::timeout(self.op_timeout, open).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => {
                return Err(LogError::Unavailable(format!(
                    "redis cluster: connecting to {}:{} timed out",
                    addr.0, addr.1
                )));
            }
        };
        self.conns.insert(addr.clone(), conn.clone());
        tracing::debug!(host = %addr.0, port = addr.1, "redis tail connected to a primary");
        Ok(conn)
    }

    /// Sends the commands of `pipe` (command `i` in slot `slots[i]`), one pipeline per primary
    /// at once, following `MOVED` and `ASK`; the replies in order, a command's own error as
    /// its [`Value::ServerError`].
    ///
    /// # Errors
    /// [`LogError::Unavailable`] on a connection error or when slots keep moving.
    pub(super) async fn query(
        &mut self,
        pipe: &Pipeline,
        slots: &[u16],
        read: &Script,
    ) -> Result<Vec<Value>, LogError> {
        let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
        debug_assert_eq!(cmds.len(), slots.len());
        let mut replies: Vec<Option<Value>> = vec![None; cmds.len()];
        let mut todo: Vec<usize> = (0..cmds.len()).collect();
        // Commands to send to an importing primary after `ASKING`.
        let mut asked: HashMap<usize, Addr> = HashMap::new();
        for _ in 0..REDIRECT_ROUNDS {
            let mut groups: HashMap<Addr, Vec<usize>> = HashMap::new();
            for &i in &todo {
                let addr = match asked.get(&i) {
                    Some(addr) => addr.clone(),
                    None => match self.owner(slots[i]) {
                        Some(addr) => addr.clone(),
                        None => {
                            self.refresh().await?;
                            self.owner(slots[i]).cloned().ok_or_else(|| {
                                LogError::Unavailable(format!(
                                    "redis cluster: no primary serves slot {}",
                                    slots[i]
                                ))
                            })?
                        }
                    },
                };
                groups.entry(addr).or_default().push(i);
            }
            let mut sends = Vec::with_capacity(groups.len());
            for (addr, indices) in groups {
                let conn = self.conn(&addr, read).await?;
                let mut group = redis::pipe();
                group.ignore_errors();
                for &i in &indices {
                    if asked.contains_key(&i) {
                        group.cmd("ASKING");
                    }
                    group.add_command(cmds[i].clone());
                }
                sends.push(async move {
                    let mut conn = conn;
                    let sent = group.query_async::<Vec<Value>>(&mut conn).await;
                    (addr, indices, sent)
                });
            }
            let mut next = Vec::new();
            let mut moved = false;
            for (addr, indices, sent) in futures::future::join_all(sends).await {
                let values = match sent {
                    Ok(values) => values,
                    Err(e) => {
                        self.conns.remove(&addr);
                        return Err(unavailable(e));
                    }
                };
                let mut values = values.into_iter();
                for i in indices {
                    if asked.remove(&i).is_some() {
                        // The `ASKING` reply.
                        values.next();
                    }
                    let value = values.next().unwrap_or(Value::Nil);
                    match &value {
                        Value::ServerError(e) if e.code() == "MOVED" => {
                            moved = true;
                            next.push(i);
                        }
                        Value::ServerError(e) if e.code() == "ASK" => {
                            match e.details().and_then(redirect_addr) {
                                Some(to) => {
                                    asked.insert(i, to);
                                    next.push(i);
                                }
                                None => replies[i] = Some(value),
                            }
                        }
                        _ => replies[i] = Some(value),
                    }
                }
            }
            if next.is_empty() {
                return Ok(replies
                    .into_iter()
                    .map(|v| v.unwrap_or(Value::Nil))
                    .collect());
            }
            if moved {
                self.refresh().await?;
            }
            todo = next;
        }
        Err(LogError::Unavailable(
            "redis cluster: slots kept moving under the tail's reads".into(),
        ))
    }
}

/// The address of a `MOVED`/`ASK` error's details, `<slot> <host>:<port>`.
fn redirect_addr(details: &str) -> Option<Addr> {
    let addr = details.split(' ').nth(1)?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// The host `client` reaches: what an empty host in `CLUSTER SLOTS` stands for.
fn asked_host(client: &Client) -> String {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's reference value: CRC16("123456789") = 0x31C3.
        assert_eq!(slot_of(b"123456789"), 0x31c3);
        // The hash tag decides.
        assert_eq!(slot_of(b"agui:{t-1}:log"), slot_of(b"t-1"));
        assert_eq!(slot_of(b"agui:{t-1}:meta"), slot_of(b"x{t-1}y"));
        // An empty tag, or none closed, hashes the whole key.
        assert_eq!(slot_of(b"a{}b"), slot_of(b"a{}b"));
        assert_ne!(slot_of(b"{}t-1"), slot_of(b"t-1"));
        assert_eq!(
            slot_of(b"foo{bar"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{bar") % 16384
        );
        // Only the first `{…}` counts.
        assert_eq!(slot_of(b"{a}{b}"), slot_of(b"a"));
    }

    #[test]
    fn redirections_name_their_node() {
        assert_eq!(
            redirect_addr("3999 127.0.0.1:6381"),
            Some(("127.0.0.1".to_string(), 6381))
        );
        assert_eq!(redirect_addr("3999"), None);
        assert_eq!(redirect_addr("3999 host:notaport"), None);
    }
}
