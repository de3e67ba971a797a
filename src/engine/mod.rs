//! The serving engine: one loaded model, many requests at once; the one way into synthesis.
//!
//! ```no_run
//! # fn demo(config: &cosy::config::Config, req: cosy::request::Request) -> cosy::Result<()> {
//! let engine = cosy::engine::Engine::builder(config).build()?; // Send + Sync; share it in an Arc
//! let handle = engine.submit(req)?;                             // queued, then runs beside the others
//! for chunk in handle.chunks() {                               // audio as it is made (24 kHz mono)
//!     let samples = chunk?;
//!     # let _ = samples;
//! }
//! # Ok(()) }
//! ```
//!
//! The engine owns the per-request pipeline ([`crate::pipeline::Synthesizer`]) and the stages'
//! batchers, and joins them: the pipeline only knows the stage traits
//! ([`crate::pipeline::LlmStage`], [`crate::pipeline::DitStage`]), which the batchers implement.
//! Each request runs on a thread of its own (frontend, text planning, its sentences'
//! token-to-wav work); the LLM's decode steps of every active sentence run as one batched call
//! ([`llm_batch`], continuous batching), the DiT calls of requests in the flow stage at the same
//! time run together ([`dit_batch`]), the small stages take turns. A request's own state (sampler
//! and seed, KV-cache row, stream planner, HiFT state) lives with the request, so its output does
//! not depend on what else runs.
//!
//! Admission, in one place: at most `engine.max_in_flight` requests synthesise, at most
//! `engine.max_queue` wait for a slot; [`Engine::submit`] refuses more with [`Error::Busy`]
//! (the server's 429). Dropping a [`RequestHandle`] (or [`RequestHandle::cancel`]) stops its
//! request at the next token or chunk, or takes it out of the queue, and frees its place.
//!
//! Residency, in one place ([`residency`]): with `engine.idle_unload_s` the model is dropped
//! after that long without requests and loaded again by the next one, which waits for it (its
//! summary's `stages.load`); [`Engine::model_state`] says where it is.

pub mod dit_batch;
pub mod llm_batch;
pub mod llm_slots;
mod load;
mod residency;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use dit_batch::{DitBatchStats, DitBatcher, RemoteEstimator};
pub use llm_batch::{DecodeHold, LlmBatchStats, LlmScheduler, RemoteLlm};
pub use load::StageLoad;
pub use residency::{ModelState, UnloadHook};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::frontend::audio::Audio;
use crate::frontend::sentences::SentenceCutter;
use crate::pipeline::Synthesizer;
use crate::profile::Profiler;
use crate::request::{Request, SentenceRecord, Summary, SynthesisObserver};
use crate::voice::SavedVoice;

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

/// How many requests synthesise and wait, against `engine.max_in_flight` and `engine.max_queue`.
#[derive(Debug)]
struct Admission {
    counts: Mutex<Counts>,
    freed: Condvar,
    max_running: usize,
    max_queue: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    running: usize,
    queued: usize,
}

impl Admission {
    fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place in the queue, or [`Error::Busy`] when every slot and every place is taken.
    fn enter(self: &Arc<Self>) -> Result<Queued> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.running + c.queued >= self.max_running + self.max_queue {
            return Err(Error::Busy(format!(
                "{} requests are synthesising and {} waiting, the most engine.max_in_flight and engine.max_queue allow; retry when one has finished",
                c.running, c.queued
            )));
        }
        c.queued += 1;
        Ok(Queued(Some(self.clone())))
    }
}

/// A request's place in the queue; dropped (cancelled) it leaves the queue.
struct Queued(Option<Arc<Admission>>);

impl Queued {
    /// Waits for a slot; gives up with [`Error::Cancelled`] once `cancel` is set (checked every
    /// 50 ms while waiting, so a client that hangs up in the queue leaves it promptly).
    fn run(mut self, cancel: &AtomicBool) -> Result<Running> {
        let Some(a) = self.0.take() else { return Err(Error::Runtime("admission: no place in the queue".into())) };
        let mut c = a.counts.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if cancel.load(Ordering::Relaxed) {
                c.queued -= 1;
                return Err(Error::Cancelled);
            }
            if c.running < a.max_running {
                c.queued -= 1;
                c.running += 1;
                drop(c);
                return Ok(Running(a));
            }
            c = a.freed.wait_timeout(c, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            let mut c = a.counts.lock().unwrap_or_else(|p| p.into_inner());
            c.queued = c.queued.saturating_sub(1);
        }
    }
}

