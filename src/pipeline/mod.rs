//! Synthesis end to end (cosyvoice3.md §3.4, §4–§7): prompt features → LLM tokens → silent
//! pruning → flow → HiFT → waveform chunks.
//!
//! [`Synthesizer`] owns the model's immutable data ([`ModelData`]: side tables, f0 net,
//! tokenizer, constants) and the [`Stages`] it was given: the LLM and the DiT behind the
//! [`LlmStage`] / [`DitStage`] traits (the engine gives its batchers; nothing here imports the
//! engine), the small stages as sessions. Every request builds its own state (KV cache, sampler,
//! silent filter, stream planner, HiFT accumulator, source generator); nothing mutable outlives a
//! request. Front ends do not construct it: `crate::engine::Engine::builder` does.
//!
//! One code path serves offline and streaming synthesis: the LLM decodes on its own thread and
//! hands each token over a channel; the token-to-wav thread prunes silent tokens, runs the flow
//! and HiFT per planned chunk (streaming) or once after the last token (offline), and sends the
//! new audio over a second channel to the caller. No thread polls or sleeps.
//!
//! Streaming: each chunk re-runs flow_front and the CFM solve over prompt + all tokens so far, as
//! `CosyVoice2Model.token2wav` does. HiFT keeps what no later chunk can change ([`HiftStream`]:
//! settled f0 and source, and a decoder window of `decode_left_context_frames` before the first
//! new sample instead of the whole accumulated mel), so the emitted samples are the official ones
//! (docs/fidelity.md, "What streaming reuses between chunks").

pub mod constants;
mod limits;
pub use limits::{model_prompt_limit, prompt_limit_seconds};
mod prefix_cache;
mod prefix_disk;
pub use prefix_cache::{prefix_key, PrefixKey, PrefixStats, PrefixStore};
pub use prefix_disk::PrefixDisk;
mod prompt;
pub mod stages;
mod token2wav;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ndarray::Array2;

use crate::config::{Config, MarkdownSettings, NormalizerChoice};
use crate::error::{Error, Result};
use crate::flow::StreamParams;
use crate::frontend::prompt::plan;
use crate::frontend::lexicon::Lexicon;
use crate::frontend::pause::Piece;
use crate::frontend::markdown::to_speech;
use crate::frontend::sentences::SentenceCutter;
use crate::frontend::text::{bypasses_frontend, is_only_punctuation, normalize, normalize_numbers, IdentityNormalizer, Normalizer};
use crate::frontend::tn::WetextPair;
use crate::frontend::tokenizer::TextTokenizer;
use crate::hift::{F0Predictor, SourceGenerator};
use crate::llm::{build_llm_input, decode_with, DecodeOptions, Sampler, SamplingParams, SilentTokenFilter, Termination};
use crate::llm::LlmStep;
use crate::flow::Estimator;
use crate::model::ModelDir;
use crate::profile::Profiler;
use crate::runtime::StageSession;
use crate::side::{SideEmbeddings, SideFile};

pub use constants::ModelConstants;
pub use crate::request::{PromptFeatures, SegmentTrace, SentenceRecord};
use crate::frontend::ssml::Stretch;
use crate::request::{check_options, rated_speed, check_speakable, check_text_length, sentence_label, shorten, NoObserver, Normalization, Request, SentenceSpan, StageTimes, Summary, SynthesisObserver, Voice};
use token2wav::{RequestState, TokenToWav};

/// The LLM as the pipeline uses it: one [`LlmStep`] per sentence. The serving engine implements
/// it with its continuous-batching scheduler; a test can give a fake.
pub trait LlmStage: Send + Sync {
    /// A fresh decode (prefill, then steps) for one sentence; its calls record into `profiler`.
    fn step(&self, profiler: &Profiler) -> Result<Box<dyn LlmStep + '_>>;

    /// Asked while a streaming request's first chunk runs its flow and HiFT: the stage may hold
    /// its decode steps until the returned guard is dropped, so that the chunk on the path to
    /// first audio has the cores. `None` = it does not hold (the default; the engine's rule:
    /// `EngineSettings::first_audio_priority_applies`).
    fn hold_decoding(&self) -> Option<Box<dyn Send + '_>> {
        None
    }
}

/// The DiT as the pipeline uses it: one [`Estimator`] per CFM solve. The serving engine
/// implements it with its batcher.
pub trait DitStage: Send + Sync {
    /// An estimator for one solve; its calls record into `profiler`.
    fn estimator(&self, profiler: &Profiler) -> Result<Box<dyn Estimator + '_>>;

    /// The per-voice prompt-prefix cache non-final streaming calls use; `None` = none (the
    /// graph lacks the cache I/O, or it is turned off).
    fn prefix_store(&self) -> Option<&PrefixStore> {
        None
    }
}

/// Open stages, shared by every request in flight: the LLM and the DiT behind whatever the
/// caller gives (the engine's batchers), the others behind a lock (one call at a time; they are
/// a small share of the work).
pub struct Stages {
    pub llm: Box<dyn LlmStage>,
    pub flow_front: Mutex<StageSession>,
    pub dit: Box<dyn DitStage>,
    pub hift: Mutex<StageSession>,
    pub campplus: Mutex<StageSession>,
    pub speech_tokenizer: Mutex<StageSession>,
}

