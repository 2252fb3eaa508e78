//! `[agents.<name>]`: the upstream AG-UI agents the run gateway serves at
//! `POST /v1/agents/<name>` (PROTOCOL §11), their URL, headers, timeouts and what a caller's
//! disconnect does. Checked once at start-up like every other key.

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Longest agent name (it is a path segment of `POST /v1/agents/{name}`).
pub const MAX_AGENT_NAME: usize = 64;

/// One upstream agent: an AG-UI endpoint that takes a `RunAgentInput` POST and answers with
/// an AG-UI SSE stream (AGUI.md §3, §4.1).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's AG-UI endpoint, `http://` or `https://` (required).
    pub url: String,
    /// Headers sent with every upstream request, e.g. an API key. A value is a literal string
    /// or `{ env = "VAR" }`, read from the broker's environment at start-up (a variable that is
    /// not set is refused then). Values are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderSource>,
    /// Names of request headers copied from the caller's request to the upstream request
    /// (e.g. `["authorization"]`), when the caller sent them; case-insensitive.
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Longest wait for the upstream's TCP (and TLS) connection (humantime; default `10s`).
    #[serde(default = "default_connect_timeout", with = "super::duration")]
    pub connect_timeout: Duration,
    /// A run whose upstream sends no event for this long (response headers included; SSE
    /// comments do not count) ends with `RUN_ERROR` `upstream_timeout` (humantime; default
    /// `2m`).
    #[serde(default = "default_idle_timeout", with = "super::duration")]
    pub idle_timeout: Duration,
    /// What a caller that goes away does to its run: `continue` (default: the run goes on to
    /// its end in the log) or `cancel` (the upstream request is aborted and the run ends with
    /// `RUN_ERROR` `cancelled`).
    #[serde(default)]
    pub on_disconnect: OnDisconnect,
    /// PEM file of the certificate authorities an `https://` agent's certificate must chain
    /// to, instead of the platform's trust store (an agent behind a private CA). Only with
    /// `https://`; read at start-up, where a file that cannot be read or holds no usable
    /// certificate is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl AgentConfig {
    /// An agent at `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        AgentConfig {
            url: url.into(),
            headers: BTreeMap::new(),
            forward_headers: Vec::new(),
            connect_timeout: default_connect_timeout(),
            idle_timeout: default_idle_timeout(),
            on_disconnect: OnDisconnect::default(),
            ca_file: None,
        }
    }

    /// The trust roots of `ca_file` for agent `name` (`None` when it is not set: the
    /// platform's trust store).
    ///
    /// # Errors
    /// A message naming `agents.<name>.ca_file` when the file cannot be read, a PEM block in
    /// it is malformed, or it holds no certificate rustls accepts as a trust anchor.
    pub fn root_store(&self, name: &str) -> Result<Option<rustls::RootCertStore>, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        let at = format!("agents.{name}.ca_file ({})", path.display());
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{at}: {e}"))?;
        let mut roots = rustls::RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("{at}: the file holds no usable PEM certificate"));
        }
        Ok(Some(roots))
    }
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(120)
}

/// Header values may be secrets: shown as `<set>`.
impl fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentConfig")
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("forward_headers", &self.forward_headers)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("on_disconnect", &self.on_disconnect)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// What a caller's disconnect does to its run (PROTOCOL §11 "Run lifecycle").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDisconnect {
    /// The run goes on; a viewer finds it in the thread.
    #[default]
    Continue,
    /// The upstream request is aborted and the run ends as a cancel does.
    Cancel,
}

/// A static header's value: a literal, or the name of an environment variable (`{ env = "X" }`)
/// so that a key stays out of the configuration file.
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderSource {
    /// The value as written.
    Literal(String),
    /// The value of this environment variable, read at start-up.
    Env(String),
}

impl HeaderSource {
    /// The value: the literal, or the variable's value.
    ///
    /// # Errors
    /// A message naming the variable when it is not set or not UTF-8 (never the value).
    pub fn resolve(&self) -> Result<String, String> {
        match self {
            HeaderSource::Literal(v) => Ok(v.clone()),
            HeaderSource::Env(var) => std::env::var(var).map_err(|e| match e {
                std::env::VarError::NotPresent => {
                    format!("the environment variable {var} is not set")
                }
                std::env::VarError::NotUnicode(_) => {
                    format!("the environment variable {var} is not UTF-8")
                }
            }),
        }
    }
}

