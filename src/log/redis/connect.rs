//! Building the Redis clients of a [`RedisLog`](super::RedisLog) from its configuration: the
//! URL (or comma-separated seed URLs of a cluster), and for `rediss://` the TLS material (a CA
//! file instead of the system's trust store, a client certificate for mutual TLS), read once
//! at start; whether the server is a Redis Cluster (`CLUSTER INFO`); and telling a TLS
//! failure, which no retry can fix, from an outage.

use super::RedisLogConfig;
use super::conn::Target;
use crate::log::LogError;
use redis::cluster::ClusterClientBuilder;
use redis::{Client, ClientTlsConfig, RedisError, TlsCertificates};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// TLS settings of a `rediss://` connection (PEM files). All `None`: the system's trust
/// store, no client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// Certificate authorities the server's certificate must chain to (instead of the
    /// system's trust store).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain and its private key, for servers that ask for one
    /// (`tls-auth-clients`); both or neither.
    pub client_cert_file: Option<PathBuf>,
    /// Private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
}

impl RedisTls {
    /// True when any file is set.
    fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.client_cert_file.is_some() || self.client_key_file.is_some()
    }
}

/// Installs ring as the process's rustls crypto provider, once (the redis crate's rustls
/// builds its configuration from the process default; another part of the process may have
/// installed one first, which is kept).
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The comma-separated URLs of `config.url` (one for a single Redis; seeds of a cluster).
fn urls(config: &RedisLogConfig) -> Vec<&str> {
    config
        .url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// The TLS material of `config` (`None`: no file set), read once.
///
/// # Errors
/// A file that cannot be read or holds no PEM certificate or key; a certificate without its
/// key.
fn tls_certificates(config: &RedisLogConfig) -> Result<Option<TlsCertificates>, LogError> {
    if !config.tls.is_set() {
        return Ok(None);
    }
    let root_cert = match &config.tls.ca_file {
        Some(path) => Some(pem_file(path, "redis_tls_ca", "CERTIFICATE")?),
        None => None,
    };
    let client_tls = match (&config.tls.client_cert_file, &config.tls.client_key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: pem_file(cert, "redis_tls_cert", "CERTIFICATE")?,
            client_key: pem_file(key, "redis_tls_key", "PRIVATE KEY")?,
        }),
        (None, None) => None,
        _ => {
            return Err(LogError::Unavailable(
                "redis_tls_cert and redis_tls_key must be set together".into(),
            ));
        }
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The client of each URL of `config.url`, with the TLS material for `rediss://`.
///
/// # Errors
/// [`LogError::Unavailable`] for a configuration that can never work: no URL, a malformed
/// one, `redis://` and `rediss://` mixed, TLS files set for `redis://`, a file that cannot be
/// read or holds no PEM certificate or key.
fn clients(config: &RedisLogConfig) -> Result<Vec<Client>, LogError> {
    let urls = urls(config);
    let Some(first) = urls.first() else {
        return Err(LogError::Unavailable("the redis URL is empty".into()));
    };
    let tls = first.starts_with("rediss://");
    if urls.iter().any(|u| u.starts_with("rediss://") != tls) {
        return Err(LogError::Unavailable(
            "the redis URLs mix redis:// and rediss://; use one scheme for every seed".into(),
        ));
    }
    if tls {
        install_crypto_provider();
    }
    if !tls && config.tls.is_set() {
        return Err(LogError::Unavailable(
            "redis TLS files are set but the redis URL does not start with rediss://".into(),
        ));
    }
    let certificates = tls_certificates(config)?;
    urls.iter()
        .map(|url| {
            match &certificates {
                None => Client::open(*url),
                Some(certs) => Client::build_with_tls(*url, certs.clone()),
            }
            .map_err(|e| LogError::Unavailable(format!("invalid redis URL {url:?}: {e}")))
        })
        .collect()
}

/// What `CLUSTER INFO` said.
enum Kind {
    /// A Redis Cluster node; its `cluster_state` line.
    Cluster(String),
    /// A Redis without cluster support.
    Single,
}

/// `CLUSTER INFO` on `client`, bounded by `timeout`; `None` when it did not answer.
async fn kind(client: &Client, timeout: std::time::Duration) -> Option<Kind> {
    // Asked in database 0: a cluster refuses `SELECT` (the URL's database is checked after).
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_db(0);
    let client = Client::open(info.set_redis_settings(settings)).ok()?;
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async::<String>(&mut conn)
            .await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(info)) => Some(Kind::Cluster(
            info.lines()
                .find(|l| l.starts_with("cluster_state:"))
                .unwrap_or("cluster_state:unknown")
                .trim()
                .to_string(),
        )),
        // "ERR This instance has cluster support disabled" (or a command the server's ACLs
        // deny, as on some managed single servers).
        Ok(Err(e)) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
            tracing::debug!(error = %e, "CLUSTER INFO refused: not a cluster");
            Some(Kind::Single)
        }
        _ => None,
    }
}

