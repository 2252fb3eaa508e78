//! Typed configuration, layered once at start-up: built-in defaults, then a TOML file
//! (`config/default.toml` or `--config FILE`), then `AGUI_*` environment variables, then
//! command-line flags (PROTOCOL §9). Validated once; the rest of the program trusts it.
//!
//! Environment names: top-level keys as `AGUI_<KEY>` (`AGUI_LISTEN`, `AGUI_REDIS_URL`), nested
//! keys with a double underscore (`AGUI_QUEUE__MAX_EVENTS`, `AGUI_SSE__HEARTBEAT`).

pub mod agents;
mod console;
mod error;

pub use console::ConsoleConfig;
pub use error::ConfigError;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Top-level keys of [`Config`], for picking `AGUI_*` environment variables.
const TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "redis_url",
    "redis_tls_ca",
    "redis_tls_cert",
    "redis_tls_key",
    "redis_block",
    "redis_tail_stall",
    "redis_outcome_timeout",
    "strict_order",
    "insecure",
    "auth",
    "cors",
    "sse",
    "queue",
    "limits",
    "retention",
    "runs",
    "shutdown",
    "console",
    "agents",
];

/// Environment variables (after `AGUI_`) taken verbatim as strings, not parsed as values the
/// way figment parses the others: keys, where `12345` must stay a string, surrounding spaces
/// and quotes belong to the secret, and a parse error must not echo the value.
type Field = fn(&mut Config) -> &mut String;
const VERBATIM_ENV: [(&str, Field); 2] = [
    ("AUTH__HS256_SECRET", |c| &mut c.auth.hs256_secret),
    ("AUTH__RS256_PUBLIC_KEY", |c| &mut c.auth.rs256_public_key),
];

/// The whole broker configuration. Every field has a default, so an empty file is valid.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP server binds (default `127.0.0.1:8080`).
    #[serde(deserialize_with = "address")]
    pub listen: SocketAddr,
    /// Redis URL (`redis://host:port/db`, or `rediss://…` for TLS), or comma-separated URLs of
    /// seed nodes of a Redis Cluster (whether the server is a cluster is found at start).
    /// Empty: the embedded `memory` log backend.
    pub redis_url: String,
    /// PEM file of the certificate authorities a `rediss://` server's certificate must chain
    /// to; empty: the system's trust store. Only with `rediss://`.
    pub redis_tls_ca: String,
    /// PEM file of the client certificate (chain) shown to a `rediss://` server that asks for
    /// one (mutual TLS, `tls-auth-clients`); empty: none. Set together with `redis_tls_key`.
    pub redis_tls_cert: String,
    /// PEM file of the private key of `redis_tls_cert`; empty: none.
    pub redis_tls_key: String,
    /// Period of the Redis tail's checks (humantime, e.g. `"1s"`): its read of every followed
    /// stream (how late an entry `XADD`ed directly to a stream, without the broker's append
    /// note, may be seen), the epoch checks of quiet threads, and its `XREAD BLOCK` without
    /// notes. At least 1 ms.
    #[serde(with = "duration")]
    pub redis_block: Duration,
    /// How long the Redis tail may go without reading back the node's own probe (written
    /// every second through the append path) before it counts as stalled: it then drops and
    /// reopens its connections, continuing from each thread's cursor, and `/readyz` answers
    /// 503 until a probe comes back (humantime, e.g. `"5s"`). Raised to at least three times
    /// `redis_block`.
    #[serde(with = "duration")]
    pub redis_tail_stall: Duration,
    /// How long a publish whose append reply Redis did not give in time (past the 2 s
    /// operation timeout, or a connection lost after sending) may spend finding out, on
    /// another connection, whether the append ran, before it answers 503
    /// `append_outcome_unknown` (humantime, e.g. `"5s"`; `"0s"`: answer that at once;
    /// PROTOCOL §2 "Unknown outcomes").
    #[serde(with = "duration")]
    pub redis_outcome_timeout: Duration,
    /// Refuse (409/422) events that would break the `@ag-ui/client` order rules or a
    /// `STATE_DELTA` that does not apply to the thread's state (PROTOCOL §2). Default on.
    pub strict_order: bool,
    /// Allow listening on a non-loopback address without authentication (PROTOCOL §8: refused
    /// unless this is set; `--insecure` on the command line).
    pub insecure: bool,
    /// JWT authentication of publishes and subscriptions (PROTOCOL §8); off while no key is set.
    pub auth: AuthConfig,
    /// Cross-origin requests from browsers (PROTOCOL §8); off while no origin is listed.
    pub cors: CorsConfig,
    /// SSE stream settings.
    pub sse: SseConfig,
    /// Per-connection queue bounds.
    pub queue: QueueConfig,
    /// Publish size limits.
    pub limits: LimitsConfig,
    /// Log retention.
    pub retention: RetentionConfig,
    /// Run lifecycle: orphaned runs (PROTOCOL §2).
    pub runs: RunsConfig,
    /// Graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// The operator console at `/console` (PROTOCOL §12).
    pub console: ConsoleConfig,
    /// The run gateway's upstream agents, by name (`[agents.<name>]`, PROTOCOL §11); none by
    /// default.
    pub agents: std::collections::BTreeMap<String, agents::AgentConfig>,
}