/// Locks a stage session; a panic in another request while it held the lock leaves the session
/// itself usable (ONNX Runtime keeps no state between runs), so poisoning is ignored.
fn lock(session: &Mutex<StageSession>) -> std::sync::MutexGuard<'_, StageSession> {
    session.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One item of what a request says, in order ([`Synthesizer::plan_text`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Spoken {
    /// A sentence, exactly as the model gets it.
    Sentence(String),
    /// Exact silence from a pause tag: this many samples of zeros.
    Pause { samples: usize },
    /// The sentences from here on are said at this speed (an SSML `<prosody rate>` times the
    /// request's speed), until the next; only where it changes.
    Speed(f64),
}

/// A loaded model ready to synthesise: its data, its open stages, and the request defaults.
pub struct Synthesizer {
    data: ModelData,
    /// Sampling after config overrides (the manifest's yaml values by default).
    pub sampling: SamplingParams,
    pub stream_params: StreamParams,
    /// Default seed (config `sampling.seed`).
    pub seed: u64,
    sessions: Stages,
    /// `limits.max_text_chars`: longer texts are refused.
    max_text_chars: usize,
    /// Precision of the frontend graphs (recorded in saved voices).
    frontend_precision: crate::vocab::Precision,
    /// Span recorder for `cosy profile`; disabled (free) unless given to [`Synthesizer::new`].
    profiler: Profiler,
    /// `text.markdown`, `text.code_blocks`, `text.symbols`: how Markdown is read unless a request
    /// turns it off.
    markdown: MarkdownSettings,
    /// `text.numbers`: numbers spelt out by the official frontend unless a request says otherwise.
    numbers: bool,
    /// `text.lexicon`: the user's pronunciation lexicon, applied after Markdown and before the
    /// official frontend (empty without one).
    lexicon: Lexicon,
}

/// A model folder's data, read and checked before any session is opened: everything the
/// pipeline needs besides the stages themselves.
pub struct ModelData {
    pub model: Arc<ModelDir>,
    pub constants: ModelConstants,
    embeddings: SideEmbeddings,
    /// `[80, noise_frames]`.
    noise: Array2<f32>,
    f0: F0Predictor,
    /// A source generator with no noise rows drawn yet; each request clones it.
    source_proto: SourceGenerator,
    tokenizer: TextTokenizer,
    /// wetext grammars from the model's `tn/` folder, or the identity (what the official frontend
    /// does when wetext is not installed) for folders exported without them.
    normalizer: Box<dyn Normalizer>,
    /// [`crate::voice::model_key`] of this model (saved voices must carry the same).
    voice_key: String,
}

fn model_err(dir: &ModelDir, msg: impl Into<String>) -> Error {
    Error::model(&dir.root, msg)
}

impl ModelData {
    /// Opens the model folder of `config`: its manifest, files, side tables, tokenizer and text
    /// normaliser (no session).
    pub fn load(config: &Config) -> Result<ModelData> {
        let dir = Arc::new(ModelDir::open(&config.model_dir)?);
        for stage in crate::vocab::STAGES {
            dir.graph(stage)?;
        }
        let problems = dir.check_files(false);
        if let Some(first) = problems.first() {
            let more = match problems.len() {
                1 => String::new(),
                n => format!(" (and {} more problem(s))", n - 1),
            };
            return Err(model_err(&dir, format!("{first}{more}; re-export the model")));
        }
        let constants = ModelConstants::from_manifest(&dir)?;
        let file_of = |key: &str| dir.listed_file(key);
        let side = Arc::new(SideFile::open(&file_of("side")?)?);
        let embeddings = SideEmbeddings::new(side.clone())?;
        if embeddings_hidden(&embeddings) != constants.llm_shape.hidden {
            return Err(model_err(&dir, "side.safetensors: embedding width differs from config.llm.hidden_size"));
        }
        let noise_t = side.f32("flow.noise")?;
        let noise = match noise_t.shape.as_slice() {
            &[c, n] if c == constants.mel_dim => Array2::from_shape_vec((c, n), noise_t.data)
                .map_err(|e| model_err(&dir, format!("flow.noise: {e}")))?,
            other => return Err(model_err(&dir, format!("side flow.noise has shape {other:?}, expected [80, frames]"))),
        };
        limits::check_noise_frames(&dir, &constants, noise.ncols())?;
        let f0 = load_f0(&side)?;
        let lw = side.f32("hift.source.l_linear.weight")?;
        let lb = side.f32("hift.source.l_linear.bias")?;
        let source_proto = SourceGenerator::new(
            constants.source,
            &lw.data,
            lb.data.first().copied().unwrap_or(0.0),
            constants.sine_noise_offset,
        )?;
        let tokenizer = TextTokenizer::from_file(&file_of("tokenizer")?)?;
        let voice_key = crate::voice::model_key(&dir)?;
        let normalizer = load_normalizer(&dir, config.text.normalizer)?;
        Ok(ModelData { model: dir, constants, embeddings, noise, f0, source_proto, tokenizer, normalizer, voice_key })
    }
}

/// Streamed text cut into settled sentences ([`SentenceCutter`], reading it as Markdown first
/// with `markdown`: a construct split across pieces reads as whole), each normalised as it
/// settles as the offline frontend normalises text, the rest at the end ([`Engine::normalize_sentences`](crate::engine::Engine::normalize_sentences)).
/// `synth`: any hold on the pipeline that the iterator keeps (the engine's keeps the model in
/// memory while the iterator lives); `lexicon`: the request's (its voice's over the global one),
/// `None` = the global one; `numbers`: whether numbers are spelt out (`text.numbers`).
pub fn normalize_sentences_in<'a, S, I>(synth: S, markdown: Option<MarkdownSettings>, numbers: bool, lexicon: Option<Lexicon>, pieces: I) -> impl Iterator<Item = Result<String>> + 'a
where
    S: std::ops::Deref<Target = Synthesizer> + 'a,
    I: IntoIterator<Item = Result<String>>,
    I::IntoIter: 'a,
{
    let mut pieces = pieces.into_iter();
    let mut cutter = SentenceCutter::new(markdown);
    let mut done = false;
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        match pieces.next() {
            Some(Ok(piece)) => {
                if let Some(span) = cutter.push(&piece) {
                    return Some(Ok(synth.normalize_span(&span, numbers, lexicon.as_ref())));
                }
            }
            Some(Err(e)) => return Some(Err(e)),
            None => {
                done = true;
                return cutter.finish().map(|rest| Ok(synth.normalize_span(&rest, numbers, lexicon.as_ref())));
            }
        }
    })
}

