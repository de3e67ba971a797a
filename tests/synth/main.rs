//! Integration tests: synth (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;

mod flow;
mod hift;
mod llm;
mod rng;
