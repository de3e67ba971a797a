//! Synthesis end to end (cosyvoice3.md §3.4, §4–§7): prompt features → LLM tokens → silent
//! pruning → flow → HiFT → waveform chunks.
//!
//! [`Synthesizer`] owns the model's immutable data (side tables, f0 net, tokenizer, constants)
//! and its open sessions. Every request builds its own state (KV cache, sampler, silent filter,
//! stream planner, HiFT accumulator, source generator); nothing mutable outlives a request.
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
pub mod dump;
mod limits;
pub mod stages;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ndarray::{s, Array2, ArrayView2};

use crate::config::{Config, NormalizerChoice};
use crate::error::{Error, Result};
use crate::flow::{build_cond, flow_front_tokens, solve_cfm, speed_interpolate, strip_prompt, CfmRequest, StreamParams, StreamPlanner, FlowChunk};
use crate::frontend::align::align_prompt;
use crate::frontend::audio::{load_audio, to_rate, Audio};
use crate::frontend::features::{kaldi_fbank_cmn, mel_24k, whisper_log_mel};
use crate::frontend::prompt::{plan, PromptMode};
use crate::frontend::text::{is_only_punctuation, normalize, IdentityNormalizer, Normalizer};
use crate::frontend::tn::WetextPair;
use crate::frontend::tokenizer::TextTokenizer;
use crate::hift::{F0Predictor, HiftStream, SourceGenerator};
use crate::llm::{build_llm_input, decode_with, DecodeOptions, Sampler, SamplingParams, SilentTokenFilter, Termination};
use crate::model::{ModelDir, Stage};
use crate::profile::Profiler;
use crate::runtime::{SessionFactory, StageSession};
use crate::side::{SideEmbeddings, SideFile};
use crate::voice::SavedVoice;

pub use constants::ModelConstants;
pub use dump::SegmentTrace;
use crate::engine::{DitBatcher, LlmScheduler};
use stages::{run_campplus, run_flow_front, run_hift_decode, run_speech_tokenizer};

/// Open sessions, one per stage, shared by every request in flight: the LLM and the DiT each
/// behind a thread that batches the calls of concurrent requests (src/engine), the others
/// behind a lock (one call at a time; they are a small share of the work).
struct Sessions {
    llm: LlmScheduler,
    flow_front: Mutex<StageSession>,
    dit: DitBatcher,
    hift: Mutex<StageSession>,
    campplus: Mutex<StageSession>,
    speech_tokenizer: Mutex<StageSession>,
}

/// Locks a stage session; a panic in another request while it held the lock leaves the session
/// itself usable (ONNX Runtime keeps no state between runs), so poisoning is ignored.
fn lock(session: &Mutex<StageSession>) -> std::sync::MutexGuard<'_, StageSession> {
    session.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A loaded model ready to synthesise.
pub struct Synthesizer {
    pub model: Arc<ModelDir>,
    pub constants: ModelConstants,
    /// Sampling after config overrides (the manifest's yaml values by default).
    pub sampling: SamplingParams,
    pub stream_params: StreamParams,
    /// Default seed (config `sampling.seed`).
    pub seed: u64,
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
    sessions: Sessions,
    /// [`crate::voice::model_key`] of this model (saved voices must carry the same).
    voice_key: String,
    /// `limits.max_text_chars`: longer texts are refused.
    max_text_chars: usize,
    /// Precision of the frontend graphs (recorded in saved voices).
    frontend_precision: crate::config::Precision,
    /// Span recorder for `cosy profile`; disabled (free) unless [`Synthesizer::set_profiler`].
    profiler: Profiler,
    /// How long each session took to open, in the order they were opened.
    load_times: Vec<StageLoad>,
}

/// How one stage's session was opened (for `cosy profile`).
#[derive(Debug, Clone, PartialEq)]
pub struct StageLoad {
    /// Manifest stage name (`llm`, `flow_front`, `dit`, `hift_decode`, `campplus`, `speech_tokenizer`).
    pub stage: String,
    pub seconds: f64,
    pub provider: crate::config::ProviderKind,
    pub precision: crate::config::Precision,
    /// `load` (engine cache hit), `build` (TensorRT built an engine), `cached graph` (the saved
    /// optimised graph, not optimised again), `graph optimised and saved` (first CPU load) or
    /// `session` (optimised at load, nothing saved).
    pub kind: &'static str,
    /// Providers asked for but not used, with the reason.
    pub fallbacks: Vec<String>,
}