/// JWT bearer tokens (PROTOCOL §8; see `http::auth`). Authentication is on when
/// `hs256_secret` or `rs256_public_key` is set; tokens signed with either are then accepted.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HS256 shared secret (UTF-8 bytes as given); empty: HS256 tokens are refused.
    pub hs256_secret: String,
    /// RS256 public key of the token issuer, PEM (`-----BEGIN PUBLIC KEY-----` or
    /// `-----BEGIN RSA PUBLIC KEY-----`); empty: RS256 tokens are refused.
    pub rs256_public_key: String,
    /// Name of the cookie that may carry the token.
    pub cookie: String,
    /// Required `aud` of every token; empty: a token with an `aud` claim is refused.
    pub audience: String,
    /// Required `iss` of every token; empty: not checked.
    pub issuer: String,
}

/// Secrets stay out of logs and error messages.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field(
                "hs256_secret",
                &(!self.hs256_secret.is_empty()).then_some("<set>"),
            )
            .field(
                "rs256_public_key",
                &(!self.rs256_public_key.is_empty()).then_some("<set>"),
            )
            .field("cookie", &self.cookie)
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .finish()
    }
}

impl AuthConfig {
    /// Whether a key is set (authentication on).
    pub fn enabled(&self) -> bool {
        !self.hs256_secret.is_empty() || !self.rs256_public_key.is_empty()
    }
}

/// CORS (the Fetch standard's CORS protocol), for browsers on other origins (PROTOCOL §8).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins allowed to read responses (`https://app.example.com`, exact); `["*"]`: any
    /// origin (not with `allow_credentials`). Empty: no CORS headers at all.
    pub allow_origins: Vec<String>,
    /// Send `Access-Control-Allow-Credentials: true` (cookies and `EventSource`'s
    /// `withCredentials`).
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight answer (humantime; `Access-Control-Max-Age`).
    #[serde(with = "duration")]
    pub max_age: Duration,
}

/// SSE stream settings (PROTOCOL §3).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SseConfig {
    /// Reconnection delay sent as the first frame's `retry:` field, in milliseconds.
    pub retry_ms: u64,
    /// Interval of heartbeat comments on an otherwise idle stream (humantime, e.g. `"15s"`).
    #[serde(with = "duration")]
    pub heartbeat: Duration,
    /// A subscriber whose socket accepts no byte for this long is disconnected (humantime,
    /// e.g. `"60s"`; nginx's `send_timeout`): a client that stopped reading costs the fan-out
    /// nothing (its queue is reset and drops what comes), but it holds a socket and its kernel
    /// buffers until then. Streams written by the connection front time their writes; every
    /// connection served by hyper has a socket write timeout of the same length.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// `SO_SNDBUF` of a subscriber's socket in bytes (the kernel doubles it for its own
    /// bookkeeping; nginx's `sndbuf`); `0` keeps the kernel's autotuning, which lets a client
    /// that stopped reading take up to `net.ipv4.tcp_wmem`'s maximum (4 MiB by default) of
    /// kernel memory, all of it copied by the node's one writer. Applies to HTTP/1 streams
    /// written by the connection front and to every connection served by hyper (whose write
    /// timeout would otherwise cut a slow but steady reader of a 4 MiB buffer).
    pub send_buffer: usize,
    /// Rebalancing: a stream older than this ends with a short `retry:` (humantime, e.g.
    /// `"30m"`), each stream at a moment drawn from ¾× to 1× of it, so that after a scale-out
    /// clients spread onto the new nodes; they resume exactly with `Last-Event-ID` (PROTOCOL
    /// §9). Unset or `"0s"`: streams last as long as their clients stay.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub max_stream_age: Option<Duration>,
}

