//! Integration tests: cli (one test binary per area, so a clean build links few binaries).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/serve.rs"]
mod serve;

mod book;
mod defaults;
mod disk;
mod doctor;
mod install;
mod outputs;
mod pipeline;
mod probe;
mod profile;
mod bistream;
mod official;
mod say_bad_inputs;
mod say_playback;
mod say_voices;
mod speechd;
mod trt_rtx;
mod say_warm;