impl Synthesizer {
    /// The pipeline over a model's data and its open stages; spans of every request go to
    /// `profiler` (pass [`Profiler::disabled`] for none).
    pub fn new(config: &Config, data: ModelData, stages: Stages, profiler: Profiler) -> Result<Synthesizer> {
        Ok(Synthesizer {
            sampling: data.constants.sampling_for(config),
            stream_params: data.constants.stream_for(config)?,
            seed: config.sampling.seed,
            data,
            sessions: stages,
            max_text_chars: config.limits.max_text_chars,
            frontend_precision: config.precision_for(crate::vocab::StageGroup::Frontend),
            profiler,
            markdown: config.text.markdown,
            numbers: config.text.numbers,
            lexicon: match &config.text.lexicon {
                Some(path) => Lexicon::load(path)?,
                None => Lexicon::default(),
            },
        })
    }

    /// The model's constants (rates, sizes, token ids) as its manifest gives them.
    pub fn constants(&self) -> &ModelConstants {
        &self.data.constants
    }

    /// The LLM and DiT stages this pipeline was built over (the engine reads its batchers' counters).
    pub fn stages(&self) -> &Stages {
        &self.sessions
    }

    /// The key saved voices of this model carry ([`crate::voice::model_key`]).
    pub fn voice_key(&self) -> &str {
        &self.data.voice_key
    }

