//! Authentication and authorisation of publishes, subscriptions and snapshots (PROTOCOL §8): a
//! JWT bearer token (RFC 7519; RFC 6750 for how it is carried) signed with HS256 (a shared
//! secret) or RS256 (the issuer's RSA public key), checked with the `jsonwebtoken` crate.
//!
//! - **Where the token is**, first found wins: the `Authorization: Bearer <token>` header, the
//!   `access_token` query parameter (RFC 6750 §2.3; what a native `EventSource` can send), the
//!   cookie named by `auth.cookie` (default `agui_token`; an `EventSource` with
//!   `withCredentials` sends it).
//! - **What it allows**: the claim `agui`, `{"subscribe": [patterns], "publish": [patterns],
//!   "admin": true}`. A pattern is a thread id, or a prefix ending in `*` (`"*"` alone: every
//!   thread). `subscribe` also allows the thread's snapshot (it is what a subscriber gets as a
//!   prelude). `admin` (default `false`) allows the admin API and the console (PROTOCOL §12),
//!   and, since an operator's console follows and drives any thread, subscribing and
//!   publishing on every thread.
//! - **Standard claims**: a token with an `exp` (seconds since the epoch) is valid strictly
//!   before it, without leeway (RFC 7519 §4.1.4); a stream opened with it ends at that moment
//!   (the client reconnects with its `Last-Event-ID` and a fresh token). `nbf` is checked
//!   when present. With `auth.audience` / `auth.issuer` set, `aud` / `iss` must be present and
//!   match; a token carrying an `aud` is refused when no audience is configured (RFC 7519
//!   §4.1.3). A header with `crit` is refused (RFC 7515 §4.1.11).
//! - **Errors**: no token, or one that does not verify: 401 `unauthorized` with
//!   `WWW-Authenticate: Bearer` (RFC 6750 §3); a valid token that does not allow the action on
//!   the thread, or an admin request without `admin`: 403 `forbidden` naming the claim.
//!
//! `/healthz`, `/readyz` and `/metrics` are not authenticated (probes and Prometheus).

use super::ApiError;
use crate::config::AuthConfig;
use crate::event::ThreadId;
use axum::http::StatusCode;
use dashmap::DashMap;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a request wants to do with a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open its event stream, or read its snapshot.
    Subscribe,
    /// Append events.
    Publish,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribe",
            Action::Publish => "publish",
        }
    }
}

/// Where a request may carry its token: raw header values and the query's `access_token`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    /// The `Authorization` header's value.
    pub authorization: Option<&'a [u8]>,
    /// The `access_token` query parameter.
    pub query_token: Option<&'a str>,
    /// Every `Cookie` header's value (HTTP/2 may split cookies over several).
    pub cookies: &'a [&'a [u8]],
}

/// A request the token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// When the token expires (`exp`), if it says.
    pub expires: Option<SystemTime>,
}

/// The token verifier, built once from `[auth]`.
pub struct Auth {
    hs256: Option<(DecodingKey, Validation)>,
    rs256: Option<(DecodingKey, Validation)>,
    cookie: String,
    audience: Option<String>,
    issuer: Option<String>,
    /// Tokens that verified, by their exact text. Why: a producer sends the same token with
    /// every publish, and an RS256 verification costs about 200 µs of CPU where the rest of a
    /// publish costs about 30 (`loadtest/REPORT.md`). Only the signature and the static claims
    /// are remembered: `exp` and `nbf` are checked against the clock on every use. Cleared
    /// whole when it reaches [`VERIFIED_MAX`] entries.
    verified: DashMap<Box<str>, Arc<Verified>>,
}

/// Most tokens [`Auth`] remembers (about 1 KB each).
const VERIFIED_MAX: usize = 10_000;

/// What a verified token says.
struct Verified {
    /// `exp` as a time (in range: checked when verified).
    expires: Option<SystemTime>,
    /// `nbf`, seconds since the epoch.
    nbf: Option<u64>,
    grants: Grants,
}

