//! The application layer: the use cases every front end (the CLI, `say`, the HTTP routes, the
//! WebSocket, the Wyoming server; the web page through the HTTP API) calls, so that each rule
//! lives once.
//!
//! * [`voices`]: resolve the voice of a request (a saved name, the default, a recording on disk
//!   or in memory), add, list and remove saved voices (and what removing the default means).
//! * [`speech`]: build an engine [`crate::request::Request`] from a front end's options, with
//!   every check in one place (text, speed, streaming, text-in streaming, test hooks).
//! * [`text_stream`]: text that arrives in pieces, spoken segment by segment as it comes (text-in
//!   streaming, or sentence by sentence), a new segment when the speech ends before the text, so
//!   no text is dropped: one sans-I/O session owns every rule of streamed text.
//! * [`buffering`]: when live playback may play (the rate audio arrives at against what is
//!   buffered), so it never stutters; sans I/O.
//! * [`drain`]: run a request's handle into a sink (a file, stdout, a player, a report).
//! * [`models`]: the user's models folder: list, add an exported folder, choose the default.
//! * [`dump`]: `--dump DIR`, every sentence's intermediates as `.npy`, through the engine's observer.
//! * [`longform`]: a long-form job (a book): chapters said sentence by sentence into a job folder,
//!   resumable after any stop with the same audio, several sentences in flight.
//!
//! A front end translates its own input (flags, JSON, WebSocket or Wyoming messages) into these
//! calls and their typed errors ([`crate::Error::Input`]: a code and a parameter) into its own
//! answer (exit code, HTTP status); it decides nothing itself. This layer sits above the engine
//! and never imports a front end.

pub mod buffering;
pub mod drain;
pub mod dump;
pub mod longform;
pub mod models;
pub mod speech;
pub mod text_stream;
pub mod voices;
