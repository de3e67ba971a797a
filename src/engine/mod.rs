//! The serving engine: one loaded model, many requests at once.
//!
//! ```no_run
//! # fn demo(config: &cosy::config::Config, req: cosy::pipeline::Request) -> cosy::Result<()> {
//! let engine = cosy::engine::Engine::load(config)?;          // Send + Sync; share it in an Arc
//! let handle = engine.submit(req)?;                           // runs at once, beside the others
//! for chunk in handle.chunks() {                             // audio as it is made (24 kHz mono)
//!     let samples = chunk?;
//!     # let _ = samples;
//! }
//! # Ok(()) }
//! ```
//!
//! Each request runs on a thread of its own (frontend, text planning, its sentences' token-to-wav
//! work); the model's sessions are shared: the LLM's decode steps of every active sentence run
//! as one batched call ([`llm_batch`], continuous batching), the DiT calls of requests in the
//! flow stage at the same time run together ([`dit_batch`]), the small stages take turns. A
//! request's own state (sampler and seed, KV-cache row, stream planner, HiFT state) lives with
//! the request, so its output does not depend on what else runs.
//!
//! Dropping a [`RequestHandle`] (or [`RequestHandle::cancel`]) stops its request at the next
//! token or chunk and frees its slot. At most `engine.max_in_flight` requests are in flight:
//! [`Engine::try_submit`] refuses more with [`Error::Busy`], [`Engine::submit`] waits.

pub mod dit_batch;
pub mod llm_batch;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::Receiver;

pub use dit_batch::{DitBatchStats, DitBatcher, RemoteEstimator};
pub use llm_batch::{LlmBatchStats, LlmScheduler, RemoteLlm};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pipeline::{Request, Summary, SynthesisObserver, Synthesizer};

/// What a request sends its handle.
#[derive(Debug)]
pub enum Event {
    /// New audio samples (24 kHz mono f32), in order.
    Audio(Vec<f32>),
    /// The request finished; no more events follow.
    Done(Summary),
    /// The request failed (or was cancelled); no more events follow.
    Failed(Error),
}

/// Counts requests in flight against `engine.max_in_flight`.
#[derive(Debug)]
struct Slots {
    used: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

impl Slots {
    fn take(self: &Arc<Self>, wait: bool) -> Result<SlotGuard> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        while *used >= self.max {
            if !wait {
                return Err(Error::Busy(format!(
                    "{} requests are in flight, the most engine.max_in_flight allows; retry when one has finished",
                    self.max
                )));
            }
            used = self.freed.wait(used).unwrap_or_else(|p| p.into_inner());
        }
        *used += 1;
        Ok(SlotGuard(self.clone()))
    }
}

/// A slot held by a running request; dropped when the request's thread ends.
struct SlotGuard(Arc<Slots>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut used = self.0.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        self.0.freed.notify_one();
    }
}

/// One loaded model shared by every request (`Send + Sync`).
pub struct Engine {
    synth: Arc<Synthesizer>,
    slots: Arc<Slots>,
}

/// Cancellation flag plus an optional caller's observer.
struct RequestObserver {
    cancel: Arc<AtomicBool>,
    inner: Option<Arc<dyn SynthesisObserver + Send>>,
}

impl SynthesisObserver for RequestObserver {
    fn llm_token(&self, sentence: usize, index: usize, token: i64) {
        if let Some(o) = &self.inner {
            o.llm_token(sentence, index, token);
        }
    }
    fn llm_done(&self, sentence: usize, tokens: usize, termination: crate::llm::Termination) {
        if let Some(o) = &self.inner {
            o.llm_done(sentence, tokens, termination);
        }
    }
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.inner.as_ref().is_some_and(|o| o.cancelled())
    }
}

impl Engine {
    /// Loads the model of `config` once (every stage's session, the batching threads).
    pub fn load(config: &Config) -> Result<Engine> {
        Ok(Engine::from_synthesizer(Synthesizer::load(config)?, config.engine.max_in_flight))
    }

