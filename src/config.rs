//! Run-time configuration: `config.toml`, `COSY_*` environment variables and command-line flags.
//!
//! Precedence, lowest first: built-in defaults < config file < environment < flags. Every setting
//! has one dotted key (`runtime.providers`, `stages.dit.precision`, ...) and every source goes
//! through the same setter, so a bad value is refused with the same message wherever it came from:
//! the key, the value, where it came from and what is allowed. Unknown keys are refused too.
//!
//! Relative paths in a config file are resolved against the file's folder; relative paths from the
//! environment or flags against the current directory.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::paths;
use crate::vocab::{check_voice_name, Precision, ProviderKind, StageGroup};

/// Per-group overrides; `None` inherits the `[runtime]` value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageSettings {
    pub precision: Option<Precision>,
    pub providers: Option<Vec<ProviderKind>>,
    /// Intra-op threads of the group's sessions (`None`: `runtime.threads`).
    pub threads: Option<usize>,
    /// Whether the group's intra-op threads spin-wait between ops (`None`: ONNX Runtime's
    /// default, on). Off lets a stage that runs beside another (the LLM beside the DiT while
    /// streaming) have the cores the idle one's workers would burn.
    pub spinning: Option<bool>,
}

/// `[runtime]`: where ONNX Runtime is and how sessions are made.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeSettings {
    /// Path of `libonnxruntime.so`; `None`: `$ORT_DYLIB_PATH`, then the search of
    /// `runtime::env::locate_library` (beside the executable, a checkout's `.ort/`, the user's data
    /// folder, the system's library path).
    pub ort_library: Option<PathBuf>,
    /// Providers in priority order; ONNX Runtime gives each node to the first that takes it.
    pub providers: Vec<ProviderKind>,
    /// When a provider that was asked for cannot be used: `false` is an error, `true` a warning
    /// and the next provider (CPU last) is used.
    pub allow_fallback: bool,
    pub precision: Precision,
    pub device_id: u32,
    /// Intra-op threads for CPU work; 0 lets ONNX Runtime choose.
    pub threads: usize,
    /// TensorRT engine cache folder; default [`default_engine_cache`] (the user's cache folder,
    /// never the current folder).
    pub engine_cache: PathBuf,
    /// Folder of the optimised-graph cache (CPU sessions); `None`: `<engine_cache>/graphs`.
    pub graph_cache: Option<PathBuf>,
    /// Whether CPU sessions save and reuse their optimised graphs (`runtime.graph_cache`).
    pub graph_cache_enabled: bool,
    /// CUDA memory arena limit in bytes; 0 means no limit.
    pub cuda_mem_limit: u64,
    /// CUDA graphs for stages whose shapes are fixed between calls.
    pub cuda_graphs: bool,
    /// How cuDNN picks a convolution algorithm for each new input shape (CUDA provider).
    pub cuda_conv_search: CudaConvSearch,
}

/// `runtime.cuda_conv_search`: cuDNN's convolution algorithm choice, made once per input shape.
/// `Exhaustive` (ONNX Runtime's own default) times every algorithm at each new shape: streaming
/// calls change shape every chunk, and on an H200 that made each streaming HiFT call 1.6 s instead
/// of 16 ms (docs/benchmarks.md, "On a GPU"). `Heuristic` asks cuDNN's heuristics, timing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaConvSearch {
    Heuristic,
    Exhaustive,
    Default,
}

impl CudaConvSearch {
    pub const NAMES: &'static str = "heuristic, exhaustive, default";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "heuristic" => Some(Self::Heuristic),
            "exhaustive" => Some(Self::Exhaustive),
            "default" => Some(Self::Default),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Heuristic => "heuristic",
            Self::Exhaustive => "exhaustive",
            Self::Default => "default",
        }
    }
}

/// A switch whose `auto` means "where the stage runs on the CPU": `engine.prompt_cache` and
/// `engine.first_audio_priority`, two CPU-only measures (the reasons are on
/// [`EngineSettings::prompt_cache_bound`] and [`EngineSettings::first_audio_priority_applies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSwitch {
    Auto,
    On,
    Off,
}

impl CpuSwitch {
    pub const NAMES: &'static str = "auto, on, off";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "on" => Some(Self::On),
            "off" => Some(Self::Off),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

/// `[sampling]`: LLM sampling. The four sampling values are backed by the model's manifest (its
/// yaml; the official CosyVoice3 values are top_p 0.8, top_k 25, win_size 10, tau_r 0.1): `None`
/// means "not set by the user", so the model's value is used; a value the user set (file,
/// environment or flag) always wins, even when it equals some built-in number.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingSettings {
    pub seed: u64,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub win_size: Option<usize>,
    pub tau_r: Option<f64>,
}

/// `[streaming]`: chunking of the token stream into audio. The hop keys are manifest-backed like
/// the sampling values (`None`: the model's value).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamingSettings {
    /// Whether `cosy file` and `cosy profile` use the streaming schedule when neither `--stream`
    /// nor `--no-stream` is given (`cosy say` always streams).
    pub enabled: bool,
    pub token_hop_len: Option<usize>,
    pub token_max_hop_len: Option<usize>,
    pub stream_scale_factor: Option<usize>,
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputSettings {
    /// Audio device for `cosy say`: "default", "none" (no playback) or a device name.
    pub device: String,
}

/// `[voices]`.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceSettings {
    /// Folder of the saved voices (`cosy voice add`), one `<name>.safetensors` each.
    pub dir: PathBuf,
    /// The voice `say`, `file` and `profile` use when given neither `--voice` nor `--prompt-wav`;
    /// `None`: the one the voices folder names (`cosy voice default NAME`), if any.
    pub default: Option<String>,
    /// `[voices.aliases]`: other names for saved voices (`alloy = "anna"`), used when no saved
    /// voice has the name a request gives (`app::voices::Voices::resolve`). Keys are OpenAI's voice
    /// names or any valid voice name.
    pub aliases: BTreeMap<String, String>,
}

/// `[text]`: the text frontend.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSettings {
    pub normalizer: NormalizerChoice,
}

/// Which text normaliser the frontend runs. The official frontend uses whichever is installed
/// (ttsfrd, else wetext, else none); this chooses between the last two explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormalizerChoice {
    /// wetext when the model folder has its grammars (`tn/`), otherwise none.
    Auto,
    /// wetext; a model folder without `tn/` is an error.
    Wetext,
    /// No normaliser, as the official frontend without ttsfrd or wetext (English numbers are
    /// still spelled out by the inflect rule, as there).
    None,
}

impl NormalizerChoice {
    pub const ALLOWED: &'static str = "\"auto\", \"wetext\", \"none\"";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(NormalizerChoice::Auto),
            "wetext" => Some(NormalizerChoice::Wetext),
            "none" => Some(NormalizerChoice::None),
            _ => None,
        }
    }
}

/// `[limits]`: input sizes cosy refuses beyond.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSettings {
    /// Longest text (in characters) one command synthesises.
    pub max_text_chars: usize,
}

