//! The `cosy` command line: argument parsing and thin handlers over the library.

mod book;
pub mod profile_report;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use cosy::config::{Config, KeyTable, LoadOptions};
use cosy::error::{Error, StorageFault};
use crate::encode::FileFormat;

/// CosyVoice3 text-to-speech over ONNX Runtime.
#[derive(Debug, Parser)]
#[command(name = "cosy", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes. They override config.toml and the COSY_* environment.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Config file (default: $COSY_CONFIG, else ./config.toml, else
    /// $XDG_CONFIG_HOME/cosy/config.toml, else /etc/cosy/config.toml, the first that exists).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Exported model folder (model.dir).
    #[arg(long, global = true, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Execution providers in priority order, e.g. `tensorrt,cuda,cpu` or `tensorrt-rtx,cpu` (runtime.providers).
    #[arg(long, global = true, value_name = "LIST")]
    pub provider: Option<String>,
    /// Precision for every stage: fp32, fp16, bf16 or int8 (runtime.precision).
    #[arg(long, global = true, value_name = "P")]
    pub precision: Option<String>,
    /// Set any config key, e.g. `--set stages.dit.precision=fp16` (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// More log output (-v info, -vv debug, -vvv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Less log output (-q errors only, -qq nothing).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub quiet: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Speak text aloud: streaming synthesis played live (first audio while the LLM still decodes).
    Say(SayArgs),
    /// Synthesise text to a wav file (or raw PCM on stdout).
    File(FileArgs),
    /// Time each stage (table, --json, --trace); --matrix compares providers and precisions.
    Profile(ProfileArgs),
    /// Saved voices: a prompt recording prepared once, used with --voice NAME.
    Voice {
        #[command(subcommand)]
        action: VoiceAction,
    },
    /// Serve the OpenAI-compatible speech API over HTTP (docs/server.md): one loaded model for
    /// all clients, until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Check the library, providers, GPUs, model folder and engine cache.
    Doctor {
        /// Skip hashing files and opening graphs.
        #[arg(long)]
        quick: bool,
    },
    /// Manage the TensorRT engine cache and the optimised-graph cache of CPU sessions.
    Engines {
        #[command(subcommand)]
        action: EnginesAction,
    },
    /// The models cosy knows (the user's models folder): list, add an exported folder, choose
    /// the default.
    Model {
        #[command(subcommand)]
        action: ModelAction,
    },
    /// The Linux screen reader's speech server: speak through cosy (`spd-say -o cosy`, Orca).
    #[command(name = "speech-dispatcher")]
    SpeechDispatcher {
        #[command(subcommand)]
        action: SpeechDispatcherAction,
    },
    /// The pronunciation lexicon (text.lexicon; docs/text.md).
    Lexicon {
        #[command(subcommand)]
        action: LexiconAction,
    },
    /// Print a shell completion script.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on standard output; scripts/install.sh installs it as cosy.1.
    #[command(hide = true)]
    Manpage,
}