/// A slot held by a running request; dropped when the request's thread ends.
struct Running(Arc<Admission>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut c = self.0.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.running = c.running.saturating_sub(1);
        self.0.freed.notify_all();
    }
}

/// One loaded model shared by every request (`Send + Sync`).
pub struct Engine {
    /// The model, in memory or not (`engine.idle_unload_s`).
    residency: Arc<residency::Residency>,
    /// The thread that drops the model when idle (`None` when `engine.idle_unload_s` is 0).
    idle_watch: Option<std::thread::JoinHandle<()>>,
    admission: Arc<Admission>,
    /// The model's output rate, voice key and prompt limit, kept while it is not in memory.
    sample_rate: u32,
    voice_key: String,
    max_prompt_seconds: f64,
    test_hooks: bool,
    /// `limits.max_text_chars`: what a [`TextFeed`] takes at most.
    max_text_chars: usize,
    /// `text.markdown`: how a [`TextFeed`] that cuts sentences reads Markdown (with each
    /// request's switches over it).
    text_markdown: crate::config::MarkdownSettings,
}

/// How to build an [`Engine`] ([`Engine::builder`]).
pub struct EngineBuilder<'c> {
    config: &'c Config,
    profiler: Profiler,
    warm_up: Option<Request>,
    llm_gather_first: usize,
    test_hooks: bool,
    unload_hook: Option<UnloadHook>,
}

impl EngineBuilder<'_> {
    /// Records spans of every request into `profiler` (`cosy profile`, the server's metrics).
    pub fn profiler(mut self, profiler: Profiler) -> Self {
        self.profiler = profiler;
        self
    }

    /// Runs `request` to the end once the model is loaded (the first run of a session is slower:
    /// allocations, kernel choice). A failed warm-up is logged, not an error.
    pub fn warm_up(mut self, request: Request) -> Self {
        self.warm_up = Some(request);
        self
    }

    /// Test hook: the LLM scheduler's first prefill waits until `n` sentences wait for it, so
    /// that their decode steps are batched whatever the machine's timing. For tests only: a
    /// sentence that never comes holds the first ones back.
    pub fn llm_gather_first(mut self, n: usize) -> Self {
        self.llm_gather_first = n;
        self
    }

    /// Accepts requests with [`crate::request::TestHooks`] (hold points); without it they are
    /// refused. For tests and debugging only (`debug.test_hooks`).
    pub fn test_hooks(mut self, allowed: bool) -> Self {
        self.test_hooks = allowed;
        self
    }

    /// Test hook: `hook` runs on the idle-unload thread (`engine.idle_unload_s`) each time the
    /// model is marked unloading, before it is dropped, so that a test can send a request while
    /// the unload is under way. For tests only: the unload waits for the hook.
    pub fn unload_hook(mut self, hook: UnloadHook) -> Self {
        self.unload_hook = Some(hook);
        self
    }

    /// Loads the model (its data, then every stage's session and the batching threads).
    pub fn build(self) -> Result<Engine> {
        let config = self.config;
        let residency = residency::Residency::load(residency::HowToLoad {
            config: config.clone(),
            profiler: self.profiler,
            llm_gather_first: self.llm_gather_first,
            unload_hook: self.unload_hook,
        })?;
        let Some(loaded) = residency.current() else { return Err(Error::Runtime("the model is not loaded after loading it".into())) };
        let mut engine = Engine {
            sample_rate: loaded.synth.constants().sample_rate,
            voice_key: loaded.synth.voice_key().to_string(),
            max_prompt_seconds: loaded.synth.max_prompt_seconds(),
            residency,
            idle_watch: None,
            admission: Arc::new(Admission {
                counts: Mutex::new(Counts::default()),
                freed: Condvar::new(),
                max_running: config.engine.max_in_flight.max(1),
                max_queue: config.engine.max_queue,
            }),
            test_hooks: self.test_hooks || config.debug.test_hooks,
            max_text_chars: config.limits.max_text_chars,
            text_markdown: config.text.markdown,
        };
        if let Some(request) = self.warm_up {
            let started = std::time::Instant::now();
            match engine.submit(request).and_then(|h| h.wait()) {
                Ok(_) => tracing::info!("warmed up in {:.2} s", started.elapsed().as_secs_f64()),
                Err(e) => tracing::warn!("warm-up failed (the model is still usable): {e}"),
            }
        }
        drop(loaded);
        // Started after the warm-up, so that the idle time counts from a ready model.
        if config.engine.idle_unload_s > 0 {
            engine.idle_watch = Some(engine.residency.watch_idle(Duration::from_secs(config.engine.idle_unload_s))?);
        }
        Ok(engine)
    }
}