/// `[engine]`: how many requests one loaded model serves at once, and how it batches them.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// Most sentences whose LLM decode steps run as one batched call.
    pub max_batch: usize,
    /// Most requests synthesising at once; more wait in the queue.
    pub max_in_flight: usize,
    /// Most requests waiting for a slot; more are refused ([`crate::Error::Busy`], HTTP 429).
    pub max_queue: usize,
    /// Most requests whose flow (DiT) calls run as one batched call.
    pub dit_max_batch: usize,
    /// Bound, in bytes, of the in-memory per-voice DiT prompt-prefix cache that streaming
    /// chunks reuse (0 = off; docs/model-format.md "dit prompt cache").
    pub prompt_cache_bytes: usize,
    /// Where that cache is used (the bound that applies: [`EngineSettings::prompt_cache_bound`]).
    pub prompt_cache: CpuSwitch,
    /// Bound, in bytes, of the same cache on disk (`<runtime.engine_cache>/prompt-prefix`,
    /// [`Config::prompt_cache_dir`]), used wherever the in-memory one is; 0 = not on disk.
    pub prompt_cache_disk_bytes: u64,
    /// Whether the LLM's decode steps wait while a streaming request's first chunk is in the flow
    /// and HiFT ([`EngineSettings::first_audio_priority_applies`]).
    pub first_audio_priority: CpuSwitch,
    /// `cosy file --input`: lines synthesised at once.
    pub file_concurrency: usize,
}

impl EngineSettings {
    /// The prompt-prefix cache's bound for a DiT running on `dit_provider`: 0 (not used) when
    /// `engine.prompt_cache` is `off`, or `auto` on a GPU provider. It saves the prompt's share of
    /// every non-final chunk's DiT work, which is most of the first chunk's on a CPU; on a GPU that
    /// work is a few milliseconds and handing the cached keys and values to the device costs more
    /// (an H200, CUDA fp16: first audio 707 ms without, 892 ms with; DiT call 16.5 → 27.5 ms;
    /// docs/benchmarks.md, "Second session").
    pub fn prompt_cache_bound(&self, dit_provider: crate::vocab::ProviderKind) -> usize {
        let used = match self.prompt_cache {
            CpuSwitch::On => true,
            CpuSwitch::Off => false,
            CpuSwitch::Auto => dit_provider == crate::vocab::ProviderKind::Cpu,
        };
        if used {
            self.prompt_cache_bytes
        } else {
            0
        }
    }

    /// Whether the LLM's decode steps wait while a streaming request's first chunk runs its flow
    /// and HiFT (`engine.first_audio_priority`; `auto`: when the LLM and the DiT both run on the
    /// CPU). There the two stages' ONNX Runtime pools share the cores, so the LLM decoding tokens
    /// for later chunks slows the one DiT call on the path to first audio; holding it gives that
    /// call every core (the work is the same, in another order: later chunks start later by about
    /// what the first gains). On a GPU the stages do not compete for the cores. The cost: the
    /// other requests' decoding waits too (one batch), once per new streaming request.
    pub fn first_audio_priority_applies(&self, llm_provider: crate::vocab::ProviderKind, dit_provider: crate::vocab::ProviderKind) -> bool {
        match self.first_audio_priority {
            CpuSwitch::On => true,
            CpuSwitch::Off => false,
            CpuSwitch::Auto => llm_provider == crate::vocab::ProviderKind::Cpu && dit_provider == crate::vocab::ProviderKind::Cpu,
        }
    }
}

/// `[debug]`: settings for tests and debugging only.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DebugSettings {
    /// Accept requests with test hooks (hold points: `cosy_test` in the HTTP API). Never in
    /// production: a held request keeps its slot until its client hangs up.
    pub test_hooks: bool,
}

/// `[server]`: `cosy serve` (the HTTP API). The library only carries these values; the server
/// in the binary uses them.
#[derive(Clone, PartialEq)]
pub struct ServerSettings {
    /// Address and port to listen on (`127.0.0.1:8080`; `0.0.0.0:8080` in a container).
    pub bind: String,
    /// Bearer token clients must send (`Authorization: Bearer KEY`); `None` = no authentication.
    pub api_key: Option<String>,
    /// The Retry-After of a 429, in seconds.
    pub retry_after_s: u64,
    /// Largest request body (JSON with a base64 prompt, or a multipart upload), in bytes.
    pub max_body_bytes: usize,
    /// Longest a request may take, waiting included, in seconds.
    pub request_timeout_s: u64,
    /// The longest a client may take to send one request head (also how long an idle keep-alive
    /// connection stays open), in seconds.
    pub header_timeout_s: u64,
    /// The longest one write may wait for the client to take it, in seconds: a client that stops
    /// reading is disconnected and its request cancelled.
    pub send_timeout_s: u64,
    /// Connections served at once (a WebSocket session counts until it ends); more wait unanswered
    /// until one closes.
    pub max_connections: usize,
    /// After SIGTERM/SIGINT: how long in-flight requests may run before the server exits anyway.
    pub shutdown_grace_s: u64,
    /// Run one short synthesis before `/ready` says yes (with the default voice, if there is one).
    pub warmup: bool,
    /// The `response_format` of a speech request that names none (OpenAI's default: mp3). The
    /// server checks the name against the formats it writes before it listens.
    pub default_format: String,
    /// Origins (`https://app.example.com`) whose pages may call the API (CORS) and open the
    /// WebSocket; `["*"]` = any. `None` (not set): the loopback origins (`http://localhost`,
    /// `http://127.0.0.1`, `http://[::1]`, any port) when the server listens on a loopback
    /// address, none otherwise.
    pub cors_origins: Option<Vec<String>>,
    /// The listings (`GET /v1/models`, `/v1/audio/models`, `/v1/audio/voices`) answer without the
    /// API key (Open WebUI lists voices without sending it).
    pub public_listings: bool,
    /// `GET /` serves the web page (embedded in the binary; it uses the public API only).
    pub web_ui: bool,
}

impl fmt::Debug for ServerSettings {
    // By hand, so that a logged configuration never shows the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerSettings")
            .field("bind", &self.bind)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("retry_after_s", &self.retry_after_s)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("request_timeout_s", &self.request_timeout_s)
            .field("header_timeout_s", &self.header_timeout_s)
            .field("send_timeout_s", &self.send_timeout_s)
            .field("max_connections", &self.max_connections)
            .field("shutdown_grace_s", &self.shutdown_grace_s)
            .field("warmup", &self.warmup)
            .field("default_format", &self.default_format)
            .field("cors_origins", &self.cors_origins)
            .field("public_listings", &self.public_listings)
            .field("web_ui", &self.web_ui)
            .finish()
    }
}

/// `[wyoming]`: the Wyoming protocol server of `cosy serve` (Home Assistant; docs/wyoming.md), on
/// the same engine as the HTTP API. The library only carries these values.
#[derive(Debug, Clone, PartialEq)]
pub struct WyomingSettings {
    /// Address and port to listen on; `None` (not set, or "") = no Wyoming server. A bare port
    /// (`10200`) means the loopback (`127.0.0.1:10200`).
    pub bind: Option<String>,
    /// Wyoming connections open at once; one more is answered with an `error` event and closed.
    pub max_connections: usize,
    /// The longest a connection may stay silent (no event, no audio being made), in seconds.
    pub idle_timeout_s: u64,
    /// Longest event header (one JSON line), in bytes.
    pub max_header_bytes: usize,
    /// Largest `data` and largest `payload` of one event, each, in bytes.
    pub max_payload_bytes: usize,
    /// Streamed text (`synthesize-chunk`): normalise each settled sentence (numbers, units,
    /// symbols) before the model reads it; false = the exact text.
    pub normalize: bool,
}

/// The whole configuration after all sources were applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The exported model folder (docs/model-format.md).
    pub model_dir: PathBuf,
    pub runtime: RuntimeSettings,
    pub stages: BTreeMap<StageGroup, StageSettings>,
    pub sampling: SamplingSettings,
    pub streaming: StreamingSettings,
    pub output: OutputSettings,
    pub voices: VoiceSettings,
    pub limits: LimitSettings,
    pub engine: EngineSettings,
    pub text: TextSettings,
    pub server: ServerSettings,
    pub wyoming: WyomingSettings,
    pub debug: DebugSettings,
    /// The config file that was read, if any.
    pub source_file: Option<PathBuf>,
    /// Where the config file and each setting came from (`cosy doctor` reports it).
    pub sources: Sources,
}