#[derive(Debug, Subcommand)]
pub enum LexiconAction {
    /// Check a lexicon file: its format, and that its phonemes are in the model's tokenizer (one
    /// line per bad entry; exit 1 if any).
    Check {
        /// The lexicon (TOML).
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelAction {
    /// The models folder's models (size, precisions, default) and the one in use.
    List,
    /// Add an exported model folder (scripts/export.sh's output) as NAME: copied into the models
    /// folder (or linked with --link). The first model added becomes the default.
    Add {
        /// Name for `cosy model use` (letters, digits, '.', '_', '-').
        name: String,
        /// The exported folder (with manifest.json).
        path: PathBuf,
        /// Link to the folder instead of copying it (it must stay where it is).
        #[arg(long)]
        link: bool,
        /// Replace a model of the same name.
        #[arg(long)]
        force: bool,
        /// Also make it the default.
        #[arg(long)]
        default: bool,
    },
    /// Make NAME the default model (used when no config file, COSY_MODEL or --model names one).
    Use {
        name: String,
    },
}

/// How the voice is given (shared by `file`, `say` and `profile`).
#[derive(Debug, Args)]
pub struct VoiceArgs {
    /// Prompt recording whose voice to use (wav/flac/mp3/ogg, ≥ 16 kHz, ≤ 30 s).
    #[arg(long, value_name = "FILE")]
    pub prompt_wav: Option<PathBuf>,
    /// Transcript of the prompt recording (zero-shot); without it the voice is cross-lingual.
    #[arg(long, value_name = "TEXT")]
    pub prompt_text: Option<String>,
    /// Style or dialect instruction (uses the prompt recording's or saved voice's voice).
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_text")]
    pub instruct: Option<String>,
    /// A saved voice (`cosy voice add`) instead of --prompt-wav/--prompt-text.
    #[arg(long = "voice", value_name = "NAME", conflicts_with_all = ["prompt_wav", "prompt_text"])]
    pub name: Option<String>,
}

/// `--name-template`'s default (its extension follows `--format`: `file_name_template`).
const DEFAULT_NAME_TEMPLATE: &str = "{index:03}.wav";

/// Arguments of `cosy file`.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The text to say; `-` reads it from stdin. Omit it when using --input.
    pub text: Option<String>,
    /// One utterance per line (`-` = stdin); each line becomes its own file.
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub voice: VoiceArgs,
    /// Output file (`-` = stdout); with --input, the output folder. Default: out.wav, or out.EXT for --format mp3, opus or flac (folder: .).
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// File name per --input line; `{index}` or `{index:03}` (width at most 9) is the 0-based
    /// number of the line among the non-empty ones.
    #[arg(long, value_name = "TEMPLATE", default_value = DEFAULT_NAME_TEMPLATE)]
    pub name_template: String,
    /// Benchmark/test only, NOT the official behaviour: mask the LLM's stop ids until N tokens per
    /// sentence, so a model that stops early still produces N tokens.
    #[arg(long, value_name = "N", hide = true, allow_negative_numbers = true, value_parser = parse_count)]
    pub min_tokens: Option<usize>,
    /// Test only (the test hook `max_tokens`, refused unless `debug.test_hooks = true`): end each
    /// sentence after N speech tokens, as the model's stop token would.
    #[arg(long, value_name = "N", hide = true, allow_negative_numbers = true, value_parser = parse_count)]
    pub max_tokens: Option<usize>,
    /// Speaking rate from 0.5 to 2.0 (mel time-stretch), e.g. 1.2 faster, 0.8 slower. Not with
    /// --stream.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub speed: f64,
    /// Sampling seed, an integer from 0 to 18446744073709551615 (default: sampling.seed from the
    /// config).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Use the streaming chunk schedule (chunks are written as they come for --format pcm).
    /// Default: streaming.enabled from the config.
    #[arg(long, conflicts_with = "no_stream")]
    pub stream: bool,
    /// Use the offline (whole-sentence) schedule even when streaming.enabled is true.
    #[arg(long)]
    pub no_stream: bool,
    /// Output format: wav16 (= wav), wavf32, pcm (raw 16-bit little-endian mono, stdout by
    /// default), mp3, opus (Ogg Opus) or flac. Default: by the extension of -o (.wav, .pcm/.raw,
    /// .mp3, .opus/.ogg, .flac), else wav16.
    #[arg(long, value_parser = ["wav16", "wavf32", "wav", "pcm", "mp3", "opus", "flac"])]
    pub format: Option<String>,
    /// Write every stage's intermediates (.npy, golden names) into this folder.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Pass the text to the tokenizer as is: no normalisation, no sentence splitting.
    #[arg(long)]
    pub no_text_frontend: bool,
    #[command(flatten)]
    pub normalize: NormalizeArgs,
    /// The text is SSML, `<speak>` or not (without it: SSML only when it starts with `<speak>`; docs/text.md).
    #[arg(long)]
    pub ssml: bool,
    /// Print the text exactly as the model gets it, one sentence a line (a line break inside a
    /// sentence written `\\n`), and stop: nothing is synthesised.
    #[arg(long, conflicts_with_all = ["dump", "bistream"])]
    pub show_text: bool,
    /// With `-`: text-in streaming, standard input read as it arrives and spoken while it comes
    /// (the same audio `cosy say -` plays). Needs a voice with a transcript or an instruction.
    #[arg(long)]
    pub bistream: bool,
    /// With --bistream: normalise each settled sentence instead of the exact text.
    #[arg(long, requires = "bistream")]
    pub normalize_sentences: bool,
    /// Load the model here even when a `cosy serve` runs (say.server, COSY_SERVER).
    #[arg(long)]
    pub local: bool,
    /// A book or long document to say (EPUB, Markdown or plain text, told apart by content), into
    /// one file with chapter marks (docs/long-form.md). A TEXT that names an existing .epub, .md,
    /// .markdown or .txt file is read as a book too.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["text", "input", "bistream", "dump", "show_text"])]
    pub book: Option<PathBuf>,
    /// The book's job folder: each finished sentence is kept there, and the same command run
    /// again continues where it stopped. Default: OUTPUT.cosy-job beside the output, removed when
    /// the book is done.
    #[arg(long, value_name = "DIR")]
    pub job: Option<PathBuf>,
    /// With a book: `chapters` writes one file per chapter into the folder -o names, with an M3U8
    /// playlist.
    #[arg(long, value_name = "HOW", value_parser = ["chapters"])]
    pub split: Option<String>,
    /// With a book: captions, each sentence's start and end from the audio's sample counts; the
    /// format by the extension (.srt, .vtt, .json).
    #[arg(long, value_name = "FILE")]
    pub captions: Option<PathBuf>,
    /// With a book: sentences said at once (batched; faster on a GPU). Above 1, a resumed job
    /// matches an uninterrupted one in its sentences and lengths but not always to the bit.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub in_flight: u16,
}

/// The normalisation switches of `say` and `file` (docs/text.md, "The switches").
#[derive(Debug, Args)]
pub struct NormalizeArgs {
    /// Give the text to the frontend as written, not read as Markdown (text.markdown; docs/text.md);
    /// the same as --normalize markdown=off.
    #[arg(long)]
    pub no_markdown: bool,
    /// Normalisation switches by category, CATEGORY=on|off separated by commas (repeatable):
    /// markdown, numbers, urls, phone, units; symbols=drop|name|keep. E.g. numbers=off,urls=off.
    #[arg(long, value_name = "SWITCHES")]
    pub normalize: Vec<String>,
}

impl NormalizeArgs {
    /// The request's switches these flags give (unset: as configured).
    pub fn normalization(&self) -> Result<cosy::request::Normalization, Error> {
        let mut n = cosy::request::Normalization::default();
        for spec in &self.normalize {
            n.set_from(spec)?;
        }
        if self.no_markdown {
            n.markdown = Some(false);
        }
        Ok(n)
    }
}

/// A request's switches as the HTTP API's `normalization` object (`None` when all are unset).
fn normalization_json(n: &cosy::request::Normalization) -> Option<serde_json::Value> {
    let mut object = serde_json::Map::new();
    for (name, switch) in [("markdown", n.markdown), ("numbers", n.numbers), ("urls", n.urls), ("phone", n.phone), ("units", n.units)] {
        if let Some(on) = switch {
            object.insert(name.into(), on.into());
        }
    }
    if let Some(symbols) = n.symbols {
        let name = match symbols {
            cosy::config::Symbols::Drop => "drop",
            cosy::config::Symbols::Name => "name",
            cosy::config::Symbols::Keep => "keep",
        };
        object.insert("symbols".into(), name.into());
    }
    (!object.is_empty()).then_some(serde_json::Value::Object(object))
}

/// Arguments of `cosy say`.
#[derive(Debug, Args)]
pub struct SayArgs {
    /// The text to say; `-` reads it from stdin.
    pub text: Option<String>,
    #[command(flatten)]
    pub voice: VoiceArgs,
    /// Speaking rate from 0.5 to 2.0 (mel time-stretch). Other than 1, each sentence is
    /// synthesised whole before it plays (the streaming schedule cannot stretch).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub speed: f64,
    /// Sampling seed, an integer from 0 to 18446744073709551615 (default: sampling.seed from the
    /// config).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Pass the text to the tokenizer as is: no normalisation, no sentence splitting.
    #[arg(long)]
    pub no_text_frontend: bool,
    #[command(flatten)]
    pub normalize: NormalizeArgs,
    /// The text is SSML, `<speak>` or not (without it: SSML only when it starts with `<speak>`; docs/text.md).
    #[arg(long)]
    pub ssml: bool,
    /// With `-`: normalise each settled sentence of the streamed text (numbers, symbols) instead
    /// of speaking it exactly as written (the official text-in streaming normalises nothing).
    #[arg(long)]
    pub normalize_sentences: bool,
    /// Output device (see --list-devices); default: output.device from the config.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// List the output devices and exit.
    #[arg(long)]
    pub list_devices: bool,
    /// Play each chunk as soon as it comes, even when synthesis runs slower than real time and
    /// playback stutters (by default playback waits until what is buffered lasts).
    #[arg(long)]
    pub no_buffering: bool,
    /// Debug/test: write one line per event (LLM tokens, chunks, first device samples) to PATH.
    #[arg(long, value_name = "PATH", hide = true)]
    pub event_log: Option<PathBuf>,
    /// Benchmark/test only, NOT the official behaviour: mask the LLM's stop ids until N tokens per
    /// sentence.
    #[arg(long, value_name = "N", hide = true, allow_negative_numbers = true, value_parser = parse_count)]
    pub min_tokens: Option<usize>,
    /// Test hook (needs `--set debug.test_hooks=true`): after its first chunk the request waits
    /// until it is stopped (a test of stopping cosy from outside).
    #[arg(long, hide = true)]
    pub hold_after_first_audio: bool,
    /// Test only (needs debug.test_hooks): slow synthesis down to this real-time factor.
    #[arg(long, value_name = "RTF", hide = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub slow_to_rtf: Option<u32>,
    /// Load the model here even when a `cosy serve` runs (say.server, COSY_SERVER).
    #[arg(long)]
    pub local: bool,
}

/// `cosy speech-dispatcher …` (docs/desktop.md).
#[derive(Debug, Subcommand)]
pub enum SpeechDispatcherAction {
    /// Print the output module's configuration (speech-dispatcher's generic module running
    /// `cosy say`, with the saved voices) on standard output.
    Config,
    /// Write the module's configuration into the user's speech-dispatcher folder and register
    /// it there (run it again after adding or removing voices).
    Install {
        /// speech-dispatcher's configuration folder (default: $XDG_CONFIG_HOME/speech-dispatcher).
        #[arg(long, value_name = "DIR")]
        config_dir: Option<PathBuf>,
    },
    /// Remove the module from the user's speech-dispatcher folders.
    Remove,
}

/// Arguments of `cosy profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The text to synthesise (default: a built-in sentence); `-` reads stdin.
    pub text: Option<String>,
    /// Read the text from this file instead.
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub voice: VoiceArgs,
    /// Profile the streaming schedule (reports time to first audio of the first chunk).
    /// Default: streaming.enabled from the config.
    #[arg(long, conflicts_with = "no_stream")]
    pub stream: bool,
    /// Profile the offline schedule even when streaming.enabled is true.
    #[arg(long)]
    pub no_stream: bool,
    /// Measured runs, at most 1000 (the median run's breakdown is reported; p50/p95 pool every run).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = parse_runs)]
    pub runs: usize,
    /// Unmeasured runs first (allocator and thread-pool warm-up), at most 100.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = parse_warmup)]
    pub warmup: usize,
    /// Write the report as JSON to this file (`-` = stdout, the table then goes to stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of the measured runs.
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Benchmark only: mask stop tokens until N speech tokens and stop there (random weights).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_count)]
    pub min_tokens: Option<usize>,
    /// Sampling seed, an integer from 0 to 18446744073709551615 (default: sampling.seed from the
    /// config).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Pass the text to the tokenizer as is: no normalisation, no sentence splitting.
    #[arg(long)]
    pub no_text_frontend: bool,
    /// Run over several provider × precision settings and print one table.
    #[arg(long)]
    pub matrix: bool,
    /// The settings of --matrix, e.g. `cpu:fp32,cpu:fp16,cuda:fp16,tensorrt:fp16`.
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "matrix")]
    pub settings: Vec<String>,
}

/// Arguments of `cosy serve` (every other setting is in `[server]` of the config, or `--set`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080, or 0.0.0.0:8080 in a container (server.bind).
    /// Port 0 picks a free port; the address is printed as `cosy serve: listening on http://...`.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Also serve the Wyoming protocol (Home Assistant; docs/wyoming.md) at this address, e.g.
    /// 127.0.0.1:10200, 0.0.0.0:10200, or a bare port for the loopback (wyoming.bind). The address
    /// is printed as `cosy serve: wyoming on tcp://...`.
    #[arg(long, value_name = "ADDR")]
    pub wyoming: Option<String>,
    /// Announce the Wyoming server over mDNS/zeroconf (`_wyoming._tcp`) so that Home Assistant
    /// finds it, as NAME ("cosy" when none is given) (wyoming.zeroconf). Needs --wyoming.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "true")]
    pub zeroconf: Option<String>,
}

/// `--seed`: clap's own message for `-1` would suggest `-- -1` (which makes -1 the text); this
/// one gives the range.
fn parse_seed(s: &str) -> Result<u64, String> {
    s.trim().parse::<u64>().map_err(|_| format!("{s:?} is not a seed: give an integer from 0 to {}", u64::MAX))
}