/// Cancellation flag, the test hooks, plus an optional caller's observer.
struct RequestObserver {
    cancel: Arc<AtomicBool>,
    inner: Option<Arc<dyn SynthesisObserver + Send>>,
}

impl SynthesisObserver for RequestObserver {
    fn text_tokens(&self, sentence: usize, text: &str, tokens: &[i64]) {
        if let Some(o) = &self.inner {
            o.text_tokens(sentence, text, tokens);
        }
    }
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
    fn sentence_audio_done(&self, sentence: usize, end: usize) {
        if let Some(o) = &self.inner {
            o.sentence_audio_done(sentence, end);
        }
    }
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.inner.as_ref().is_some_and(|o| o.cancelled())
    }
    fn wants_trace(&self) -> bool {
        self.inner.as_ref().is_some_and(|o| o.wants_trace())
    }
    fn sentence_done(&self, sentence: &SentenceRecord<'_>) -> Result<()> {
        match &self.inner {
            Some(o) => o.sentence_done(sentence),
            None => Ok(()),
        }
    }
}

/// Checks the constants synthesis reads from a model folder's manifest (rates, steps, bounds),
/// as [`EngineBuilder::build`] does first; for reports (`cosy doctor`) that load nothing.
pub fn check_model_constants(dir: &crate::model::ModelDir) -> Result<()> {
    crate::pipeline::ModelConstants::from_manifest(dir).map(|_| ())
}

/// The longest prompt recording the model in `dir` takes, in seconds, read from its manifest and
/// side file without loading it (the same number as [`Engine::max_prompt_seconds`]).
pub fn max_prompt_seconds_of(dir: &std::path::Path) -> Result<f64> {
    crate::pipeline::model_prompt_limit(&crate::model::ModelDir::open(dir)?)
}

