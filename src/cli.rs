//! The `cosy` command line: argument parsing and thin handlers over the library.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::config::{Config, LoadOptions};
use crate::error::Error;

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
    /// Config file (default: $COSY_CONFIG, else ./config.toml if present).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Exported model folder (model.dir).
    #[arg(long, global = true, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Execution providers in priority order, e.g. `tensorrt,cuda,cpu` (runtime.providers).
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
    /// Check the library, providers, GPUs, model folder and engine cache.
    Doctor {
        /// Skip hashing files and opening graphs.
        #[arg(long)]
        quick: bool,
    },
    /// Manage the TensorRT engine cache.
    Engines {
        #[command(subcommand)]
        action: EnginesAction,
    },
    /// Print a shell completion script.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
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
    /// Output file (`-` = stdout); with --input, the output folder. Default: out.wav (folder: .).
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// File name per --input line; `{index}` or `{index:03}` is the 0-based line number.
    #[arg(long, value_name = "TEMPLATE", default_value = "{index:03}.wav")]
    pub name_template: String,
    /// Benchmark/test only, NOT the official behaviour: mask the LLM's stop ids until N tokens per
    /// sentence, so a model that stops early still produces N tokens.
    #[arg(long, value_name = "N", hide = true)]
    pub min_tokens: Option<usize>,
    /// Speaking rate (mel time-stretch), e.g. 1.2 faster, 0.8 slower. Not with --stream.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Sampling seed (default: sampling.seed from the config).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use the streaming chunk schedule (chunks are written as they come for --format pcm).
    #[arg(long)]
    pub stream: bool,
    /// Output format: wav16, wavf32, or pcm (raw 16-bit little-endian mono, stdout by default).
    #[arg(long, default_value = "wav16", value_parser = ["wav16", "wavf32", "pcm"])]
    pub format: String,
    /// Write every stage's intermediates (.npy, golden names) into this folder.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Pass the text to the tokenizer as is: no normalisation, no sentence splitting.
    #[arg(long)]
    pub no_text_frontend: bool,
}

/// Arguments of `cosy say`.
#[derive(Debug, Args)]
pub struct SayArgs {
    /// The text to say; `-` reads it from stdin.
    pub text: Option<String>,
    #[command(flatten)]
    pub voice: VoiceArgs,
    /// Speaking rate (mel time-stretch). Other than 1, each sentence is synthesised whole before
    /// it plays (the streaming schedule cannot stretch).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Sampling seed (default: sampling.seed from the config).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Pass the text to the tokenizer as is: no normalisation, no sentence splitting.
    #[arg(long)]
    pub no_text_frontend: bool,
    /// Output device (see --list-devices); default: output.device from the config.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// List the output devices and exit.
    #[arg(long)]
    pub list_devices: bool,
    /// Debug/test: write one line per event (LLM tokens, chunks, first device samples) to PATH.
    #[arg(long, value_name = "PATH", hide = true)]
    pub event_log: Option<PathBuf>,
    /// Benchmark/test only, NOT the official behaviour: mask the LLM's stop ids until N tokens per
    /// sentence.
    #[arg(long, value_name = "N", hide = true)]
    pub min_tokens: Option<usize>,
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
    #[arg(long)]
    pub stream: bool,
    /// Measured runs (the median run's breakdown is reported; p50/p95 pool every run).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Unmeasured runs first (allocator and thread-pool warm-up).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Write the report as JSON to this file (`-` = stdout, the table then goes to stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of the measured runs.
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Benchmark only: mask stop tokens until N speech tokens and stop there (random weights).
    #[arg(long, value_name = "N")]
    pub min_tokens: Option<usize>,
    /// Sampling seed (default: sampling.seed from the config).
    #[arg(long)]
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
    },
    /// List the saved voices.
    List,
    /// Delete a saved voice.
    Rm {
        name: String,
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
    /// List cache entries with their keys, sizes and state.
    List,
    /// Remove stale, unfinished and corrupt entries (all with --all).
    Clean {
        #[arg(long)]
        all: bool,
    },
}

impl Cli {
    /// The configuration from file, environment and these flags.
    pub fn load_config(&self) -> crate::Result<Config> {
        let mut opts = LoadOptions::from_process_env();
        opts.config_file = self.global.config.clone();
        opts.default_file = Some(PathBuf::from("config.toml"));
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
        Config::load(&opts)
    }