/// How the voice is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Voice {
    /// Zero-shot: a prompt recording and its transcript.
    ZeroShot { wav: PathBuf, transcript: String },
    /// Cross-lingual: the recording's voice, no transcript.
    CrossLingual { wav: PathBuf },
    /// Instruct: the recording's voice plus a style instruction.
    Instruct { wav: PathBuf, instruction: String },
    /// A saved voice (`cosy voice add`): zero-shot with its transcript, or instruct with
    /// `instruction`; no prompt audio is read.
    Saved { voice: Arc<SavedVoice>, instruction: Option<String> },
    /// A prompt recording already in memory (decoded with [`crate::frontend::audio::decode_bytes`]
    /// or [`crate::frontend::audio::from_pcm`]): zero-shot with a transcript, instruct with an
    /// instruction, cross-lingual with neither. `label` names it in messages.
    Recording { audio: Arc<Audio>, label: PathBuf, transcript: Option<String>, instruction: Option<String> },
}

impl Voice {
    /// The prompt recording, if this voice is given by one.
    fn wav(&self) -> Option<&Path> {
        match self {
            Voice::ZeroShot { wav, .. } | Voice::CrossLingual { wav } | Voice::Instruct { wav, .. } => Some(wav),
            Voice::Saved { .. } | Voice::Recording { .. } => None,
        }
    }
    fn mode(&self) -> PromptMode {
        match self {
            Voice::ZeroShot { transcript, .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::CrossLingual { .. } => PromptMode::CrossLingual,
            Voice::Instruct { instruction, .. } | Voice::Saved { instruction: Some(instruction), .. } => {
                PromptMode::Instruct { instruction: instruction.clone() }
            }
            Voice::Saved { voice, instruction: None } => PromptMode::ZeroShot { transcript: voice.transcript.clone() },
            Voice::Recording { transcript: Some(transcript), .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::Recording { instruction: Some(instruction), .. } => PromptMode::Instruct { instruction: instruction.clone() },
            Voice::Recording { .. } => PromptMode::CrossLingual,
        }
    }
}

/// Hooks into a running synthesis, for event logs and cancellation. The LLM calls run on the
/// LLM thread and the rest on the token-to-wav thread, hence `Sync`.
pub trait SynthesisObserver: Sync {
    /// The LLM emitted token number `index` (from 0) of sentence `sentence`.
    fn llm_token(&self, _sentence: usize, _index: usize, _token: i64) {}
    /// The LLM finished sentence `sentence` after `tokens` tokens.
    fn llm_done(&self, _sentence: usize, _tokens: usize, _termination: Termination) {}
    /// Polled after every token and before every flow call; `true` stops the LLM and the
    /// token-to-wav worker, and the synthesis returns [`Error::Cancelled`].
    fn cancelled(&self) -> bool {
        false
    }
}

/// An observer that observes nothing.
pub struct NoObserver;
impl SynthesisObserver for NoObserver {}

/// One synthesis request.
#[derive(Debug, Clone)]
pub struct Request {
    pub text: String,
    pub voice: Voice,
    /// Run the text frontend (normalisation + sentence splitting), the official default.
    pub text_frontend: bool,
    /// Mel time-stretch (offline only); 1.0 = unchanged.
    pub speed: f64,
    /// Sampling seed; `None` = the configured `sampling.seed`.
    pub seed: Option<u64>,
    /// Use the streaming chunk schedule.
    pub stream: bool,
    /// Benchmark/test knob, not the official behaviour: decode exactly this many speech tokens
    /// per sentence, stop ids masked (see [`DecodeOptions::ignore_stop_until`]). `None` = official.
    pub ignore_stop_until: Option<usize>,
}

/// The prompt's features (the frontend part of a request; shared by its sentences). For a saved
/// voice only `speech_token`, `embedding` and `feat` are known; `whisper_mel`, `speech_token_raw`,
/// `fbank` and `feat_raw` are then empty (and not dumped).
#[derive(Debug, Clone)]
pub struct PromptFeatures {
    /// `[128, T16]`
    pub whisper_mel: Array2<f32>,
    pub speech_token_raw: Vec<i64>,
    /// Aligned: used by the LLM (zero-shot) and the flow.
    pub speech_token: Vec<i64>,
    /// `[Tf, 80]`
    pub fbank: Array2<f32>,
    /// `[192]`
    pub embedding: Vec<f32>,
    /// `[F, 80]`
    pub feat_raw: Array2<f32>,
    /// `[2·Ns, 80]`
    pub feat: Array2<f32>,
}

/// What a request produced.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub samples: usize,
    pub sentences: usize,
    pub chunks: usize,
    /// Speech tokens the LLM emitted (before silent-token pruning), all sentences.
    pub speech_tokens: usize,
}

fn model_err(dir: &ModelDir, msg: impl Into<String>) -> Error {
    Error::model(&dir.root, msg)
}

impl Synthesizer {
    /// Opens the model folder of `config` and every stage.
    pub fn load(config: &Config) -> Result<Synthesizer> {
        let dir = Arc::new(ModelDir::open(&config.model_dir)?);
        for stage in crate::model::STAGES {
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
        let file_of = |key: &str| -> Result<PathBuf> {
            dir.manifest
                .files
                .get(key)
                .map(|f| dir.path_of(&f.file))
                .ok_or_else(|| model_err(&dir, format!("manifest.json lists no {key} file")))
        };
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
        let factory = SessionFactory::new(config, dir.clone())?;
        let mut load_times = Vec::new();
        let mut open = |stage: Stage| -> Result<StageSession> {
            let started = std::time::Instant::now();
            let session = factory.open(stage)?;
            load_times.push(StageLoad {
                stage: stage.name().to_string(),
                seconds: started.elapsed().as_secs_f64(),
                provider: session.provider_used,
                precision: session.precision,
                kind: match (session.engine_cached, session.graph_cache) {
                    (Some(true), _) => "load",
                    (Some(false), _) => "build",
                    (None, crate::runtime::GraphCacheUse::Loaded) => "cached graph",
                    (None, crate::runtime::GraphCacheUse::Saved) => "graph optimised and saved",
                    (None, _) => "session",
                },
                fallbacks: session.fallbacks.clone(),
            });
            Ok(session)
        };
        let sessions = Sessions {
            llm: LlmScheduler::start(open(Stage::Llm)?, constants.llm_shape, config.engine.max_batch)?,
            flow_front: Mutex::new(open(Stage::FlowFront)?),
            dit: DitBatcher::start(open(Stage::Dit)?, config.engine.dit_max_batch)?,
            hift: Mutex::new(open(Stage::HiftDecode)?),
            campplus: Mutex::new(open(Stage::Campplus)?),
            speech_tokenizer: Mutex::new(open(Stage::SpeechTokenizer)?),
        };
        let normalizer = load_normalizer(&dir, config.text.normalizer)?;
        Ok(Synthesizer {
            normalizer,
            sampling: constants.sampling_for(config),
            stream_params: constants.stream_for(config)?,
            seed: config.sampling.seed,
            model: dir,
            constants,
            embeddings,
            noise,
            f0,
            source_proto,
            tokenizer,
            sessions,
            voice_key,
            max_text_chars: config.limits.max_text_chars,
            frontend_precision: config.precision_for(crate::config::StageGroup::Frontend),
            profiler: Profiler::disabled(),
            load_times,
        })
    }

    /// What the LLM scheduler and the DiT batcher have done so far (how much was batched).
    pub fn batch_stats(&self) -> (crate::engine::LlmBatchStats, crate::engine::DitBatchStats) {
        (self.sessions.llm.stats(), self.sessions.dit.stats())
    }

    /// The key saved voices of this model carry ([`crate::voice::model_key`]).
    pub fn voice_key(&self) -> &str {
        &self.voice_key
    }

    /// Computes a saved voice from a prompt recording and its transcript (all prompt-audio work,
    /// once). Refuses an empty transcript.
    pub fn make_voice(&self, name: &str, wav: &Path, transcript: &str) -> Result<SavedVoice> {
        self.make_voice_with(name, wav, transcript, || self.profiler.time("frontend.audio_load", || load_audio(wav)))
    }

    /// [`Self::make_voice`] from a recording already decoded; `label` names it (and is recorded
    /// as the voice's source).
    pub fn make_voice_from(&self, name: &str, audio: &Audio, label: &Path, transcript: &str) -> Result<SavedVoice> {
        self.make_voice_with(name, label, transcript, || Ok(audio.clone()))
    }

    fn make_voice_with(&self, name: &str, wav: &Path, transcript: &str, audio: impl FnOnce() -> Result<Audio>) -> Result<SavedVoice> {
        crate::voice::check_name(name)?;
        if transcript.trim().is_empty() {
            return Err(Error::Input("the transcript (--text) is empty; give the words spoken in the recording".into()));
        }
        let prompt = self.prompt_features_of(&audio()?, wav)?;
        Ok(SavedVoice {
            name: name.to_string(),
            transcript: transcript.to_string(),
            speech_token: prompt.speech_token,
            prompt_feat: prompt.feat,
            embedding: prompt.embedding,
            model_key: self.voice_key.clone(),
            model: self.model.root.display().to_string(),
            frontend_precision: self.frontend_precision.to_string(),
            source_wav: wav.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            created: crate::voice::utc_now_rfc3339(),
            cosy_version: env!("CARGO_PKG_VERSION").to_string(),
        })
    }

    /// The prompt features of a voice: from the recording, or straight from a saved voice (after
    /// checking that it was made for this model).
    pub fn prompt_for(&self, voice: &Voice) -> Result<PromptFeatures> {
        match voice {
            Voice::Saved { voice, .. } => {
                voice.check_model(&self.voice_key, &self.model.root)?;
                if voice.prompt_feat.ncols() != self.constants.mel_dim || voice.speech_token.is_empty() {
                    return Err(Error::Input(format!("voice {:?}: stored features do not fit this model", voice.name)));
                }
                Ok(PromptFeatures {
                    whisper_mel: Array2::zeros((0, 0)),
                    speech_token_raw: Vec::new(),
                    speech_token: voice.speech_token.clone(),
                    fbank: Array2::zeros((0, 0)),
                    embedding: voice.embedding.clone(),
                    feat_raw: Array2::zeros((0, 0)),
                    feat: voice.prompt_feat.clone(),
                })
            }
            Voice::Recording { audio, label, .. } => self.prompt_features_of(audio, label),
            other => {
                let wav = other.wav().ok_or_else(|| Error::Input("the voice has no prompt recording".into()))?;
                self.prompt_features(wav)
            }
        }
    }

    /// Records spans of every later request into `profiler` (see [`crate::profile::STAGE_KEYS`]).
    pub fn set_profiler(&mut self, profiler: Profiler) {
        self.profiler = profiler;
    }

    /// How each stage's session was opened, and how long it took.
    pub fn load_times(&self) -> &[StageLoad] {
        &self.load_times
    }

    /// The text tokenizer of the model.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The prompt's features: 16 kHz whisper mel → speech tokens; 16 kHz fbank → campplus
    /// embedding; 24 kHz mel; alignment of tokens and mel.
    pub fn prompt_features(&self, wav: &Path) -> Result<PromptFeatures> {
        let audio = self.profiler.time("frontend.audio_load", || load_audio(wav))?;
        self.prompt_features_of(&audio, wav)
    }

    /// [`Self::prompt_features`] of a recording already decoded; `wav` names it in messages.
    pub fn prompt_features_of(&self, audio: &Audio, wav: &Path) -> Result<PromptFeatures> {
        let audio = audio.clone();
        let prof = &self.profiler;
        // Length limits (every stage's minimum, the tokenizer's 30 s, the flow noise) up front.
        self.check_prompt_audio(&audio, wav)?;
        let (wav16, wav24) = prof.time("frontend.resample", || -> Result<_> {
            Ok((to_rate(&audio, 16_000, None, wav)?, to_rate(&audio, self.constants.sample_rate, None, wav)?))
        })?;
        let whisper_mel = prof.time("frontend.whisper_mel", || whisper_log_mel(&wav16));
        let speech_token_raw = prof.time("frontend.speech_tokenizer", || {
            run_speech_tokenizer(&mut lock(&self.sessions.speech_tokenizer), whisper_mel.view())
        })?;
        let fbank = prof.time("frontend.fbank", || kaldi_fbank_cmn(&wav16));
        let embedding = prof.time("frontend.campplus", || run_campplus(&mut lock(&self.sessions.campplus), fbank.view()))?;
        let feat_raw = prof.time("frontend.mel_24k", || mel_24k(&wav24));
        limits::check_finite(wav, "speaker embedding", &embedding)?;
        limits::check_finite(wav, "prompt mel", feat_raw.iter())?;
        let (speech_token, feat) = align_prompt(&speech_token_raw, &feat_raw);
        if speech_token.is_empty() {
            return Err(Error::Input(format!("prompt audio {}: too short to give any speech token", wav.display())));
        }
        Ok(PromptFeatures { whisper_mel, speech_token_raw, speech_token, fbank, embedding, feat_raw, feat })
    }

    /// The sentences a request's text becomes, and the prompt text (both after the frontend).
    pub fn plan_text(&self, req: &Request) -> Result<(String, Vec<String>)> {
        let text = req.text.trim_end_matches(['\n', '\r']);
        check_speakable(text)?;
        check_text_length(text, self.max_text_chars)?;
        let p = plan(&req.voice.mode(), text, req.text_frontend);
        let count = |s: &str| self.tokenizer.count(s);
        let segments = if p.text_frontend {
            normalize(&p.tts_text, true, self.normalizer.as_ref(), &count).segments
        } else {
            vec![p.tts_text.clone()]
        };
        let segments: Vec<String> = segments.into_iter().filter(|s| !s.trim().is_empty()).collect();
        if segments.is_empty() || is_only_punctuation(text.trim()) {
            return Err(Error::Input(format!(
                "the text {:?} has nothing speakable (only punctuation, symbols, emoji or blanks); give some words",
                shorten(text.trim(), 40)
            )));
        }
        // The official frontend normalises the prompt text too (split=False), unless it holds markup.
        let prompt_text = if req.text_frontend {
            normalize(&p.prompt_text, true, self.normalizer.as_ref(), &count).text
        } else {
            p.prompt_text.clone()
        };
        Ok((prompt_text, segments))
    }

    /// Synthesises a request. `on_chunk` gets the audio (24 kHz mono f32) as it is produced; with
    /// `dump`, every sentence's intermediates are written (one sentence: into `dump`; several:
    /// into `dump/000`, `dump/001`, …).
    pub fn synthesize(
        &self,
        req: &Request,
        dump: Option<&Path>,
        on_chunk: impl FnMut(&[f32]) -> Result<()>,
    ) -> Result<Summary> {
        self.synthesize_observed(req, dump, &NoObserver, on_chunk)
    }

    /// [`Self::synthesize`] with an observer (token events, cancellation).
    pub fn synthesize_observed(
        &self,
        req: &Request,
        dump: Option<&Path>,
        observer: &dyn SynthesisObserver,
        mut on_chunk: impl FnMut(&[f32]) -> Result<()>,
    ) -> Result<Summary> {
        check_options(req.speed, req.stream)?;
        let profiler = self.profiler.clone();
        let frontend_span = profiler.span("frontend");
        let tokenizer_span = profiler.span("frontend.tokenizer");
        let (prompt_text, segments) = self.plan_text(req)?;
        let p = plan(&req.voice.mode(), &req.text, req.text_frontend);
        let prompt_text_token = self.encode(&prompt_text)?;
        tokenizer_span.end();
        let prompt = self.prompt_for(&req.voice)?;
        frontend_span.end();
        // A forced token count must fit the flow noise beside the prompt (see limits.rs).
        self.check_forced_tokens(&prompt, req.ignore_stop_until)?;
        // Each request starts at the configured hop; its sentences hand it on (see StreamPlanner).
        let mut state = RequestState {
            sampler: Sampler::new(self.sampling, req.seed.unwrap_or(self.seed)),
            stream_hop: self.stream_params.token_hop_len,
        };
        let mut summary = Summary { sentences: segments.len(), ..Summary::default() };
        for (i, segment) in segments.iter().enumerate() {
            if observer.cancelled() {
                return Err(Error::Cancelled);
            }
            let text_token = {
                let _f = profiler.span("frontend");
                let _t = profiler.span("frontend.tokenizer");
                self.encode(segment)?
            };
            if text_token.is_empty() {
                return Err(Error::Input(format!("sentence {segment:?} gives no text tokens")));
            }
            let mut trace = dump.map(|_| SegmentTrace::default());
            let llm_speech: &[i64] = if p.llm_prompt_speech { &prompt.speech_token } else { &[] };
            let mut on = |c: &[f32]| {
                summary.samples += c.len();
                summary.chunks += 1;
                on_chunk(c)
            };
            let seg = Segment { index: i, count: segments.len(), text: segment, prompt: &prompt, prompt_text_token: &prompt_text_token, text_token: &text_token, llm_prompt_speech: llm_speech };
            let emitted = self.run_segment(&seg, req, &mut state, observer, trace.as_mut(), &mut on)?;
            summary.speech_tokens += emitted;
            if let (Some(root), Some(trace)) = (dump, trace) {
                let dir = if segments.len() == 1 { root.to_path_buf() } else { root.join(format!("{i:03}")) };
                dump::write_segment(&dir, &prompt, &prompt_text_token, &text_token, &trace, req.stream, self.constants.sample_rate)?;
            }
        }
        Ok(summary)
    }

    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        Ok(self.tokenizer.encode(text)?.into_iter().map(i64::from).collect())
    }