/// The claims the broker reads; any others are ignored. `aud` and `iss` are kept as given
/// (present or not, any JSON type), so that a malformed one is refused rather than ignored.
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    aud: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    iss: Option<serde_json::Value>,
    #[serde(default)]
    agui: Grants,
}

/// `Some` for a member that is present, `null` included (`#[serde(default)]` gives `None` for
/// an absent one).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// The `agui` claim.
#[derive(Default, Deserialize)]
struct Grants {
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    /// The admin API and the console, and every thread (PROTOCOL §12).
    #[serde(default)]
    admin: bool,
}

impl Auth {
    /// The verifier `config` describes; `Ok(None)` when neither `hs256_secret` nor
    /// `rs256_public_key` is set (authentication off).
    ///
    /// # Errors
    /// A message naming `auth.rs256_public_key` when it is not an RSA public key in PEM.
    pub fn from_config(config: &AuthConfig) -> Result<Option<Auth>, String> {
        if config.rs256_public_key.contains("PRIVATE KEY") {
            return Err("auth.rs256_public_key holds a private key; give the public key".into());
        }
        let validation = |alg| {
            let mut v = Validation::new(alg);
            // `exp` is checked when present, not required (as Centrifugo and Mercure do).
            v.required_spec_claims.clear();
            v.leeway = 0;
            // Valid strictly before `exp` (RFC 7519 §4.1.4: "before"); the library's check is
            // in whole seconds and lets a token through during the second of `exp` itself,
            // when a stream opened with it has already ended (a client would reconnect in a
            // loop for that second).
            v.reject_tokens_expiring_in_less_than = 1;
            v.validate_nbf = true;
            if !config.audience.is_empty() {
                v.set_audience(&[&config.audience]);
            }
            if !config.issuer.is_empty() {
                v.set_issuer(&[&config.issuer]);
            }
            v
        };
        let hs256 = (!config.hs256_secret.is_empty()).then(|| {
            (
                DecodingKey::from_secret(config.hs256_secret.as_bytes()),
                validation(Algorithm::HS256),
            )
        });
        let rs256 = if config.rs256_public_key.is_empty() {
            None
        } else {
            let key =
                DecodingKey::from_rsa_pem(config.rs256_public_key.as_bytes()).map_err(|e| {
                    format!("auth.rs256_public_key is not an RSA public key in PEM: {e}")
                })?;
            Some((key, validation(Algorithm::RS256)))
        };
        if hs256.is_none() && rs256.is_none() {
            return Ok(None);
        }
        Ok(Some(Auth {
            hs256,
            rs256,
            cookie: config.cookie.clone(),
            audience: (!config.audience.is_empty()).then(|| config.audience.clone()),
            issuer: (!config.issuer.is_empty()).then(|| config.issuer.clone()),
            verified: DashMap::new(),
        }))
    }

