//! The subcommands besides `serve`: [`replay`] (publish a recorded run to a broker, a client of
//! the HTTP API) and [`token`] (print a development HS256 token). Their arguments and their
//! work live here; `main.rs` only parses the command line and dispatches.

pub mod replay;
pub mod token;
