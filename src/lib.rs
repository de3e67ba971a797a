//! cosy: CosyVoice3 inference over ONNX Runtime.
//!
//! Layers that only import downwards (docs/architecture.md): vocab (the names every layer
//! shares: stages, precisions, providers) → config → model, voice (the exported folder, saved
//! voices) → runtime (sessions, providers, caches) → frontend, llm, flow, hift (stage maths
//! behind traits) → request (what a request is, and its rules) → pipeline (one request, generic
//! over the stage traits) → engine (the one way in: builder, admission, batchers, handles) → app
//! (voices, request building, draining: what every front end calls). audio (wav files,
//! resampling) and the small helpers sit below whoever uses them.
//!
//! This library is what another program embeds: it has no command-line parsing, no HTTP and no
//! sound-card playback. The front ends (the CLI commands, `say` and playback, `doctor`, `engines`,
//! the HTTP/WebSocket/Wyoming server and its page) are modules of the `cosy` binary
//! (`src/main.rs`), which uses this library as `cosy::…`; Cargo keeps the library from importing
//! them. `examples/embed.rs` synthesises through the library alone.

pub mod app;
pub mod audio;
pub mod captions;
pub mod config;
pub mod engine;
pub mod error;
pub mod flow;
pub mod frontend;
pub mod fsx;
pub mod hift;
pub mod interp;
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
pub mod vocab;
pub mod voice;

pub use error::{Error, Result};