    /// The text tokenizer of the model.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.data.tokenizer
    }

    /// What a request's text becomes, in order: the sentences as the model gets them and the
    /// pauses of its pause tags (`frontend::pause`); and the prompt text (both after the frontend).
    pub fn plan_text(&self, req: &Request) -> Result<(String, Vec<Spoken>)> {
        let written = req.text.trim_end_matches(['\n', '\r']);
        check_speakable(written)?;
        check_text_length(written, self.max_text_chars)?;
        if req.normalization.as_planned {
            // One sentence this function planned before: said as given (`Normalization::as_planned`).
            let p = plan(&req.voice.mode(), written, false);
            return Ok((self.prompt_text_of(&p.prompt_text, req.text_frontend), vec![Spoken::Sentence(p.tts_text)]));
        }
        // SSML (a text that starts with `<speak>`, or any text the request says is SSML) becomes
        // plain text and pause tags first, stretch by stretch of one `<prosody rate>`; it is not
        // Markdown.
        let (stretches, markdown) = match req.text_frontend.then(|| req.input_format.ssml(written)).flatten() {
            Some(stretches) => (stretches?, false),
            None => (vec![Stretch { text: written.to_string(), rate: 1.0 }], true),
        };
        let lexicon = self.lexicon_for(&req.voice);
        let mut spoken = Vec::new();
        let mut read_text = String::new();
        let mut prompt_text = None;
        let mut speed = req.speed;
        for stretch in &stretches {
            // A rate is a speed of its own for the sentences of its stretch (said only where it changes).
            let rated = if stretch.rate == 1.0 { req.speed } else { rated_speed(req.speed, stretch.rate, req.stream)? };
            if rated != speed {
                speed = rated;
                spoken.push(Spoken::Speed(speed));
            }
            // Pause tags are part of the text layer: text the frontend does not see keeps them as written.
            let written = stretch.text.as_str();
            let pieces = if req.text_frontend && !bypasses_frontend(written) {
                crate::frontend::pause::split(written, self.data.constants.sample_rate)?
            } else {
                vec![Piece::Text(written)]
            };
            for piece in pieces {
                match piece {
                    Piece::Pause { samples } => spoken.push(Spoken::Pause { samples }),
                    Piece::Text(text) => {
                        let (prompt, read, sentences) = self.sentences_of(text, req, markdown, &lexicon);
                        prompt_text.get_or_insert(prompt);
                        read_text.push_str(&read);
                        spoken.extend(sentences.into_iter().map(Spoken::Sentence));
                    }
                }
            }
        }
        let written = crate::frontend::ssml::text_of(&stretches);
        let prompt_text = match prompt_text {
            Some(prompt) if spoken.iter().any(|s| matches!(s, Spoken::Sentence(_))) && !is_only_punctuation(read_text.trim()) => prompt,
            _ => {
                return Err(Error::invalid(format!(
                    "the text {:?} has nothing speakable (only punctuation, symbols, emoji or blanks); give some words",
                    shorten(written.trim(), 40)
                )))
            }
        };
        Ok((self.prompt_text_of(&prompt_text, req.text_frontend), spoken))
    }

    /// The lexicon a request's text is read with: its saved voice's over the global one
    /// (`text.lexicon`), the voice's entries winning.
    /// A saved voice's own lexicon over the global one, `None` when the voice has none (the
    /// normalisers then use the global one): what a text stream keeps for its request.
    fn voice_lexicon(&self, voice: &Voice) -> Option<Lexicon> {
        match self.lexicon_for(voice) {
            std::borrow::Cow::Owned(own) => Some(own),
            std::borrow::Cow::Borrowed(_) => None,
        }
    }

    fn lexicon_for(&self, voice: &Voice) -> std::borrow::Cow<'_, Lexicon> {
        match voice {
            Voice::Saved { lexicon: Some(own), .. } => std::borrow::Cow::Owned(own.over(&self.lexicon)),
            _ => std::borrow::Cow::Borrowed(&self.lexicon),
        }
    }

    /// One stretch of a request's text (between pause tags) through the text layer: Markdown, the
    /// lexicon, the official frontend (`markdown`: false for text from SSML). Returns the prompt
    /// text before normalisation, the text as read before the official frontend, and its non-blank
    /// sentences.
    fn sentences_of(&self, written: &str, req: &Request, markdown: bool, lexicon: &Lexicon) -> (String, String, Vec<String>) {
        // Markdown is read before the official frontend; markup (`<|…|>`) bypasses both.
        let read;
        let text = match self.markdown_for(&req.normalization, req.text_frontend) {
            Some(settings) if markdown && !bypasses_frontend(written) => {
                read = to_speech(written, settings);
                read.as_str()
            }
            _ => written,
        };
        // The lexicon reads the words as the user said, after Markdown, before the official frontend.
        let pronounced;
        let text = if req.text_frontend && !lexicon.is_empty() && !bypasses_frontend(written) {
            pronounced = lexicon.apply(text);
            pronounced.as_str()
        } else {
            text
        };
        let p = plan(&req.voice.mode(), text, req.text_frontend);
        let count = |s: &str| self.data.tokenizer.count(s);
        let segments = if p.text_frontend {
            normalize_numbers(&p.tts_text, true, self.numbers_for(&req.normalization), self.data.normalizer.as_ref(), &count).segments
        } else {
            vec![p.tts_text.clone()]
        };
        let segments = segments.into_iter().filter(|s| !s.trim().is_empty()).collect();
        (p.prompt_text, text.to_string(), segments)
    }

    /// How a request's text is read as Markdown, if it is ([`Normalization::markdown`]).
    pub fn markdown_for(&self, normalization: &Normalization, text_frontend: bool) -> Option<MarkdownSettings> {
        normalization.markdown(self.markdown, text_frontend)
    }

    /// Whether a request's numbers are spelt out ([`Normalization::numbers`]).
    pub fn numbers_for(&self, normalization: &Normalization) -> bool {
        normalization.numbers(self.numbers)
    }

    /// The prompt text as the LLM gets it: the official frontend normalises it too (split=False),
    /// unless it holds markup.
    fn prompt_text_of(&self, prompt_text: &str, text_frontend: bool) -> String {
        if !text_frontend {
            return prompt_text.to_string();
        }
        let count = |s: &str| self.data.tokenizer.count(s);
        normalize(prompt_text, true, self.data.normalizer.as_ref(), &count).text
    }

    /// Synthesises a request. `on_chunk` gets the audio (24 kHz mono f32) as it is produced.
    pub fn synthesize(&self, req: &Request, on_chunk: impl FnMut(&[f32]) -> Result<()> + Send) -> Result<Summary> {
        self.synthesize_observed(req, &NoObserver, on_chunk)
    }

    /// [`Self::synthesize`] with an observer (token events, cancellation, and each sentence's
    /// intermediates when it [wants them](SynthesisObserver::wants_trace), as `--dump` does).
    pub fn synthesize_observed(
        &self,
        req: &Request,
        observer: &dyn SynthesisObserver,
        mut on_chunk: impl FnMut(&[f32]) -> Result<()> + Send,
    ) -> Result<Summary> {
        check_options(req.speed, req.stream)?;
        // The request's own clock (its stage times in the summary) beside the shared recorder.
        let profiler = self.profiler.for_request();
        let frontend_span = profiler.span("frontend");
        let tokenizer_span = profiler.span("frontend.tokenizer");
        let (prompt_text, spoken) = self.plan_text(req)?;
        let segments: Vec<&String> = spoken
            .iter()
            .filter_map(|s| match s {
                Spoken::Sentence(sentence) => Some(sentence),
                Spoken::Pause { .. } | Spoken::Speed(_) => None,
            })
            .collect();
        let p = plan(&req.voice.mode(), &req.text, req.text_frontend);
        let prompt_text_token = self.encode(&prompt_text)?;
        tokenizer_span.end();
        let prompt = self.prompt_for_request(req)?;
        frontend_span.end();
        // A forced token count must fit the flow noise beside the prompt (see limits.rs).
        self.check_forced_tokens(&prompt, req.ignore_stop_until)?;
        let mut run = RequestRun::new(self, req, observer, &profiler);
        let mut summary = Summary { sentences: segments.len(), ..Summary::default() };
        let mut i = 0;
        let mut speed = req.speed;
        for item in &spoken {
            if observer.cancelled() {
                return Err(Error::Cancelled);
            }
            let segment = match item {
                Spoken::Sentence(sentence) => sentence,
                Spoken::Pause { samples } => {
                    // Exact silence between the audio around it, as one chunk of zeros.
                    if *samples > 0 {
                        summary.samples += samples;
                        summary.chunks += 1;
                        on_chunk(&vec![0.0; *samples])?;
                    }
                    continue;
                }
                Spoken::Speed(rated) => {
                    speed = *rated;
                    continue;
                }
            };
            let text_token = {
                let _f = profiler.span("frontend");
                let _t = profiler.span("frontend.tokenizer");
                self.encode(segment)?
            };
            if text_token.is_empty() {
                return Err(Error::invalid(format!("sentence {segment:?} gives no text tokens")));
            }
            summary.text_tokens += text_token.len();
            observer.text_tokens(i, segment, &text_token);
            let mut trace = observer.wants_trace().then(SegmentTrace::default);
            let llm_speech: &[i64] = if p.llm_prompt_speech { &prompt.speech_token } else { &[] };
            let start = summary.samples;
            let mut on = |c: &[f32]| {
                summary.samples += c.len();
                summary.chunks += 1;
                on_chunk(c)
            };
            let seg = Segment {
                index: i,
                count: segments.len(),
                label: segment,
                prompt: &prompt,
                prompt_text_token: &prompt_text_token,
                text: SegmentText::Tokens(&text_token),
                llm_prompt_speech: llm_speech,
                speed,
            };
            let emitted = self.run_segment(seg, &mut run, trace.as_mut(), &mut on)?;
            summary.speech_tokens += emitted;
            summary.spans.push(SentenceSpan { text: segment.clone(), start, samples: summary.samples - start });
            observer.sentence_audio_done(i, summary.samples);
            if let Some(trace) = trace {
                observer.sentence_done(&SentenceRecord {
                    index: i,
                    count: segments.len(),
                    prompt: &prompt,
                    prompt_text_token: &prompt_text_token,
                    text: segment,
                    text_token: &text_token,
                    trace: &trace,
                    stream: req.stream,
                    sample_rate: self.data.constants.sample_rate,
                })?;
            }
            i += 1;
        }
        summary.stages = StageTimes::of(&profiler);
        Ok(summary)
    }

    /// Text-in streaming (CosyVoice3's bi-streaming, [`crate::llm::decode_bistream`]): the text
    /// arrives as `pieces` while speech is made; `req.text` is not used. As the official code,
    /// each piece is tokenised on its own and not normalised (the exact mode); the prompt text is
    /// normalised as usual. Needs `<|endofprompt|>` in the prompt text: zero-shot or instruct
    /// (cross-lingual has no prompt text). The pieces' iterator may block while text is coming;
    /// an `Err` item ends the request with that error.
    pub fn synthesize_bistream(
        &self,
        req: &Request,
        pieces: impl IntoIterator<Item = Result<String>>,
        observer: &dyn SynthesisObserver,
        mut on_chunk: impl FnMut(&[f32]) -> Result<()> + Send,
    ) -> Result<Summary> {
        check_options(req.speed, req.stream)?;
        crate::request::check_text_streaming(&req.voice)?;
        let p = plan(&req.voice.mode(), "", req.text_frontend);
        let profiler = self.profiler.for_request();
        let frontend_span = profiler.span("frontend");
        let prompt_text_token = self.encode(&self.prompt_text_of(&p.prompt_text, req.text_frontend))?;
        let prompt = self.prompt_for_request(req)?;
        frontend_span.end();
        let mut run = RequestRun::new(self, req, observer, &profiler);
        let limit = self.max_text_chars;
        let mut chars = 0usize;
        let mut pending: std::collections::VecDeque<i64> = std::collections::VecDeque::new();
        let mut pieces = pieces.into_iter();
        // The text the pieces brought (the segment's span text).
        let mut streamed_text = String::new();
        // Text tokens one at a time, as the official generator hands them to the LLM.
        let mut tokens = std::iter::from_fn(|| loop {
            if let Some(t) = pending.pop_front() {
                return Some(Ok(t));
            }
            let piece = match pieces.next()? {
                Ok(piece) => piece,
                Err(e) => return Some(Err(e)),
            };
            chars += piece.chars().count();
            if let Err(e) = crate::request::check_streamed_length(chars, limit) {
                return Some(Err(e));
            }
            streamed_text.push_str(&piece);
            match self.encode(&piece) {
                Ok(ids) => {
                    observer.text_tokens(0, &piece, &ids);
                    pending.extend(ids)
                }
                Err(e) => return Some(Err(e)),
            }
        });
        // Nothing is said before the first text token is there: a stream that closes empty (or
        // fails at once) is an error, not speech made from the prompt alone.
        let first = match tokens.next() {
            None => return Err(Error::invalid("the streamed text was empty: the input closed without any text to say")),
            Some(first) => first?,
        };
        let mut tokens = std::iter::once(Ok(first)).chain(tokens);
        let llm_speech: &[i64] = if p.llm_prompt_speech { &prompt.speech_token } else { &[] };
        let mut summary = Summary { sentences: 1, ..Summary::default() };
        let mut on = |c: &[f32]| {
            summary.samples += c.len();
            summary.chunks += 1;
            on_chunk(c)
        };
        let seg = Segment {
            index: 0,
            count: 1,
            label: "(streamed text)",
            prompt: &prompt,
            prompt_text_token: &prompt_text_token,
            text: SegmentText::Streamed(&mut tokens),
            llm_prompt_speech: llm_speech,
            speed: req.speed,
        };
        let emitted = self.run_segment(seg, &mut run, None, &mut on)?;
        summary.speech_tokens = emitted;
        summary.spans.push(SentenceSpan { text: streamed_text, start: 0, samples: summary.samples });
        observer.sentence_audio_done(0, summary.samples);
        summary.stages = StageTimes::of(&profiler);
        Ok(summary)
    }

    /// The option of text-in streaming that normalises, over pieces that are settled spans (cut
    /// by [`SentenceCutter`]: the app's text stream, or the engine's `TextFeed`): each piece
    /// normalised whole as it is taken, as the offline frontend normalises text (numbers,
    /// symbols; `text.normalizer`). What it changes against the exact mode (the official one,
    /// which normalises nothing): numbers and symbols are read as words, a sentence is tokenised
    /// whole instead of piece by piece, and the LLM sees a sentence only once it is complete (the
    /// first audio waits for it).
    pub fn normalize_settled<'a, I>(&'a self, req: &Request, pieces: I) -> impl Iterator<Item = Result<String>> + 'a
    where
        I: IntoIterator<Item = Result<String>>,
        I::IntoIter: 'a,
    {
        let lexicon = self.voice_lexicon(&req.voice);
        let numbers = self.numbers_for(&req.normalization);
        pieces.into_iter().map(move |piece| piece.map(|span| self.normalize_span(&span, numbers, lexicon.as_ref())))
    }

    /// One settled span normalised, keeping the blank between sentences that the normaliser trims;
    /// `lexicon`: the request's ([`Synthesizer::lexicon_for`]), `None` = the global one.
    fn normalize_span(&self, span: &str, numbers: bool, lexicon: Option<&Lexicon>) -> String {
        let count = |s: &str| self.data.tokenizer.count(s);
        let lead = if span.starts_with(char::is_whitespace) { " " } else { "" };
        let span = lexicon.unwrap_or(&self.lexicon).apply(span);
        format!("{lead}{}", normalize_numbers(&span, true, numbers, self.data.normalizer.as_ref(), &count).text)
    }

    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        Ok(self.data.tokenizer.encode(text)?.into_iter().map(i64::from).collect())
    }

    /// How far one sentence's LLM may go, decided before it runs: its prefill input (none in
    /// text-in streaming, which builds it as the text arrives and has no length bound of its
    /// own), and the most speech tokens it may make.
    fn plan_segment(&self, seg: &Segment<'_>, req: &Request) -> Result<SegmentPlan> {
        let c = &self.data.constants;
        let mut input = match &seg.text {
            SegmentText::Streamed(_) => None,
            SegmentText::Tokens(text_token) => {
                Some(build_llm_input(&self.data.embeddings, seg.prompt_text_token, text_token, seg.llm_prompt_speech, &c.llm)?)
            }
        };
        // The speech must fit the flow noise beside the prompt: decoding stops there, and a
        // sentence that gets there is an error (limits.rs; `SegmentPlan::outgrown`).
        let room = self.noise_room_tokens(seg.prompt);
        // The test hook `max_tokens` ends the speech there as the model's stop token would (not
        // an error: what is said is complete; text-in streaming ends before its text).
        let max_len = input.as_ref().map_or(usize::MAX, |i| i.max_len).min(req.test_hooks.max_tokens.unwrap_or(usize::MAX));
        let outgrown = (room < max_len).then(|| self.outgrown_noise(seg.prompt, &seg.sentence_label()));
        let max_len = max_len.min(room);
        if let Some(input) = input.as_mut() {
            input.max_len = max_len;
        }
        let options = DecodeOptions { ignore_stop_until: req.ignore_stop_until.unwrap_or(0) };
        Ok(SegmentPlan { input, max_len, outgrown, options })
    }

    /// One sentence: the LLM decodes on this thread (its steps batched by the engine's scheduler)
    /// and hands each token to the sentence's token-to-wav thread, which calls `on_chunk` with
    /// each chunk's audio as soon as it is made: one extra thread per sentence. Returns the
    /// number of speech tokens; `trace` gets the sentence's intermediates when given.
    fn run_segment(
        &self,
        seg: Segment<'_>,
        run: &mut RequestRun<'_>,
        trace: Option<&mut SegmentTrace>,
        on_chunk: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
    ) -> Result<usize> {
        let c = &self.data.constants;
        let (req, observer) = (run.req, run.observer);
        let plan = self.plan_segment(&seg, req)?;
        let state = &mut run.state;
        let profiler = &state.profiler;
        let llm_failed = std::sync::atomic::AtomicBool::new(false);
        let t2w = TokenToWav {
            flow_front: &self.sessions.flow_front,
            dit: self.sessions.dit.as_ref(),
            hift: &self.sessions.hift,
            prompt: seg.prompt,
            noise: self.data.noise.view(),
            f0: &self.data.f0,
            source: self.data.source_proto.clone(),
            constants: c,
            stream_params: self.stream_params,
            stream_hop: &mut state.stream_hop,
            first_audio_made: &mut state.first_audio_made,
            llm: self.sessions.llm.as_ref(),
            stream: req.stream,
            speed: seg.speed,
            sentence: seg.sentence_label(),
            filter: SilentTokenFilter::new(&c.silent_tokens, c.max_silent_run),
            observer,
            profiler,
            record: trace.is_some(),
            llm_failed: &llm_failed,
        };
        let sampler = &mut state.sampler;
        let (tok_tx, tok_rx) = crossbeam_channel::unbounded::<i64>();
        std::thread::scope(|scope| -> Result<usize> {
            let worker = std::thread::Builder::new()
                .name("token2wav".into())
                .spawn_scoped(scope, move || t2w.run(tok_rx, on_chunk))
                .map_err(|e| Error::Runtime(format!("cannot start the token-to-wav thread: {e}")))?;
            let outcome = self.decode_segment(seg, &plan, sampler, profiler, observer, &tok_tx);
            // The worker finishes the sentence once the token channel closes, unless the LLM failed.
            if outcome.is_err() {
                llm_failed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            drop(tok_tx);
            let t2w_result = worker.join().map_err(|_| Error::Runtime("the token-to-wav thread panicked".into()))?;
            let (mut done, outcome) = segment_end(t2w_result, outcome, observer, plan)?;
            // Speech tokens only (text-in streaming also returns its fill tokens).
            let emitted = outcome.tokens.iter().filter(|&&t| !c.llm.is_stop(t)).count();
            if let Some(trace) = trace {
                done.llm_token_raw = outcome.tokens;
                done.termination = Some(outcome.termination);
                *trace = done;
            }
            Ok(emitted)
        })
    }

    /// The LLM of one sentence, on the calling thread: each token to the observer and to
    /// `tokens` (the token-to-wav thread); it stops when that thread or the request stops.
    fn decode_segment(
        &self,
        seg: Segment<'_>,
        plan: &SegmentPlan,
        sampler: &mut Sampler,
        profiler: &Profiler,
        observer: &dyn SynthesisObserver,
        tokens: &crossbeam_channel::Sender<i64>,
    ) -> Result<crate::llm::DecodeOutcome> {
        let _span = profiler.span("llm");
        let embeddings = &self.data.embeddings;
        let llm_constants = &self.data.constants.llm;
        let mut step = self.sessions.llm.step(profiler)?;
        let mut emitted = 0usize;
        let on_token = |t: i64| {
            observer.llm_token(seg.index, emitted, t);
            emitted += 1;
            tokens.send(t).is_ok() && !observer.cancelled()
        };
        let outcome = match (&plan.input, seg.text) {
            (Some(input), _) => decode_with(step.as_mut(), input, embeddings, sampler, llm_constants, &plan.options, profiler, on_token)?,
            (None, SegmentText::Streamed(text)) => crate::llm::decode_bistream(
                step.as_mut(),
                embeddings,
                sampler,
                llm_constants,
                seg.prompt_text_token,
                seg.llm_prompt_speech,
                text,
                plan.max_len,
                profiler,
                on_token,
            )?,
            (None, SegmentText::Tokens(_)) => return Err(Error::Runtime("llm: a sentence with its text tokens but no input".into())),
        };
        observer.llm_done(seg.index, outcome.tokens.len(), outcome.termination);
        Ok(outcome)
    }
}