    /// The log filter from -v/-q (`COSY_LOG` overrides it).
    pub fn log_filter(&self) -> &'static str {
        match (self.global.verbose as i32) - (self.global.quiet as i32) {
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
    let config = cli.load_config()?;
    match &cli.command {
        Command::File(args) => file_command(&config, args),
        Command::Say(args) => say_command(&config, args),
        Command::Voice { action } => voice_command(&config, action),
        Command::Profile(args) => profile_command(&config, args),
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
        Command::Completions { .. } => Ok(()),
    }
}

fn engines(config: &Config, action: &EnginesAction) -> anyhow::Result<()> {
    use crate::doctor::human_bytes;
    match action {
        EnginesAction::Build { stages, precisions } => {
            let precisions = precisions
                .iter()
                .map(|p| {
                    crate::config::Precision::parse(p)
                        .ok_or_else(|| Error::Config(format!("--precisions {p:?}: allowed: {}", crate::config::Precision::ALLOWED)))
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
            }
            for l in entries {
                let e = &l.entry;
                let name = e.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let state = match (&e.state, l.current) {
                    (crate::runtime::EntryState::Valid, Some(true)) => "valid".to_string(),
                    (crate::runtime::EntryState::Valid, Some(false)) => "stale".to_string(),
                    (crate::runtime::EntryState::Valid, None) => "valid (currency unknown)".to_string(),
                    (crate::runtime::EntryState::Incomplete, _) => "incomplete".to_string(),
                    (crate::runtime::EntryState::Corrupt(why), _) => format!("corrupt: {why}"),
                };
                let key = e.key.as_ref().map_or_else(String::new, |k| {
                    format!("  [{} {} gpu={} ort={} trt={}]", k.stage, k.precision, k.gpu, k.ort_version, k.trt_version)
                });
                println!("{name}  {}  {state}{key}", human_bytes(e.bytes));
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

/// The exit code for an error: 2 for usage, configuration, model and input problems, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Error>() {
            return match e {
                Error::Config(_) | Error::Model { .. } | Error::Input(_) => 2,
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
        let t = c.to_string();
        // thiserror messages often already include their source; do not say it twice.
        if !parts.last().is_some_and(|prev| prev.contains(&t)) {
            parts.push(t);
        }
    }
    let text = parts.join(": ");
    text.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// Fills `{index}` / `{index:0N}` in a `--name-template`.
pub fn render_name(template: &str, index: usize) -> Result<String, Error> {
    let re = regex::Regex::new(r"\{index(?::0?(\d+))?\}").map_err(|e| Error::Input(e.to_string()))?;
    if !re.is_match(template) {
        return Err(Error::Input(format!("--name-template {template:?} has no {{index}} (e.g. {{index:03}}.wav)")));
    }
    Ok(re
        .replace_all(template, |c: &regex::Captures| {
            let width = c.get(1).and_then(|w| w.as_str().parse::<usize>().ok()).unwrap_or(0);
            format!("{index:0width$}")
        })
        .into_owned())
}

fn read_stdin() -> Result<String, Error> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Error::io("<stdin>", e))?;
    Ok(s)
}

/// Refuses an output path whose folder does not exist or is not writable, before any work.
fn check_writable(path: &std::path::Path) -> Result<(), Error> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(Error::Input(format!("output {}: folder {} does not exist", path.display(), dir.display())));
    }
    if path.is_dir() {
        return Err(Error::Input(format!("output {} is a folder; give a file name", path.display())));
    }
    let probe = dir.join(format!(".cosy-write-probe-{}", std::process::id()));
    std::fs::File::create(&probe)
        .map_err(|e| Error::Input(format!("output {}: cannot write in {} ({e})", path.display(), dir.display())))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

fn file_command(config: &Config, args: &FileArgs) -> anyhow::Result<()> {
    use crate::pipeline::wav::{to_i16, write_wav, WavFormat};
    use crate::pipeline::{Request, Synthesizer};

    // Utterances: (index, text, output path or None for stdout).
    let to_stdout = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut jobs: Vec<(usize, String, Option<PathBuf>)> = Vec::new();
    if let Some(input) = &args.input {
        let text = if input.as_os_str() == "-" {
            read_stdin()?
        } else {
            std::fs::read_to_string(input).map_err(|e| Error::Input(format!("--input {}: {e}", input.display())))?
        };
        let folder = args.output.clone().unwrap_or_else(|| PathBuf::from("."));
        if args.format == "pcm" || to_stdout(&args.output) {
            return Err(Error::Input("--input writes one file per line; use a wav format and -o FOLDER".into()).into());
        }
        if !folder.is_dir() {
            return Err(Error::Input(format!("-o {}: with --input the output is a folder, and it does not exist", folder.display())).into());
        }
        for (index, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            jobs.push((index, line.to_string(), Some(folder.join(render_name(&args.name_template, index)?))));
        }
        if jobs.is_empty() {
            return Err(Error::Input(format!("--input {}: no non-empty lines", input.display())).into());
        }
    } else {
        let text = match args.text.as_deref() {
            None => return Err(Error::Input("give the text to say (or `-` for stdin, or --input FILE)".into()).into()),
            Some("-") => read_stdin()?,
            Some(t) => t.to_string(),
        };
        let out = if args.format == "pcm" && args.output.is_none() || to_stdout(&args.output) {
            None
        } else {
            Some(args.output.clone().unwrap_or_else(|| PathBuf::from("out.wav")))
        };
        jobs.push((0, text, out));
    }
    for (_, text, out) in &jobs {
        check_text(config, text)?;
        if let Some(p) = out {
            check_writable(p)?;
        }
    }
    let voice = resolve_voice(config, &args.voice)?;
    if let Some(d) = &args.dump {
        std::fs::create_dir_all(d).map_err(|e| Error::Input(format!("--dump {}: cannot create ({e})", d.display())))?;
    }

    let mut synth = Synthesizer::load(config)?;
    let rate = synth.constants.sample_rate;
    let several = jobs.len() > 1;
    for (index, text, out) in jobs {
        let req = Request {
            text,
            voice: voice.clone(),
            text_frontend: !args.no_text_frontend,
            speed: args.speed,
            seed: args.seed,
            stream: args.stream,
            ignore_stop_until: args.min_tokens,
        };
        let dump = args.dump.as_ref().map(|d| if several { d.join(format!("{index:03}")) } else { d.clone() });
        let mut samples: Vec<f32> = Vec::new();
        let pcm_stdout = out.is_none();
        let mut stdout = std::io::stdout().lock();
        synth.synthesize(&req, dump.as_deref(), |chunk| {
            if pcm_stdout {
                let bytes: Vec<u8> = chunk.iter().flat_map(|&s| to_i16(s).to_le_bytes()).collect();
                stdout.write_all(&bytes).and_then(|_| stdout.flush()).map_err(|e| Error::io("<stdout>", e))
            } else {
                samples.extend_from_slice(chunk);
                Ok(())
            }
        })?;
        if let Some(path) = out {
            match args.format.as_str() {
                "pcm" => {
                    let bytes: Vec<u8> = samples.iter().flat_map(|&s| to_i16(s).to_le_bytes()).collect();
                    crate::pipeline::dump::write_atomic(&path, &bytes)?;
                }
                f => write_wav(&path, &samples, rate, if f == "wavf32" { WavFormat::Float32 } else { WavFormat::Int16 })?,
            }
            tracing::info!("wrote {} ({:.2} s)", path.display(), samples.len() as f64 / f64::from(rate));
        }
    }
    Ok(())
}

/// Refuses text that cannot be said: empty, only punctuation, over `limits.max_text_chars`.
fn check_text(config: &Config, text: &str) -> Result<(), Error> {
    if text.trim().is_empty() {
        return Err(Error::Input("the text is empty; give something to say".into()));
    }
    if crate::frontend::text::is_only_punctuation(text.trim()) {
        return Err(Error::Input(format!("the text {:?} has nothing to say (only punctuation)", text.trim())));
    }
    crate::pipeline::check_text_length(text, config.limits.max_text_chars)
}


/// The pipeline voice from the command line. A saved voice is read (unknown names list the saved
/// ones) and checked against the configured model before anything heavy is loaded.
fn resolve_voice(config: &Config, c: &VoiceArgs) -> Result<crate::pipeline::Voice, Error> {
    use crate::pipeline::Voice;
    if let Some(name) = &c.name {
        let saved = crate::voice::VoiceStore::new(&config.voices.dir).load(name)?;
        // The model folder's own problems are reported by the model loader, with their context.
        if let Ok(dir) = crate::model::ModelDir::open(&config.model_dir) {
            saved.check_model(&crate::voice::model_key(&dir)?, &config.model_dir)?;
        }
        return Ok(Voice::Saved { voice: std::sync::Arc::new(saved), instruction: c.instruct.clone() });
    }
    let Some(wav) = c.prompt_wav.clone() else {
        return Err(Error::Input(
            "--prompt-wav FILE is required (a recording of the voice to use), or --voice NAME (a saved voice)".into(),
        ));
    };
    check_prompt_audio(&wav)?;
    Ok(match (&c.prompt_text, &c.instruct) {
        (Some(t), _) => Voice::ZeroShot { wav, transcript: t.clone() },
        (None, Some(i)) => Voice::Instruct { wav, instruction: i.clone() },
        (None, None) => Voice::CrossLingual { wav },
    })
}

/// Refuses an unusable prompt recording (unreadable, empty, truncated, < 16 kHz, silent, > 30 s)
/// before the model is loaded; the pipeline checks it again when it reads it.
fn check_prompt_audio(wav: &std::path::Path) -> Result<(), Error> {
    use crate::frontend::audio::{load_audio, to_rate, MAX_TOKENIZER_SECONDS};
    let audio = load_audio(wav)?;
    to_rate(&audio, 16_000, Some(MAX_TOKENIZER_SECONDS), wav)?;
    Ok(())
}

fn say_command(config: &Config, args: &SayArgs) -> anyhow::Result<()> {
    if args.list_devices {
        for d in crate::audio::list_devices()? {
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
    let text = match args.text.as_deref() {
        None => return Err(Error::Input("give the text to say (or `-` for stdin)".into()).into()),
        Some("-") => read_stdin()?,
        Some(t) => t.to_string(),
    };
    check_text(config, &text)?;
    let voice = resolve_voice(config, &args.voice)?;
    let req = crate::pipeline::Request {
        text,
        voice,
        text_frontend: !args.no_text_frontend,
        speed: args.speed,
        seed: args.seed,
        // The streaming schedule cannot time-stretch; with --speed each sentence is made whole.
        stream: args.speed == 1.0,
        ignore_stop_until: args.min_tokens,
    };
    let output = crate::say::Output::from_setting(args.device.as_deref(), &config.output.device);
    crate::say::say(config, &req, &output, args.event_log.as_deref())?;
    Ok(())
}

fn voice_command(config: &Config, action: &VoiceAction) -> anyhow::Result<()> {
    let store = crate::voice::VoiceStore::new(&config.voices.dir);
    match action {
        VoiceAction::Add { name, wav, text, force } => {
            crate::voice::check_name(name)?;
            if store.path_of(name).exists() && !force {
                // Refuse before the model is loaded; `save` checks again.
                return Err(Error::Input(format!(
                    "voice {name:?} already exists ({}); remove it first (`cosy voice rm {name}`) or pass --force",
                    store.path_of(name).display()
                ))
                .into());
            }
            if text.trim().is_empty() {
                return Err(Error::Input("the transcript (--text) is empty; give the words spoken in the recording".into()).into());
            }
            check_prompt_audio(wav)?;
            let mut synth = crate::pipeline::Synthesizer::load(config)?;
            let voice = synth.make_voice(name, wav, text)?;
            let path = store.save(&voice, *force)?;
            println!("saved voice {name} ({} prompt tokens) to {}", voice.speech_token.len(), path.display());
            Ok(())
        }
        VoiceAction::List => {
            let names = store.names()?;
            if names.is_empty() {
                println!("no saved voices in {} (add one with `cosy voice add NAME --wav FILE --text TEXT`)", store.dir.display());
                return Ok(());
            }
            let current = crate::model::ModelDir::open(&config.model_dir).ok().and_then(|d| crate::voice::model_key(&d).ok());
            for name in names {
                match store.load(&name) {
                    Ok(v) => {
                        let fit = match &current {
                            Some(k) if *k == v.model_key => "",
                            Some(_) => "  [made for another model]",
                            None => "",
                        };
                        let secs = v.speech_token.len() as f64 / 25.0;
                        println!("{name}  {}  {secs:.1} s  {:?}{fit}", v.created, v.transcript);
                    }
                    Err(e) => println!("{name}  [unreadable: {e}]"),
                }
            }
            Ok(())
        }
        VoiceAction::Rm { name } => {
            let path = store.remove(name)?;
            println!("removed voice {name} ({})", path.display());
            Ok(())
        }
    }
}

fn profile_command(config: &Config, args: &ProfileArgs) -> anyhow::Result<()> {
    use crate::pipeline::Request;
    use crate::profile::report::{machine, matrix, profile, render_matrix, ProfilePlan, Setting};

    let text = match (&args.input, args.text.as_deref()) {
        (Some(f), _) => std::fs::read_to_string(f).map_err(|e| Error::Input(format!("--input {}: {e}", f.display())))?,
        (None, Some("-")) => read_stdin()?,
        (None, Some(t)) => t.to_string(),
        (None, None) => PROFILE_TEXT.to_string(),
    };
    let voice = resolve_voice(config, &args.voice)?;
    if args.runs == 0 {
        return Err(Error::Input("--runs must be at least 1".into()).into());
    }
    let plan = ProfilePlan {
        request: Request {
            text,
            voice,
            text_frontend: !args.no_text_frontend,
            speed: 1.0,
            seed: args.seed,
            stream: args.stream,
            ignore_stop_until: args.min_tokens,
        },
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
            config.runtime.providers.first().copied().unwrap_or(crate::config::ProviderKind::Cpu),
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
        crate::pipeline::dump::write_atomic(path, text.as_bytes())
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