/// Where the configuration came from: why this config file, and the source of each key a file,
/// the environment or a flag set. Keys not listed have their built-in default
/// ([`Config::source_of`] says what that default is and why).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Why the config file was read (or why none was): `named by --config`, `./config.toml in the
    /// current folder (a project folder)`, `the user's config file`, …
    pub config_file: String,
    /// The origin of each key that was set (`/etc/cosy/config.toml:4`, `environment COSY_MODEL`).
    pub keys: BTreeMap<String, String>,
    /// Why `model.dir` is what it is when nothing set it ([`crate::paths::default_model`]).
    pub default_model: Option<String>,
}

/// Two configurations are equal when their values are: where a value came from is not part of it
/// (a key set to its default by a flag gives the same configuration as the default).
impl PartialEq for Sources {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            // `Config::load` replaces it with the models folder's default when no source sets it.
            model_dir: paths::models_dir().join("cosyvoice3"),
            runtime: RuntimeSettings {
                ort_library: None,
                providers: vec![ProviderKind::Cpu],
                allow_fallback: false,
                precision: Precision::Fp32,
                device_id: 0,
                threads: 0,
                engine_cache: default_engine_cache(),
                graph_cache: None,
                graph_cache_enabled: true,
                cuda_mem_limit: 0,
                cuda_graphs: false,
                cuda_conv_search: CudaConvSearch::Heuristic,
            },
            stages: StageGroup::ALL.into_iter().map(|g| (g, StageSettings::default())).collect(),
            sampling: SamplingSettings { seed: 0, top_p: None, top_k: None, win_size: None, tau_r: None },
            streaming: StreamingSettings {
                enabled: false,
                token_hop_len: None,
                token_max_hop_len: None,
                stream_scale_factor: None,
            },
            output: OutputSettings { device: "default".into() },
            voices: VoiceSettings { dir: paths::voices_dir(), default: None, aliases: BTreeMap::new() },
            limits: LimitSettings { max_text_chars: 5000 },
            engine: EngineSettings { max_batch: 16, max_in_flight: 16, max_queue: 64, dit_max_batch: 8, prompt_cache_bytes: 2 << 30, prompt_cache: CpuSwitch::Auto, prompt_cache_disk_bytes: 4 << 30, first_audio_priority: CpuSwitch::Auto, file_concurrency: 4 },
            text: TextSettings { normalizer: NormalizerChoice::Auto },
            server: ServerSettings {
                bind: "127.0.0.1:8080".into(),
                api_key: None,
                retry_after_s: 1,
                max_body_bytes: 16 << 20,
                request_timeout_s: 300,
                header_timeout_s: 30,
                send_timeout_s: 30,
                max_connections: 1024,
                shutdown_grace_s: 30,
                warmup: true,
                default_format: "mp3".into(),
                cors_origins: None,
                public_listings: false,
                web_ui: true,
            },
            wyoming: WyomingSettings {
                bind: None,
                max_connections: 64,
                idle_timeout_s: 60,
                max_header_bytes: 64 << 10,
                max_payload_bytes: 1 << 20,
                normalize: true,
            },
            debug: DebugSettings::default(),
            source_file: None,
            sources: Sources::default(),
        }
    }
}

/// Every key a config file may set (the `stages.<group>.*` keys for each group).
pub const KEYS: &[&str] = &[
    "model.dir",
    "runtime.ort_library",
    "runtime.providers",
    "runtime.allow_fallback",
    "runtime.precision",
    "runtime.device_id",
    "runtime.threads",
    "runtime.engine_cache",
    "runtime.graph_cache",
    "runtime.graph_cache_enabled",
    "runtime.cuda_mem_limit",
    "runtime.cuda_graphs",
    "runtime.cuda_conv_search",
    "stages.<llm|flow|dit|hift|frontend>.precision",
    "stages.<llm|flow|dit|hift|frontend>.providers",
    "stages.<llm|flow|dit|hift|frontend>.threads",
    "stages.<llm|flow|dit|hift|frontend>.spinning",
    "sampling.seed",
    "sampling.top_p",
    "sampling.top_k",
    "sampling.win_size",
    "sampling.tau_r",
    "streaming.enabled",
    "streaming.token_hop_len",
    "streaming.token_max_hop_len",
    "streaming.stream_scale_factor",
    "output.device",
    "voices.dir",
    "voices.default",
    "voices.aliases.<name>",
    "limits.max_text_chars",
    "engine.max_batch",
    "engine.max_in_flight",
    "engine.max_queue",
    "engine.dit_max_batch",
    "engine.prompt_cache_bytes",
    "engine.prompt_cache",
    "engine.prompt_cache_disk_bytes",
    "engine.first_audio_priority",
    "engine.file_concurrency",
    "text.normalizer",
    "server.bind",
    "server.api_key",
    "server.retry_after_s",
    "server.max_body_bytes",
    "server.request_timeout_s",
    "server.header_timeout_s",
    "server.send_timeout_s",
    "server.max_connections",
    "server.shutdown_grace_s",
    "server.warmup",
    "server.default_format",
    "server.cors_origins",
    "server.public_listings",
    "server.web_ui",
    "wyoming.bind",
    "wyoming.max_connections",
    "wyoming.idle_timeout_s",
    "wyoming.max_header_bytes",
    "wyoming.max_payload_bytes",
    "wyoming.normalize",
    "debug.test_hooks",
];

/// Keys that were renamed: still read, with a warning naming the new key.
pub const DEPRECATED_KEYS: &[(&str, &str)] = &[("server.max_concurrent", "engine.max_in_flight"), ("server.max_queue", "engine.max_queue")];

/// Environment variables and the key each one sets.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("COSY_MODEL", "model.dir"),
    ("COSY_ORT_LIBRARY", "runtime.ort_library"),
    ("COSY_PROVIDERS", "runtime.providers"),
    ("COSY_ALLOW_FALLBACK", "runtime.allow_fallback"),
    ("COSY_PRECISION", "runtime.precision"),
    ("COSY_DEVICE_ID", "runtime.device_id"),
    ("COSY_THREADS", "runtime.threads"),
    ("COSY_ENGINE_CACHE", "runtime.engine_cache"),
    ("COSY_GRAPH_CACHE", "runtime.graph_cache"),
    ("COSY_GRAPH_CACHE_ENABLED", "runtime.graph_cache_enabled"),
    ("COSY_SEED", "sampling.seed"),
    ("COSY_OUTPUT_DEVICE", "output.device"),
    ("COSY_VOICES", "voices.dir"),
    ("COSY_VOICE", "voices.default"),
    ("COSY_BIND", "server.bind"),
    ("COSY_API_KEY", "server.api_key"),
    ("COSY_WYOMING", "wyoming.bind"),
];

/// The environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "COSY_CONFIG";

/// The environment variable holding a log filter (it overrides `-v`/`-q`): checked as strictly as
/// the settings ([`check_log_filter`]).
pub const LOG_ENV: &str = "COSY_LOG";

