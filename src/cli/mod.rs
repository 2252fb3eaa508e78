//! The subcommands besides `serve`: [`replay`] (publish a recorded run to a broker, a client of
//! the HTTP API), [`token`] (print a development HS256 token) and [`demo_agent`] (a built-in
//! AG-UI agent server with scripted runs). Their arguments and their work live here; `main.rs`
//! only parses the command line and dispatches.

pub mod demo_agent;
pub mod replay;
pub mod token;
