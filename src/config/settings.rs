//! The settings themselves: one struct per table of config.toml, [`Config`] holding them all, and
//! their built-in defaults ([`Config::default`]). Which key sets which field, and what it allows, is
//! the key table's (`config/keys.rs`); what a setting means for a stage is answered here
//! ([`Config::precision_for`], …).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::paths;
use crate::vocab::{Precision, ProviderKind, StageGroup};


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
    /// Path of the TensorRT for RTX plugin (`libonnxruntime_providers_nv_tensorrt_rtx.so`); `None`:
    /// beside the loaded `libonnxruntime.so`, where `scripts/setup-trt-rtx.sh` puts it.
    pub tensorrt_rtx_library: Option<PathBuf>,
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
    /// ONNX Runtime's profiling (`runtime.ort_profile`): each session writes its per-node timings to
    /// `<prefix>-<stage>_<time>.json` when it closes; `None`: off (profiling costs time on every run).
    pub ort_profile: Option<PathBuf>,
    /// Whether the `dit` and `hift_decode` calls are padded up to a few fixed lengths
    /// (`runtime.shape_buckets`; [`RuntimeSettings::shape_buckets_apply`]).
    pub shape_buckets: ShapeBuckets,
}

impl RuntimeSettings {
    /// Whether a stage that runs on `provider` pads its calls to shape buckets: `auto` does on
    /// CUDA and TensorRT, where every new input shape costs new convolution plans (and a CUDA
    /// graph is per shape), and not on the CPU, where a padded frame is only more work.
    pub fn shape_buckets_apply(&self, provider: crate::vocab::ProviderKind) -> bool {
        match self.shape_buckets {
            ShapeBuckets::On => true,
            ShapeBuckets::Off => false,
            ShapeBuckets::Auto => provider != crate::vocab::ProviderKind::Cpu,
        }
    }
}

/// `runtime.shape_buckets`: pad the DiT's and HiFT's calls to a few fixed lengths. Unlike
/// [`CpuSwitch`], `auto` means "on a GPU provider" ([`RuntimeSettings::shape_buckets_apply`]).
pub type ShapeBuckets = AutoSwitch;

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
pub type CpuSwitch = AutoSwitch;

/// `auto`, `on` or `off`: what `auto` means is decided where the setting is read (one rule per
/// key: [`CpuSwitch`], [`ShapeBuckets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoSwitch {
    Auto,
    On,
    Off,
}

impl AutoSwitch {
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

/// `engine.llm_kv`: how the LLM keeps its key/value cache between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmKv {
    /// `static` where the LLM runs on CUDA or TensorRT and the model has the `llm_step` graph;
    /// `growing` elsewhere (on the CPU, attending over the whole preallocated buffer costs more
    /// than the copies it saves; [`EngineSettings::llm_kv_static`]).
    Auto,
    /// The `llm_step` graph: every row's cache in a preallocated slot, written in place; fixed
    /// shapes per batch-size bucket (`engine::llm_slots`).
    Static,
    /// The `llm` graph: one shared, left-padded cache that every step returns one column longer.
    Growing,
}

impl LlmKv {
    pub const NAMES: &'static str = "auto, static, growing";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "static" => Some(Self::Static),
            "growing" => Some(Self::Growing),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Static => "static",
            Self::Growing => "growing",
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
    /// How Markdown and chat text is spoken (`crate::frontend::markdown`); a request may turn
    /// its `markdown` off (`crate::request::Normalization`).
    pub markdown: MarkdownSettings,
    /// `text.numbers`: the official frontend spells numbers out (the wetext normaliser, English
    /// digit runs as words); false: the digits reach the model as written. A request may turn it
    /// off or on (`crate::request::Normalization`).
    pub numbers: bool,
    /// `text.lexicon`: the pronunciation lexicon file (`crate::frontend::lexicon`), if any.
    pub lexicon: Option<PathBuf>,
}

/// `text.markdown`, `text.code_blocks`, `text.symbols`, `text.urls`, `text.phone`, `text.units`:
/// the text layer before the official frontend (`crate::frontend::markdown`). With `enabled`
/// false the whole layer is off (the text as written), its other categories with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MarkdownSettings {
    /// Read Markdown as a person would (marks dropped, blocks end sentences …); off: the text
    /// reaches the official frontend as written.
    pub enabled: bool,
    pub code_blocks: CodeBlocks,
    pub symbols: Symbols,
    /// Bare URLs, e-mail addresses and file paths read out ("example dot com"); false: as written.
    pub urls: bool,
    /// Phone numbers read digit by digit in groups (`crate::frontend::readings`); false: as written.
    pub phone: bool,
    /// Unit abbreviations after a number read as words ("5 km" → "5 kilometers"); false: as written.
    pub units: bool,
}

