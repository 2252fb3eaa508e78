//! Wiring: builds the log backend, the hub and the router from a [`Config`], serves HTTP, and
//! drains gracefully: readiness turns false, a subscribe is told to reconnect, streams end
//! themselves within the drain period (each at a jittered moment, with a short jittered
//! `retry:`), SSE ingests still open at its end answer with what they appended, in-flight
//! publishes complete, and only then does the process exit (PROTOCOL §9). Gateway runs still
//! going at the end of the drain period end with `RUN_ERROR` `broker_shutdown` (PROTOCOL §11).

use crate::config::Config;
use crate::http::{self, AppState};
use crate::hub::Hub;
use crate::ingest::Ingest;
use crate::log::memory::MemoryLog;
use crate::log::redis::{RedisLog, RedisLogConfig, RedisTls};
use crate::log::{EventLog, Retention};
use crate::queue::QueueLimits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Extra time after the drain period for in-flight requests before the server is abandoned.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// A running broker.
pub struct Server {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    /// Shared handler state (tests read the log or hub through it).
    pub state: AppState,
    /// Cancel to start a graceful shutdown.
    pub shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// Waits until the server has shut down (after [`Server::shutdown`] was cancelled).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    /// Cancels the shutdown token and waits for the drain to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.wait().await;
    }
}

/// Builds the log backend the configuration names: `redis` when `redis_url` is set, else
/// `memory`.
///
/// # Errors
/// A Redis URL that cannot be parsed (an unreachable Redis is not an error: the node starts
/// not ready and publishes answer 503 until Redis answers).
pub async fn build_log(config: &Config) -> anyhow::Result<Arc<dyn EventLog>> {
    let retention = Retention {
        max_events: config.retention.max_events,
        // `0s` disables, like an unset value.
        max_age: config.retention.max_age.filter(|d| !d.is_zero()),
        idle_ttl: config.retention.idle_ttl.filter(|d| !d.is_zero()),
    };
    if config.redis_url.is_empty() {
        return Ok(Arc::new(MemoryLog::new(retention)));
    }
    let mut redis = RedisLogConfig::new(config.redis_url.clone());
    let file = |path: &str| (!path.is_empty()).then(|| PathBuf::from(path));
    redis.tls = RedisTls {
        ca_file: file(&config.redis_tls_ca),
        client_cert_file: file(&config.redis_tls_cert),
        client_key_file: file(&config.redis_tls_key),
    };
    redis.retention = retention;
    redis.block = config.redis_block;
    redis.stall_after = config.redis_tail_stall;
    redis.outcome_timeout = config.redis_outcome_timeout;
    Ok(Arc::new(RedisLog::connect(redis).await?))
}

/// Pending connections the listen socket queues (tokio's default is 1,024): a resume storm
/// after a deploy brings thousands of reconnects at once.
const LISTEN_BACKLOG: u32 = 8_192;

/// Binds a listening socket with [`LISTEN_BACKLOG`] (the kernel caps it at `somaxconn`).
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `config.listen`, starts serving, and returns at once. Cancel [`Server::shutdown`]
/// (or let `main` do it on SIGTERM/SIGINT) to drain and stop.
///
/// # Errors
/// The address cannot be bound, or the log backend cannot be built.
pub async fn start(config: Config) -> anyhow::Result<Server> {
    let log = build_log(&config).await?;
    start_with_log(config, log).await
}

