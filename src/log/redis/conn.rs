//! What the Redis backend connects to: a single Redis (or a primary with replicas) or a Redis
//! Cluster, and the connections it shares across calls for either. Which one is decided once
//! at start (`connect.rs`: `CLUSTER INFO`).
//!
//! In a cluster, every call that touches a thread names its keys in one slot (the `{threadId}`
//! hash tag), so the redis crate's cluster connection sends it to the slot's primary and
//! follows `MOVED`/`ASK` (a slot migrating, a replica promoted). The tail does not use it: it
//! reads each primary on a dedicated connection of its own (`tail/cluster.rs`).

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

/// The server(s) of the log, as found at start.
// One per log, built once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum Target {
    /// One Redis: its client.
    Single(Client),
    /// A Redis Cluster: the cluster client and one client per seed URL (in the order given;
    /// the tail learns the primaries from them with `CLUSTER SLOTS`).
    Cluster {
        cluster: ClusterClient,
        /// The same cluster in RESP3, for the shard subscriptions of the append notes.
        notes: ClusterClient,
        seeds: Vec<Client>,
    },
}

impl Target {
    /// True for a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster { .. })
    }
}

/// A connection of either kind; clones share it.
#[derive(Clone)]
pub(super) enum Shared {
    /// A single Redis through a connection manager (reconnects on the next call).
    Manager(ConnectionManager),
    /// A single Redis, one multiplexed connection.
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster: connections to every primary, routed by slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Shared {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Shared::Manager(c) => c.req_packed_command(cmd),
            Shared::Multiplexed(c) => c.req_packed_command(cmd),
            Shared::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Shared::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Shared::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Shared::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Shared::Manager(c) => c.get_db(),
            Shared::Multiplexed(c) => c.get_db(),
            Shared::Cluster(c) => c.get_db(),
        }
    }
}