/// How a sentence ended, from what its two threads returned: an LLM error first, then the
/// worker's (a worker that stopped early, because its consumer went away or a stage failed, made
/// the LLM stop too: its error is the cause); a decode the token callback stopped is the
/// request's cancel or the worker's stop; a decode cut at the flow noise's room is
/// [`SegmentPlan::outgrown`] (not with a forced token count).
fn segment_end(
    worker: Result<SegmentTrace>,
    llm: Result<crate::llm::DecodeOutcome>,
    observer: &dyn SynthesisObserver,
    plan: SegmentPlan,
) -> Result<(SegmentTrace, crate::llm::DecodeOutcome)> {
    let (done, outcome) = match (worker, llm) {
        (_, Err(e)) => return Err(e),
        (Err(e), Ok(_)) => return Err(e),
        (Ok(done), Ok(outcome)) => (done, outcome),
    };
    if outcome.termination == Termination::Cancelled {
        return Err(if observer.cancelled() {
            Error::Cancelled
        } else {
            Error::Runtime("the token-to-wav worker stopped taking tokens".into())
        });
    }
    if let Some(e) = plan.outgrown.filter(|_| outcome.termination == Termination::MaxLen && plan.options.ignore_stop_until == 0) {
        return Err(e);
    }
    Ok((done, outcome))
}

