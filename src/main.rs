//! `agui-fanout`: parse the command line and configuration, start logging, run the chosen
//! subcommand until it ends or SIGTERM/SIGINT arrives. Nothing else lives here.

use agui_fanout::app;
use agui_fanout::cli::{demo_agent, replay, token};
use agui_fanout::config::{Config, Overrides};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the per-request allocations of the publish path
/// (hyper, axum, JSON) took about 12% of the node's user CPU with glibc. Measured with the
/// load test's `threads` scenario: user CPU per delivery 0.84×, idle RSS per connection
/// 4,705 → 5,035 B (`loadtest/REPORT.md`, session 4).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A broker that fans AG-UI agent events out to browsers over Server-Sent Events.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the broker.
    Serve {
        /// Configuration file (TOML). Default: config/default.toml when it exists.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (overrides the file and AGUI_LISTEN).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Redis URL; selects the redis log backend (overrides the file and AGUI_REDIS_URL).
        #[arg(long)]
        redis_url: Option<String>,
        /// PEM file of the certificate authorities a `rediss://` Redis must be signed by
        /// (overrides the file and AGUI_REDIS_TLS_CA; default: the system's trust store).
        #[arg(long)]
        redis_tls_ca: Option<String>,
        /// Allow a non-loopback listen address without authentication (PROTOCOL §8; also
        /// AGUI_INSECURE=true).
        #[arg(long)]
        insecure: bool,
    },
    /// Publish a recorded AG-UI run (a JSON array of events) to a broker, paced like a live agent.
    Replay(replay::ReplayArgs),
    /// Print an HS256 token for development (PROTOCOL §8): its `agui` claim allows the given
    /// thread patterns (a thread id, or a prefix ending in `*`).
    Token(token::TokenArgs),
    /// Run a built-in AG-UI agent (`POST /`, RunAgentInput in, AG-UI SSE out) with scripted
    /// bank-onboarding runs and no model keys: for the quick start and tests.
    DemoAgent(demo_agent::DemoAgentArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGUI_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run(Cli::parse().command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line for people, not `Error: {e:?}` (a cause list and, with RUST_BACKTRACE,
            // a backtrace).
            eprintln!("agui-fanout: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Runs the subcommand.
async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            config,
            listen,
            redis_url,
            redis_tls_ca,
            insecure,
        } => {
            let overrides = Overrides {
                listen,
                redis_url,
                redis_tls_ca,
                insecure,
            };
            let config = Config::load(config.as_deref(), &overrides)?;
            let server = app::start(config).await.map_err(|e| {
                busy_address_hint(
                    e,
                    "--listen ADDR, AGUI_LISTEN or `listen` in the config file",
                )
            })?;
            let shutdown = server.shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                shutdown.cancel();
            });
            server.wait().await;
            Ok(())
        }
        Command::Token(args) => {
            println!("{}", token::run(&args)?);
            Ok(())
        }
        Command::DemoAgent(args) => {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("cannot listen on {}", args.listen))
                .map_err(|e| busy_address_hint(e, "--listen ADDR"))?;
            // Tests and scripts read the bound address (port 0 picks one) from this line.
            println!("demo agent listening on http://{}", listener.local_addr()?);
            let shutdown = tokio_util::sync::CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                stop.cancel();
            });
            demo_agent::serve(listener, demo_agent::Pacing::of(&args), shutdown).await?;
            Ok(())
        }
        Command::Replay(args) => {
            let summary = replay::run(&args).await?;
            println!(
                "published {} events to thread {} (ids {} .. {})",
                summary.published,
                summary.thread,
                summary.first_id.as_deref().unwrap_or("-"),
                summary.last_id.as_deref().unwrap_or("-")
            );
            Ok(())
        }
    }
}

/// `e` and its causes on one line, each cause once: a cause whose text the message already
/// quotes (errors that print their source in their own message) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

/// Adds how to choose another address (`how`) to a start-up error caused by an address in
/// use.
fn busy_address_hint(e: anyhow::Error, how: &str) -> anyhow::Error {
    let in_use = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    });
    if in_use {
        let line = one_line(&e);
        anyhow::anyhow!(
            "{line} (another process is listening there; choose another address with {how})"
        )
    } else {
        e
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
