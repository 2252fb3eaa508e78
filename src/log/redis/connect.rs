//! Building the Redis client of a [`RedisLog`](super::RedisLog) from its configuration: the
//! URL, and for `rediss://` the TLS material (a CA file instead of the system's trust store, a
//! client certificate for mutual TLS), read once at start; and telling a TLS failure, which
//! no retry can fix, from an outage.

use super::RedisLogConfig;
use crate::log::LogError;
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

/// The client for `config.url`, with its TLS material for `rediss://`.
///
/// # Errors
/// [`LogError::Unavailable`] for a configuration that can never work: a malformed URL, TLS
/// files set for a `redis://` URL, a file that cannot be read or holds no PEM certificate or
/// key.
pub(super) fn client(config: &RedisLogConfig) -> Result<Client, LogError> {
    let url = config.url.as_str();
    let tls = url.starts_with("rediss://");
    if tls {
        install_crypto_provider();
    }
    if !tls && config.tls.is_set() {
        return Err(LogError::Unavailable(
            "redis TLS files are set but the redis URL does not start with rediss://".into(),
        ));
    }
    if !config.tls.is_set() {
        return Client::open(url)
            .map_err(|e| LogError::Unavailable(format!("invalid redis URL: {e}")));
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
    Client::build_with_tls(
        url,
        TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| LogError::Unavailable(format!("invalid redis TLS configuration: {e}")))
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
pub(super) async fn check_tls(client: &Client, config: &RedisLogConfig) -> Result<(), LogError> {
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