impl Engine {
    /// A builder over `config` (profiler, warm-up, test hooks); [`EngineBuilder::build`] loads.
    pub fn builder(config: &Config) -> EngineBuilder<'_> {
        EngineBuilder { config, profiler: Profiler::disabled(), warm_up: None, llm_gather_first: 0, test_hooks: false, unload_hook: None }
    }

    /// Loads the model of `config` with the default options.
    pub fn load(config: &Config) -> Result<Engine> {
        Engine::builder(config).build()
    }

    /// The output sample rate (Hz) of the model.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The key saved voices of this model carry ([`crate::voice::model_key`]).
    pub fn voice_key(&self) -> &str {
        &self.voice_key
    }

    /// The longest prompt recording this model takes, in seconds.
    pub fn max_prompt_seconds(&self) -> f64 {
        self.max_prompt_seconds
    }

    /// Computes a saved voice from a recording and its transcript: the frontend graphs run on the
    /// caller's thread, in a slot of the engine's admission like any request (so voice uploads
    /// count against `engine.max_in_flight` and `engine.max_queue`).
    pub fn make_voice(&self, name: &str, audio: &Audio, label: &std::path::Path, transcript: &str) -> Result<SavedVoice> {
        let _slot = self.admission.enter()?.run(&AtomicBool::new(false))?;
        let model = self.residency.acquire()?;
        model.synth.make_voice_from(name, audio, label, transcript)
    }

    /// The normalising option of text-in streaming on its own: `pieces` regrouped into settled
    /// sentences, each normalised ([`Synthesizer::normalize_sentences`]). The iterator holds the
    /// model in memory (loading it first if it was unloaded; a failed load is its one item).
    pub fn normalize_sentences<'a, I>(&'a self, normalization: crate::request::Normalization, pieces: I) -> impl Iterator<Item = Result<String>> + 'a
    where
        I: IntoIterator<Item = Result<String>>,
        I::IntoIter: 'a,
    {
        let sentences: Box<dyn Iterator<Item = Result<String>> + 'a> = match self.residency.acquire() {
            Ok(model) => {
                let markdown = model.synth.markdown_for(&normalization, true);
                let numbers = model.synth.numbers_for(&normalization);
                // The global lexicon: no voice is known here.
                Box::new(crate::pipeline::normalize_sentences_in(residency::LeasedSynthesizer(model), markdown, numbers, None, pieces))
            }
            Err(e) => Box::new(std::iter::once(Err(e))),
        };
        sentences
    }

    /// The sentences of a whole-text request exactly as the model gets them (after Markdown,
    /// normalisation and splitting), and its pauses, without synthesising (`cosy file --show-text`).
    pub fn plan_text(&self, request: &Request) -> Result<Vec<crate::pipeline::Spoken>> {
        let model = self.residency.acquire()?;
        Ok(model.synth.plan_text(request)?.1)
    }

    /// How each stage's session was opened, and how long it took, at the last load (none while
    /// the model is unloaded).
    pub fn load_times(&self) -> Vec<StageLoad> {
        self.residency.current().map(|l| l.load_times.clone()).unwrap_or_default()
    }

    /// What the LLM scheduler and the DiT batcher have done so far (how much was batched), over
    /// every load of the model.
    pub fn batch_stats(&self) -> (LlmBatchStats, DitBatchStats) {
        self.residency.batch_stats()
    }

    /// The DiT prompt-prefix cache's counters (`None` when it is not used, or while the model
    /// is unloaded: the in-memory cache goes with it).
    pub fn prompt_cache_stats(&self) -> Option<crate::pipeline::PrefixStats> {
        self.residency.current().and_then(|l| l.dit.prefix_store().map(|s| s.stats()))
    }

    /// Whether the model is in memory now (`engine.idle_unload_s` drops it when idle; the next
    /// request loads it again).
    pub fn model_state(&self) -> ModelState {
        self.residency.state()
    }

    /// How many times the model was loaded again after an idle unload.
    pub fn reloads(&self) -> u64 {
        self.residency.reloads()
    }

    /// Requests (with a slot) waiting for the model to be dropped or loaded before they start.
    pub fn waiting_for_model(&self) -> usize {
        self.residency.waiting()
    }

    /// Requests synthesising now.
    pub fn in_flight(&self) -> usize {
        self.admission.counts().running
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.admission.counts().queued
    }

    /// `engine.max_in_flight` and `engine.max_queue` in effect.
    pub fn limits(&self) -> (usize, usize) {
        (self.admission.max_running, self.admission.max_queue)
    }

    /// Queues `request` (it starts when a slot is free), or refuses it with [`Error::Busy`] when
    /// every slot and every place in the queue is taken.
    pub fn submit(&self, request: Request) -> Result<RequestHandle> {
        self.submit_observed(request, None)
    }

    /// [`Engine::submit`] with an observer of its tokens and sentences (its `cancelled` is
    /// honoured too; `--dump` writes through one).
    pub fn submit_observed(&self, mut request: Request, observer: Option<Arc<dyn SynthesisObserver + Send>>) -> Result<RequestHandle> {
        let hooks = request.test_hooks.clone();
        if let Some(n) = hooks.min_tokens {
            request.ignore_stop_until = Some(n);
        }
        self.spawn(observer, hooks, move |synth, observer, on_chunk| synth.synthesize_observed(&request, observer, on_chunk))
    }

    /// Queues a text-in streaming request ([`Synthesizer::synthesize_bistream`]): `request.text`
    /// is not used; the text comes through the returned [`TextFeed`] while audio comes out of
    /// the handle. Dropping the feed ends the text. Refused as [`Engine::submit`].
    /// With `options.normalize_sentences`, each piece the request takes is a span of settled
    /// sentences, normalised whole ([`Synthesizer::normalize_settled`]): the caller's pieces when
    /// it cut them (`options.settled_pieces`), else the spans the feed cuts from them as they
    /// arrive ([`TextFeed`]); otherwise the text goes in as written (the official, exact mode).
    pub fn submit_bistream(
        &self,
        request: Request,
        options: BistreamOptions,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
    ) -> Result<(TextFeed, RequestHandle)> {
        // Pieces queue here until the LLM takes them. Sending never blocks (an async front end
        // must keep reading audio while it writes text): the queue is bounded by the text limit
        // instead, which `TextFeed::send` enforces.
        let (tx, rx) = crossbeam_channel::unbounded::<Result<String>>();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let taken_here = taken.clone();
        let hooks = request.test_hooks.clone();
        // The feed cuts the sentences (on the caller's side of the queue, so that a piece the
        // request takes is a piece the LLM gets: an early end leaves whole spans in the queue).
        let cutter = (options.normalize_sentences && !options.settled_pieces)
            .then(|| SentenceCutter::new(request.normalization.markdown(self.text_markdown, request.text_frontend)));
        let handle = self.spawn(observer, hooks, move |synth, observer, on_chunk| {
            // While it waits for text, the request still notices a cancel.
            let pieces = std::iter::from_fn(|| loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(piece) => {
                        taken_here.fetch_add(1, Ordering::SeqCst);
                        return Some(piece);
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) if observer.cancelled() => return Some(Err(Error::Cancelled)),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return None,
                }
            });
            if options.normalize_sentences {
                synth.synthesize_bistream(&request, synth.normalize_settled(&request, pieces), observer, on_chunk)
            } else {
                synth.synthesize_bistream(&request, pieces, observer, on_chunk)
            }
        })?;
        let progress = FeedProgress { taken, handed: Arc::new(Mutex::new(Vec::new())) };
        Ok((TextFeed { tx, progress, cutter, chars: 0, limit: self.max_text_chars }, handle))
    }

    /// The test hooks rule (every request goes through it; a front end may ask early, before a
    /// session's first request): hooks only when the engine is started for tests, and their own
    /// rules ([`crate::request::TestHooks::check`]).
    pub fn check_test_hooks(&self, hooks: &crate::request::TestHooks) -> Result<()> {
        if hooks.is_set() && !self.test_hooks {
            return Err(Error::input(
                crate::error::InputCode::TestHooksDisabled,
                Some("test_hooks"),
                "test hooks are refused unless the engine is started for tests (debug.test_hooks = true)",
            ));
        }
        hooks.check()
    }

    fn spawn<J>(
        &self,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
        hooks: crate::request::TestHooks,
        job: J,
    ) -> Result<RequestHandle>
    where
        J: FnOnce(&Synthesizer, &dyn SynthesisObserver, &mut (dyn FnMut(&[f32]) -> Result<()> + Send)) -> Result<Summary> + Send + 'static,
    {
        self.check_test_hooks(&hooks)?;
        let queued = self.admission.enter()?;
        let cancel = Arc::new(AtomicBool::new(false));
        // Audio waits here for the caller; a slow reader holds its request back (not the others).
        let (tx, rx) = flume::bounded::<Event>(16);
        let residency = self.residency.clone();
        let observer = RequestObserver { cancel: cancel.clone(), inner: observer };
        let submitted = std::time::Instant::now();
        std::thread::Builder::new()
            .name("request".into())
            .spawn(move || {
                let result = queued.run(&observer.cancel).and_then(|_slot| {
                    // The request's time in the queue (its summary's `stages.queue`).
                    let queue = submitted.elapsed().as_secs_f64();
                    // The model, loaded again first if it was dropped when idle (`stages.load`).
                    let model = residency.acquire()?;
                    let mut first = true;
                    let mut slow = hooks.slow_to_rtf.map(|rtf| SlowToRtf::new(rtf, model.synth.constants().sample_rate));
                    let mut on_chunk = |chunk: &[f32]| {
                        if let Some(slow) = slow.as_mut() {
                            slow.wait(chunk.len(), &observer.cancel);
                        }
                        tx.send(Event::Audio(chunk.to_vec())).map_err(|_| Error::Cancelled)?;
                        if std::mem::take(&mut first) && hooks.hold_after_first_audio {
                            hold_until_cancelled(&observer.cancel);
                            return Err(Error::Cancelled);
                        }
                        Ok(())
                    };
                    job(&model.synth, &observer, &mut on_chunk).map(|mut summary| {
                        summary.stages.queue = queue;
                        summary.stages.load = model.load_seconds.unwrap_or(0.0);
                        summary
                    })
                });
                let _ = tx.send(match result {
                    Ok(summary) => Event::Done(summary),
                    Err(e) => Event::Failed(e),
                });
            })
            .map_err(|e| Error::Runtime(format!("cannot start a request thread: {e}")))?;
        Ok(RequestHandle { rx, cancel, finished: false })
    }
}