    /// One sentence: LLM thread → tokens → token2wav thread → chunks → `on_chunk` (this thread).
    fn run_segment(
        &self,
        seg: &Segment<'_>,
        req: &Request,
        state: &mut RequestState,
        observer: &dyn SynthesisObserver,
        trace: Option<&mut SegmentTrace>,
        on_chunk: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<usize> {
        let c = &self.constants;
        let prompt = seg.prompt;
        let mut input = build_llm_input(&self.embeddings, seg.prompt_text_token, seg.text_token, seg.llm_prompt_speech, &c.llm)?;
        // The speech must fit the flow noise beside the prompt: decoding stops there, and a
        // sentence that gets there is an error below (limits.rs).
        let room = self.noise_room_tokens(prompt);
        let outgrown = (room < input.max_len).then(|| self.outgrown_noise(prompt, &sentence_label(seg.index, seg.count, seg.text)));
        input.max_len = input.max_len.min(room);
        let options = DecodeOptions { ignore_stop_until: req.ignore_stop_until.unwrap_or(0) };
        let sentence = seg.index;
        let profiler = &self.profiler;
        let embeddings = &self.embeddings;
        let llm_constants = &c.llm;
        let t2w = TokenToWav {
            flow_front: &self.sessions.flow_front,
            dit: &self.sessions.dit,
            hift: &self.sessions.hift,
            prompt,
            noise: self.noise.view(),
            f0: &self.f0,
            source: self.source_proto.clone(),
            constants: c,
            stream_params: self.stream_params,
            stream_hop: &mut state.stream_hop,
            stream: req.stream,
            speed: req.speed,
            sentence: sentence_label(seg.index, seg.count, seg.text),
            filter: SilentTokenFilter::new(&c.silent_tokens, c.max_silent_run),
            observer,
            profiler,
            record: trace.is_some(),
        };
        let scheduler = &self.sessions.llm;
        let sampler = &mut state.sampler;
        let (tok_tx, tok_rx) = crossbeam_channel::unbounded::<i64>();
        let (chunk_tx, chunk_rx) = crossbeam_channel::bounded::<Vec<f32>>(4);
        std::thread::scope(|scope| -> Result<usize> {
            let llm = std::thread::Builder::new()
                .name("llm".into())
                .spawn_scoped(scope, move || -> Result<crate::llm::DecodeOutcome> {
                    let _span = profiler.span("llm");
                    let mut step = scheduler.client(profiler)?;
                    let mut emitted = 0usize;
                    let outcome = decode_with(&mut step, &input, embeddings, sampler, llm_constants, &options, profiler, |t| {
                        observer.llm_token(sentence, emitted, t);
                        emitted += 1;
                        tok_tx.send(t).is_ok() && !observer.cancelled()
                    })?;
                    observer.llm_done(sentence, outcome.tokens.len(), outcome.termination);
                    Ok(outcome)
                })
                .map_err(|e| Error::Runtime(format!("cannot start the LLM thread: {e}")))?;
            let worker = std::thread::Builder::new()
                .name("token2wav".into())
                .spawn_scoped(scope, move || t2w.run(tok_rx, chunk_tx))
                .map_err(|e| Error::Runtime(format!("cannot start the token-to-wav thread: {e}")))?;
            let mut consumer_err = None;
            for chunk in chunk_rx.iter() {
                if let Err(e) = on_chunk(&chunk) {
                    consumer_err = Some(e);
                    break;
                }
            }
            drop(chunk_rx);
            let outcome = llm.join().map_err(|_| Error::Runtime("the LLM thread panicked".into()))?;
            let t2w_result = worker.join().map_err(|_| Error::Runtime("the token-to-wav thread panicked".into()))?;
            if let Some(e) = consumer_err {
                return Err(e);
            }
            let outcome = outcome?;
            let mut done = t2w_result?;
            if outcome.termination == Termination::Cancelled {
                return Err(if observer.cancelled() {
                    Error::Cancelled
                } else {
                    Error::Runtime("the token-to-wav worker stopped taking tokens".into())
                });
            }
            if let Some(e) = outgrown.filter(|_| outcome.termination == Termination::MaxLen && options.ignore_stop_until == 0) {
                return Err(e);
            }
            let emitted = outcome.tokens.len();
            if let Some(trace) = trace {
                done.llm_token_raw = outcome.tokens;
                done.termination = Some(outcome.termination);
                *trace = done;
            }
            Ok(emitted)
        })
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
            .map_err(|_| Error::Input(format!("hift.f0.condnet.{i}.weight has shape {:?}", w.shape)))?;
        let w = ndarray::Array3::from_shape_vec((o, c, k), w.data).map_err(|e| Error::Input(format!("condnet.{i}: {e}")))?;
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
    text: &'a str,
    prompt: &'a PromptFeatures,
    prompt_text_token: &'a [i64],
    text_token: &'a [i64],
    /// Prompt speech tokens for the LLM (empty in cross-lingual and instruct modes).
    llm_prompt_speech: &'a [i64],
}

/// The speeds `--speed` takes: the range of the official web UI's speed control (0.5 to 2.0).
/// The official code itself does not bound it, but the change is a linear time-stretch of the
/// mel: far outside this range it is no longer speech, and a tiny speed asks for a huge mel
/// (`--speed 1e-6` would be gigabytes).
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.5..=2.0;

/// The speed and streaming rules of a request, in one place: the speed is in [`SPEED_RANGE`],
/// and streaming cannot time-stretch (the official code refuses a speed when streaming too).
pub fn check_options(speed: f64, stream: bool) -> Result<()> {
    check_speed(speed)?;
    if stream && speed != 1.0 {
        return Err(Error::Input("--speed works only without --stream (the official code refuses it too)".into()));
    }
    Ok(())
}

/// Whether a request streams: as asked (`Some`), else `default` unless a speed is set (the
/// streaming schedule cannot time-stretch, so a sentence with a speed is made whole).
pub fn choose_streaming(asked: Option<bool>, default: bool, speed: f64) -> bool {
    asked.unwrap_or(default && speed == 1.0)
}

/// Refuses a speed outside [`SPEED_RANGE`] (and NaN, infinities).
pub fn check_speed(speed: f64) -> Result<()> {
    if speed.is_finite() && SPEED_RANGE.contains(&speed) {
        return Ok(());
    }
    Err(Error::Input(format!(
        "--speed {speed}: use a number from {:.1} to {:.1} (1 = normal, 2 = twice as fast)",
        SPEED_RANGE.start(),
        SPEED_RANGE.end()
    )))
}

/// `text` cut to at most `max` characters, with `…` when it was cut (for messages).
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Refuses a text with nothing to say: empty, only blanks and invisible characters (zero-width
/// spaces and joiners, word joiner, byte-order mark, other format characters), or only
/// punctuation, symbols and emoji.
pub fn check_speakable(text: &str) -> Result<()> {
    let visible = crate::frontend::text::strip_invisible(text);
    if visible.is_empty() {
        return Err(Error::Input(if text.trim().is_empty() {
            "the text is empty; give something to say".into()
        } else {
            "the text is empty (only invisible characters such as zero-width spaces); give something to say".into()
        }));
    }
    if is_only_punctuation(&visible) {
        return Err(Error::Input(format!(
            "the text {:?} has nothing speakable (only punctuation, symbols or emoji); give some words",
            shorten(text.trim(), 40)
        )));
    }
    Ok(())
}

/// `sentence N of M ("its text…")` for messages: 1-based, the text cut to 40 characters and
/// without the system prompt that cross-lingual mode puts in front of it.
fn sentence_label(index: usize, count: usize, text: &str) -> String {
    let marker = crate::frontend::tokenizer::ENDOFPROMPT;
    let said = text.rsplit(marker).next().filter(|t| !t.trim().is_empty()).unwrap_or(text);
    format!("sentence {} of {count} ({:?})", index + 1, shorten(said.trim(), 40))
}

/// Refuses a text longer than `limit` characters (`limits.max_text_chars`).
pub fn check_text_length(text: &str, limit: usize) -> Result<()> {
    let n = text.chars().count();
    if n > limit {
        return Err(Error::Input(format!(
            "the text has {n} characters, more than the limit of {limit} (limits.max_text_chars); split it, or raise the limit"
        )));
    }
    Ok(())
}

/// The token-to-wav worker of one sentence.
/// What the sentences of one request share and hand on: the sampling RNG and the streaming hop.
struct RequestState {
    sampler: Sampler,
    stream_hop: usize,
}

struct TokenToWav<'a> {
    flow_front: &'a Mutex<StageSession>,
    dit: &'a DitBatcher,
    hift: &'a Mutex<StageSession>,
    prompt: &'a PromptFeatures,
    noise: ArrayView2<'a, f32>,
    f0: &'a F0Predictor,
    source: SourceGenerator,
    constants: &'a ModelConstants,
    stream_params: StreamParams,
    /// The streaming hop this sentence starts with; updated to the hop it ends with (official
    /// `self.token_hop_len`, carried across the sentences of one request).
    stream_hop: &'a mut usize,
    stream: bool,
    speed: f64,
    /// `sentence N of M ("text…")`, for messages.
    sentence: String,
    filter: SilentTokenFilter,
    observer: &'a dyn SynthesisObserver,
    profiler: &'a Profiler,
    /// Keep the intermediates `--dump` writes (mel, f0, source, waveform); without it only the
    /// tokens and chunk sizes are kept.
    record: bool,
}

impl TokenToWav<'_> {
    /// Consumes tokens until the LLM thread hangs up; sends each chunk's new audio.
    fn run(
        mut self,
        tokens_in: crossbeam_channel::Receiver<i64>,
        chunks_out: crossbeam_channel::Sender<Vec<f32>>,
    ) -> Result<SegmentTrace> {
        let mut trace = SegmentTrace::default();
        let mut tokens: Vec<i64> = Vec::new();
        let mut planner = StreamPlanner::starting_at(self.stream_params, self.prompt.speech_token.len(), *self.stream_hop);
        let mut hift = HiftStream::new(
            self.constants.mel_dim,
            self.constants.source.nb_harmonics + 1,
            self.constants.hift_decode_left_context,
        );
        for t in tokens_in.iter() {
            if self.observer.cancelled() {
                return Err(Error::Cancelled);
            }
            if self.filter.accept(t) {
                tokens.push(t);
            }
            if self.stream {
                while let Some(chunk) = planner.next_chunk(tokens.len()) {
                    let audio = self.run_chunk(&chunk, &tokens, &mut hift, &mut trace)?;
                    if chunks_out.send(audio).is_err() {
                        return Err(Error::Runtime("the audio consumer stopped".into()));
                    }
                }
            }
        }
        // The LLM is done (or failed; its error is reported by the caller).
        if self.observer.cancelled() {
            return Err(Error::Cancelled);
        }
        if tokens.is_empty() {
            return Err(Error::Input(format!(
                "{}: the LLM produced no speech tokens (it stopped at once); try other text",
                self.sentence
            )));
        }
        if self.stream {
            while let Some(chunk) = planner.next_chunk(tokens.len()) {
                let audio = self.run_chunk(&chunk, &tokens, &mut hift, &mut trace)?;
                if chunks_out.send(audio).is_err() {
                    return Err(Error::Runtime("the audio consumer stopped".into()));
                }
            }
        }
        if self.stream {
            *self.stream_hop = planner.hop();
        }
        let last = planner.final_chunk(tokens.len())?;
        let audio = self.run_chunk(&last, &tokens, &mut hift, &mut trace)?;
        if chunks_out.send(audio).is_err() {
            return Err(Error::Runtime("the audio consumer stopped".into()));
        }
        trace.speech_token = tokens;
        if self.record {
            trace.flow_mel = Some(hift.mel().to_owned());
            trace.hift_f0 = Some(hift.f0().to_vec());
            trace.hift_source = Some(hift.source().to_vec());
        }
        Ok(trace)
    }

    /// One flow call plus one HiFT call over the accumulated mel; returns the new samples.
    fn run_chunk(
        &mut self,
        chunk: &FlowChunk,
        tokens: &[i64],
        hift: &mut HiftStream,
        trace: &mut SegmentTrace,
    ) -> Result<Vec<f32>> {
        let c = self.constants;
        let prof = self.profiler;
        let flow_span = prof.span("flow");
        let prompt_tokens = &self.prompt.speech_token;
        let ratio = self.stream_params.token_mel_ratio;
        let prompt_frames = ratio * prompt_tokens.len();
        let ft = flow_front_tokens(prompt_tokens, &tokens[..chunk.n_tokens], chunk.finalize, self.stream_params.pre_lookahead_len);
        let (mu, spks) = prof.time("flow.front", || run_flow_front(&mut lock(self.flow_front), &ft, &self.prompt.embedding))?;
        let total = mu.ncols();
        if total != prompt_frames + chunk.mel_frames {
            return Err(Error::Runtime(format!(
                "flow_front gave {total} frames, expected {} (prompt) + {}",
                prompt_frames, chunk.mel_frames
            )));
        }
        if self.noise.ncols() < total {
            return Err(Error::Input(format!(
                "{total} mel frames exceed the model's {}-frame flow noise; use shorter sentences",
                self.noise.ncols()
            )));
        }
        let cond = build_cond(self.prompt.feat.view(), total)?;
        let spks = ndarray::Array1::from_vec(spks);
        let request = CfmRequest { mu: mu.view(), spks: spks.view(), cond: cond.view(), noise: self.noise };
        let mut estimator = self.dit.client(prof)?;
        let mut solved = solve_cfm(&mut estimator, &[request], &c.cfm, chunk.block_frames as i64)?;
        let mel_all = solved.pop().ok_or_else(|| Error::Runtime("flow solver returned nothing".into()))?;
        let mel = strip_prompt(mel_all.view(), prompt_frames)?;
        let mut new = mel.slice(s![.., chunk.first_new_frame..]).to_owned();
        if chunk.finalize && self.speed != 1.0 && hift.mel().ncols() == 0 {
            new = speed_interpolate(new.view(), self.speed)?;
        }
        if chunk.finalize && self.record {
            trace.flow_mu = Some(mu);
            trace.flow_cond = Some(cond);
        }
        flow_span.end();
        let _hift_span = prof.span("hift");
        hift.push_mel(new.view())?;
        let inputs = hift.prepare(self.f0, &mut self.source, chunk.finalize, c.conv_pre_look_right, prof)?;
        let plan = inputs.plan;
        let first_frame = inputs.first_frame;
        let spf = c.source.samples_per_frame;
        let mut wav = prof.time("hift.decode", || run_hift_decode(&mut lock(self.hift), inputs.mel, inputs.source))?;
        let keep = wav.len().saturating_sub(plan.drop_tail_samples);
        wav.truncate(keep);
        if wav.len() + spf * first_frame != plan.total_samples {
            return Err(Error::Runtime(format!(
                "hift_decode gave {} samples from frame {first_frame}, expected {} in all",
                wav.len(),
                plan.total_samples
            )));
        }
        let out = hift.take_new(&wav, first_frame, spf);
        trace.chunk_samples.push(out.len() as i64);
        if self.record {
            trace.waveform.extend_from_slice(&out);
        }
        Ok(out)
    }
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