    /// Checks that the request's token allows `action` on `thread`.
    ///
    /// # Errors
    /// 401 `unauthorized` (no token, or it does not verify: signature, algorithm, `exp`,
    /// `nbf`, `aud`, `iss`, malformed); 403 `forbidden` (no pattern of the action matches).
    pub fn check(
        &self,
        credentials: Credentials<'_>,
        thread: &ThreadId,
        action: Action,
    ) -> Result<Granted, ApiError> {
        let verified = self.verified(credentials)?;
        let patterns = match action {
            Action::Subscribe => &verified.grants.subscribe,
            Action::Publish => &verified.grants.publish,
        };
        if !verified.grants.admin && !patterns.iter().any(|p| pattern_matches(p, thread.as_str())) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "the token does not allow {} on thread {thread}",
                    action.as_str()
                ),
            )
            .field(Some(format!("agui.{}", action.as_str()))));
        }
        Ok(Granted {
            expires: verified.expires,
        })
    }

    /// Checks that the request's token carries `"admin": true` in its `agui` claim (the admin
    /// API and the console, PROTOCOL §12).
    ///
    /// # Errors
    /// 401 `unauthorized` as [`Auth::check`]; 403 `forbidden` naming `agui.admin`.
    pub fn check_admin(&self, credentials: Credentials<'_>) -> Result<Granted, ApiError> {
        let verified = self.verified(credentials)?;
        if !verified.grants.admin {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the token does not allow the admin API (agui.admin)",
            )
            .field(Some("agui.admin".into())));
        }
        Ok(Granted {
            expires: verified.expires,
        })
    }

    /// The request's token, verified (or remembered) and checked against the clock.
    fn verified(&self, credentials: Credentials<'_>) -> Result<Arc<Verified>, ApiError> {
        let token = self
            .token(credentials)
            .ok_or_else(|| unauthorized("a bearer token is required", false))?;
        let verified = match self.verified.get(token) {
            Some(v) => v.clone(),
            None => {
                let v = Arc::new(self.verify(token)?);
                if self.verified.len() >= VERIFIED_MAX {
                    self.verified.clear();
                }
                self.verified.insert(token.into(), v.clone());
                v
            }
        };
        // As the library checks them on a first use: valid strictly before `exp`, from `nbf`.
        let now = SystemTime::now();
        if verified.expires.is_some_and(|exp| now >= exp) {
            return Err(unauthorized("invalid token: ExpiredSignature", true));
        }
        let now_secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if verified.nbf.is_some_and(|nbf| nbf > now_secs) {
            return Err(unauthorized("invalid token: ImmatureSignature", true));
        }
        Ok(verified)
    }

    /// Verifies a token not seen before: header, algorithm, signature, claims.
    fn verify(&self, token: &str) -> Result<Verified, ApiError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| unauthorized(&format!("malformed token: {e}"), true))?;
        // Critical extensions must be understood (RFC 7515 §4.1.11): the broker knows none.
        if header.crit.is_some() {
            return Err(unauthorized(
                "the token names critical header parameters (crit), none of which are supported",
                true,
            ));
        }
        let (key, validation) = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref(),
            Algorithm::RS256 => self.rs256.as_ref(),
            _ => None,
        }
        .ok_or_else(|| {
            unauthorized(
                &format!("tokens signed with {:?} are not accepted", header.alg),
                true,
            )
        })?;
        let claims = jsonwebtoken::decode::<Claims>(token, key, validation)
            .map_err(|e| unauthorized(&format!("invalid token: {e}"), true))?
            .claims;
        self.check_audience_and_issuer(&claims)?;
        // An `exp` beyond what the clock can represent is not a date.
        let expires = match claims.exp {
            None => None,
            Some(s) => Some(
                UNIX_EPOCH
                    .checked_add(Duration::from_secs(s))
                    .ok_or_else(|| unauthorized("invalid token: exp out of range", true))?,
            ),
        };
        Ok(Verified {
            expires,
            nbf: claims.nbf,
            grants: claims.agui,
        })
    }

    /// `aud` (RFC 7519 §4.1.3): with an audience configured, a string equal to it or an array
    /// of strings holding it; without, absent. `iss` (§4.1.1): with an issuer configured, a
    /// string equal to it. Checked here rather than left to the library, which lets a claim
    /// of the wrong JSON type pass as absent.
    fn check_audience_and_issuer(&self, claims: &Claims) -> Result<(), ApiError> {
        let aud_ok = match (&self.audience, &claims.aud) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some(_), None) => false,
            (Some(want), Some(serde_json::Value::String(got))) => got == want,
            (Some(want), Some(serde_json::Value::Array(items))) => {
                items.iter().all(serde_json::Value::is_string)
                    && items.iter().any(|i| i.as_str() == Some(want))
            }
            (Some(_), Some(_)) => false,
        };
        if !aud_ok {
            return Err(unauthorized("invalid token: audience (aud)", true));
        }
        if let Some(want) = &self.issuer
            && claims.iss.as_ref().and_then(serde_json::Value::as_str) != Some(want)
        {
            return Err(unauthorized("invalid token: issuer (iss)", true));
        }
        Ok(())
    }

    /// The token: `Authorization: Bearer`, else `access_token`, else the cookie.
    fn token<'a>(&self, c: Credentials<'a>) -> Option<&'a str> {
        let bearer = c.authorization.and_then(|v| {
            let v = std::str::from_utf8(v).ok()?.trim();
            let (scheme, token) = v.split_once(' ')?;
            // The scheme is case-insensitive (RFC 9110 §11.1).
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim())
                .filter(|t| !t.is_empty())
        });
        bearer
            .or(c.query_token.filter(|t| !t.is_empty()))
            .or_else(|| {
                c.cookies.iter().find_map(|header| {
                    let header = std::str::from_utf8(header).ok()?;
                    cookie::Cookie::split_parse(header)
                        .filter_map(Result::ok)
                        .filter(|ck| ck.name() == self.cookie)
                        // Borrowed from `header` (not from the parsed cookie).
                        .filter_map(|ck| ck.value_raw())
                        // A cookie value may be quoted (RFC 6265 §4.1.1).
                        .map(|v| {
                            v.strip_prefix('"')
                                .and_then(|v| v.strip_suffix('"'))
                                .unwrap_or(v)
                        })
                        .find(|v| !v.is_empty())
                })
            })
    }
}