/// One sentence's LLM bounds ([`Synthesizer::plan_segment`]).
struct SegmentPlan {
    /// The prefill input; `None` in text-in streaming.
    input: Option<crate::llm::LlmInput>,
    /// The most speech tokens: the input's own bound, the test hook's, the room in the flow noise.
    max_len: usize,
    /// The error when the room in the flow noise is what stops the decoding.
    outgrown: Option<Error>,
    options: DecodeOptions,
}

/// One request on its way through its sentences: the request, who watches it, and what its
/// sentences hand on to each other.
struct RequestRun<'a> {
    req: &'a Request,
    observer: &'a dyn SynthesisObserver,
    state: RequestState,
}

impl<'a> RequestRun<'a> {
    /// The request's own sampler (its seed, else the configured one), and the configured hop to
    /// start at: its sentences hand it on (see StreamPlanner).
    fn new(synth: &Synthesizer, req: &'a Request, observer: &'a dyn SynthesisObserver, profiler: &Profiler) -> Self {
        let state = RequestState {
            sampler: Sampler::new(synth.sampling, req.seed.unwrap_or(synth.seed)),
            stream_hop: synth.stream_params.token_hop_len,
            profiler: profiler.clone(),
            first_audio_made: false,
        };
        RequestRun { req, observer, state }
    }
}

