//! cosy: CosyVoice3 inference over ONNX Runtime.
//!
//! Layers that only import downwards (docs/architecture.md): vocab (the names every layer
//! shares: stages, precisions, providers) → config → model, voice (the exported folder, saved
//! voices) → runtime (sessions, providers, caches) → frontend, llm, flow, hift (stage maths
//! behind traits) → request (what a request is, and its rules) → pipeline (one request, generic
//! over the stage traits) → engine (the one way in: builder, admission, batchers, handles) → app
//! (voices, request building, draining: what every front end calls) → front ends (cli, say,
//! doctor, engines; the HTTP server lives in the binary). audio (wav, playback) and the small
//! helpers sit below whoever uses them.

pub mod app;
pub mod audio;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
#[cfg(feature = "cli")]
pub mod doctor;
pub mod engine;
#[cfg(feature = "cli")]
pub mod engines;
pub mod error;
pub mod flow;
pub mod frontend;
pub mod hift;
pub mod interp;
#[cfg(feature = "cli")]
pub mod interrupt;
pub mod llm;
pub mod model;
pub mod npy;
pub mod output;
pub mod paths;
pub mod pipeline;
pub mod profile;
pub mod request;
pub mod rng;
pub mod side;
pub mod runtime;
#[cfg(feature = "cli")]
pub mod say;
pub mod vocab;
pub mod voice;

pub use error::{Error, Result};
