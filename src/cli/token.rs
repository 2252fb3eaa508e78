//! The `token` subcommand (PROTOCOL §8): prints an HS256 token for development whose `agui` claim
//! allows the given thread patterns (or everything, `--admin`), with the `aud` and `iss` a
//! broker may require. Signing is
//! [`crate::http::auth::DevToken`].

use crate::config::MIN_HS256_SECRET;
use std::time::Duration;

/// Arguments of `token`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// The HS256 secret, at least 32 bytes as the broker requires (default:
    /// AGUI_AUTH__HS256_SECRET).
    #[arg(long, env = "AGUI_AUTH__HS256_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// A thread pattern the token may subscribe to (repeatable).
    #[arg(long)]
    pub subscribe: Vec<String>,
    /// A thread pattern the token may publish to (repeatable).
    #[arg(long)]
    pub publish: Vec<String>,
    /// An operator's token (`"admin": true`): the admin API, the console, and subscribing and
    /// publishing on every thread (PROTOCOL §12).
    #[arg(long)]
    pub admin: bool,
    /// Lifetime, e.g. `1h`, `30m` ("0s": no `exp`).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// The token's `aud` claim: what the broker's `auth.audience` requires (default:
    /// AGUI_AUTH__AUDIENCE; unset: no `aud`).
    #[arg(long, env = "AGUI_AUTH__AUDIENCE")]
    pub audience: Option<String>,
    /// The token's `iss` claim: what the broker's `auth.issuer` requires (default:
    /// AGUI_AUTH__ISSUER; unset: no `iss`).
    #[arg(long, env = "AGUI_AUTH__ISSUER")]
    pub issuer: Option<String>,
}

/// Signs the token `args` describe (a zero `ttl`: no `exp`; an empty audience or issuer: no
/// such claim, as the broker's empty settings mean).
///
/// # Errors
/// No secret, or one shorter than the broker accepts ([`MIN_HS256_SECRET`] bytes: a token it
/// could never verify); the `jsonwebtoken` crate's, when signing fails.
pub fn run(args: &TokenArgs) -> anyhow::Result<String> {
    let Some(secret) = args.secret.as_deref().filter(|s| !s.is_empty()) else {
        anyhow::bail!("no secret: pass --secret or set AGUI_AUTH__HS256_SECRET");
    };
    if secret.len() < MIN_HS256_SECRET {
        anyhow::bail!(
            "the secret must be at least {MIN_HS256_SECRET} bytes, as the broker's \
             auth.hs256_secret (RFC 7518 §3.2)"
        );
    }
    let ttl = (!args.ttl.is_zero()).then_some(args.ttl);
    fn claim(v: &Option<String>) -> Option<&str> {
        v.as_deref().filter(|v| !v.is_empty())
    }
    crate::http::auth::DevToken {
        subscribe: &args.subscribe,
        publish: &args.publish,
        admin: args.admin,
        ttl,
        audience: claim(&args.audience),
        issuer: claim(&args.issuer),
    }
    .sign_hs256(secret)
    .map_err(Into::into)
}