fn embeddings_hidden(e: &SideEmbeddings) -> usize {
    use crate::llm::EmbeddingLookup;
    e.hidden_size()
}

fn load_f0(side: &SideFile) -> Result<F0Predictor> {
    let mut weights = Vec::new();
    for i in [0, 2, 4, 6, 8] {
        let w = side.f64(&format!("hift.f0.condnet.{i}.weight"))?;
        let b = side.f64(&format!("hift.f0.condnet.{i}.bias"))?;
        let [o, c, k]: [usize; 3] = w
            .shape
            .as_slice()
            .try_into()
            .map_err(|_| Error::invalid(format!("hift.f0.condnet.{i}.weight has shape {:?}", w.shape)))?;
        let w = ndarray::Array3::from_shape_vec((o, c, k), w.data).map_err(|e| Error::invalid(format!("condnet.{i}: {e}")))?;
        weights.push((w, b.data));
    }
    let views: Vec<(ndarray::ArrayView3<f64>, &[f64])> = weights.iter().map(|(w, b)| (w.view(), b.as_slice())).collect();
    let cw = side.f64("hift.f0.classifier.weight")?;
    let cb = side.f64("hift.f0.classifier.bias")?;
    F0Predictor::new(&views, &cw.data, cb.data.first().copied().unwrap_or(0.0))
}