/// The levels a log filter may name.
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks a `COSY_LOG` filter: comma-separated directives, each a level or `TARGET=LEVEL` (e.g.
/// `debug`, `cosy=debug,ort=warn`). Stricter than `tracing`'s own syntax, which takes any bare
/// word as a target at every level: a misspelt level (`COSY_LOG=verbose`) would silently log
/// nothing of what was meant. Empty is refused too (unset the variable instead).
pub fn check_log_filter(value: &str) -> Result<()> {
    let fix = "give a level (trace, debug, info, warn, error, off) or TARGET=LEVEL directives, e.g. COSY_LOG=debug or \
COSY_LOG=cosy=debug,ort=warn";
    let bad = |why: String| Error::Config(format!("environment {LOG_ENV}={value:?}: {why}; {fix}"));
    if value.trim().is_empty() {
        return Err(bad("is empty (unset it for the default)".into()));
    }
    for d in value.split(',').map(str::trim) {
        let level = match d.rsplit_once('=') {
            Some((target, level)) if !target.trim().is_empty() => level.trim(),
            Some(_) => return Err(bad(format!("{d:?} has no target before '='"))),
            None => d,
        };
        if !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(bad(format!("{level:?} is not a level")));
        }
    }
    tracing_subscriber::EnvFilter::try_new(value).map(|_| ()).map_err(|e| bad(format!("not a log filter ({e})")))
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
pub enum Origin {
    File(PathBuf),
    /// A line of a config file (1-based): errors read `config.toml:12: runtime.threads = …`.
    FileLine(PathBuf, usize),
    Env(&'static str),
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::FileLine(p, line) => write!(f, "{}:{line}", p.display()),
            Origin::Env(v) => write!(f, "environment {v}"),
            Origin::Flag(s) => write!(f, "flag {s}"),
        }
    }
}

/// A value as given: a TOML value from a file, or text from the environment or a flag.
#[derive(Debug, Clone)]
pub enum RawValue {
    Toml(toml::Value),
    Text(String),
}

impl fmt::Display for RawValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawValue::Toml(v) => write!(f, "{v}"),
            RawValue::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// What [`Config::load`] reads besides the built-in defaults.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--config`; a given file must exist.
    pub config_file: Option<PathBuf>,
    /// Use `./config.toml` when no file is named (the CLI does; tests usually do not).
    pub default_file: Option<PathBuf>,
    /// With no file named and no `default_file`: read the user's config file
    /// (`$XDG_CONFIG_HOME/cosy/config.toml`), else `/etc/cosy/config.toml` (the CLI does; tests
    /// usually do not, so that a machine's own files cannot change them).
    pub user_files: bool,
    /// The environment, as (name, value) pairs; only `COSY_*` names are looked at.
    pub env: Vec<(String, String)>,
    /// Flag settings as (key, value), applied last in order.
    pub flags: Vec<(String, String)>,
}

impl LoadOptions {
    /// Options holding this process's `COSY_*` environment.
    pub fn from_process_env() -> Self {
        LoadOptions {
            env: std::env::vars().filter(|(k, _)| k.starts_with("COSY_")).collect(),
            ..Default::default()
        }
    }
}

impl Config {
    /// Builds the configuration: defaults, then the config file, the environment, the flags.
    pub fn load(opts: &LoadOptions) -> Result<Config> {
        let mut cfg = Config::default();
        let env_file = opts.env.iter().find(|(k, _)| k == CONFIG_ENV).map(|(_, v)| (PathBuf::from(v), CONFIG_ENV));
        let named = opts.config_file.clone().map(|p| (p, "--config")).or(env_file);
        let choice = paths::choose_config(named, opts.default_file.as_deref(), opts.user_files)?;
        if let Some(path) = &choice.file {
            cfg.apply_file(path)?;
        }
        cfg.sources.config_file = choice.why;
        for (var, key) in ENV_VARS {
            if let Some((_, value)) = opts.env.iter().find(|(k, _)| k == var) {
                cfg.set(key, &RawValue::Text(value.clone()), &Origin::Env(var), None)?;
            }
        }
        if let Some((_, value)) = opts.env.iter().find(|(k, _)| k == LOG_ENV) {
            check_log_filter(value)?;
        }
        let known_env: Vec<&str> = ENV_VARS.iter().map(|(v, _)| *v).chain([CONFIG_ENV, LOG_ENV]).collect();
        for (name, value) in &opts.env {
            // A misspelt variable would otherwise be ignored without a word.
            if name.starts_with("COSY_")
                && !known_env.contains(&name.as_str())
                && !IGNORED_ENV.contains(&name.as_str())
                && !is_service_link(name)
            {
                return Err(Error::Config(format!(
                    "environment {name}={value:?}: unknown variable; known: {}",
                    known_env.join(", ")
                )));
            }
        }
        for (key, value) in &opts.flags {
            cfg.set(key, &RawValue::Text(value.clone()), &Origin::Flag(key.clone()), None)?;
        }
        if !cfg.sources.keys.contains_key("model.dir") {
            let bundled = paths::bundled_model();
            let (dir, why) = paths::default_model(&paths::models_dir(), bundled.as_deref())?;
            cfg.model_dir = dir;
            cfg.sources.default_model = Some(why);
        }
        Ok(cfg)
    }

    /// Where a key's value came from: the file line, variable or flag that set it, else what its
    /// default is (for `model.dir`, `voices.dir`, `runtime.engine_cache`: which user folder).
    pub fn source_of(&self, key: &str) -> String {
        if let Some(s) = self.sources.keys.get(key) {
            return format!("set by {s}");
        }
        match key {
            "model.dir" => self.sources.default_model.clone().unwrap_or_else(|| "the built-in default".into()),
            "voices.dir" => "the default: the user's data folder ($XDG_DATA_HOME/cosy/voices)".into(),
            "runtime.engine_cache" => "the default: the user's cache folder ($XDG_CACHE_HOME/cosy/engines)".into(),
            "runtime.graph_cache" => "the default: <runtime.engine_cache>/graphs".into(),
            _ => "the built-in default".into(),
        }
    }

