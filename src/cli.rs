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
    /// Precision for every stage: fp32, fp16 or bf16 (runtime.precision).
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
    /// Speak text aloud (or to a file with --out).
    Say(SynthArgs),
    /// Synthesise a text file to a wav file.
    File(SynthArgs),
    /// Time each stage on a sample text.
    Profile(SynthArgs),
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

/// Arguments of the synthesis commands (not yet implemented).
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Text, or the input file for `cosy file`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum EnginesAction {
    /// Build engines for every stage (or --stage) at the configured precision (or --precision).
    Build {
        #[arg(long = "stage", value_name = "STAGE")]
        stages: Vec<String>,
        /// Precisions to build (repeatable): fp32, fp16, bf16.
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
        Command::Say(_) | Command::File(_) | Command::Profile(_) => {
            let name = match &cli.command {
                Command::Say(_) => "say",
                Command::File(_) => "file",
                _ => "profile",
            };
            anyhow::bail!("`cosy {name}` is not yet implemented")
        }
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
                        .ok_or_else(|| Error::Config(format!("--precisions {p:?}: allowed: fp32, fp16, bf16")))
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
