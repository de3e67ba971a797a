//! Integration tests: frontend (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;

mod features;
mod formats;
mod text;
mod tn_wetext;
mod audio_files;
mod book;
mod prompt_bad_inputs;