    /// Reads one TOML file over the current values. Every error names the file and the line
    /// (`config.toml:12:`): a syntax error also the column and the key or table it is about, a
    /// bad value its key.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| toml_error(path, &text, &e))?;
        let lines = key_lines(&text);
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut leaves = Vec::new();
        flatten("", &toml::Value::Table(table), &mut leaves);
        for (key, value) in leaves {
            let origin = match lines.get(&key) {
                Some(&line) => Origin::FileLine(path.to_path_buf(), line),
                None => Origin::File(path.to_path_buf()),
            };
            self.set(&key, &RawValue::Toml(value), &origin, Some(&base))?;
        }
        self.source_file = Some(path.to_path_buf());
        Ok(())
    }

    /// Sets one dotted key. `base` resolves relative paths (the config file's folder). The origin
    /// is remembered ([`Config::source_of`]).
    pub fn set(&mut self, key: &str, value: &RawValue, origin: &Origin, base: Option<&Path>) -> Result<()> {
        self.set_value(key, value, origin, base)?;
        // `""` for a path with a default (engine cache, graph cache, library) means that default.
        let said = if text_of(value).is_some_and(|s| s.is_empty()) { format!("{origin} (\"\": the default)") } else { origin.to_string() };
        self.sources.keys.insert(key.to_string(), said);
        Ok(())
    }

    fn set_value(&mut self, key: &str, value: &RawValue, origin: &Origin, base: Option<&Path>) -> Result<()> {
        let bad = |allowed: &str| {
            Error::Config(format!("{origin}: {key} = {value}: invalid value; allowed: {allowed}"))
        };
        // An integer from 1 to `max`.
        let up_to = |max: usize| -> Result<usize> {
            positive(value).filter(|&n| n <= max).ok_or_else(|| bad(&format!("an integer from 1 to {max}")))
        };
        let path_value = |v: &RawValue| -> Result<PathBuf> {
            let s = text_of(v).ok_or_else(|| bad("a path (string)"))?;
            // An empty path would silently mean the current folder (or the config file's).
            if s.is_empty() {
                return Err(bad("a path, not empty (\".\" for the current folder)"));
            }
            let p = PathBuf::from(s);
            Ok(match base {
                Some(b) if p.is_relative() => b.join(p),
                _ => p,
            })
        };
        match key {
            "model.dir" => self.model_dir = path_value(value)?,
            "runtime.ort_library" => {
                let s = text_of(value).ok_or_else(|| bad("a path (string); empty for the default"))?;
                self.runtime.ort_library = if s.is_empty() { None } else { Some(path_value(value)?) };
            }
            "runtime.providers" => {
                self.runtime.providers = providers_of(value).ok_or_else(|| bad(PROVIDERS_ALLOWED))?
            }
            "runtime.allow_fallback" => self.runtime.allow_fallback = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "runtime.precision" => {
                self.runtime.precision =
                    text_of(value).and_then(|s| Precision::parse(&s)).ok_or_else(|| bad(Precision::ALLOWED))?
            }
            "runtime.device_id" => {
                self.runtime.device_id = int_of(value)
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad("an integer >= 0"))?
            }
            "runtime.threads" => {
                self.runtime.threads = int_of(value)
                    .and_then(|v| usize::try_from(v).ok())
                    .filter(|&v| v <= 1024)
                    .ok_or_else(|| bad("an integer 0..=1024 (0: ONNX Runtime's choice)"))?
            }
            "runtime.engine_cache" => {
                let s = text_of(value).ok_or_else(|| bad("a path (string); \"\" for the user's cache folder"))?;
                self.runtime.engine_cache = if s.is_empty() { default_engine_cache() } else { path_value(value)? };
            }
            "runtime.graph_cache" => {
                let s = text_of(value).ok_or_else(|| bad("a path (string); \"\" for <runtime.engine_cache>/graphs"))?;
                self.runtime.graph_cache = if s.is_empty() { None } else { Some(path_value(value)?) };
            }
            "runtime.graph_cache_enabled" => {
                self.runtime.graph_cache_enabled = bool_of(value).ok_or_else(|| bad("true, false"))?
            }
            "runtime.cuda_mem_limit" => {
                self.runtime.cuda_mem_limit = int_of(value)
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| bad("bytes as an integer >= 0 (0: no limit)"))?
            }
            "runtime.cuda_graphs" => self.runtime.cuda_graphs = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "runtime.cuda_conv_search" => {
                self.runtime.cuda_conv_search =
                    text_of(value).and_then(|s| CudaConvSearch::parse(&s)).ok_or_else(|| bad(CudaConvSearch::NAMES))?
            }
            "sampling.seed" => {
                self.sampling.seed =
                    int_of(value).and_then(|v| u64::try_from(v).ok()).ok_or_else(|| bad("an integer >= 0"))?
            }
            "sampling.top_p" => {
                self.sampling.top_p = model_backed(value, |v| float_of(v).filter(|&v| v > 0.0 && v <= 1.0))
                    .ok_or_else(|| bad("a number in (0, 1], or \"\" for the model's value"))?
            }
            "sampling.top_k" => {
                self.sampling.top_k = model_backed(value, positive).ok_or_else(|| bad(INT_OR_MODEL))?
            }
            "sampling.win_size" => {
                self.sampling.win_size = model_backed(value, positive).ok_or_else(|| bad(INT_OR_MODEL))?
            }
            "sampling.tau_r" => {
                // Above 1 the repetition rule never fires (the official greedy test configs use 2).
                self.sampling.tau_r = model_backed(value, |v| float_of(v).filter(|&v| v >= 0.0))
                    .ok_or_else(|| bad("a number >= 0, or \"\" for the model's value"))?
            }
            "streaming.enabled" => self.streaming.enabled = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "streaming.token_hop_len" => {
                self.streaming.token_hop_len = model_backed(value, positive).ok_or_else(|| bad(INT_OR_MODEL))?
            }
            "streaming.token_max_hop_len" => {
                self.streaming.token_max_hop_len = model_backed(value, positive).ok_or_else(|| bad(INT_OR_MODEL))?
            }
            "streaming.stream_scale_factor" => {
                self.streaming.stream_scale_factor = model_backed(value, positive).ok_or_else(|| bad(INT_OR_MODEL))?
            }
            "output.device" => {
                self.output.device = text_of(value)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| bad("\"default\", \"none\" or a device name"))?
            }
            "voices.dir" => self.voices.dir = path_value(value)?,
            "voices.default" => {
                let s = text_of(value).ok_or_else(|| bad("a saved voice's name, or \"\" for the voices folder's default"))?;
                if !s.is_empty() {
                    check_voice_name(&s).map_err(|_| {
                        bad("a saved voice's name (letters, digits, '.', '_', '-'), or \"\" for the voices folder's default")
                    })?;
                }
                self.voices.default = (!s.is_empty()).then_some(s);
            }
            "limits.max_text_chars" => {
                self.limits.max_text_chars = positive(value).ok_or_else(|| bad("an integer >= 1"))?
            }
            "engine.max_batch" => self.engine.max_batch = up_to(256)?,
            "engine.max_in_flight" => self.engine.max_in_flight = up_to(65_536)?,
            "engine.max_queue" => {
                self.engine.max_queue = int_of(value)
                    .and_then(|v| usize::try_from(v).ok())
                    .filter(|&n| n <= 1 << 20)
                    .ok_or_else(|| bad("an integer from 0 to 1048576"))?
            }
            "engine.dit_max_batch" => self.engine.dit_max_batch = up_to(64)?,
            "engine.prompt_cache" => {
                self.engine.prompt_cache =
                    text_of(value).and_then(|s| CpuSwitch::parse(&s)).ok_or_else(|| bad(CpuSwitch::NAMES))?
            }
            "engine.first_audio_priority" => {
                self.engine.first_audio_priority =
                    text_of(value).and_then(|s| CpuSwitch::parse(&s)).ok_or_else(|| bad(CpuSwitch::NAMES))?
            }
            "engine.prompt_cache_disk_bytes" => {
                self.engine.prompt_cache_disk_bytes = int_of(value)
                    .and_then(|v| u64::try_from(v).ok())
                    .filter(|&n| n <= 1 << 44)
                    .ok_or_else(|| bad("a number of bytes from 0 (off) to 17592186044416"))?
            }
            "engine.prompt_cache_bytes" => {
                self.engine.prompt_cache_bytes = int_of(value)
                    .and_then(|v| usize::try_from(v).ok())
                    .filter(|&n| n <= 1 << 40)
                    .ok_or_else(|| bad("a number of bytes from 0 (off) to 1099511627776"))?
            }
            "engine.file_concurrency" => self.engine.file_concurrency = up_to(256)?,
            "server.bind" => {
                let s = text_of(value).ok_or_else(|| bad("HOST:PORT, e.g. \"127.0.0.1:8080\" or \"0.0.0.0:8080\""))?;
                if !valid_bind(&s) {
                    return Err(bad("HOST:PORT, e.g. \"127.0.0.1:8080\" or \"0.0.0.0:8080\" (port 0 = any free port)"));
                }
                self.server.bind = s;
            }
            "server.api_key" => {
                // Not echoed in the message: it is a secret.
                let s = text_of(value).ok_or_else(|| {
                    Error::Config(format!("{origin}: {key}: invalid value; allowed: a string (\"\" = no key)"))
                })?;
                if s.chars().any(|c| c.is_control() || c == ' ') {
                    return Err(Error::Config(format!(
                        "{origin}: {key}: the key has spaces or control characters; use printable characters only"
                    )));
                }
                self.server.api_key = (!s.is_empty()).then_some(s);
            }
            "server.max_concurrent" | "server.max_queue" => {
                let new = DEPRECATED_KEYS.iter().find(|(old, _)| *old == key).map_or("", |(_, new)| *new);
                self.set_value(new, value, origin, base).map_err(|e| match e {
                    Error::Config(m) => Error::Config(m.replacen(new, &format!("{key} (now {new})"), 1)),
                    other => other,
                })?;
                tracing::warn!("{origin}: {key} is deprecated; it now sets {new} (one limit for every front end): rename it");
                return Ok(());
            }
            "server.retry_after_s" => self.server.retry_after_s = up_to(3600)? as u64,
            "server.max_body_bytes" => {
                self.server.max_body_bytes = positive(value)
                    .filter(|&n| (1024..=1 << 30).contains(&n))
                    .ok_or_else(|| bad("an integer from 1024 to 1073741824"))?
            }
            "server.request_timeout_s" => self.server.request_timeout_s = up_to(86_400)? as u64,
            "server.header_timeout_s" => self.server.header_timeout_s = up_to(3600)? as u64,
            "server.send_timeout_s" => self.server.send_timeout_s = up_to(3600)? as u64,
            "server.max_connections" => self.server.max_connections = up_to(1_000_000)?,
            "server.shutdown_grace_s" => {
                self.server.shutdown_grace_s = int_of(value)
                    .and_then(|v| u64::try_from(v).ok())
                    .filter(|&n| n <= 3600)
                    .ok_or_else(|| bad("an integer from 0 to 3600"))?
            }
            "server.warmup" => self.server.warmup = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "server.default_format" => {
                let s = text_of(value).map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty());
                self.server.default_format = s.ok_or_else(|| bad("a response format's name, e.g. \"mp3\" (the server lists the others)"))?;
            }
            "server.public_listings" => self.server.public_listings = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "server.web_ui" => self.server.web_ui = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "server.cors_origins" => {
                // Blank text means "not set" (the loopback default), as for every other key: an empty
                // shell variable must not switch browsers off. None is said as [] or "none".
                self.server.cors_origins = match text_of(value) {
                    Some(s) if s.trim().is_empty() => None,
                    Some(s) if s.trim().eq_ignore_ascii_case("none") => Some(Vec::new()),
                    _ => Some(origins_of(value).map_err(|why| bad(&format!("{CORS_ALLOWED} ({why})")))?),
                }
            }
            "wyoming.bind" => {
                const ALLOWED: &str =
                    "HOST:PORT, e.g. \"127.0.0.1:10200\" or \"0.0.0.0:10200\" (a bare port = the loopback; port 0 = any free port), or \"\" for none";
                let s = text_of(value).map(|s| s.trim().to_string()).ok_or_else(|| bad(ALLOWED))?;
                self.wyoming.bind = if s.is_empty() {
                    None
                } else if s.parse::<u16>().is_ok() {
                    Some(format!("127.0.0.1:{s}"))
                } else if valid_bind(&s) {
                    Some(s)
                } else {
                    return Err(bad(ALLOWED));
                };
            }
            "wyoming.max_connections" => self.wyoming.max_connections = up_to(1_000_000)?,
            "wyoming.idle_timeout_s" => self.wyoming.idle_timeout_s = up_to(86_400)? as u64,
            "wyoming.max_header_bytes" => {
                self.wyoming.max_header_bytes = positive(value)
                    .filter(|&n| (1024..=1 << 24).contains(&n))
                    .ok_or_else(|| bad("an integer from 1024 to 16777216"))?
            }
            "wyoming.max_payload_bytes" => {
                self.wyoming.max_payload_bytes = positive(value)
                    .filter(|&n| (1024..=1 << 30).contains(&n))
                    .ok_or_else(|| bad("an integer from 1024 to 1073741824"))?
            }
            "wyoming.normalize" => self.wyoming.normalize = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "voices.aliases" => {
                return Err(bad("a table of aliases: [voices.aliases] then alloy = \"anna\" (or --set voices.aliases.alloy=anna)"));
            }
            _ if key.starts_with("voices.aliases.") => {
                let alias = &key["voices.aliases.".len()..];
                if alias == "default" || check_voice_name(alias).is_err() {
                    return Err(Error::Config(format!(
                        "{origin}: {key}: the alias {alias:?} is not a voice name a request can give; use one of OpenAI's voice names \
                         (alloy, ash, ballad, coral, echo, fable, onyx, nova, sage, shimmer, verse, marin, cedar) or 1-64 letters, \
                         digits, '.', '_', '-' (not \"default\")"
                    )));
                }
                let s = text_of(value).ok_or_else(|| bad("a saved voice's name (string), or \"\" to remove the alias"))?;
                if s.is_empty() {
                    self.voices.aliases.remove(alias);
                } else {
                    check_voice_name(&s).map_err(|_| bad("a saved voice's name (letters, digits, '.', '_', '-'), or \"\" to remove the alias"))?;
                    if s == alias {
                        return Err(bad("another voice's name (an alias of itself means nothing)"));
                    }
                    self.voices.aliases.insert(alias.to_string(), s);
                }
            }
            "debug.test_hooks" => self.debug.test_hooks = bool_of(value).ok_or_else(|| bad("true, false"))?,
            "text.normalizer" => {
                self.text.normalizer = text_of(value)
                    .and_then(|s| NormalizerChoice::parse(&s))
                    .ok_or_else(|| bad(NormalizerChoice::ALLOWED))?
            }
            _ => {
                let parts: Vec<&str> = key.split('.').collect();
                let group = match parts.as_slice() {
                    ["stages", g, _] => StageGroup::parse(g),
                    _ => None,
                };
                let Some(group) = group else {
                    return Err(Error::Config(format!(
                        "{origin}: {key} = {value}: unknown key; known keys: {}",
                        KEYS.join(", ")
                    )));
                };
                let stage = self.stages.entry(group).or_default();
                match parts[2] {
                    "precision" => {
                        let s = text_of(value).ok_or_else(|| bad(&format!("{}, or \"\" to inherit", Precision::ALLOWED)))?;
                        stage.precision = if s.is_empty() {
                            None
                        } else {
                            Some(Precision::parse(&s).ok_or_else(|| bad(&format!("{}, or \"\" to inherit", Precision::ALLOWED)))?)
                        };
                    }
                    "providers" | "provider" => {
                        if text_of(value).is_some_and(|s| s.is_empty()) {
                            stage.providers = None;
                        } else {
                            stage.providers = Some(providers_of(value).ok_or_else(|| bad(PROVIDERS_ALLOWED))?);
                        }
                    }
                    "threads" => {
                        stage.threads = if text_of(value).is_some_and(|s| s.is_empty()) {
                            None
                        } else {
                            Some(
                                int_of(value)
                                    .and_then(|v| usize::try_from(v).ok())
                                    .filter(|&n| n <= 1024)
                                    .ok_or_else(|| bad("an integer from 0 (ONNX Runtime chooses) to 1024, or \"\" to inherit runtime.threads"))?,
                            )
                        };
                    }
                    "spinning" => {
                        stage.spinning = if text_of(value).is_some_and(|s| s.is_empty()) {
                            None
                        } else {
                            Some(bool_of(value).ok_or_else(|| bad("true, false, or \"\" for ONNX Runtime's default (on)"))?)
                        };
                    }
                    _ => {
                        return Err(Error::Config(format!(
                            "{origin}: {key} = {value}: unknown key; a stage has: precision, providers, threads, spinning"
                        )))
                    }
                }
            }
        }
        self.check_consistency().map_err(|msg| Error::Config(format!("{origin}: {key} = {value}: {msg}")))
    }

    fn check_consistency(&self) -> std::result::Result<(), String> {
        if let (Some(hop), Some(max)) = (self.streaming.token_hop_len, self.streaming.token_max_hop_len) {
            if max < hop {
                return Err(format!(
                    "streaming.token_max_hop_len ({max}) must be >= streaming.token_hop_len ({hop})"
                ));
            }
        }
        Ok(())
    }

    /// The precision a group runs in (its override, else `runtime.precision`).
    pub fn precision_for(&self, group: StageGroup) -> Precision {
        self.stages.get(&group).and_then(|s| s.precision).unwrap_or(self.runtime.precision)
    }

    /// Intra-op threads of a group's sessions (its override, else `runtime.threads`; 0 = ONNX
    /// Runtime chooses).
    pub fn threads_for(&self, group: StageGroup) -> usize {
        self.stages.get(&group).and_then(|s| s.threads).unwrap_or(self.runtime.threads)
    }

    /// Whether a group's intra-op threads spin between ops (`None`: ONNX Runtime's default).
    pub fn spinning_for(&self, group: StageGroup) -> Option<bool> {
        self.stages.get(&group).and_then(|s| s.spinning)
    }

    /// The providers, in priority order, for a group (its override, else `runtime.providers`).
    pub fn providers_for(&self, group: StageGroup) -> Vec<ProviderKind> {
        self.stages
            .get(&group)
            .and_then(|s| s.providers.clone())
            .unwrap_or_else(|| self.runtime.providers.clone())
    }

    /// The optimised-graph cache folder, or `None` when the cache is turned off.
    pub fn graph_cache_dir(&self) -> Option<PathBuf> {
        self.runtime.graph_cache_enabled.then(|| self.graph_cache_folder())
    }

    /// The DiT prompt-prefix cache's folder on disk: `<runtime.engine_cache>/prompt-prefix`.
    pub fn prompt_cache_dir(&self) -> PathBuf {
        self.runtime.engine_cache.join("prompt-prefix")
    }

    /// Where the optimised-graph cache is, whether or not it is turned on (`cosy engines list|clean`
    /// still show and remove its entries when it is off): `runtime.graph_cache`, else
    /// `<runtime.engine_cache>/graphs`.
    pub fn graph_cache_folder(&self) -> PathBuf {
        self.runtime.graph_cache.clone().unwrap_or_else(|| self.runtime.engine_cache.join("graphs"))
    }

    /// The ONNX Runtime library a setting names: config/env `runtime.ort_library`, then
    /// `$ORT_DYLIB_PATH`; `None`: search for it (`runtime::env::locate_library`).
    pub fn ort_library_setting(&self) -> Option<(PathBuf, &'static str)> {
        if let Some(p) = &self.runtime.ort_library {
            return Some((p.clone(), "runtime.ort_library"));
        }
        match std::env::var("ORT_DYLIB_PATH") {
            Ok(p) if !p.is_empty() => Some((PathBuf::from(p), "ORT_DYLIB_PATH")),
            _ => None,
        }
    }
}

