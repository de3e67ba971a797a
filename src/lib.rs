//! cosy: CosyVoice3 inference over ONNX Runtime.
//!
//! Modules mirror the pipeline: vocab (the names every layer shares: stages, precisions,
//! providers) → config → runtime (sessions, providers, engine cache) → model
//! (the exported folder and its manifest) → frontend (text, audio features, voices) → llm → flow
//! → hift → pipeline (one request, streaming) → engine (many requests: batching, handles) → audio
//! (wav, playback). The binary in `main.rs` is a thin CLI.

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
