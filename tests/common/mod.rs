//! Helpers shared by the integration tests: brokers (in-process or as child processes), an
//! SSE client built on a real SSE parser, fixtures, and Redis.
#![allow(dead_code)]

pub mod agui_client;
pub mod broker;
pub mod fixtures;
pub mod logs;
pub mod redis_server;
pub mod sse_client;