/// The TensorRT engine cache when no config, environment or flag names one:
/// `$XDG_CACHE_HOME/cosy/engines`, else `~/.cache/cosy/engines` (the optimised-graph cache is its
/// `graphs/` folder), else, with no home folder at all, `/var/cache/cosy/engines`. Never relative:
/// a run writes nothing into the current folder unless asked to (a config file's relative
/// `runtime.engine_cache = "engines"` is relative to the file's folder).
pub fn default_engine_cache() -> PathBuf {
    paths::engine_cache_dir()
}

/// `COSY_*` variables that are not settings (used by scripts and tests).
const IGNORED_ENV: &[&str] = &[
    "COSY_VENV",
    "COSY_BIN",
    "COSY_DIST",
    "COSY_SHARED",
    "COSY_WETEXT_DIR",
    "COSY_TN_CASES",
    "COSY_FUZZ_CASES",
    "COSY_FUZZ_SEED",
    "COSY_FUZZ_FROM",
    "COSY_FUZZ_CASE_SECONDS",
];

const CORS_ALLOWED: &str = "a list of origins such as [\"https://app.example.com\", \"http://localhost:3000\"] \
     (array, or comma-separated text; [] or \"none\" = none; [\"*\"] = any; \"\" = not set: loopback pages on a loopback bind)";