/// The router's state for `config` over `log`: the hub (its tail stopped by `hub_stop`),
/// ingest, gateway (with the orphan sweep when `runs.orphan_timeout` is set), auth, CORS and
/// the bodies budget, with `metrics` as the `/metrics` handle. Shared by [`start_with_log`] and
/// the tests and benches that drive `http::router` without a socket.
///
/// # Errors
/// The auth or gateway configuration is invalid.
pub fn state(
    config: Config,
    log: Arc<dyn EventLog>,
    hub_stop: CancellationToken,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> anyhow::Result<AppState> {
    let auth = crate::http::auth::Auth::from_config(&config.auth)
        .map_err(anyhow::Error::msg)?
        .map(Arc::new);
    let hub = Hub::start(
        log.clone(),
        QueueLimits {
            max_events: config.queue.max_events,
            max_bytes: config.queue.max_bytes,
        },
        hub_stop.clone(),
    );
    let ingest = Ingest::with_queue_limits(
        log.clone(),
        config.strict_order,
        config.retention.max_events,
        QueueLimits {
            max_events: config.queue.max_events,
            max_bytes: config.queue.max_bytes,
        },
    );
    ingest.hand_values_to(Arc::new(hub.clone()));
    let gateway = crate::gateway::Gateway::new(&config, ingest.clone(), log.clone())
        .map_err(anyhow::Error::msg)?;
    // Stopped with the hub: a sweep may still close a run while streams drain.
    if !config.runs.orphan_timeout.is_zero() {
        ingest.start_orphan_sweep(config.runs.orphan_timeout, hub_stop);
    }
    let cors = crate::http::cors::layer(&config.cors).map(Arc::new);
    let bodies = http::BodyBudget::new(config.limits.bodies_in_flight_bytes);
    Ok(AppState::new(http::AppShared {
        config: Arc::new(config),
        log,
        ingest,
        hub,
        gateway,
        metrics,
        draining: Arc::new(AtomicBool::new(false)),
        drain_ended: CancellationToken::new(),
        auth,
        cors,
        bodies,
        connections: http::admin::connections::Connections::new(),
    }))
}

/// Like [`start`], with a given log backend (tests share one log between two brokers).
///
/// # Errors
/// The address cannot be bound.
pub async fn start_with_log(config: Config, log: Arc<dyn EventLog>) -> anyhow::Result<Server> {
    // Also for configurations built in code (tests): the non-loopback rule of PROTOCOL §8 holds.
    config.validate()?;
    let listener = anyhow::Context::with_context(bind(config.listen), || {
        format!("cannot listen on {}", config.listen)
    })?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    // The hub's tail outlives the HTTP drain: streams still being drained keep receiving.
    let hub_stop = CancellationToken::new();
    let state = state(config, log, hub_stop.clone(), crate::metrics::install())?;
    // Every family on /metrics from start, and `agui_backend_up` from a first ping rather than
    // from the first operation (an alert on it must not wait for traffic).
    crate::metrics::export_zero_series(
        crate::event::EventType::ALL.iter().map(|t| t.as_str()),
        !state.config.redis_url.is_empty(),
    );
    let up = state.log.ping().await.is_ok();
    metrics::gauge!(crate::metrics::BACKEND_UP).set(if up { 1.0 } else { 0.0 });
    // Zero series for the gateway's bounded labels (after the recorder is installed).
    crate::gateway::describe_metrics();
    let upkeep = tokio::spawn(crate::metrics::run_upkeep(state.metrics.clone()));
    let router = http::router(state.clone());
    let drain = state.config.shutdown.drain;
    let stop = shutdown.clone();
    let serve_state = state.clone();
    let task = tokio::spawn(async move {
        let stop_accepting = {
            let stop = stop.clone();
            let state = serve_state.clone();
            async move {
                stop.cancelled().await;
                tracing::info!(drain = ?drain, "draining: readiness off, subscribes told to reconnect, open streams end within the drain period");
                state.draining.store(true, Ordering::Relaxed);
                // Streams end one by one over the drain period (each after a jittered
                // `retry:`), so their clients do not all come back at the same moment.
                let hub = state.hub.clone();
                tokio::spawn(async move { hub.drain_streams(drain).await });
                // Keep answering during the drain (503 on /readyz, subscribes told to
                // reconnect, publishes still accepted) so load balancers see the node leave;
                // then stop accepting and let in-flight requests finish: SSE ingests stop
                // reading and answer with what they appended.
                tokio::time::sleep(drain).await;
                state.drain_ended.cancel();
                // Gateway runs still going end now, each with a `RUN_ERROR` (PROTOCOL §11),
                // which also ends their callers' responses.
                state.gateway.stop(DRAIN_GRACE).await;
            }
        };
        // Counted from SIGTERM, not from when the accept loop ends: a task of its own.
        let deadline = {
            let fired = CancellationToken::new();
            let (stop, fire) = (stop.clone(), fired.clone());
            tokio::spawn(async move {
                stop.cancelled().await;
                tokio::time::sleep(drain + DRAIN_GRACE).await;
                fire.cancel();
            });
            fired.cancelled_owned()
        };
        http::conn::serve(listener, serve_state, router, stop_accepting, deadline).await;
        upkeep.abort();
        hub_stop.cancel();
        tracing::info!("stopped");
    });
    tracing::info!(%addr, "listening");
    Ok(Server {
        addr,
        state,
        shutdown,
        task,
    })
}