/// Signs an HS256 token with `secret` whose `agui` claim allows `subscribe` and `publish`
/// (patterns, as above), expiring after `ttl` (`None`: no `exp`), without `aud` or `iss`. For
/// tests and development (`agui-fanout token`); production tokens come from the application's
/// own issuer.
///
/// # Errors
/// The `jsonwebtoken` crate's, when signing fails.
pub fn issue_hs256(
    secret: &str,
    subscribe: &[String],
    publish: &[String],
    ttl: Option<Duration>,
) -> Result<String, jsonwebtoken::errors::Error> {
    DevToken {
        subscribe,
        publish,
        admin: false,
        ttl,
        audience: None,
        issuer: None,
    }
    .sign_hs256(secret)
}

/// The claims of a development token (`agui-fanout token`): what it allows, how long, and the
/// `aud` and `iss` a broker with `auth.audience` / `auth.issuer` set requires.
#[derive(Debug, Clone, Copy)]
pub struct DevToken<'a> {
    /// Thread patterns it may subscribe to.
    pub subscribe: &'a [String],
    /// Thread patterns it may publish to.
    pub publish: &'a [String],
    /// `"admin": true`: the admin API, the console and every thread (PROTOCOL §12).
    pub admin: bool,
    /// Lifetime (`None`: no `exp`).
    pub ttl: Option<Duration>,
    /// The `aud` claim (`None`: none).
    pub audience: Option<&'a str>,
    /// The `iss` claim (`None`: none).
    pub issuer: Option<&'a str>,
}

impl DevToken<'_> {
    /// Signs the token with the HS256 key `secret`.
    ///
    /// # Errors
    /// The `jsonwebtoken` crate's, when signing fails.
    pub fn sign_hs256(&self, secret: &str) -> Result<String, jsonwebtoken::errors::Error> {
        let mut claims = serde_json::json!({
            "agui": {"subscribe": self.subscribe, "publish": self.publish}
        });
        if self.admin {
            claims["agui"]["admin"] = true.into();
        }
        if let Some(ttl) = self.ttl {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            claims["exp"] = (now + ttl).as_secs().into();
        }
        if let Some(aud) = self.audience {
            claims["aud"] = aud.into();
        }
        if let Some(iss) = self.issuer {
            claims["iss"] = iss.into();
        }
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
    }
}