/// A count (`--runs`, `--warmup`): an integer >= 0, said so for `-1` too.
fn parse_count(s: &str) -> Result<usize, String> {
    s.trim().parse::<usize>().map_err(|_| format!("{s:?} is not a count: give an integer >= 0"))
}

/// The most measured runs `cosy profile --runs` takes: p95 over 1000 runs is as exact as it gets;
/// more would only run for hours (each run is a whole synthesis).
pub const MAX_PROFILE_RUNS: usize = 1000;
/// The most warm-up runs `cosy profile --warmup` takes: allocators and thread pools are warm after
/// one or two; a million ran until killed.
pub const MAX_WARMUP_RUNS: usize = 100;

/// `--runs`: a count of at most [`MAX_PROFILE_RUNS`].
fn parse_runs(s: &str) -> Result<usize, String> {
    parse_count_at_most(s, MAX_PROFILE_RUNS)
}

/// `--warmup`: a count of at most [`MAX_WARMUP_RUNS`].
fn parse_warmup(s: &str) -> Result<usize, String> {
    parse_count_at_most(s, MAX_WARMUP_RUNS)
}

/// A count of at most `cap`, the cap named when it is passed.
fn parse_count_at_most(s: &str, cap: usize) -> Result<usize, String> {
    let n = parse_count(s)?;
    if n > cap {
        return Err(format!("{n} is more than the cap of {cap}; give at most {cap}"));
    }
    Ok(n)
}

/// The text `cosy profile` speaks when given none.
pub const PROFILE_TEXT: &str = "The quick brown fox jumps over the lazy dog, and then it runs back home across the wide green field.";

#[derive(Debug, Subcommand)]
pub enum VoiceAction {
    /// Prepare a voice from a recording and its transcript and save it as NAME.
    Add {
        /// Name to use with --voice (letters, digits, '.', '_', '-').
        name: String,
        /// The recording (wav/flac/mp3/ogg, ≥ 16 kHz, ≤ 30 s).
        #[arg(long, value_name = "FILE")]
        wav: PathBuf,
        /// What is said in the recording.
        #[arg(long, value_name = "TEXT")]
        text: String,
        /// Replace a voice of the same name.
        #[arg(long)]
        force: bool,
        /// Also make it the default voice (used when neither --voice nor --prompt-wav is given).
        #[arg(long)]
        default: bool,
        /// Its pronunciation lexicon (TOML, as text.lexicon's; docs/text.md), copied beside the
        /// voice and applied over the global one.
        #[arg(long, value_name = "FILE")]
        lexicon: Option<PathBuf>,
    },
    /// List the saved voices (the default one is marked).
    List,
    /// Delete a saved voice.
    Rm {
        name: String,
    },
    /// Show the default voice, or make NAME the default (`--clear` forgets it).
    Default {
        /// The saved voice to use when neither --voice nor --prompt-wav is given.
        #[arg(conflicts_with = "clear")]
        name: Option<String>,
        /// Forget the voices folder's default voice.
        #[arg(long)]
        clear: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum EnginesAction {
    /// Build engines for every stage (or --stage) at the configured precision (or --precision).
    Build {
        #[arg(long = "stage", value_name = "STAGE")]
        stages: Vec<String>,
        /// Precisions to build (repeatable): fp32, fp16, bf16 (int8 has no TensorRT engine).
        #[arg(long = "precisions", value_name = "P", value_delimiter = ',')]
        precisions: Vec<String>,
    },
    /// List cache entries (TensorRT engines and optimised CPU graphs) with their keys, sizes and state.
    List,
    /// Remove stale, unfinished and corrupt entries of both caches (all with --all).
    Clean {
        #[arg(long)]
        all: bool,
    },
}

impl Cli {
    /// Parses the process's arguments (clap prints usage errors and exits with 2), keeping every
    /// `--set`: [`Cli::parse_keeping_sets`].
    pub fn parse_args() -> Cli {
        Cli::parse_keeping_sets(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `args` (the program name first). clap keeps only one level's occurrences of a
    /// global option, so in `cosy --set a=1 profile --set b=2` the first would be lost without a
    /// word; every `--set KEY=VALUE` / `--set=KEY=VALUE` before a `--` counts here, in order (a
    /// later one for the same key wins, as in the config).
    pub fn parse_keeping_sets<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let mut cli = <Cli as clap::Parser>::try_parse_from(&args)?;
        let mut sets = Vec::new();
        let mut rest = args.iter().skip(1).map(|a| a.to_string_lossy());
        while let Some(arg) = rest.next() {
            if arg == "--" {
                break;
            }
            if arg == "--set" {
                sets.extend(rest.next().map(|v| v.into_owned()));
            } else if let Some(kv) = arg.strip_prefix("--set=") {
                sets.push(kv.to_string());
            }
        }
        cli.global.set = sets;
        Ok(cli)
    }

    /// The configuration from file, environment and these flags, with the keys of the binary's
    /// front ends (`front_ends`: the server's `[server]` and `[wyoming]`, `say`'s `[say]`, which a shared config
    /// file may hold whatever the command).
    pub fn load_config(&self, front_ends: &mut [&mut dyn KeyTable]) -> cosy::Result<Config> {
        Config::load_with(&self.load_options()?, front_ends)
    }

    /// What [`Cli::load_config`] loads: the process's environment, the config file flag and every
    /// flag that stands for a setting (`--model`, `--provider`, `--precision`, each `--set`), in
    /// the order the config's precedence needs.
    fn load_options(&self) -> cosy::Result<LoadOptions> {
        let mut opts = LoadOptions::from_process_env();
        opts.config_file = self.global.config.clone();
        opts.default_file = Some(PathBuf::from(cosy::paths::PROJECT_CONFIG));
        opts.user_files = true;
        let g = &self.global;
        if let Some(m) = &g.model {
            opts.flags.push(("model.dir".into(), m.to_string_lossy().into_owned()));
        }
        if let Some(p) = &g.provider {
            opts.flags.push(("runtime.providers".into(), p.clone()));
        }
        if let Some(p) = &g.precision {
            opts.flags.push(("runtime.precision".into(), p.clone()));
        }
        for kv in &g.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("--set {kv:?}: expected KEY=VALUE")))?;
            opts.flags.push((k.trim().to_string(), v.to_string()));
        }
        Ok(opts)
    }