/// Per-connection queue bounds (PROTOCOL §5). A subscriber whose queue would exceed either bound
/// is over-full.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// Most events pending for one connection.
    pub max_events: usize,
    /// Most bytes of encoded frames pending for one connection.
    pub max_bytes: usize,
}

/// Request limits: sizes (HTTP 413 beyond them), the request head, and the time and memory
/// request bodies may take.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest single event, in bytes of JSON as sent.
    pub max_event_bytes: usize,
    /// Largest JSON or NDJSON request body, in bytes (an SSE ingest is checked per event).
    pub max_body_bytes: usize,
    /// Largest request head (request line and header fields), in bytes; beyond it: 431. At
    /// least 8 KiB (hyper's smallest read buffer). The default leaves room for a subscribe
    /// whose `?lastEventId=` or `Last-Event-ID` is 64 KiB (it gets a prelude, PROTOCOL §4.3).
    pub max_head_bytes: usize,
    /// Time a JSON or NDJSON request body has to arrive whole, from when its reading starts
    /// (humantime, e.g. `"30s"`); beyond it: 408 and the connection is closed. A total, not
    /// an idle time: a body that trickles in cannot hold its memory longer.
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// Most bytes of JSON and NDJSON request bodies being read or held at once on this node
    /// (all connections together); a body that would go over it: 503 `busy` with
    /// `Retry-After`. At least `max_body_bytes`.
    pub bodies_in_flight_bytes: usize,
}

/// Log retention (PROTOCOL §6).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Keep about this many newest events per thread (`0`: unbounded); checkpoints trim to
    /// between `max_events` and `2 * max_events`, with a hard cap of `4 * max_events`.
    pub max_events: usize,
    /// Drop events older than this, at checkpoint granularity (humantime, e.g. `"24h"`);
    /// unset or `"0s"`: no age limit.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Expire a thread (log, checkpoint, epoch) after this long without an append
    /// (humantime, default `"7d"`); `"0s"`: never.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub idle_ttl: Option<Duration>,
}

/// Run lifecycle (PROTOCOL §2 "Orphaned runs").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// A run with no event for this long gets a `RUN_ERROR` (`code: "orphaned"`) appended by
    /// the broker, once, whichever node notices (humantime, default `"10m"`); `"0s"`: never.
    /// Ten minutes outlasts a slow model call or tool without events; a producer whose runs
    /// stay silent longer sends an event (a `CUSTOM` heartbeat) within it.
    #[serde(with = "duration")]
    pub orphan_timeout: Duration,
}

/// Graceful shutdown (PROTOCOL §9).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long open streams may stay open after SIGTERM before they are ended (humantime).
    #[serde(with = "duration")]
    pub drain: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            redis_url: String::new(),
            redis_tls_ca: String::new(),
            redis_tls_cert: String::new(),
            redis_tls_key: String::new(),
            redis_block: Duration::from_secs(1),
            redis_tail_stall: Duration::from_secs(5),
            redis_outcome_timeout: Duration::from_secs(5),
            strict_order: true,
            insecure: false,
            auth: AuthConfig::default(),
            cors: CorsConfig::default(),
            sse: SseConfig::default(),
            queue: QueueConfig::default(),
            limits: LimitsConfig::default(),
            retention: RetentionConfig::default(),
            runs: RunsConfig::default(),
            shutdown: ShutdownConfig::default(),
            console: ConsoleConfig::default(),
            agents: Default::default(),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            hs256_secret: String::new(),
            rs256_public_key: String::new(),
            cookie: "agui_token".into(),
            audience: String::new(),
            issuer: String::new(),
        }
    }
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allow_origins: Vec::new(),
            allow_credentials: false,
            max_age: Duration::from_secs(600),
        }
    }
}

