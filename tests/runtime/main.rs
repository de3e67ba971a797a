//! Integration tests: runtime (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;

mod config;
mod engine_cache;
mod graph_cache;
mod sessions;
