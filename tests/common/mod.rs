//! Helpers shared by the integration tests: brokers (in-process or as child processes), an
//! SSE client built on the one strict SSE wire parser ([`sse`]), fixtures, and Redis.
// Each test crate includes this module privately, so its `pub` items are crate-wide by design.
#![allow(dead_code, unreachable_pub)]

pub mod agui_client;
pub mod broker;
pub mod demo_agent;
pub mod fixtures;
pub mod frames;
pub mod logs;
pub mod redis_cluster;
pub mod redis_server;
pub mod redis_tls;
pub mod sse;
pub mod sse_client;
pub mod tcp_proxy;
pub mod trace;
pub mod upstream;