/// Whether `pattern` (a thread id, or a prefix ending in `*`) covers `thread`.
fn pattern_matches(pattern: &str, thread: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => thread.starts_with(prefix),
        None => pattern == thread,
    }
}

/// 401 with `WWW-Authenticate: Bearer` (RFC 6750 §3; `error="invalid_token"` when a token was
/// given).
fn unauthorized(message: &str, token_given: bool) -> ApiError {
    let challenge = if token_given {
        "Bearer error=\"invalid_token\""
    } else {
        "Bearer"
    };
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).challenge(challenge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("team-a/*", "team-a/x"));
        assert!(pattern_matches("team-a*", "team-a"));
        assert!(!pattern_matches("team-a/*", "team-b/x"));
        assert!(pattern_matches("t1", "t1"));
        assert!(!pattern_matches("t1", "t10"));
        assert!(!pattern_matches("", "t1"));
    }

    /// A verifier of HS256 tokens signed with `secret`.
    fn hs256_auth(secret: &str) -> Auth {
        let config = AuthConfig {
            hs256_secret: secret.into(),
            ..AuthConfig::default()
        };
        Auth::from_config(&config)
            .unwrap()
            .expect("a key is set: on")
    }

    /// What `agui-fanout token` prints is accepted for exactly what it names.
    #[test]
    fn issued_tokens_verify() {
        let auth = hs256_auth("s");
        let token = issue_hs256(
            "s",
            &["t-*".into()],
            &["t-1".into()],
            Some(Duration::from_secs(60)),
        )
        .unwrap();
        let creds = Credentials {
            authorization: Some(format!("bearer {token}").into_bytes().leak()),
            ..Credentials::default()
        };
        let thread = |t: &str| ThreadId::parse(t).unwrap();
        let granted = auth
            .check(creds, &thread("t-2"), Action::Subscribe)
            .unwrap();
        let left = granted
            .expires
            .unwrap()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(left <= Duration::from_secs(60) && left >= Duration::from_secs(58));
        assert!(auth.check(creds, &thread("t-1"), Action::Publish).is_ok());
        let refused = auth
            .check(creds, &thread("t-2"), Action::Publish)
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        let forever = issue_hs256("s", &[], &["*".into()], None).unwrap();
        let creds = Credentials {
            query_token: Some(&forever),
            ..Credentials::default()
        };
        let granted = auth.check(creds, &thread("x"), Action::Publish).unwrap();
        assert_eq!(granted.expires, None);
    }

    /// A remembered token is checked against the clock on every use, and only tokens that
    /// verified are remembered.
    #[test]
    fn remembered_tokens_still_expire() {
        let auth = hs256_auth("s");
        let t = ThreadId::parse("t").unwrap();
        let token = issue_hs256("s", &[], &["*".into()], Some(Duration::from_secs(60))).unwrap();
        let creds = Credentials {
            query_token: Some(&token),
            ..Credentials::default()
        };
        auth.check(creds, &t, Action::Publish).unwrap();
        assert_eq!(auth.verified.len(), 1);
        auth.check(creds, &t, Action::Publish).unwrap();
        // The same token, now past its `exp` (as if a minute had gone by).
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let past = Verified {
            expires: Some(UNIX_EPOCH + Duration::from_secs(now)),
            nbf: None,
            grants: Grants {
                subscribe: vec![],
                publish: vec!["*".into()],
                admin: false,
            },
        };
        auth.verified.insert(token.as_str().into(), Arc::new(past));
        let e = auth.check(creds, &t, Action::Publish).unwrap_err();
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        // A token that does not verify is not remembered.
        let last = if token.ends_with('x') { 'y' } else { 'x' };
        let forged = format!("{}{last}", &token[..token.len() - 1]);
        let creds = Credentials {
            query_token: Some(&forged),
            ..Credentials::default()
        };
        assert!(auth.check(creds, &t, Action::Publish).is_err());
        assert_eq!(auth.verified.len(), 1);
    }
}