impl Default for SseConfig {
    fn default() -> Self {
        SseConfig {
            retry_ms: 2_000,
            heartbeat: Duration::from_secs(15),
            write_timeout: Duration::from_secs(60),
            send_buffer: 256 << 10,
            max_stream_age: None,
        }
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_events: 4_096,
            max_bytes: 4 << 20,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_event_bytes: 1 << 20,
            max_body_bytes: 16 << 20,
            max_head_bytes: 96 << 10,
            body_timeout: Duration::from_secs(30),
            bodies_in_flight_bytes: 64 << 20,
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            max_events: 10_000,
            max_age: None,
            idle_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

impl Default for RunsConfig {
    fn default() -> Self {
        RunsConfig {
            orphan_timeout: Duration::from_secs(600),
        }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            drain: Duration::from_secs(5),
        }
    }
}

/// Durations in `humantime` form (`"30s"`, `"500ms"`, `"7d"`); a value that is not one is
/// refused with an example of the form.
mod duration {
    use serde::de::{Deserializer, Error, Visitor};
    use serde::{Deserialize, Serializer};
    use std::time::Duration;

    /// What a duration looks like, for error messages.
    const EXPECTED: &str = "a duration like \"30s\" or \"500ms\"";

    struct Humantime;

    impl Visitor<'_> for Humantime {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(EXPECTED)
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<Duration, E> {
            humantime::parse_duration(v)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &EXPECTED))
        }
    }

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_str(Humantime)
    }

    /// The same for an optional duration.
    pub(super) mod option {
        use super::*;

        struct Wrapped(Duration);

        impl<'de> Deserialize<'de> for Wrapped {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Wrapped)
            }
        }

        pub(in super::super) fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
        }
    }
}

/// `listen`: a socket address; a value that is not one is refused with an example.
fn address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    const EXPECTED: &str = "an address like \"127.0.0.1:8080\" or \"[::1]:8080\"";
    let raw = String::deserialize(d)?;
    raw.parse()
        .map_err(|_| serde::de::Error::invalid_value(serde::de::Unexpected::Str(&raw), &EXPECTED))
}

/// The shortest `auth.hs256_secret` accepted, in bytes: RFC 7518 §3.2 wants an HS256 key at
/// least as long as the hash (256 bits).
pub const MIN_HS256_SECRET: usize = 32;

/// Flags given on the command line, applied last.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--listen ADDR`.
    pub listen: Option<SocketAddr>,
    /// `--redis-url URL`.
    pub redis_url: Option<String>,
    /// `--redis-tls-ca FILE`.
    pub redis_tls_ca: Option<String>,
    /// `--insecure`.
    pub insecure: bool,
}