    /// An engine over an already loaded model.
    pub fn from_synthesizer(synth: Synthesizer, max_in_flight: usize) -> Engine {
        Engine {
            synth: Arc::new(synth),
            slots: Arc::new(Slots { used: Mutex::new(0), freed: Condvar::new(), max: max_in_flight.max(1) }),
        }
    }

    /// The loaded model (voices, tokenizer, constants, one-off synthesis on the caller's thread).
    pub fn synthesizer(&self) -> &Arc<Synthesizer> {
        &self.synth
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        *self.slots.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `request`, waiting for a free slot when `engine.max_in_flight` are in flight.
    pub fn submit(&self, request: Request) -> Result<RequestHandle> {
        self.start(request, None, true)
    }

    /// Starts `request`, or refuses it with [`Error::Busy`] when no slot is free.
    pub fn try_submit(&self, request: Request) -> Result<RequestHandle> {
        self.start(request, None, false)
    }

    /// [`Engine::submit`] with an observer of its tokens (its `cancelled` is honoured too).
    pub fn submit_observed(&self, request: Request, observer: Arc<dyn SynthesisObserver + Send>) -> Result<RequestHandle> {
        self.start(request, Some(observer), true)
    }

    fn start(&self, request: Request, observer: Option<Arc<dyn SynthesisObserver + Send>>, wait: bool) -> Result<RequestHandle> {
        self.spawn(observer, wait, move |synth, observer, on_chunk| synth.synthesize_observed(&request, None, observer, on_chunk))
    }

    /// Starts a text-in streaming request ([`Synthesizer::synthesize_bistream`]): `request.text`
    /// is not used; the text comes through the returned [`TextFeed`] while audio comes out of
    /// the handle. Dropping the feed ends the text. Waits for a slot as [`Engine::submit`].
    /// With `options.normalize_sentences`, settled sentences are normalised
    /// ([`Synthesizer::normalize_sentences`]); otherwise the text goes in as written (the
    /// official, exact mode).
    pub fn submit_bistream(
        &self,
        request: Request,
        options: BistreamOptions,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
    ) -> Result<(TextFeed, RequestHandle)> {
        self.bistream(request, options, observer, true)
    }

    /// [`Engine::submit_bistream`], refused with [`Error::Busy`] when no slot is free.
    pub fn try_submit_bistream(
        &self,
        request: Request,
        options: BistreamOptions,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
    ) -> Result<(TextFeed, RequestHandle)> {
        self.bistream(request, options, observer, false)
    }

    fn bistream(
        &self,
        request: Request,
        options: BistreamOptions,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
        wait: bool,
    ) -> Result<(TextFeed, RequestHandle)> {
        // Pieces queue here until the LLM takes them; a writer far ahead of the speech is held
        // back by the bound (the text limit bounds the whole anyway).
        let (tx, rx) = crossbeam_channel::bounded::<Result<String>>(1024);
        let handle = self.spawn(observer, wait, move |synth, observer, on_chunk| {
            // While it waits for text, the request still notices a cancel.
            let pieces = std::iter::from_fn(|| loop {
                match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                    Ok(piece) => return Some(piece),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) if observer.cancelled() => return Some(Err(Error::Cancelled)),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return None,
                }
            });
            if options.normalize_sentences {
                synth.synthesize_bistream(&request, synth.normalize_sentences(pieces), observer, on_chunk)
            } else {
                synth.synthesize_bistream(&request, pieces, observer, on_chunk)
            }
        })?;
        Ok((TextFeed { tx }, handle))
    }

    fn spawn<J>(&self, observer: Option<Arc<dyn SynthesisObserver + Send>>, wait: bool, job: J) -> Result<RequestHandle>
    where
        J: FnOnce(&Synthesizer, &dyn SynthesisObserver, &mut (dyn FnMut(&[f32]) -> Result<()> + Send)) -> Result<Summary> + Send + 'static,
    {
        let slot = self.slots.take(wait)?;
        let cancel = Arc::new(AtomicBool::new(false));
        // Audio waits here for the caller; a slow reader holds its request back (not the others).
        let (tx, rx) = crossbeam_channel::bounded::<Event>(16);
        let synth = self.synth.clone();
        let observer = RequestObserver { cancel: cancel.clone(), inner: observer };
        std::thread::Builder::new()
            .name("request".into())
            .spawn(move || {
                let _slot = slot;
                let mut on_chunk = |chunk: &[f32]| tx.send(Event::Audio(chunk.to_vec())).map_err(|_| Error::Cancelled);
                let result = job(&synth, &observer, &mut on_chunk);
                let _ = tx.send(match result {
                    Ok(summary) => Event::Done(summary),
                    Err(e) => Event::Failed(e),
                });
            })
            .map_err(|e| Error::Runtime(format!("cannot start a request thread: {e}")))?;
        Ok(RequestHandle { rx, cancel, finished: false })
    }
}

