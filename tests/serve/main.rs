//! Integration tests: serve (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/serve.rs"]
mod serve;

mod api;
mod formats;
mod idle;
mod limits;
mod openai;
mod text_table;
mod web;