impl MarkdownSettings {
    /// The default: Markdown read, code blocks stood in for, emoji dropped, URLs and units read,
    /// phone numbers left to the official normaliser (docs/text.md says why).
    pub const ON: MarkdownSettings =
        MarkdownSettings { enabled: true, code_blocks: CodeBlocks::StandIn, symbols: Symbols::Drop, urls: true, phone: false, units: true };
}

/// What a fenced code block becomes in speech.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeBlocks {
    /// A short spoken stand-in ("rust code block").
    #[default]
    StandIn,
    /// Nothing.
    Skip,
    /// Its text, as written.
    Read,
}

impl CodeBlocks {
    pub const ALLOWED: &'static str = "\"stand-in\", \"skip\", \"read\"";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stand-in" => Some(CodeBlocks::StandIn),
            "skip" => Some(CodeBlocks::Skip),
            "read" => Some(CodeBlocks::Read),
            _ => None,
        }
    }
}

/// What emoji (and the pictographic symbols around them) become in speech.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Symbols {
    /// Dropped.
    #[default]
    Drop,
    /// Said by their Unicode names ("party popper"); one without a name is dropped.
    Name,
    /// Left as written (the model gets them).
    Keep,
}

impl Symbols {
    pub const ALLOWED: &'static str = "\"drop\", \"name\", \"keep\"";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "drop" => Some(Symbols::Drop),
            "name" => Some(Symbols::Name),
            "keep" => Some(Symbols::Keep),
            _ => None,
        }
    }
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
    /// Longest prompt transcript or instruction (in characters): `app::voices::check_prompt_text`.
    pub max_prompt_text_chars: usize,
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
    /// Seconds without requests after which the engine drops the model (its sessions) until the
    /// next request loads it again; 0 = never (`engine::residency`).
    pub idle_unload_s: u64,
    /// `engine.llm_kv`: the growing cache (graph `llm`) or the static slot cache (graph `llm_step`).
    pub llm_kv: LlmKv,
    /// `engine.llm_max_positions`: columns per slot the static cache starts with (grown by
    /// doubling when a row needs more).
    pub llm_max_positions: usize,
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

    /// Whether the LLM runs the static slot cache (graph `llm_step`) rather than the growing one
    /// (graph `llm`), for an LLM whose first provider is `llm_provider` on a model that has
    /// (`has_step`) or lacks the `llm_step` graph. `static` asked for on a model without it is an
    /// error naming the key and the fix. `auto`: static on CUDA/TensorRT where the graph exists
    /// (fixed shapes, no per-step reallocation: the launch-bound GPU decode step), growing on the
    /// CPU, where attending over every preallocated column costs more than the copies it saves.
    pub fn llm_kv_static(&self, llm_provider: crate::vocab::ProviderKind, has_step: bool) -> crate::Result<bool> {
        match self.llm_kv {
            LlmKv::Growing => Ok(false),
            LlmKv::Auto => Ok(has_step && llm_provider != crate::vocab::ProviderKind::Cpu),
            LlmKv::Static if has_step => Ok(true),
            LlmKv::Static => Err(crate::Error::Config(
                "engine.llm_kv = \"static\" needs the llm_step graph, which this model folder lacks: re-export the model with cosy_export (or set engine.llm_kv = \"auto\")".into(),
            )),
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
    /// The server tells each sentence's text exactly as it was tokenised for the model, with its
    /// token ids (`debug.model_text` events on the WebSocket, `cosy-model-text` on Wyoming): for
    /// checking what the text layer made of a stream.
    pub model_text: bool,
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
                tensorrt_rtx_library: None,
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
                ort_profile: None,
                shape_buckets: ShapeBuckets::Auto,
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
            limits: LimitSettings { max_text_chars: 5000, max_prompt_text_chars: 2000 },
            engine: EngineSettings { max_batch: 16, max_in_flight: 16, max_queue: 64, dit_max_batch: 8, prompt_cache_bytes: 2 << 30, prompt_cache: CpuSwitch::Auto, prompt_cache_disk_bytes: 4 << 30, first_audio_priority: CpuSwitch::Auto, file_concurrency: 4, idle_unload_s: 0, llm_kv: LlmKv::Growing, llm_max_positions: 2048 },
            text: TextSettings { normalizer: NormalizerChoice::Auto, markdown: MarkdownSettings::ON, numbers: true, lexicon: None },
            debug: DebugSettings::default(),
            source_file: None,
            sources: Sources::default(),
        }
    }
}

impl Config {
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
