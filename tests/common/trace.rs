//! The broker's own log lines in a test's captured output: shown by the test harness only when
//! the test fails, so a rare failure (a Redis failover under load, say) comes with what the
//! broker saw.

/// Sends the broker's `tracing` events at `info` and above (`RUST_LOG` overrides) to the test
/// harness's captured output. Call first in a test; later calls (other tests of the same
/// binary) do nothing.
pub fn capture_broker_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("agui_fanout=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}