/// Resolves `config.url` (one URL, or comma-separated seed URLs) to a single Redis or a Redis
/// Cluster: the first seed that answers `CLUSTER INFO` decides. With no seed answering, one URL
/// is taken for a single Redis and several for a cluster (the node starts not ready either
/// way).
///
/// # Errors
/// [`LogError::Unavailable`] for a configuration that cannot work: see [`clients`]; a TLS
/// handshake that fails ([`check_tls`]); several URLs naming a Redis that is not a cluster; a
/// database other than 0 with a cluster (a cluster has only database 0).
pub(super) async fn resolve(config: &RedisLogConfig) -> Result<Target, LogError> {
    let seeds = clients(config)?;
    check_tls(&seeds[0], config).await?;
    let mut found = None;
    for (i, seed) in seeds.iter().enumerate() {
        if let Some(kind) = kind(seed, config.op_timeout).await {
            found = Some((i, kind));
            break;
        }
    }
    let cluster = match &found {
        Some((_, Kind::Single)) if seeds.len() > 1 => {
            return Err(LogError::Unavailable(format!(
                "redis_url lists {} servers but they are not a Redis Cluster (CLUSTER INFO: \
                 cluster support disabled); give one URL for a single Redis",
                seeds.len()
            )));
        }
        Some((_, Kind::Single)) => false,
        Some((i, Kind::Cluster(state))) => {
            if state != "cluster_state:ok" {
                tracing::warn!(seed = i, %state, "the redis cluster is not ok yet");
            }
            true
        }
        None => {
            tracing::warn!(
                seeds = seeds.len(),
                "no redis server answered CLUSTER INFO; assuming {}",
                if seeds.len() > 1 {
                    "a cluster"
                } else {
                    "a single Redis"
                }
            );
            seeds.len() > 1
        }
    };
    if !cluster {
        // Exactly one seed: several are refused above, or taken for a cluster.
        return Ok(Target::Single(seeds[0].clone()));
    }
    if seeds
        .iter()
        .any(|s| s.get_connection_info().redis_settings().db() != 0)
    {
        return Err(LogError::Unavailable(
            "a Redis Cluster has only database 0: remove the /<db> from redis_url".into(),
        ));
    }
    let certs = tls_certificates(config)?;
    let build = |protocol: redis::ProtocolVersion| {
        let mut builder = ClusterClientBuilder::new(
            seeds
                .iter()
                .map(|s| s.get_connection_info().clone())
                .collect::<Vec<_>>(),
        )
        // A `MOVED`/`ASK` (or a reconnect) is followed by retrying the call: every call of the
        // backend is safe to repeat (an append finds its own outcome record and returns it).
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(500)
        .connection_timeout(config.op_timeout)
        .response_timeout(config.op_timeout)
        .use_protocol(protocol);
        if let Some(certs) = &certs {
            builder = builder.certs(certs.clone());
        }
        builder
            .build()
            .map_err(|e| LogError::Unavailable(format!("invalid redis cluster URLs: {e}")))
    };
    let cluster = build(redis::ProtocolVersion::RESP2)?;
    // Pushes (the shard subscriptions' messages) need RESP3.
    let notes = build(redis::ProtocolVersion::RESP3)?;
    tracing::info!(seeds = seeds.len(), "redis log backend: a Redis Cluster");
    Ok(Target::Cluster {
        cluster,
        notes,
        seeds,
    })
}

/// The bytes of a PEM file, checked to hold a block whose label ends with `label` (so that a
/// swapped or empty file is named at start rather than failing every connection).
fn pem_file(path: &Path, key: &str, label: &str) -> Result<Vec<u8>, LogError> {
    let bytes = std::fs::read(path).map_err(|e| {
        LogError::Unavailable(format!("{key}: cannot read {}: {e}", path.display()))
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.lines().any(|l| {
        l.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|name| name.ends_with(label))
    });
    if !found {
        return Err(LogError::Unavailable(format!(
            "{key}: {} holds no PEM {label}",
            path.display()
        )));
    }
    Ok(bytes)
}

/// The TLS failure in `e`, if it is one: the handshake failed (a certificate refused by
/// either side, no common protocol), which retrying cannot fix. `None` for other errors
/// (refused connections, timeouts, server replies).
pub(super) fn tls_failure(e: &RedisError) -> Option<String> {
    std::error::Error::source(e)
        .and_then(rustls_error)
        .map(|e| e.to_string())
}

/// The [`rustls::Error`] inside `err`: the redis crate keeps an I/O error as an
/// `Arc<dyn Error>`, and tokio-rustls wraps the TLS error in an `io::Error` (whose `source`
/// skips it), so both are opened by type.
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    if let Some(shared) = err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        return rustls_error(&**shared);
    }
    if let Some(io) = err.downcast_ref::<std::io::Error>()
        && let Some(inner) = io.get_ref()
    {
        return rustls_error(inner);
    }
    err.source().and_then(rustls_error)
}

/// For a `rediss://` URL, one connection and `PING` (bounded by `op_timeout`) to find a TLS
/// handshake that fails: that is a configuration error, refused at start with the reason.
/// Any other failure (Redis down, a timeout) is left to the usual retries: the node starts
/// not ready.
///
/// # Errors
/// [`LogError::Unavailable`] naming the TLS failure.
async fn check_tls(client: &Client, config: &RedisLogConfig) -> Result<(), LogError> {
    if !config.url.starts_with("rediss://") {
        return Ok(());
    }
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await
    };
    match tokio::time::timeout(config.op_timeout, attempt).await {
        Ok(Err(e)) => match tls_failure(&e) {
            Some(why) => Err(LogError::Unavailable(format!(
                "redis TLS handshake failed: {why} (check redis_tls_ca, redis_tls_cert and \
                 redis_tls_key, and that the server's certificate names the URL's host)"
            ))),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}