/// The hold point of [`crate::request::TestHooks::hold_after_first_audio`]: the request keeps its
/// slot until it is cancelled (a hang-up, a timeout, a drain). Test-only, so a 10 ms poll is fine.
fn hold_until_cancelled(cancel: &AtomicBool) {
    while !cancel.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The test hook [`crate::request::TestHooks::slow_to_rtf`]: each chunk is handed over no sooner
/// than `rtf` times its duration after the previous one, so the audio arrives at most at 1/`rtf`
/// of real time whatever the machine. Test-only: it sleeps, in short steps that notice a cancel.
struct SlowToRtf {
    rtf: u32,
    sample_rate: u32,
    last: std::time::Instant,
}

impl SlowToRtf {
    fn new(rtf: u32, sample_rate: u32) -> SlowToRtf {
        SlowToRtf { rtf, sample_rate: sample_rate.max(1), last: std::time::Instant::now() }
    }

    fn wait(&mut self, samples: usize, cancel: &AtomicBool) {
        let due = Duration::from_secs_f64(f64::from(self.rtf) * samples as f64 / f64::from(self.sample_rate));
        while !cancel.load(Ordering::Relaxed) {
            let left = due.saturating_sub(self.last.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
        self.last = std::time::Instant::now();
    }
}

/// How a text-in streaming request treats its text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BistreamOptions {
    /// Normalise settled sentences (numbers, symbols) instead of the exact, unnormalised text.
    pub normalize_sentences: bool,
    /// With `normalize_sentences`: each piece is already a span of settled sentences, read as
    /// Markdown by the caller (`app::text_stream` cuts them), so it is normalised whole as it is
    /// taken. Without it the [`TextFeed`] cuts the caller's text into such spans as it arrives
    /// (the same cut, [`SentenceCutter`]) and hands those over. Either way a piece the request
    /// took is a piece the LLM got: a segment that ends early leaves whole pieces behind
    /// ([`FeedProgress::not_taken`]), none half-read.
    pub settled_pieces: bool,
}

/// The text of a text-in streaming request, piece by piece ([`Engine::submit_bistream`]).
/// Dropping it (or [`TextFeed::finish`]) ends the text.
pub struct TextFeed {
    tx: crossbeam_channel::Sender<Result<String>>,
    /// What was handed over and what the request took of it.
    progress: FeedProgress,
    /// Cuts the text into settled spans before they are handed over (normalised text-in
    /// streaming whose caller does not cut: [`BistreamOptions::settled_pieces`]).
    cutter: Option<SentenceCutter>,
    /// Characters sent (bounded by `limit`: the queue never blocks).
    chars: usize,
    limit: usize,
}

impl TextFeed {
    /// Hands the next piece of text to the request (any length; spaces count as written; an
    /// empty piece is no piece). Never blocks; more than `limits.max_text_chars` characters in
    /// all are refused. A feed that cuts sentences hands over each span as it settles.
    pub fn send(&mut self, piece: impl Into<String>) -> Result<()> {
        let piece = piece.into();
        if piece.is_empty() {
            return Ok(());
        }
        self.chars += piece.chars().count();
        crate::request::check_streamed_length(self.chars, self.limit)?;
        let piece = match self.cutter.as_mut() {
            Some(cutter) => match cutter.push(&piece) {
                Some(span) => span,
                None => return Ok(()),
            },
            None => piece,
        };
        self.hand_over(piece)
    }

    fn hand_over(&mut self, piece: String) -> Result<()> {
        self.progress.handed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(piece.clone());
        self.tx.send(Ok(piece)).map_err(|_| Error::Runtime("the request has ended; it takes no more text".into()))
    }

    /// How many of the pieces handed over (empty ones not counted; the spans, for a feed that
    /// cuts sentences) the request has taken so far. Once it has ended, the pieces after these
    /// were never read: text a front end may speak in a new request (`app::text_stream`).
    pub fn taken(&self) -> usize {
        self.progress.taken()
    }

    /// How many pieces were handed over (empty ones not counted; the spans, for a feed that cuts
    /// sentences).
    pub fn sent(&self) -> usize {
        self.progress.handed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// [`TextFeed::taken`] and [`FeedProgress::not_taken`], readable after the feed is finished.
    pub fn progress(&self) -> FeedProgress {
        self.progress.clone()
    }

    /// Ends the request with `error` (bad input upstream: invalid text, a broken connection).
    pub fn fail(mut self, error: Error) {
        // Not the rest of the text: the request ends with the error instead.
        self.cutter = None;
        let _ = self.tx.send(Err(error));
    }

    /// The text is complete.
    pub fn finish(self) {}
}

impl Drop for TextFeed {
    /// The end of the text: a feed that cuts sentences hands over what it still holds (the last
    /// sentence needs no end mark; [`SentenceCutter::finish`]).
    fn drop(&mut self) {
        if let Some(rest) = self.cutter.take().as_mut().and_then(SentenceCutter::finish) {
            // A request that already ended takes nothing: `not_taken` still lists it.
            let _ = self.hand_over(rest);
        }
    }
}

/// How far a text-in streaming request has read its text ([`TextFeed::progress`]).
#[derive(Clone)]
pub struct FeedProgress {
    /// Pieces the request has taken from the queue (its thread counts them).
    taken: Arc<std::sync::atomic::AtomicUsize>,
    /// Every piece handed over, in order.
    handed: Arc<Mutex<Vec<String>>>,
}

impl FeedProgress {
    /// How many of the pieces handed over the request has taken.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    /// The pieces handed over that the request has not taken: once it has ended (an early end:
    /// the model's end token or the length bound before the text's end), the text it never read,
    /// whole pieces in order, for a new request to speak.
    pub fn not_taken(&self) -> Vec<String> {
        let handed = self.handed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        handed.get(self.taken().min(handed.len())..).unwrap_or_default().to_vec()
    }
}

/// A request in flight. Dropping it cancels the request.
pub struct RequestHandle {
    rx: flume::Receiver<Event>,
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

    /// [`RequestHandle::next_event`], waiting at most `timeout`: [`TimedOut`] when nothing came
    /// (a caller that must look at something else between waits: the Python package notices
    /// Ctrl-C there).
    pub fn next_event_timeout(&mut self, timeout: Duration) -> std::result::Result<Option<Event>, TimedOut> {
        if self.finished {
            return Ok(None);
        }
        let event = match self.rx.recv_timeout(timeout) {
            Ok(event) => Some(event),
            Err(flume::RecvTimeoutError::Timeout) => return Err(TimedOut),
            Err(flume::RecvTimeoutError::Disconnected) => None,
        };
        match &event {
            Some(Event::Audio(_)) => {}
            _ => self.finished = true,
        }
        Ok(event)
    }

    /// [`RequestHandle::next_event`] for async callers (the server): awaits without a thread.
    pub async fn next_event_async(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.rx.recv_async().await.ok();
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

/// Nothing came within the time [`RequestHandle::next_event_timeout`] waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

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

impl Drop for Engine {
    fn drop(&mut self) {
        self.residency.stop();
        if let Some(watch) = self.idle_watch.take() {
            let _ = watch.join();
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