/// `server.cors_origins`: `scheme://host[:port]` each (what a browser sends as `Origin`), or `*`
/// alone; lower-cased, without a trailing slash.
fn origins_of(v: &RawValue) -> std::result::Result<Vec<String>, String> {
    let items: Vec<String> = match v {
        RawValue::Toml(toml::Value::Array(items)) => {
            items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<_>>().ok_or("every item must be a string")?
        }
        RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => s.split(',').map(str::to_string).collect(),
        _ => return Err("not a list".into()),
    };
    let mut out: Vec<String> = Vec::new();
    for item in items {
        let o = item.trim().trim_end_matches('/').to_ascii_lowercase();
        if o.is_empty() {
            continue;
        }
        if o == "*" {
            out.push(o);
            continue;
        }
        let Some((scheme, rest)) = o.split_once("://") else {
            return Err(format!("{item:?} has no scheme; write it as a browser sends it, e.g. https://app.example.com"));
        };
        let host_ok = !rest.is_empty()
            && !rest.contains('/')
            && rest.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'));
        if !matches!(scheme, "http" | "https") || !host_ok {
            return Err(format!("{item:?} is not an origin (scheme://host[:port], no path)"));
        }
        if !out.contains(&o) {
            out.push(o);
        }
    }
    if out.len() > 1 && out.iter().any(|o| o == "*") {
        return Err("\"*\" (any origin) goes alone".into());
    }
    Ok(out)
}

const PROVIDERS_ALLOWED: &str =
    "a list of tensorrt, cuda, cpu in priority order (array, or comma-separated text), without repeats";

/// Line and column (1-based, in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..floor_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The character boundary at or before byte `i` (a parser's span is always on one; this keeps a
/// slice from panicking if it is not).
fn floor_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A TOML syntax error as one line: the file, line and column, what is wrong, and the text there
/// (the duplicate key or table the `toml` crate's message leaves out).
fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> Error {
    let msg = e.message().trim().trim_end_matches('.').to_string();
    let Some(span) = e.span() else {
        return Error::Config(format!("{}: not valid TOML: {msg}", path.display()));
    };
    let (line, col) = line_col(text, span.start);
    let start = floor_boundary(text, span.start);
    let end = floor_boundary(text, span.end.max(span.start));
    let at: String = text[start..end].lines().next().unwrap_or("").trim().chars().take(60).collect();
    let file = path.display();
    if msg.contains("duplicate") {
        return Error::Config(format!(
            "{file}:{line}:{col}: not valid TOML: {}; each table and each key may appear once: remove or merge the repeat",
            describe_duplicate(text, line, &at)
        ));
    }
    let at = if at.is_empty() { String::new() } else { format!(" (at `{at}`)") };
    Error::Config(format!("{file}:{line}:{col}: not valid TOML: {msg}{at}"))
}

/// What a duplicate is, for [`toml_error`]: the table (`[runtime]`) or the dotted key
/// (`runtime.threads`) repeated on `line` (1-based), and the line it first appeared on when that
/// can be seen from the text.
fn describe_duplicate(text: &str, line: usize, at: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let here = lines.get(line - 1).copied().unwrap_or("");
    let header = |l: &str| -> Option<String> {
        let l = l.split('#').next().unwrap_or("").trim();
        l.starts_with('[').then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
    };
    let before = &lines[..(line - 1).min(lines.len())];
    if let Some(table) = header(here) {
        let first = before.iter().position(|l| header(l).as_deref() == Some(table.as_str()));
        let also = first.map_or(String::new(), |i| format!(" (first on line {})", i + 1));
        return format!("table [{table}] appears twice{also}");
    }
    // The table the key is in: the last header above it.
    let section = before.iter().rposition(|l| header(l).is_some());
    let table = section.and_then(|i| header(before[i])).unwrap_or_default();
    let key = if at.is_empty() { here.split('=').next().unwrap_or("").trim().to_string() } else { at.to_string() };
    let full = if here.contains('{') {
        format!("{key} (in the inline table on this line)")
    } else if table.is_empty() {
        key.clone()
    } else {
        format!("{table}.{key}")
    };
    let from = section.map_or(0, |i| i + 1);
    let first = before[from..]
        .iter()
        .position(|l| l.split('=').next().is_some_and(|k| k.trim() == key))
        .map(|i| from + i);
    let also = first.map_or(String::new(), |i| format!(" (first on line {})", i + 1));
    format!("key {full} appears twice{also}")
}