impl Config {
    /// Loads defaults ← `file` (or `config/default.toml` when it exists) ← `AGUI_*` env ← flags.
    ///
    /// # Errors
    /// [`ConfigError`] naming the bad key or value; a missing explicit `file` is an error.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) => {
                if !path.exists() {
                    return Err(ConfigError::Invalid(format!(
                        "config file {} not found",
                        path.display()
                    )));
                }
                fig = fig.merge(Toml::file(path));
            }
            None => fig = fig.merge(Toml::file("config/default.toml")),
        }
        // Only variables naming a configuration key: other `AGUI_*` variables (`AGUI_LOG`, the
        // log filter read by `main`, or a test harness's own) are not configuration.
        fig = fig.merge(
            Env::prefixed("AGUI_")
                .filter(|k| {
                    let top = k.as_str().split("__").next().unwrap_or("");
                    TOP_LEVEL_KEYS.iter().any(|t| top.eq_ignore_ascii_case(t))
                        && !VERBATIM_ENV
                            .iter()
                            .any(|(v, _)| k.as_str().eq_ignore_ascii_case(v))
                })
                .split("__"),
        );
        if let Some(listen) = overrides.listen {
            fig = fig.merge(("listen", listen));
        }
        if let Some(url) = &overrides.redis_url {
            fig = fig.merge(("redis_url", url));
        }
        if let Some(ca) = &overrides.redis_tls_ca {
            fig = fig.merge(("redis_tls_ca", ca));
        }
        if overrides.insecure {
            fig = fig.merge(("insecure", true));
        }
        let mut config: Config = fig
            .extract()
            .map_err(|e| ConfigError::Load(error::describe(e)))?;
        for (var, field) in VERBATIM_ENV {
            match std::env::var(format!("AGUI_{var}")) {
                Ok(value) => *field(&mut config) = value,
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(ConfigError::Invalid(format!("AGUI_{var} is not UTF-8")));
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges the types cannot express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.queue.max_events == 0 || self.queue.max_bytes == 0 {
            return bad("queue.max_events and queue.max_bytes must be > 0");
        }
        if self.limits.max_event_bytes == 0
            || self.limits.max_body_bytes < self.limits.max_event_bytes
        {
            return bad("limits.max_event_bytes must be > 0 and <= limits.max_body_bytes");
        }
        if self.limits.max_body_bytes > u32::MAX as usize {
            return bad("limits.max_body_bytes must be at most 4294967295");
        }
        if self.limits.max_head_bytes < 8192 {
            return bad("limits.max_head_bytes must be at least 8192");
        }
        if self.limits.body_timeout.is_zero() {
            return bad("limits.body_timeout must be > 0");
        }
        if self.limits.bodies_in_flight_bytes < self.limits.max_body_bytes {
            return bad("limits.bodies_in_flight_bytes must be >= limits.max_body_bytes");
        }
        if self.sse.heartbeat.is_zero() {
            return bad("sse.heartbeat must be > 0");
        }
        if self.sse.write_timeout.is_zero() {
            return bad("sse.write_timeout must be > 0");
        }
        if self.redis_block < Duration::from_millis(1) {
            return bad("redis_block must be at least 1ms");
        }
        if self.redis_tail_stall < Duration::from_millis(100) {
            return bad("redis_tail_stall must be at least 100ms");
        }
        let urls: Vec<&str> = self.redis_url.split(',').map(str::trim).collect();
        if !self.redis_url.is_empty()
            && urls
                .iter()
                .any(|u| !u.starts_with("redis://") && !u.starts_with("rediss://"))
        {
            return bad(
                "redis_url must be a redis:// or rediss:// URL, or a comma-separated list of \
                 them (the seed nodes of a Redis Cluster)",
            );
        }
        let tls_files = [
            ("redis_tls_ca", &self.redis_tls_ca),
            ("redis_tls_cert", &self.redis_tls_cert),
            ("redis_tls_key", &self.redis_tls_key),
        ];
        if let Some((key, _)) = tls_files.iter().find(|(_, v)| !v.is_empty())
            && !urls.iter().all(|u| u.starts_with("rediss://"))
        {
            return Err(ConfigError::Invalid(format!(
                "{key} is set but redis_url does not start with rediss:// (TLS)"
            )));
        }
        if self.redis_tls_cert.is_empty() != self.redis_tls_key.is_empty() {
            return bad("redis_tls_cert and redis_tls_key must be set together (mutual TLS)");
        }
        if self.auth.enabled() && self.auth.cookie.is_empty() {
            return bad("auth.cookie must not be empty");
        }
        if !self.auth.hs256_secret.is_empty() && self.auth.hs256_secret.len() < MIN_HS256_SECRET {
            return bad("auth.hs256_secret must be at least 32 bytes (RFC 7518 §3.2)");
        }
        let any_origin = self.cors.allow_origins.iter().any(|o| o == "*");
        if any_origin && self.cors.allow_origins.len() > 1 {
            return bad("cors.allow_origins: \"*\" must be the only entry");
        }
        if any_origin && self.cors.allow_credentials {
            return bad(
                "cors.allow_credentials cannot be used with cors.allow_origins = [\"*\"] \
                 (the Fetch standard forbids credentials with a wildcard origin)",
            );
        }
        if let Some(o) = self.cors.allow_origins.iter().find(|o| {
            *o != "*"
                && (o.ends_with('/')
                    || o.contains(char::is_whitespace)
                    || !(o.starts_with("http://") || o.starts_with("https://"))
                    || axum::http::HeaderValue::from_str(o).is_err())
        }) {
            return Err(ConfigError::Invalid(format!(
                "cors.allow_origins: {o:?} is not an origin (scheme://host[:port], no path)"
            )));
        }
        agents::validate(&self.agents).map_err(ConfigError::Invalid)?;
        if !self.listen.ip().is_loopback() && !self.auth.enabled() && !self.insecure {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {} without authentication (PROTOCOL §8): set \
                 auth.hs256_secret or auth.rs256_public_key (AGUI_AUTH__HS256_SECRET, AGUI_AUTH__RS256_PUBLIC_KEY), \
                 or start with --insecure (AGUI_INSECURE=true)",
                self.listen
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_url_takes_one_url_or_a_seed_list() {
        let with = |url: &str| Config {
            redis_url: url.into(),
            ..Config::default()
        };
        with("redis://a:6379").validate().unwrap();
        with("redis://a:6379, redis://b:6379").validate().unwrap();
        with("rediss://a:6379,rediss://b:6379").validate().unwrap();
        let e = with("redis://a:6379,b:6379").validate().unwrap_err();
        assert!(e.to_string().contains("comma-separated"), "{e}");
        let mut tls = with("rediss://a:6379,redis://b:6379");
        tls.redis_tls_ca = "ca.pem".into();
        let e = tls.validate().unwrap_err();
        assert!(e.to_string().contains("redis_tls_ca is set"), "{e}");
    }

    #[test]
    fn defaults_are_valid_and_file_matches_them() {
        Config::default().validate().unwrap();
        let shipped = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::file(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/config/default.toml"
            )))
            .extract::<Config>()
            .unwrap();
        assert_eq!(
            shipped,
            Config::default(),
            "config/default.toml documents the defaults"
        );
    }

    #[test]
    // figment's `Jail` closure must return figment's own (large) error type.
    #[allow(clippy::result_large_err)]
    fn retention_durations_are_humantime_and_optional() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "r.toml",
                "[retention]\nmax_age = \"90s\"\nidle_ttl = \"0s\"\n",
            )?;
            let c = Config::load(Some(Path::new("r.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.retention.max_age, Some(Duration::from_secs(90)));
            assert_eq!(c.retention.idle_ttl, Some(Duration::ZERO));
            jail.set_env("AGUI_RETENTION__MAX_AGE", "1h");
            jail.set_env("AGUI_RETENTION__IDLE_TTL", "2d");
            let c = Config::load(Some(Path::new("r.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.retention.max_age, Some(Duration::from_secs(3600)));
            assert_eq!(c.retention.idle_ttl, Some(Duration::from_secs(2 * 86_400)));
            jail.create_file("empty.toml", "")?;
            jail.clear_env();
            let c = Config::load(Some(Path::new("empty.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.retention, RetentionConfig::default());
            assert_eq!(c.retention.max_age, None);
            Ok(())
        });
    }

    #[test]
    // figment's `Jail` closure must return figment's own (large) error type.
    #[allow(clippy::result_large_err)]
    fn env_overrides_file_and_flags_override_env() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "listen = \"127.0.0.1:1\"\n[queue]\nmax_events = 5\n",
            )?;
            jail.set_env("AGUI_QUEUE__MAX_EVENTS", "7");
            jail.set_env("AGUI_REDIS_URL", "redis://127.0.0.1:6379");
            jail.set_env("AGUI_REDIS_BLOCK", "250ms");
            jail.set_env("AGUI_LOG", "debug");
            jail.set_env("AGUI_TEST_REDIS_URL", "redis://elsewhere");
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.queue.max_events, 7);
            assert_eq!(c.listen.port(), 1);
            assert_eq!(c.redis_url, "redis://127.0.0.1:6379");
            assert_eq!(c.redis_block, Duration::from_millis(250));
            let o = Overrides {
                listen: Some("127.0.0.1:2".parse().unwrap()),
                redis_url: Some(String::new()),
                redis_tls_ca: None,
                insecure: false,
            };
            let c = Config::load(Some(Path::new("c.toml")), &o).unwrap();
            assert_eq!(c.listen.port(), 2);
            assert_eq!(c.redis_url, "");
            // Keys are taken verbatim: digits stay a string, spaces and quotes stay.
            let secret = " \"12345678901234567890123456789012\" ";
            jail.set_env("AGUI_AUTH__HS256_SECRET", secret);
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.auth.hs256_secret, secret);
            jail.set_env("AGUI_AUTH__HS256_SECRET", "12345");
            let e = Config::load(Some(Path::new("c.toml")), &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("at least 32 bytes"), "{e}");
            assert!(
                !e.to_string().contains("12345"),
                "the secret is not echoed: {e}"
            );
            jail.set_env("AGUI_AUTH__HS256_SECRET", "");
            jail.create_file("bad.toml", "[queue]\nmax_evnts = 5\n")?;
            assert!(Config::load(Some(Path::new("bad.toml")), &Overrides::default()).is_err());
            Ok(())
        });
    }
}
