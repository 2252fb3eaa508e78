//! `[console]`: whether the broker serves its operator console (PROTOCOL §12).

use super::Config;
use serde::{Deserialize, Serialize};

/// The operator console (PROTOCOL §12): static pages embedded in the binary, served at
/// `/console`, that call the admin API (so, with authentication on, they need an admin token).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console. Unset: served when `listen` is a loopback address (a developer's
    /// broker), not otherwise (a deployed node serves it only when asked to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

impl Config {
    /// Whether `/console` is served: `console.enabled`, or when unset whether `listen` is a
    /// loopback address.
    pub fn console_enabled(&self) -> bool {
        self.console
            .enabled
            .unwrap_or_else(|| self.listen.ip().is_loopback())
    }
}