impl fmt::Debug for HeaderSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderSource::Literal(_) => f.write_str("<literal>"),
            HeaderSource::Env(var) => write!(f, "env {var}"),
        }
    }
}

impl Serialize for HeaderSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            HeaderSource::Literal(v) => s.serialize_str(v),
            HeaderSource::Env(var) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("env", var)?;
                m.end()
            }
        }
    }
}

/// A string, or a table with exactly the key `env` (any other key is refused, naming it).
impl<'de> Deserialize<'de> for HeaderSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HeaderSource;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, or a table { env = \"VARIABLE\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HeaderSource, E> {
                Ok(HeaderSource::Literal(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderSource, A::Error> {
                let mut var: Option<String> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "env" {
                        return Err(de::Error::unknown_field(&key, &["env"]));
                    }
                    if var.is_some() {
                        return Err(de::Error::duplicate_field("env"));
                    }
                    var = Some(map.next_value()?);
                }
                var.map(HeaderSource::Env)
                    .ok_or_else(|| de::Error::missing_field("env"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Headers the gateway sets itself or that belong to one connection (RFC 9110 §7.6.1), which
/// neither `headers` nor `forward_headers` may name.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Checks every agent: name, URL, header names and values, timeouts.
///
/// # Errors
/// A message naming the key, e.g. `agents.demo.url must start with http:// or https://`.
/// Header values are never part of a message.
pub fn validate(agents: &BTreeMap<String, AgentConfig>) -> Result<(), String> {
    for (name, agent) in agents {
        let at = format!("agents.{name}");
        let name_ok = !name.is_empty()
            && name.len() <= MAX_AGENT_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !name_ok {
            return Err(format!(
                "{at}: an agent name is 1-{MAX_AGENT_NAME} characters of [A-Za-z0-9._-]"
            ));
        }
        let url: hyper::http::Uri = agent
            .url
            .parse()
            .map_err(|e| format!("{at}.url is not a URL: {e}"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
            return Err(format!(
                "{at}.url must be an http:// or https:// URL with a host"
            ));
        }
        for (header, value) in &agent.headers {
            check_header_name(header, &format!("{at}.headers"))?;
            let value = value
                .resolve()
                .map_err(|e| format!("{at}.headers.{header}: {e}"))?;
            if hyper::http::HeaderValue::from_str(&value).is_err() {
                return Err(format!(
                    "{at}.headers.{header}: the value is not a valid header value"
                ));
            }
        }
        for header in &agent.forward_headers {
            check_header_name(header, &format!("{at}.forward_headers"))?;
        }
        if agent.ca_file.is_some() && url.scheme_str() != Some("https") {
            return Err(format!(
                "{at}.ca_file is set but {at}.url does not start with https://"
            ));
        }
        agent.root_store(name)?;
        if agent.connect_timeout.is_zero() || agent.idle_timeout.is_zero() {
            return Err(format!(
                "{at}: connect_timeout and idle_timeout must be > 0"
            ));
        }
    }
    Ok(())
}

fn check_header_name(name: &str, at: &str) -> Result<(), String> {
    if hyper::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!("{at}: {name:?} is not a header name"));
    }
    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{at}: {name:?} is set by the gateway or belongs to one connection"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<BTreeMap<String, AgentConfig>, String> {
        #[derive(Deserialize)]
        struct Wrap {
            agents: BTreeMap<String, AgentConfig>,
        }
        use figment::providers::Format;
        figment::Figment::from(figment::providers::Toml::string(toml))
            .extract::<Wrap>()
            .map(|w| w.agents)
            .map_err(|e| e.to_string())
    }

    #[test]
    // figment's `Jail` closure must return figment's own (large) error type.
    #[allow(clippy::result_large_err)]
    fn an_agent_with_defaults_and_env_headers() {
        // Inside a `Jail`: another test's jail clears the whole environment
        // while it runs, and the jail's lock keeps the two apart.
        figment::Jail::expect_with(|jail| {
            jail.set_env("AGUI_TEST_AGENT_KEY", "k-1");
            let agents = parse(
                "[agents.demo]\nurl = \"http://127.0.0.1:9/\"\n\
                 headers = { x-api-key = { env = \"AGUI_TEST_AGENT_KEY\" }, x-team = \"a\" }\n",
            )
            .unwrap();
            let demo = &agents["demo"];
            assert_eq!(demo.on_disconnect, OnDisconnect::Continue);
            assert_eq!(demo.idle_timeout, Duration::from_secs(120));
            let key = &demo.headers["x-api-key"];
            assert_eq!(key, &HeaderSource::Env("AGUI_TEST_AGENT_KEY".into()));
            assert_eq!(key.resolve().unwrap(), "k-1");
            assert_eq!(demo.headers["x-team"].resolve().unwrap(), "a");
            validate(&agents).unwrap();
            assert!(!format!("{demo:?}").contains("\"a\""), "values stay hidden");
            Ok(())
        });
    }

    #[test]
    // figment's `Jail` closure must return figment's own (large) error type.
    #[allow(clippy::result_large_err)]
    fn agents_come_from_the_file_and_the_environment() {
        use crate::config::{Config, Overrides};
        use std::path::Path;
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "a.toml",
                "[agents.demo]\nurl = \"http://127.0.0.1:9000/\"\non_disconnect = \"cancel\"\n",
            )?;
            jail.set_env("AGUI_AGENTS__DEMO__IDLE_TIMEOUT", "5s");
            jail.set_env("AGUI_AGENTS__OTHER__URL", "https://agent.example/run");
            let c = Config::load(Some(Path::new("a.toml")), &Overrides::default()).unwrap();
            assert_eq!(c.agents["demo"].on_disconnect, OnDisconnect::Cancel);
            assert_eq!(c.agents["demo"].idle_timeout, Duration::from_secs(5));
            assert_eq!(c.agents["other"].url, "https://agent.example/run");
            jail.clear_env();
            jail.create_file("b.toml", "[agents.x]\nurl = \"http://h/\"\nretry = 1\n")?;
            let e = Config::load(Some(Path::new("b.toml")), &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("retry"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let e = parse("[agents.a]\nurl = \"http://x/\"\nretries = 3\n").unwrap_err();
        assert!(e.contains("retries"), "{e}");
        let e = parse("[agents.a]\nurl = \"http://x/\"\nheaders = { k = { vr = \"X\" } }\n")
            .unwrap_err();
        assert!(e.contains("vr"), "{e}");
        let e = parse("[agents.a]\nurl = \"http://x/\"\non_disconnect = \"stop\"\n").unwrap_err();
        assert!(e.contains("stop"), "{e}");
        let bad = [
            ("[agents.a]\nurl = \"ftp://x/\"\n", "agents.a.url"),
            ("[agents.\"a/b\"]\nurl = \"http://x/\"\n", "agents.a/b"),
            (
                "[agents.a]\nurl = \"http://x/\"\nforward_headers = [\"host\"]\n",
                "agents.a.forward_headers",
            ),
            (
                "[agents.a]\nurl = \"http://x/\"\nheaders = { k = { env = \"AGUI_TEST_NOT_SET_92\" } }\n",
                "AGUI_TEST_NOT_SET_92 is not set",
            ),
            (
                "[agents.a]\nurl = \"http://x/\"\nidle_timeout = \"0s\"\n",
                "idle_timeout",
            ),
            (
                "[agents.a]\nurl = \"http://x/\"\nca_file = \"Cargo.toml\"\n",
                "agents.a.ca_file is set but agents.a.url does not start with https://",
            ),
            (
                "[agents.a]\nurl = \"https://x/\"\nca_file = \"/nonexistent/ca.pem\"\n",
                "agents.a.ca_file (/nonexistent/ca.pem): ",
            ),
        ];
        for (toml, want) in bad {
            let e = validate(&parse(toml).unwrap()).unwrap_err();
            assert!(e.contains(want), "{toml}: {e}");
        }
        // A readable file without a PEM certificate (an absolute path: figment's `Jail` in
        // another test changes the working directory).
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let toml = format!("[agents.a]\nurl = \"https://x/\"\nca_file = \"{manifest}\"\n");
        let e = validate(&parse(&toml).unwrap()).unwrap_err();
        assert!(
            e.contains(&format!(
                "agents.a.ca_file ({manifest}): the file holds no usable PEM certificate"
            )),
            "{e}"
        );
    }
}