/// How a text-in streaming request treats its text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BistreamOptions {
    /// Normalise settled sentences (numbers, symbols) instead of the exact, unnormalised text.
    pub normalize_sentences: bool,
}

/// The text of a text-in streaming request, piece by piece ([`Engine::submit_bistream`]).
/// Dropping it (or [`TextFeed::finish`]) ends the text.
pub struct TextFeed {
    tx: crossbeam_channel::Sender<Result<String>>,
}

impl TextFeed {
    /// Hands the next piece of text to the request (any length; spaces count as written).
    pub fn send(&self, piece: impl Into<String>) -> Result<()> {
        self.tx.send(Ok(piece.into())).map_err(|_| Error::Runtime("the request has ended; it takes no more text".into()))
    }

    /// Ends the request with `error` (bad input upstream: invalid text, a broken connection).
    pub fn fail(self, error: Error) {
        let _ = self.tx.send(Err(error));
    }

    /// The text is complete.
    pub fn finish(self) {}
}

/// A request in flight. Dropping it cancels the request.
pub struct RequestHandle {
    rx: Receiver<Event>,
    cancel: Arc<AtomicBool>,
    finished: bool,
}

impl RequestHandle {
    /// The next event; `None` once the request has finished or failed.
    pub fn next_event(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.rx.recv().ok();
        match &event {
            Some(Event::Audio(_)) => {}
            _ => self.finished = true,
        }
        event
    }

    /// The audio chunks in order, then the request's error if it failed.
    pub fn chunks(mut self) -> impl Iterator<Item = Result<Vec<f32>>> {
        std::iter::from_fn(move || match self.next_event()? {
            Event::Audio(a) => Some(Ok(a)),
            Event::Done(_) => None,
            Event::Failed(e) => Some(Err(e)),
        })
    }

    /// Waits for the whole request: all its audio and its summary.
    pub fn wait(mut self) -> Result<(Vec<f32>, Summary)> {
        let mut audio = Vec::new();
        loop {
            match self.next_event() {
                Some(Event::Audio(a)) => audio.extend_from_slice(&a),
                Some(Event::Done(summary)) => return Ok((audio, summary)),
                Some(Event::Failed(e)) => return Err(e),
                None => return Err(Error::Runtime("the request ended without a result".into())),
            }
        }
    }

    /// Stops the request at its next token or chunk (its handle then yields `Failed(Cancelled)`).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// A token that cancels this request from elsewhere (another thread or task, while this
    /// handle waits in [`RequestHandle::next_event`]).
    pub fn cancel_token(&self) -> CancelToken {
        CancelToken(self.cancel.clone())
    }
}

/// Cancels one request ([`RequestHandle::cancel_token`]); cloneable, `Send + Sync`.
#[derive(Debug, Clone)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// Stops the request at its next token or chunk.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the request was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