    /// The log filter from -v/-q (`COSY_LOG` overrides it). A server logs its requests (info)
    /// by default; the other commands only warnings.
    pub fn log_filter(&self) -> &'static str {
        let base = i32::from(matches!(self.command, Command::Serve(_)));
        match base + (self.global.verbose as i32) - (self.global.quiet as i32) {
            i32::MIN..=-2 => "off",
            -1 => "error",
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Completions { shell } = &cli.command {
        let mut cmd = Cli::command();
        clap_complete::generate(*shell, &mut cmd, "cosy", &mut std::io::stdout());
        return Ok(());
    }
    if let Command::Manpage = &cli.command {
        let mut out = Vec::new();
        clap_mangen::Man::new(Cli::command()).render(&mut out)?;
        std::io::stdout().write_all(&out)?;
        return Ok(());
    }
    // The binary's keys (`[server]`, `[wyoming]`, `[say]`) are read with the library's whatever the
    // command: one config file serves every command.
    let mut server = crate::serve::settings::Settings::default();
    let config = cli.load_config(&mut [&mut server.keys()])?;
    match &cli.command {
        Command::File(args) => file_command(&config, &server, args).map_err(name_the_flag),
        Command::Say(args) => say_command(&config, &server, args, cli.global.quiet == 0).map_err(name_the_flag),
        Command::Voice { action } => voice_command(&config, action).map_err(|e| name_the_flag_with(e, voice_flag_of)),
        Command::Profile(args) => profile_command(&config, args).map_err(name_the_flag),
        Command::Doctor { quick } => {
            let report = crate::doctor::run(&config, &crate::doctor::DoctorOptions { quick: *quick });
            print!("{}", report.render());
            std::io::stdout().flush().ok();
            let n = report.problems.len();
            if let Some(first) = report.problems.into_iter().next() {
                // Keep the first problem's kind, so the exit code says what sort of trouble it is.
                return Err(anyhow::Error::new(first).context(format!("doctor found {n} problem(s); first")));
            }
            Ok(())
        }
        Command::Engines { action } => engines(&config, action),
        Command::Model { action } => model_command(&config, action).map_err(name_the_flag),
        Command::SpeechDispatcher { action } => match action {
            SpeechDispatcherAction::Config => crate::speechd::print_config(&config),
            SpeechDispatcherAction::Install { config_dir } => crate::speechd::install_for_user(&config, config_dir.as_deref()),
            SpeechDispatcherAction::Remove => crate::speechd::remove_for_user(),
        },
        Command::Lexicon { action: LexiconAction::Check { file } } => {
            let bad = cosy::frontend::lexicon::check_file(file, &config.model_dir)?;
            for line in &bad {
                println!("{}: {line}", file.display());
            }
            match bad.len() {
                0 => Ok(()),
                n => Err(anyhow::anyhow!("{}: {n} entr{} with phonemes the tokenizer does not have", file.display(), if n == 1 { "y" } else { "ies" })),
            }
        }
        Command::Completions { .. } | Command::Manpage => Ok(()),
        Command::Serve(args) => crate::serve::run(
            config,
            server,
            crate::serve::ServeFlags { bind: args.bind.clone(), wyoming: args.wyoming.clone(), zeroconf: args.zeroconf.clone() },
        ),
    }
}

fn engines(config: &Config, action: &EnginesAction) -> anyhow::Result<()> {
    use crate::doctor::human_bytes;
    match action {
        EnginesAction::Build { stages, precisions } => {
            let precisions = precisions
                .iter()
                .map(|p| {
                    cosy::vocab::Precision::parse(p)
                        .ok_or_else(|| Error::Config(format!("--precisions {p:?}: allowed: {}", cosy::vocab::Precision::ALLOWED)))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} ({elapsed})")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            let built = crate::engines::build(config, stages, &precisions, |done, total, label| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                bar.set_message(format!("building {label}"));
            });
            bar.finish_and_clear();
            for b in built? {
                println!("{} {}  {}  {}", b.stage, b.precision, b.dir.display(), human_bytes(b.bytes));
            }
            Ok(())
        }
        EnginesAction::List => {
            let entries = crate::engines::list(config)?;
            if entries.is_empty() {
                println!("engine cache {} is empty", config.runtime.engine_cache.display());
                println!(
                    "optimised-graph cache {} is empty{}",
                    config.graph_cache_folder().display(),
                    if config.runtime.graph_cache_enabled { "" } else { " (and off: runtime.graph_cache_enabled = false)" }
                );
            }
            for e in entries {
                let name = e.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let state = match (&e.state, e.current) {
                    (cosy::runtime::EntryState::Valid, Some(true)) => "valid".to_string(),
                    (cosy::runtime::EntryState::Valid, Some(false)) => "stale".to_string(),
                    (cosy::runtime::EntryState::Valid, None) => "valid (currency unknown)".to_string(),
                    (cosy::runtime::EntryState::Incomplete, _) if e.in_progress => "being written".to_string(),
                    (cosy::runtime::EntryState::Incomplete, _) => "incomplete".to_string(),
                    (cosy::runtime::EntryState::Corrupt(why), _) => format!("corrupt: {why}"),
                };
                let key = e.summary.as_ref().map_or_else(String::new, |s| format!("  [{s}]"));
                println!("{name}  {}  {}  {state}{key}", e.kind.as_str(), human_bytes(e.bytes));
            }
            Ok(())
        }
        EnginesAction::Clean { all } => {
            let removed = crate::engines::clean(config, *all)?;
            for d in &removed {
                println!("removed {}", d.display());
            }
            println!("{} entr{} removed", removed.len(), if removed.len() == 1 { "y" } else { "ies" });
            Ok(())
        }
    }
}

/// The command line's name for a request parameter of an input error ([`Error::Input`]'s `param`,
/// as the HTTP API names it).
fn flag_of(param: &str) -> Option<&'static str> {
    Some(match param {
        "speed" => "--speed",
        "voice" => "--voice",
        "ref_audio" => "--prompt-wav",
        "ref_text" => "--prompt-text",
        "instructions" => "--instruct",
        "seed" => "--seed",
        "min_tokens" => "--min-tokens",
        _ => return None,
    })
}

/// `cosy voice`'s names for the same parameters: its commands take the voice as the argument
/// NAME (`voice add NAME`, `voice rm NAME`, `voice default NAME`), never `--voice`; `add` takes
/// the recording and its transcript as `--wav` and `--text`.
fn voice_flag_of(param: &str) -> Option<&'static str> {
    match param {
        "ref_audio" => Some("--wav"),
        "ref_text" => Some("--text"),
        "voice" => Some("NAME"),
        other => flag_of(other),
    }
}

/// An input error says which flag it is about: the library's message (the same words every front
/// end shows), prefixed with the flag (`--speed: speed 3 is out of range: …`).
fn name_the_flag(err: anyhow::Error) -> anyhow::Error {
    name_the_flag_with(err, flag_of)
}

/// [`name_the_flag`] with a command's own flag names.
fn name_the_flag_with(err: anyhow::Error, flag_of: fn(&str) -> Option<&'static str>) -> anyhow::Error {
    match err.downcast::<Error>() {
        Ok(Error::Input { code: code @ cosy::error::InputCode::NoVoice, param, message }) => {
            Error::Input { code, param, message: format!("--voice NAME or --prompt-wav FILE: {message}") }.into()
        }
        Ok(Error::Input { code, param: Some(param), message }) => match flag_of(param) {
            Some(flag) => Error::Input { code, param: Some(param), message: format!("{flag}: {message}") }.into(),
            None => Error::Input { code, param: Some(param), message }.into(),
        },
        Ok(other) => other.into(),
        Err(other) => other,
    }
}

/// The exit code for an error: 2 for usage, configuration, model and input problems (and a folder
/// that cannot be written), 130 for
/// work that was stopped (as a shell reports SIGINT), 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Error>() {
            return match e {
                Error::Config(_) | Error::Model { .. } | Error::Input { .. } => 2,
                // A provider that was asked for (runtime.providers, --provider) and cannot run
                // here, without runtime.allow_fallback: a setting to change, like the above.
                Error::Provider { .. } => 2,
                // A folder cosy was told to use (voices.dir, -o, a cache) it may not write: a
                // setting to change, like a configuration error. A full disk is not.
                Error::Storage { fault: StorageFault::ReadOnly | StorageFault::Denied, .. } => 2,
                // As a shell reports a process ended by SIGINT.
                Error::Cancelled => 130,
                _ => 1,
            };
        }
    }
    1
}

/// One line: the error and its causes joined with `: `, newlines folded.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in err.chain() {
        // What stopped the work, when the command line knows: Ctrl-C.
        let t = match c.downcast_ref::<Error>() {
            Some(Error::Cancelled) if crate::interrupt::requested() => crate::interrupt::STOPPED.to_string(),
            _ => c.to_string(),
        };
        // thiserror messages often already include their source; do not say it twice.
        if !parts.last().is_some_and(|prev| prev.contains(&t)) {
            parts.push(t);
        }
    }
    let text = parts.join(": ");
    text.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// The widest `{index:0N}` a `--name-template` may ask for.
pub const MAX_INDEX_WIDTH: usize = 9;

/// Fills `{index}` / `{index:0N}` (N at most [`MAX_INDEX_WIDTH`]) in a `--name-template`. The
/// result must be a file name (no `/`) of at most 255 bytes; anything else is refused, naming the
/// template.
pub fn render_name(template: &str, index: usize) -> Result<String, Error> {
    let bad = |why: String| Error::invalid(format!("--name-template {template:?}: {why}"));
    let re = regex::Regex::new(r"\{index(?::(\d+))?\}").map_err(|e| Error::invalid(e.to_string()))?;
    if template.contains('/') {
        return Err(bad("must be a file name, not a path (no '/'); give the folder with -o".into()));
    }
    let placeholders: Vec<regex::Captures> = re.captures_iter(template).collect();
    if placeholders.is_empty() {
        return Err(Error::invalid(format!("--name-template {template:?} has no {{index}} (e.g. {{index:03}}.wav)")));
    }
    if template.matches("{index").count() != placeholders.len() {
        return Err(bad(format!("write the line number as {{index}} or {{index:0N}} with N from 1 to {MAX_INDEX_WIDTH}")));
    }
    let mut widths = Vec::with_capacity(placeholders.len());
    for c in &placeholders {
        let width = match c.get(1) {
            None => 0,
            Some(w) => match w.as_str().parse::<usize>() {
                Ok(n) if n <= MAX_INDEX_WIDTH => n,
                _ => {
                    return Err(bad(format!(
                        "width {} is too wide; use at most {MAX_INDEX_WIDTH} (e.g. {{index:03}})",
                        w.as_str()
                    )))
                }
            },
        };
        widths.push(width);
    }
    let mut widths = widths.into_iter();
    let name = re
        .replace_all(template, |_: &regex::Captures| {
            let width = widths.next().unwrap_or(0);
            format!("{index:0width$}")
        })
        .into_owned();
    if name.len() > cosy::output::NAME_MAX {
        return Err(bad(format!(
            "the file name it gives (for index {index}) is {} bytes, over the {}-byte limit of file names; use a shorter template",
            name.len(),
            cosy::output::NAME_MAX
        )));
    }
    Ok(name)
}

/// `--stream` / `--no-stream` as asked (`None`: the default applies).
fn asked_streaming(stream: bool, no_stream: bool) -> Option<bool> {
    (stream || no_stream).then_some(stream)
}

