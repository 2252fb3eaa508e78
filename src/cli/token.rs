//! The `token` subcommand (PROTOCOL §8): prints an HS256 token for development whose `agui` claim
//! allows the given thread patterns. Signing is [`crate::http::auth::issue_hs256`].

use std::time::Duration;

/// Arguments of `token`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// The HS256 secret (default: AGUI_AUTH__HS256_SECRET).
    #[arg(long, env = "AGUI_AUTH__HS256_SECRET", hide_env_values = true)]
    pub secret: String,
    /// A thread pattern the token may subscribe to (repeatable).
    #[arg(long)]
    pub subscribe: Vec<String>,
    /// A thread pattern the token may publish to (repeatable).
    #[arg(long)]
    pub publish: Vec<String>,
    /// Lifetime, e.g. `1h`, `30m` ("0s": no `exp`).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
}

/// Signs the token `args` describe (a zero `ttl`: no `exp`).
///
/// # Errors
/// The `jsonwebtoken` crate's, when signing fails.
pub fn run(args: &TokenArgs) -> Result<String, jsonwebtoken::errors::Error> {
    let ttl = (!args.ttl.is_zero()).then_some(args.ttl);
    crate::http::auth::issue_hs256(&args.secret, &args.subscribe, &args.publish, ttl)
}