/// What one sentence's synthesis starts from.
struct Segment<'a> {
    index: usize,
    /// How many sentences the request has, and this one's text (for messages).
    count: usize,
    label: &'a str,
    prompt: &'a PromptFeatures,
    prompt_text_token: &'a [i64],
    text: SegmentText<'a>,
    /// Prompt speech tokens for the LLM (empty in cross-lingual and instruct modes).
    llm_prompt_speech: &'a [i64],
    /// Its mel time-stretch: the request's speed, or an SSML `<prosody rate>`'s.
    speed: f64,
}

impl Segment<'_> {
    /// `sentence N of M ("text…")`, for messages.
    fn sentence_label(&self) -> String {
        sentence_label(self.index, self.count, self.label)
    }
}

/// Where a sentence's text tokens come from.
enum SegmentText<'a> {
    /// All of them, known before it starts.
    Tokens(&'a [i64]),
    /// Text-in streaming: as they arrive (an `Err` ends the request with it).
    Streamed(&'a mut dyn Iterator<Item = Result<i64>>),
}

/// The text normaliser `text.normalizer` asks for: wetext from the model folder's grammars (its
/// manifest `tn` entry), or the identity, as the official frontend behaves without wetext.
fn load_normalizer(dir: &ModelDir, choice: NormalizerChoice) -> Result<Box<dyn Normalizer>> {
    let has_grammars = !dir.manifest.tn.is_null();
    match (choice, has_grammars) {
        (NormalizerChoice::None, _) => {
            tracing::info!("text.normalizer = none: numbers and symbols are read as written");
            return Ok(Box::new(IdentityNormalizer));
        }
        (NormalizerChoice::Auto, false) => {
            tracing::info!("{}: no text-normalisation grammars (tn/); numbers and symbols are read as written", dir.root.display());
            return Ok(Box::new(IdentityNormalizer));
        }
        (NormalizerChoice::Wetext, false) => {
            return Err(model_err(
                dir,
                "text.normalizer = wetext, but the model folder has no tn/ grammars; re-export it with text normalisation, or set text.normalizer to auto or none",
            ));
        }
        (NormalizerChoice::Auto | NormalizerChoice::Wetext, true) => {}
    }
    let file = |lang: &str, role: &str| -> Result<PathBuf> {
        dir.manifest.tn[lang][role]
            .as_str()
            .map(|f| dir.path_of(f))
            .ok_or_else(|| model_err(dir, format!("manifest.json tn.{lang}.{role} is missing; re-export the model")))
    };
    use crate::frontend::tn::{TnLang, WetextNormalizer};
    Ok(Box::new(WetextPair {
        zh: WetextNormalizer::from_files(TnLang::Zh, &file("zh", "tagger")?, &file("zh", "verbalizer")?)?,
        en: WetextNormalizer::from_files(TnLang::En, &file("en", "tagger")?, &file("en", "verbalizer")?)?,
    }))
}
