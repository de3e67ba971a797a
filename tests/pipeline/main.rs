//! Integration tests: pipeline (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;

mod golden;
mod reference;
mod bistream;
mod engine_concurrency;
mod idle_unload;
mod longform;