/// The line of each dotted key of a config file that parses (keys of inline tables and dotted keys
/// included), for errors about its values.
fn key_lines(text: &str) -> BTreeMap<String, usize> {
    fn walk(text: &str, prefix: &str, table: &toml::de::DeTable<'_>, out: &mut BTreeMap<String, usize>) {
        for (k, v) in table.iter() {
            let key = if prefix.is_empty() { k.get_ref().to_string() } else { format!("{prefix}.{}", k.get_ref()) };
            match v.get_ref() {
                toml::de::DeValue::Table(t) => walk(text, &key, t, out),
                _ => {
                    out.insert(key, line_col(text, k.span().start).0);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(doc) = toml::de::DeTable::parse(text) {
        walk(text, "", doc.get_ref(), &mut out);
    }
    out
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

fn text_of(v: &RawValue) -> Option<String> {
    match v {
        RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => Some(s.trim().to_string()),
        _ => None,
    }
}

fn bool_of(v: &RawValue) -> Option<bool> {
    match v {
        RawValue::Toml(toml::Value::Boolean(b)) => Some(*b),
        RawValue::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Some(true),
            "false" | "0" | "no" | "off" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

fn int_of(v: &RawValue) -> Option<i64> {
    match v {
        RawValue::Toml(toml::Value::Integer(i)) => Some(*i),
        RawValue::Text(s) => s.trim().parse().ok(),
        _ => None,
    }
}

const INT_OR_MODEL: &str = "an integer >= 1, or \"\" for the model's value";

/// A manifest-backed key: `""` means "the model's value" (`Some(None)`), anything else must parse
/// (`Some(Some(v))`); `None` is a bad value.
fn model_backed<T>(v: &RawValue, parse: impl Fn(&RawValue) -> Option<T>) -> Option<Option<T>> {
    if text_of(v).is_some_and(|s| s.is_empty()) {
        return Some(None);
    }
    parse(v).map(Some)
}

/// Variables a platform sets for a service named `cosy` (Kubernetes service links, Docker
/// links): `COSY_SERVICE_HOST`, `COSY_SERVICE_PORT_HTTP`, `COSY_PORT`, `COSY_PORT_80_TCP_ADDR`, …
/// They are not ours and must not stop a server from starting.
fn is_service_link(name: &str) -> bool {
    let rest = &name["COSY_".len()..];
    rest.starts_with("SERVICE_HOST") || rest.starts_with("SERVICE_PORT") || rest == "PORT" || rest.starts_with("PORT_")
}

/// `HOST:PORT` with a numeric port: an IP address, `[v6]`, or a host name such as `localhost`.
fn valid_bind(s: &str) -> bool {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
}

fn positive(v: &RawValue) -> Option<usize> {
    int_of(v).filter(|&i| i >= 1).and_then(|i| usize::try_from(i).ok())
}

fn float_of(v: &RawValue) -> Option<f64> {
    match v {
        RawValue::Toml(toml::Value::Float(f)) => Some(*f),
        RawValue::Toml(toml::Value::Integer(i)) => Some(*i as f64),
        RawValue::Text(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|f: &f64| f.is_finite())
}

fn providers_of(v: &RawValue) -> Option<Vec<ProviderKind>> {
    let names: Vec<String> = match v {
        RawValue::Toml(toml::Value::Array(items)) => {
            items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<_>>()?
        }
        RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => s.split(',').map(str::to_string).collect(),
        _ => return None,
    };
    let mut out = Vec::new();
    for n in names {
        let p = ProviderKind::parse(&n)?;
        if out.contains(&p) {
            return None;
        }
        out.push(p);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_link_variables_are_not_config() {
        for v in ["COSY_SERVICE_HOST", "COSY_SERVICE_PORT", "COSY_SERVICE_PORT_HTTP", "COSY_PORT", "COSY_PORT_80_TCP_ADDR"] {
            assert!(is_service_link(v), "{v}");
        }
        for v in ["COSY_PORTS", "COSY_MODEL", "COSY_SERVICE"] {
            assert!(!is_service_link(v), "{v}");
        }
        let mut opts = LoadOptions {
            env: vec![("COSY_SERVICE_HOST".into(), "10.0.0.1".into()), ("COSY_PORT".into(), "tcp://10.0.0.1:80".into())],
            ..LoadOptions::default()
        };
        assert!(Config::load(&opts).is_ok());
        opts.env = vec![("COSY_MODLE".into(), "x".into())];
        assert!(Config::load(&opts).is_err(), "a misspelt variable is still refused");
    }

    #[test]
    fn voice_aliases_and_cors_origins_are_checked() {
        let set = |pairs: &[(&str, &str)]| {
            let flags = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Config::load(&LoadOptions { flags, ..LoadOptions::default() })
        };
        let c = set(&[("voices.aliases.alloy", "anna"), ("voices.aliases.my-voice", "ben")]).unwrap();
        assert_eq!(c.voices.aliases.get("alloy").map(String::as_str), Some("anna"));
        assert_eq!(c.voices.aliases.len(), 2);
        assert!(set(&[("voices.aliases.alloy", "anna"), ("voices.aliases.alloy", "")]).unwrap().voices.aliases.is_empty());
        for (key, value, needle) in [
            ("voices.aliases.../x", "anna", "not a voice name"),
            ("voices.aliases.default", "anna", "not a voice name"),
            ("voices.aliases.alloy", "a/b", "saved voice's name"),
            ("voices.aliases.alloy", "alloy", "itself"),
            ("voices.aliases", "anna", "table"),
            ("server.cors_origins", "app.example.com", "no scheme"),
            ("server.cors_origins", "https://a.example/path", "not an origin"),
            ("server.cors_origins", "*, https://a.example", "alone"),
        ] {
            let e = set(&[(key, value)]).expect_err(key).to_string();
            assert!(e.contains(key) && e.contains(needle), "{key}={value}: {e}");
        }
        let c = set(&[("server.cors_origins", "HTTPS://App.Example.com/, http://localhost:3000")]).unwrap();
        assert_eq!(c.server.cors_origins, Some(vec!["https://app.example.com".to_string(), "http://localhost:3000".to_string()]));
        // "" is "not set" (an empty shell variable must not switch browsers off); none is "none" or [].
        assert_eq!(set(&[("server.cors_origins", "")]).unwrap().server.cors_origins, None);
        assert_eq!(set(&[("server.cors_origins", "none")]).unwrap().server.cors_origins, Some(vec![]));
        assert_eq!(Config::default().server.cors_origins, None);
    }

    #[test]
    fn providers_parse_lists_and_refuse_repeats() {
        let v = RawValue::Text("tensorrt, CUDA,cpu".into());
        assert_eq!(providers_of(&v), Some(vec![ProviderKind::TensorRt, ProviderKind::Cuda, ProviderKind::Cpu]));
        assert_eq!(providers_of(&RawValue::Text("cuda,cuda".into())), None);
        assert_eq!(providers_of(&RawValue::Text("rocm".into())), None);
        assert_eq!(providers_of(&RawValue::Text("".into())), None);
    }
}