/// All of standard input, without a byte-order mark at its start ([`cosy::frontend::text::read_text`]).
fn read_stdin() -> Result<String, Error> {
    cosy::frontend::text::read_text(std::io::stdin().lock(), "<stdin>")
}

/// A text file named by `flag` (`--input`), read as standard input is.
fn read_text_file(flag: &str, path: &std::path::Path) -> Result<String, Error> {
    let what = format!("{flag} {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    cosy::frontend::text::read_text(file, &what)
}

/// One utterance of `cosy file`: its text, where its audio goes, and which line it was.
struct FileJob {
    /// 0-based among the non-empty lines (the `{index}` of `--name-template`, the `--dump` subfolder).
    index: usize,
    text: String,
    /// The file to write; `None`: standard output.
    out: Option<PathBuf>,
    /// Its line of `--input` (1-based), for messages.
    line: Option<usize>,
}

/// A request of `cosy file` for one utterance's text.
type FileRequest<'a> = dyn Fn(String) -> Result<cosy::request::Request, Error> + 'a;

/// `cosy file`'s format: `--format`, else the extension of `-o` (of `--name-template` with
/// `--input`), else wav16 (`crate::encode::FileFormat::choose`). Standard output takes raw pcm
/// only (streamed as it is made).
fn file_format(args: &FileArgs) -> Result<FileFormat, Error> {
    let to_stdout = args.output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let named = if args.input.is_some() { Some(PathBuf::from(file_name_template(args))) } else { args.output.clone().filter(|_| !to_stdout) };
    let format = FileFormat::choose(args.format.as_deref(), named.as_deref())?;
    if to_stdout && !matches!(format, FileFormat::Plain(_)) {
        return Err(Error::invalid(format!(
            "-o - streams raw pcm to standard output; {} is written to a file: give -o FILE.{}",
            format.extension(),
            format.extension()
        )));
    }
    Ok(format)
}

/// `-o`'s default: `out.wav`, or `out.mp3`, `out.opus`, `out.flac` for those formats.
fn default_output(format: FileFormat) -> PathBuf {
    PathBuf::from(format!("out.{}", format.extension()))
}

/// The file name per `--input` line: `--name-template`, whose default takes the extension of
/// `--format`.
fn file_name_template(args: &FileArgs) -> String {
    match (&args.format, args.name_template.as_str()) {
        (Some(f), DEFAULT_NAME_TEMPLATE) => match FileFormat::parse(f) {
            Ok(format) => format!("{{index:03}}.{}", format.extension()),
            Err(_) => DEFAULT_NAME_TEMPLATE.to_string(),
        },
        (_, template) => template.to_string(),
    }
}

fn file_command(config: &Config, settings: &crate::serve::settings::Settings, args: &FileArgs) -> anyhow::Result<()> {
    cosy::request::check_speed(args.speed)?;
    let format = file_format(args)?;
    if args.bistream {
        return file_bistream(config, settings, args, format);
    }
    // Everything that can be checked is checked before the model is loaded: a book read, its
    // outputs; else each utterance.
    let book = book::book_input(args).map(|path| book::BookPlan::prepare(args, &path, format)).transpose()?;
    let jobs = if book.is_some() {
        Vec::new()
    } else {
        let jobs = plan_file_jobs(args, format)?;
        check_file_jobs(config, args, &jobs)?;
        jobs
    };
    let local_only = [
        ("a book", book.is_some()),
        ("--input", args.input.is_some()),
        ("--dump", args.dump.is_some()),
        ("--min-tokens", args.min_tokens.is_some()),
        ("--max-tokens", args.max_tokens.is_some()),
        ("--no-text-frontend", args.no_text_frontend),
        ("--show-text", args.show_text),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    if let Some(client) = server_for(settings, args.local, local_only)? {
        return file_from_server(config, &client, args, jobs, format);
    }
    let voice = resolve_voice(config, &args.voice)?;
    if let Some(d) = &args.dump {
        cosy::output::check_folder("--dump", d, true)?;
    }

    // A bad --normalize is refused before the model loads.
    let normalization = args.normalize.normalization()?;
    let engine = cosy::engine::Engine::load(config)?;
    let request = |text: String| {
        let mut o = cosy::app::speech::SpeechOptions::new(text, voice.clone(), config.streaming.enabled);
        o.text_frontend = !args.no_text_frontend;
        o.normalization = normalization;
        o.input_format = input_format(args.ssml);
        o.speed = args.speed;
        o.seed = args.seed;
        o.stream = asked_streaming(args.stream, args.no_stream);
        o.min_tokens = args.min_tokens;
        o.test_hooks.max_tokens = args.max_tokens;
        cosy::app::speech::build_request(config, o)
    };
    if let Some(book) = book {
        crate::interrupt::install()?;
        return book.run(config, &engine, args, &request);
    }
    if args.show_text {
        return show_text(&engine, jobs, &request);
    }
    match &args.dump {
        Some(dump_root) => write_file_jobs_dumped(&engine, jobs, dump_root, format, &request),
        None => write_file_jobs(config, &engine, jobs, format, &request),
    }
}

/// `cosy file --show-text`: each utterance's sentences as the model gets them, one a line, and
/// its pauses.
fn show_text(engine: &cosy::engine::Engine, jobs: Vec<FileJob>, request: &FileRequest<'_>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    for job in jobs {
        for item in engine.plan_text(&request(job.text)?)? {
            match item {
                cosy::pipeline::Spoken::Sentence(sentence) => {
                    writeln!(out, "{}", sentence.replace('\\', "\\\\").replace('\n', "\\n").replace('\r', "\\r"))?
                }
                cosy::pipeline::Spoken::Pause { samples } => writeln!(out, "[pause: {samples} samples of silence]")?,
                cosy::pipeline::Spoken::Speed(speed) => writeln!(out, "[speed: {speed}]")?,
            }
        }
    }
    Ok(())
}

/// `cosy file TEXT` through a running server: the one text, written as without it.
fn file_from_server(
    config: &Config,
    client: &crate::client::Client,
    args: &FileArgs,
    jobs: Vec<FileJob>,
    format: FileFormat,
) -> anyhow::Result<()> {
    for job in jobs {
        // The schedule this command would use (sent as `stream`: the server then uses the same).
        let stream = cosy::app::speech::check_all_but_the_voice(config, &job.text, asked_streaming(args.stream, args.no_stream), config.streaming.enabled, args.speed)?;
        let mut request = server_request(&job.text, &args.voice, args.speed, args.seed, stream, &args.normalize.normalization()?)?;
        ssml_field(&mut request, args.ssml);
        let mut audio = client.speak(request)?;
        let samples = collect_audio(job.out.is_none(), |sink| {
            while let Some(chunk) = audio.next_chunk()? {
                sink.audio(&chunk)?;
            }
            Ok(())
        })?;
        if let Some(path) = job.out {
            crate::encode::file::write_audio(&path, &samples, client.sample_rate, format)?;
            tracing::info!("wrote {} ({:.2} s)", path.display(), samples.len() as f64 / f64::from(client.sample_rate));
        }
    }
    Ok(())
}

/// The running server `say` or `file` uses (`say.server`, `COSY_SERVER`): none with --local, nor
/// when a flag needs the model here (`local_only`, named in a note when a server runs).
fn server_for(
    settings: &crate::serve::settings::Settings,
    local: bool,
    local_only: Option<&str>,
) -> Result<Option<crate::client::Client>, Error> {
    if local {
        return Ok(None);
    }
    if let Some(flag) = local_only {
        if let Some(at) = crate::client::listening(&settings.say.server) {
            eprintln!("note: {flag} is not served by a cosy server: loading the model here, not using the one at {at}");
        }
        return Ok(None);
    }
    crate::client::find(&settings.say.server, settings.server.api_key.as_deref())
}

/// `--ssml`: the text is SSML; without it, SSML only when it starts with `<speak>`.
fn input_format(ssml: bool) -> cosy::frontend::ssml::InputFormat {
    if ssml {
        cosy::frontend::ssml::InputFormat::Ssml
    } else {
        cosy::frontend::ssml::InputFormat::Auto
    }
}

/// `--ssml` as the HTTP API's field (`input_format`).
fn ssml_field(request: &mut serde_json::Value, ssml: bool) {
    if ssml {
        request["input_format"] = "ssml".into();
    }
}

/// The speech request (the HTTP API's fields) for `text` from the command line's options: the
/// voice as the flags give it (a saved voice's name, or the recording itself), the server's
/// default voice and seed when none is given.
fn server_request(text: &str, voice: &VoiceArgs, speed: f64, seed: Option<u64>, stream: bool, normalization: &cosy::request::Normalization) -> Result<serde_json::Value, Error> {
    use base64::Engine as _;
    let mut request = serde_json::json!({ "input": text, "stream": stream });
    if let Some(switches) = normalization_json(normalization) {
        request["normalization"] = switches;
    }
    if speed != 1.0 {
        request["speed"] = speed.into();
    }
    if let Some(seed) = seed {
        request["seed"] = seed.into();
    }
    if let Some(name) = &voice.name {
        request["voice"] = name.as_str().into();
    }
    if let Some(wav) = &voice.prompt_wav {
        let bytes = std::fs::read(wav).map_err(|e| Error::invalid(format!("--prompt-wav {}: {e}", wav.display())))?;
        request["ref_audio"] = base64::engine::general_purpose::STANDARD.encode(bytes).into();
    }
    if let Some(transcript) = &voice.prompt_text {
        request["ref_text"] = transcript.as_str().into();
    }
    if let Some(instruction) = &voice.instruct {
        request["instructions"] = instruction.as_str().into();
    }
    Ok(request)
}

/// The utterances of `cosy file` and where each goes: one per non-empty line of `--input` (into
/// the `-o` folder, named by `--name-template`), or the one text (to `-o`, stdout for `-` or a
/// pcm without `-o`, else `out.wav` or the format's `out.EXT`).
fn plan_file_jobs(args: &FileArgs, format: FileFormat) -> Result<Vec<FileJob>, Error> {
    let pcm = format == FileFormat::Plain(cosy::audio::OutputFormat::Pcm16);
    let to_stdout = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let Some(input) = &args.input else {
        let text = match args.text.as_deref() {
            None => return Err(Error::invalid("give the text to say (or `-` for stdin, or --input FILE)")),
            Some("-") => read_stdin()?,
            Some(t) => t.to_string(),
        };
        let out = if pcm && args.output.is_none() || to_stdout(&args.output) {
            None
        } else {
            Some(args.output.clone().unwrap_or_else(|| default_output(format)))
        };
        return Ok(vec![FileJob { index: 0, text, out, line: None }]);
    };
    let text = if input.as_os_str() == "-" {
        read_stdin()?
    } else {
        read_text_file("--input", input)?
    };
    let folder = args.output.clone().unwrap_or_else(|| PathBuf::from("."));
    if pcm || to_stdout(&args.output) {
        return Err(Error::invalid("--input writes one file per line; use a file format (wav, mp3, opus, flac) and -o FOLDER"));
    }
    cosy::output::check_folder("-o", &folder, false)?;
    let mut jobs = Vec::new();
    let lines = cosy::frontend::text::split_lines(&text).enumerate().filter(|(_, l)| !l.trim().is_empty());
    for (index, (line, text)) in lines.enumerate() {
        let out = folder.join(render_name(&file_name_template(args), index)?);
        jobs.push(FileJob { index, text: text.to_string(), out: Some(out), line: Some(line + 1) });
    }
    if jobs.is_empty() {
        return Err(Error::invalid(format!("--input {}: no non-empty lines", input.display())));
    }
    Ok(jobs)
}

/// Each utterance's text (a bad `--input` line named by its number) and output file (never an
/// input, writable).
fn check_file_jobs(config: &Config, args: &FileArgs, jobs: &[FileJob]) -> Result<(), Error> {
    for job in jobs {
        cosy::app::speech::check_text(config, &job.text).map_err(|e| match (job.line, &args.input, e) {
            (Some(n), Some(input), Error::Input { code, param, message }) => {
                Error::Input { code, param, message: format!("--input {} line {n}: {message}", input.display()) }
            }
            (_, _, e) => e,
        })?;
        if let Some(p) = &job.out {
            let label = if args.input.is_some() { "--name-template" } else { "-o" };
            cosy::output::check_not_an_input(label, p, &file_inputs(args))?;
            cosy::output::check_file("-o", p)?;
        }
    }
    Ok(())
}

/// With --dump: one utterance at a time, each sentence's intermediates written as it ends (in a
/// subfolder per utterance when there are several).
fn write_file_jobs_dumped(
    engine: &cosy::engine::Engine,
    jobs: Vec<FileJob>,
    dump_root: &std::path::Path,
    format: FileFormat,
    request: &FileRequest<'_>,
) -> anyhow::Result<()> {
    let several = jobs.len() > 1;
    for job in jobs {
        let dump = if several { dump_root.join(format!("{:03}", job.index)) } else { dump_root.to_path_buf() };
        let observer = std::sync::Arc::new(cosy::app::dump::DumpObserver::new(dump));
        let handle = engine.submit_observed(request(job.text)?, Some(observer))?;
        let mut samples: Vec<f32> = Vec::new();
        cosy::app::drain::drain(handle, &mut samples)?;
        match job.out {
            Some(path) => crate::encode::file::write_audio(&path, &samples, engine.sample_rate(), format)?,
            None => write_pcm_stdout(&samples)?,
        }
    }
    Ok(())
}

/// The utterances through the engine `engine.file_concurrency` at a time (their LLM steps and DiT
/// calls batched); files are written in line order, each the same as when run alone.
fn write_file_jobs(
    config: &Config,
    engine: &cosy::engine::Engine,
    jobs: Vec<FileJob>,
    format: FileFormat,
    request: &FileRequest<'_>,
) -> anyhow::Result<()> {
    let rate = engine.sample_rate();
    let several = jobs.len() > 1;
    // Never more than the engine admits at once (running + queued), so no line is refused as busy.
    let admitted = config.engine.max_in_flight + config.engine.max_queue;
    let window = if several { config.engine.file_concurrency.clamp(1, admitted.max(1)) } else { 1 };
    // One tick per file written (drawn on stderr only when it is a terminal).
    let progress = several.then(|| {
        let bar = indicatif::ProgressBar::new(jobs.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} lines ({elapsed}, {eta} left)")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut pending = jobs.into_iter();
    let mut running: std::collections::VecDeque<(Option<PathBuf>, cosy::engine::RequestHandle)> = Default::default();
    loop {
        while running.len() < window {
            let Some(job) = pending.next() else { break };
            running.push_back((job.out, engine.submit(request(job.text)?)?));
        }
        let Some((out, handle)) = running.pop_front() else { break };
        let samples = collect_audio(out.is_none(), |sink| cosy::app::drain::drain(handle, sink))?;
        if let Some(path) = out {
            crate::encode::file::write_audio(&path, &samples, rate, format)?;
            tracing::info!("wrote {} ({:.2} s)", path.display(), samples.len() as f64 / f64::from(rate));
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(())
}

/// The files `cosy file` reads, by flag: no output may be one of them.
fn file_inputs(args: &FileArgs) -> Vec<(&'static str, &std::path::Path)> {
    let mut inputs = Vec::new();
    if let Some(p) = &args.input {
        inputs.push(("--input", p.as_path()));
    }
    if let Some(p) = &args.voice.prompt_wav {
        inputs.push(("--prompt-wav", p.as_path()));
    }
    inputs
}

/// `cosy file - --bistream`: text-in streaming from standard input, the audio to a file (or
/// streamed pcm on stdout), the same audio `cosy say -` plays.
fn file_bistream(
    config: &Config,
    settings: &crate::serve::settings::Settings,
    args: &FileArgs,
    format: FileFormat,
) -> anyhow::Result<()> {
    if args.text.as_deref() != Some("-") || args.input.is_some() {
        return Err(Error::invalid("--bistream reads the text from standard input as it arrives: give `-` as the text").into());
    }
    if args.dump.is_some() || args.min_tokens.is_some() || args.speed != 1.0 {
        return Err(Error::invalid("--bistream does not take --dump, --min-tokens or --speed").into());
    }
    let to_stdout = args.output.as_deref().is_some_and(|p| p.as_os_str() == "-") || (format == FileFormat::Plain(cosy::audio::OutputFormat::Pcm16) && args.output.is_none());
    let out = (!to_stdout).then(|| args.output.clone().unwrap_or_else(|| default_output(format)));
    if let Some(p) = &out {
        cosy::output::check_not_an_input("-o", p, &file_inputs(args))?;
        cosy::output::check_file("-o", p)?;
    }
    // Text that arrives in pieces is not served by the HTTP route: the model is loaded here.
    server_for(settings, args.local, Some("--bistream"))?;
    let voice = resolve_voice(config, &args.voice)?;
    let mut o = cosy::app::speech::SpeechOptions::new(String::new(), voice, config.streaming.enabled);
    o.text_frontend = !args.no_text_frontend;
    o.normalization = args.normalize.normalization()?;
    o.input_format = input_format(args.ssml);
    o.seed = args.seed;
    o.stream = asked_streaming(args.stream, args.no_stream);
    let req = cosy::app::speech::build_streaming_request(o)?;
    let engine = cosy::engine::Engine::load(config)?;
    let rate = engine.sample_rate();
    let options = cosy::engine::BistreamOptions { normalize_sentences: args.normalize_sentences, ..Default::default() };
    let stream = cosy::app::text_stream::TextStream::text_in(std::sync::Arc::new(engine), config, req, options, None);
    let samples = collect_audio(out.is_none(), |sink| cosy::app::text_stream::speak_read(stream, std::io::stdin(), "<stdin>", None, sink))?;
    if let Some(path) = out {
        crate::encode::file::write_audio(&path, &samples, rate, format)?;
        tracing::info!("wrote {} ({:.2} s)", path.display(), samples.len() as f64 / f64::from(rate));
    }
    Ok(())
}

/// The audio `speak` makes into its sink: written to standard output as it comes (`to_stdout`:
/// streamed pcm, nothing kept), or collected; its error if it fails.
fn collect_audio<T>(to_stdout: bool, speak: impl FnOnce(&mut dyn cosy::app::drain::AudioSink) -> Result<T, Error>) -> Result<Vec<f32>, Error> {
    let mut samples: Vec<f32> = Vec::new();
    if to_stdout {
        speak(&mut cosy::app::drain::FnSink(|chunk: &[f32]| write_pcm_stdout(chunk)))?;
    } else {
        speak(&mut samples)?;
    }
    Ok(samples)
}

/// Writes samples to standard output as s16le and flushes (streamed pcm).
fn write_pcm_stdout(samples: &[f32]) -> Result<(), Error> {
    let bytes = cosy::audio::pcm16_bytes(samples);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&bytes).and_then(|_| stdout.flush()).map_err(|e| Error::io("<stdout>", e))
}

/// The voice from the command line, through the application layer ([`cosy::app::voices`]): a
/// saved voice is read and checked against the configured model before anything heavy is loaded.
fn resolve_voice(config: &Config, c: &VoiceArgs) -> Result<cosy::request::Voice, Error> {
    use cosy::app::voices::{Recording, VoiceChoice, Voices};
    let voices = Voices::new(config);
    let choice = VoiceChoice {
        name: c.name.clone(),
        recording: c.prompt_wav.clone().map(Recording::File),
        transcript: c.prompt_text.clone(),
        instruction: c.instruct.clone(),
    };
    let key = voices.model_key_on_disk();
    let resolved = voices.resolve(choice, key.as_deref())?;
    // A name that meant another voice (an alias, or the default for an OpenAI name) is said.
    if resolved.how.is_substitute() {
        eprintln!("note: voice {}", resolved.how);
    } else {
        tracing::info!("voice: {}", resolved.how);
    }
    Ok(resolved.voice)
}

/// `notices`: whether `say` may tell on stderr that it waits for audio (not with `-q`).
fn say_command(config: &Config, settings: &crate::serve::settings::Settings, args: &SayArgs, notices: bool) -> anyhow::Result<()> {
    if args.list_devices {
        for d in crate::playback::list_devices()? {
            let mark = if d.is_default { " (default)" } else { "" };
            let detail = match &d.error {
                Some(e) => format!("unusable: {e}"),
                None => {
                    let rates: Vec<String> = d.sample_rates.iter().map(|(lo, hi)| {
                        if lo == hi { format!("{lo}") } else { format!("{lo}-{hi}") }
                    }).collect();
                    let channels: Vec<String> = d.channels.iter().map(u16::to_string).collect();
                    format!("{} Hz, {} ch", rates.join(","), channels.join(","))
                }
            };
            println!("{}{mark}  {}  [{detail}]", d.name, d.description);
        }
        return Ok(());
    }
    cosy::request::check_speed(args.speed)?;
    let output = crate::say::Output::from_setting(args.device.as_deref(), &config.output.device)?;
    // Text that arrives in pieces is not served by the HTTP route; no text is refused below.
    let local_only = [
        ("`say -` (text read as it arrives)", args.text.as_deref() == Some("-")),
        ("--no-text-frontend", args.no_text_frontend),
        ("--min-tokens", args.min_tokens.is_some()),
        ("--hold-after-first-audio", args.hold_after_first_audio),
        ("--slow-to-rtf", args.slow_to_rtf.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    if let (Some(text), Some(client)) = (args.text.as_deref(), server_for(settings, args.local || args.text.is_none(), local_only)?) {
        // The rules that need no voice here; the server applies every one again. `stream: true`:
        // the answer comes as it is made, in the schedule `say` uses (chunks at speed 1, else
        // whole sentences).
        cosy::app::speech::check_all_but_the_voice(config, text, None, true, args.speed)?;
        let mut request = server_request(text, &args.voice, args.speed, args.seed, true, &args.normalize.normalization()?)?;
        ssml_field(&mut request, args.ssml);
        let play = crate::say::PlayOptions { buffering: !args.no_buffering, notices };
        crate::say::say(crate::say::Source::Server { client: &client, request }, &output, play, args.event_log.as_deref())?;
        return Ok(());
    }
    let voice = resolve_voice(config, &args.voice)?;
    // `say -` speaks standard input while it arrives (text-in streaming), when the voice allows
    // it (a transcript or an instruction) and no speed asks for whole sentences.
    let streaming_stdin = args.text.as_deref() == Some("-") && cosy::app::speech::can_stream_text_as(&voice, args.speed, input_format(args.ssml));
    if args.text.as_deref() == Some("-") && !streaming_stdin {
        tracing::info!("reading all of standard input first: text-in streaming needs a voice with a transcript or an instruction, and speed 1");
    }
    let text = match args.text.as_deref() {
        None => return Err(Error::invalid("give the text to say (or `-` for stdin)").into()),
        Some("-") if streaming_stdin => String::new(),
        Some("-") => read_stdin()?,
        Some(t) => t.to_string(),
    };
    // `say` streams unless a speed asks for whole sentences.
    let mut o = cosy::app::speech::SpeechOptions::new(text, voice, true);
    o.text_frontend = !args.no_text_frontend;
    o.normalization = args.normalize.normalization()?;
    o.input_format = input_format(args.ssml);
    o.speed = args.speed;
    o.seed = args.seed;
    o.min_tokens = args.min_tokens;
    o.test_hooks.hold_after_first_audio = args.hold_after_first_audio;
    o.test_hooks.slow_to_rtf = args.slow_to_rtf;
    let req = if streaming_stdin {
        cosy::app::speech::build_streaming_request(o)?
    } else {
        cosy::app::speech::build_request(config, o)?
    };
    let source = if streaming_stdin {
        crate::say::SayText::Stdin(cosy::engine::BistreamOptions { normalize_sentences: args.normalize_sentences, ..Default::default() })
    } else {
        crate::say::SayText::Whole
    };
    let play = crate::say::PlayOptions { buffering: !args.no_buffering, notices };
    crate::say::say(crate::say::Source::Local { config, req: &req, text: source }, &output, play, args.event_log.as_deref())?;
    Ok(())
}

fn voice_command(config: &Config, action: &VoiceAction) -> anyhow::Result<()> {
    let voices = cosy::app::voices::Voices::new(config);
    let store = voices.store();
    match action {
        VoiceAction::Add { name, wav, text, force, default, lexicon } => {
            use cosy::app::voices::{check_recording, Recording, Voices};
            // Refused before the model is loaded; `add` checks again.
            voices.check_new(name, text, *force)?;
            let lexicon = lexicon.as_deref().map(Voices::read_lexicon).transpose()?;
            let recording = Recording::File(wav.clone());
            check_recording(&recording, voices.prompt_limit())?;
            let engine = cosy::engine::Engine::load(config)?;
            let (voice, path) = voices.add(&engine, name, &recording, text, *force, *default)?;
            println!("saved voice {name} ({} prompt tokens) to {}", voice.speech_token.len(), path.display());
            if let Some(lexicon) = lexicon {
                println!("saved its lexicon to {}", voices.save_lexicon(name, &lexicon)?.display());
            }
            if *default {
                println!("{name} is now the default voice");
                warn_config_default(config, name);
            }
            Ok(())
        }
        VoiceAction::List => {
            let key = voices.model_key_on_disk();
            let entries = voices.list(key.as_deref())?;
            if entries.is_empty() {
                println!("no saved voices in {} (add one with `cosy voice add NAME --wav FILE --text TEXT`)", store.dir.display());
                return Ok(());
            }
            for e in entries {
                match &e.voice {
                    Ok(v) => {
                        let fit = if e.fits_model == Some(false) { "  [made for another model]" } else { "" };
                        let mark = if e.is_default { "  (default)" } else { "" };
                        let secs = cosy::app::voices::summary_seconds(v);
                        let lexicon = e.lexicon.as_ref().map(|p| format!("  [lexicon {}]", p.display())).unwrap_or_default();
                        println!("{}  {}  {secs:.1} s  {:?}{fit}{mark}{lexicon}", e.name, v.created, v.transcript);
                    }
                    Err(problem) => {
                        // A broken default is still the default: say so, and what it means.
                        let mark = if e.is_default { "  (default: requests without a voice fail until it is fixed)" } else { "" };
                        println!("{}  [unusable: {problem}]{mark}", e.name);
                    }
                }
            }
            Ok(())
        }
        VoiceAction::Rm { name } => {
            let removed = voices.remove(name)?;
            println!("removed voice {name} ({})", removed.path.display());
            if removed.was_default {
                println!("{name} was the default voice; there is none now (`cosy voice default NAME`)");
            }
            Ok(())
        }
        VoiceAction::Default { name: Some(name), .. } => {
            let marker = store.set_default(name)?;
            println!("{name} is now the default voice ({})", marker.display());
            warn_config_default(config, name);
            Ok(())
        }
        VoiceAction::Default { name: None, clear: true } => {
            if store.clear_default()? {
                println!("the voices folder has no default voice now");
            } else {
                println!("the voices folder had no default voice");
            }
            if let Some(c) = &config.voices.default {
                println!("note: voices.default = {c:?} in the config still applies");
            }
            Ok(())
        }
        VoiceAction::Default { name: None, clear: false } => {
            match voices.default_voice()? {
                Some((name, cosy::voice::DefaultSource::Config)) => println!("{name} (voices.default in the config)"),
                Some((name, cosy::voice::DefaultSource::Folder(p))) => println!("{name} ({})", p.display()),
                None => println!(
                    "no default voice (make one with `cosy voice default NAME` or `cosy voice add NAME --wav FILE --text TEXT --default`)"
                ),
            }
            Ok(())
        }
    }
}

/// The config's `voices.default` beats the folder's default: say so when they now differ.
fn warn_config_default(config: &Config, name: &str) {
    if let Some(c) = config.voices.default.as_deref().filter(|c| *c != name) {
        eprintln!("note: voices.default = {c:?} in the config overrides this; remove it there to use {name}");
    }
}

fn profile_command(config: &Config, args: &ProfileArgs) -> anyhow::Result<()> {
    use crate::cli::profile_report::{machine, matrix, profile, render_matrix, ProfilePlan, Setting};

    let text = match (&args.input, args.text.as_deref()) {
        (Some(f), _) => read_text_file("--input", f)?,
        (None, Some("-")) => read_stdin()?,
        (None, Some(t)) => t.to_string(),
        (None, None) => PROFILE_TEXT.to_string(),
    };
    cosy::app::speech::check_text(config, &text)?;
    if args.runs == 0 {
        return Err(Error::invalid("--runs must be at least 1").into());
    }
    // The outputs are checked before the (long) measurement, and must not be one file.
    let json_file = args.json.as_deref().filter(|p| p.as_os_str() != "-");
    if let Some(p) = json_file {
        cosy::output::check_file("--json", p)?;
    }
    if let Some(p) = &args.trace {
        if p.as_os_str() == "-" {
            return Err(Error::invalid("--trace -: the trace is written to a file only; give a file name").into());
        }
        cosy::output::check_file("--trace", p)?;
        if json_file.is_some_and(|j| cosy::output::same_file(j, p)) {
            return Err(Error::invalid(format!(
                "--json {} and --trace {} are the same file; give them different names",
                json_file.map(|j| j.display().to_string()).unwrap_or_default(),
                p.display()
            ))
            .into());
        }
    }
    let voice = resolve_voice(config, &args.voice)?;
    let mut o = cosy::app::speech::SpeechOptions::new(text, voice, config.streaming.enabled);
    o.text_frontend = !args.no_text_frontend;
    o.seed = args.seed;
    o.stream = asked_streaming(args.stream, args.no_stream);
    o.min_tokens = args.min_tokens;
    let plan = ProfilePlan {
        request: cosy::app::speech::build_request(config, o)?,
        runs: args.runs,
        warmup: args.warmup,
    };
    // With `--json -` the JSON owns stdout and the table goes to stderr.
    let json_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let show = |text: &str| {
        if json_stdout {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    };
    let (json, trace) = if args.matrix {
        let settings = if args.settings.is_empty() {
            Setting::default_matrix()
        } else {
            args.settings.iter().map(|s| Setting::parse(s)).collect::<Result<Vec<_>, _>>()?
        };
        let rows = matrix(config, &plan, &settings);
        show(&render_matrix(&rows));
        let trace = rows.iter().find_map(|r| r.report.as_ref()).map(|r| r.chrome_trace());
        (serde_json::json!({ "machine": machine(), "matrix": rows }), trace)
    } else {
        let label = format!(
            "{} {}",
            config.runtime.providers.first().copied().unwrap_or(cosy::vocab::ProviderKind::Cpu),
            config.runtime.precision
        );
        let report = profile(config, &plan, &label)?;
        show(&report.render());
        let mut json = serde_json::to_value(&report).map_err(|e| Error::Runtime(format!("report: {e}")))?;
        json["machine"] = machine();
        (json, Some(report.chrome_trace()))
    };
    let write = |path: &std::path::Path, value: &serde_json::Value| -> Result<(), Error> {
        let text = serde_json::to_string_pretty(value).map_err(|e| Error::Runtime(format!("json: {e}")))?;
        cosy::output::write_bytes(path, text.as_bytes())
    };
    if let Some(p) = &args.json {
        if json_stdout {
            println!("{}", serde_json::to_string_pretty(&json).map_err(|e| Error::Runtime(format!("json: {e}")))?);
        } else {
            write(p, &json)?;
        }
    }
    if let (Some(p), Some(t)) = (&args.trace, trace) {
        write(p, &t)?;
    }
    Ok(())
}

fn model_command(config: &Config, action: &ModelAction) -> anyhow::Result<()> {
    use cosy::app::models::Models;
    let models = Models::of_user();
    match action {
        ModelAction::List => {
            let listed = models.list()?;
            println!("models folder: {}", models.dir.display());
            if listed.is_empty() {
                println!("no models: add an exported folder with `cosy model add NAME PATH` (scripts/export.sh SRC exports into the models folder)");
            }
            for m in &listed {
                let mut notes = Vec::new();
                if m.bundled {
                    notes.push("bundled".to_string());
                }
                if m.random {
                    notes.push("random weights: noise, not speech".to_string());
                }
                if let Some(p) = &m.problem {
                    notes.push(format!("cannot be used: {p}"));
                }
                let notes = if notes.is_empty() { String::new() } else { format!("  ({})", notes.join("; ")) };
                println!(
                    "{} {:<16} {:>10}  {:<14} {}{notes}",
                    if m.is_default { "*" } else { " " },
                    m.name,
                    crate::doctor::human_bytes(m.bytes),
                    if m.precisions.is_empty() { "-".to_string() } else { m.precisions.join(",") },
                    m.path.display()
                );
            }
            println!("in use: {} ({})", config.model_dir.display(), config.source_of("model.dir"));
        }
        ModelAction::Add { name, path, link, force, default } => {
            let added = models.add(name, path, *link, *force, *default)?;
            let how = if *link { "linked" } else { "copied" };
            println!("added model {name:?} ({how}: {})", added.path.display());
            if added.made_default {
                println!("{name:?} is now the default model");
            }
        }
        ModelAction::Use { name } => {
            models.set_default(name)?;
            println!("{name:?} is now the default model ({})", models.dir.join(name).display());
            if let Some(by) = config.sources.keys.get("model.dir") {
                eprintln!("note: model.dir is set by {by}, which still wins over the default model");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_of(args: &[&str]) -> cosy::Result<Vec<(String, String)>> {
        let cli = Cli::parse_keeping_sets(args.iter().copied()).expect("the arguments parse");
        cli.load_options().map(|o| o.flags)
    }

    /// The flags that stand for settings reach the config loader as settings (the loader itself,
    /// with any value, is fuzzed in tests/fuzz.rs), `--set` on both sides of the command counts.
    #[test]
    fn setting_flags_become_the_loaders_flags_in_order() {
        let flags = flags_of(&["cosy", "--set", "a.b=1", "--model", "m", "--provider", "cpu", "--precision", "fp16", "doctor", "--set=c.d= x=y"]);
        let pairs = |v: &[(&str, &str)]| v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert_eq!(
            flags.expect("loads"),
            pairs(&[("model.dir", "m"), ("runtime.providers", "cpu"), ("runtime.precision", "fp16"), ("a.b", "1"), ("c.d", " x=y")])
        );
        let err = flags_of(&["cosy", "--set", "runtime.threads", "doctor"]).expect_err("no '='");
        assert_eq!(err.to_string(), Error::Config("--set \"runtime.threads\": expected KEY=VALUE".into()).to_string());
    }

    #[test]
    fn name_templates_render_the_index() {
        assert_eq!(render_name("take-{index:09}.wav", 7).unwrap(), "take-000000007.wav");
        assert_eq!(render_name("{index}.wav", 12).unwrap(), "12.wav");
    }
}
