//! Run-time configuration: `config.toml`, `COSY_*` environment variables and command-line flags.
//!
//! Precedence, lowest first: built-in defaults < config file < environment < flags. Every setting
//! has one dotted key (`runtime.providers`, `stages.dit.precision`, ...), declared once in a key
//! table ([`KEYS`], `config/keys.rs`: default, allowed values, variable, doc, setter), and every
//! source goes through the same setter, so a bad value is refused with the same message wherever
//! it came from: the key, the value, where it came from and what is allowed. Unknown keys are
//! refused too. A front end with settings of its own (`cosy serve`: `[server]`, `[wyoming]`)
//! passes its own table ([`KeyTable`]) to [`Config::load_with`]: one load, one precedence, one
//! record of where each value came from, over both.
//!
//! Relative paths in a config file are resolved against the file's folder; relative paths from the
//! environment or flags against the current directory.

mod key;
mod keys;
mod settings;
mod toml_file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::paths;

use key::{matches, text_of};
pub use key::{About, Key, KeyTable, Origin, RawValue, Renamed, Section, Setter, Setting, TRUE_FALSE};
pub use keys::{KEYS, RENAMED};
pub use settings::{
    default_engine_cache, AutoSwitch, Config, CpuSwitch, CudaConvSearch, ShapeBuckets, LlmKv, DebugSettings, EngineSettings, LimitSettings, MarkdownSettings, CodeBlocks, Symbols, NormalizerChoice,
    OutputSettings, RuntimeSettings, SamplingSettings, Sources, StageSettings, StreamingSettings, TextSettings, VoiceSettings,
};

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
    /// Builds the configuration of the library's keys: defaults, then the config file, the
    /// environment, the flags ([`Config::load_with`] without a front end's keys).
    pub fn load(opts: &LoadOptions) -> Result<Config> {
        Config::load_with(opts, &mut [])
    }

    /// Builds the configuration: defaults, then the config file, the environment, the flags, into
    /// the library's keys and each front end's table (`cosy serve`'s `[server]` and `[wyoming]`).
    /// A key none of them has is refused; where each value came from is in [`Config::sources`].
    pub fn load_with(opts: &LoadOptions, front_ends: &mut [&mut dyn KeyTable]) -> Result<Config> {
        let mut cfg = Config::default();
        let env_file = opts.env.iter().find(|(k, _)| k == CONFIG_ENV).map(|(_, v)| (PathBuf::from(v), CONFIG_ENV));
        let named = opts.config_file.clone().map(|p| (p, "--config")).or(env_file);
        let choice = paths::choose_config(named, opts.default_file.as_deref(), opts.user_files)?;
        let mut sources = BTreeMap::new();
        cfg.loading(front_ends, &mut sources, |loading| {
            if let Some(path) = &choice.file {
                for (key, value, origin) in toml_file::read_leaves(path)? {
                    loading.set(&key, &RawValue::Toml(value), &origin, path.parent())?;
                }
            }
            loading.apply_env(&opts.env)?;
            for (key, value) in &opts.flags {
                loading.set(key, &RawValue::Text(value.clone()), &Origin::Flag(key.clone()), None)?;
            }
            Ok(())
        })?;
        cfg.source_file = choice.file;
        cfg.sources.config_file = choice.why;
        cfg.sources.keys = sources;
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
        if let (Some(why), "model.dir") = (&self.sources.default_model, key) {
            return why.clone();
        }
        match KEYS.iter().find(|k| matches(k.about.name, key).is_some()).and_then(|k| k.about.default_is) {
            Some(what) => format!("the default: {what}"),
            None => "the built-in default".into(),
        }
    }

    /// Sets one dotted key of the library's. `base` resolves relative paths (the config file's
    /// folder). The origin is remembered ([`Config::source_of`]).
    pub fn set(&mut self, key: &str, value: &RawValue, origin: &Origin, base: Option<&Path>) -> Result<()> {
        self.set_with(&mut [], key, value, origin, base)
    }

    /// Sets one dotted key of the library's or of a front end's table (`cosy serve --bind`), and
    /// remembers its origin here as [`Config::load_with`] does.
    pub fn set_with(
        &mut self,
        front_ends: &mut [&mut dyn KeyTable],
        key: &str,
        value: &RawValue,
        origin: &Origin,
        base: Option<&Path>,
    ) -> Result<()> {
        let mut sources = std::mem::take(&mut self.sources.keys);
        let result = self.loading(front_ends, &mut sources, |loading| loading.set(key, value, origin, base));
        self.sources.keys = sources;
        result
    }

    /// Runs `f` over the tables of one load: this configuration's (the library's keys) first, then
    /// the front ends'; the origins go to `sources`.
    fn loading(
        &mut self,
        front_ends: &mut [&mut dyn KeyTable],
        sources: &mut BTreeMap<String, String>,
        f: impl FnOnce(&mut Loading<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        let mut own = Section::new(KEYS, RENAMED, self);
        let mut tables: Vec<&mut dyn KeyTable> = vec![&mut own];
        for t in front_ends.iter_mut() {
            tables.push(&mut **t);
        }
        f(&mut Loading { tables, sources })
    }
}

/// One load in progress: the key tables it fills (the library's first, then the front ends') and
/// where each value came from. Every source goes through [`Loading::set`]: one lookup, one refusal
/// of unknown keys, one record.
struct Loading<'t, 's> {
    tables: Vec<&'t mut dyn KeyTable>,
    sources: &'s mut BTreeMap<String, String>,
}

/// A key found in a table: which, and what its setter is told.
struct Found {
    table: usize,
    index: usize,
    allowed: &'static str,
    /// What its placeholders stand for.
    names: Vec<String>,
    /// The key as messages name it.
    shown: String,
    /// A renamed key: the new name and why it was renamed (a warning says both).
    renamed: Option<(String, &'static str)>,
}

impl Loading<'_, '_> {
    fn about(&self) -> Vec<&'static About> {
        self.tables.iter().flat_map(|t| t.about()).collect()
    }

    /// Sets one dotted key in whichever table has it (under an old name too), and records where
    /// the value came from (`""` for a key with a default: that default).
    fn set(&mut self, key: &str, value: &RawValue, origin: &Origin, base: Option<&Path>) -> Result<()> {
        let found = self.find(key).ok_or_else(|| self.unknown_key(key, value, origin))?;
        let setting = Setting { shown: &found.shown, value, origin, base, allowed: found.allowed, names: &found.names };
        self.tables[found.table].set(found.index, &setting)?;
        if let Some((new, why)) = &found.renamed {
            tracing::warn!("{origin}: {key} is deprecated; it now sets {new} ({why}): rename it");
        }
        let said = if text_of(value).is_some_and(|s| s.is_empty()) { format!("{origin} (\"\": the default)") } else { origin.to_string() };
        self.sources.insert(key.to_string(), said);
        Ok(())
    }

    fn find(&self, key: &str) -> Option<Found> {
        let lookup = |key: &str| {
            self.tables.iter().enumerate().find_map(|(table, t)| {
                t.about().into_iter().enumerate().find_map(|(index, a)| matches(a.name, key).map(|names| (table, index, a.allowed, names)))
            })
        };
        if let Some((table, index, allowed, names)) = lookup(key) {
            return Some(Found { table, index, allowed, names, shown: key.to_string(), renamed: None });
        }
        let (new, why) = self.tables.iter().flat_map(|t| t.renamed()).find_map(|r| r.rename(key).map(|new| (new, r.why)))?;
        let (table, index, allowed, names) = lookup(&new)?;
        let shown = if why.is_some() { format!("{key} (now {new})") } else { key.to_string() };
        Some(Found { table, index, allowed, names, shown, renamed: why.map(|why| (new, why)) })
    }

    /// A key no table has: the fields of its family when its parent is one (`stages.dit.x`),
    /// else every key.
    fn unknown_key(&self, key: &str, value: &RawValue, origin: &Origin) -> Error {
        let about = self.about();
        if let Some((parent, _)) = key.rsplit_once('.') {
            let fields: Vec<&str> = about
                .iter()
                .filter_map(|a| a.name.rsplit_once('.'))
                .filter(|(family, _)| family.contains('<') && matches(family, parent).is_some())
                .map(|(_, field)| field)
                .collect();
            if !fields.is_empty() {
                return Error::Config(format!("{origin}: {key} = {value}: unknown key; {parent} has: {}", fields.join(", ")));
            }
        }
        let known: Vec<&str> = about.iter().map(|a| a.name).collect();
        Error::Config(format!("{origin}: {key} = {value}: unknown key; known keys: {}", known.join(", ")))
    }

    /// The `COSY_*` variables of every table's keys; any other `COSY_*` name is refused (a
    /// misspelt variable would otherwise be ignored without a word).
    fn apply_env(&mut self, env: &[(String, String)]) -> Result<()> {
        let vars: Vec<(&'static str, &'static str)> = self.about().iter().filter_map(|a| a.env.map(|var| (var, a.name))).collect();
        for (var, key) in &vars {
            if let Some((_, value)) = env.iter().find(|(k, _)| k == var) {
                self.set(key, &RawValue::Text(value.clone()), &Origin::Env(var), None)?;
            }
        }
        if let Some((_, value)) = env.iter().find(|(k, _)| k == LOG_ENV) {
            check_log_filter(value)?;
        }
        let known: Vec<&str> = vars.iter().map(|(var, _)| *var).chain([CONFIG_ENV, LOG_ENV]).collect();
        for (name, value) in env {
            if name.starts_with("COSY_") && !known.contains(&name.as_str()) && !IGNORED_ENV.contains(&name.as_str()) && !is_service_link(name) {
                return Err(Error::Config(format!("environment {name}={value:?}: unknown variable; known: {}", known.join(", "))));
            }
        }
        Ok(())
    }
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
    crate::fsx::KILL_AT_ENV,
    crate::fsx::PAUSE_AT_ENV,
    crate::fsx::PAUSE_DIR_ENV,
];

/// Variables a platform sets for a service named `cosy` (Kubernetes service links, Docker
/// links): `COSY_SERVICE_HOST`, `COSY_SERVICE_PORT_HTTP`, `COSY_PORT`, `COSY_PORT_80_TCP_ADDR`, …
/// They are not ours and must not stop a server from starting.
fn is_service_link(name: &str) -> bool {
    let rest = &name["COSY_".len()..];
    rest.starts_with("SERVICE_HOST") || rest.starts_with("SERVICE_PORT") || rest == "PORT" || rest.starts_with("PORT_")
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
    fn voice_aliases_are_checked() {
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
        ] {
            let e = set(&[(key, value)]).expect_err(key).to_string();
            assert!(e.contains(key) && e.contains(needle), "{key}={value}: {e}");
        }
        let e = set(&[("voices.aliases.x y", "anna")]).expect_err("a space").to_string();
        assert!(e.contains("alloy, ash, ballad, coral, echo, fable, onyx, nova, sage, shimmer, verse, marin, cedar"), "{e}");
    }

    #[test]
    fn a_family_names_its_fields_and_old_names_are_still_read() {
        let load = |key: &str, value: &str| Config::load(&LoadOptions { flags: vec![(key.into(), value.into())], ..LoadOptions::default() });
        let e = load("stages.dit.threading", "2").expect_err("not a stage key").to_string();
        assert!(e.contains("unknown key; stages.dit has: precision, providers, threads, spinning"), "{e}");
        let e = load("stages.vocoder.threads", "2").expect_err("not a group").to_string();
        assert!(e.contains("unknown key; known keys: model.dir, "), "{e}");
        let c = load("stages.dit.provider", "cuda").unwrap();
        assert_eq!(c.providers_for(crate::vocab::StageGroup::Dit), vec![crate::vocab::ProviderKind::Cuda]);
        assert!(c.sources.keys.contains_key("stages.dit.provider"));
        let e = load("stages.dit.provider", "rocm").expect_err("no such provider").to_string();
        assert!(e.contains("flag stages.dit.provider: stages.dit.provider = \"rocm\": invalid value"), "{e}");
    }

    /// What `cosy doctor` says of a key nothing set: the table's words for a default found at run
    /// time, else the built-in default.
    #[test]
    fn the_source_of_a_default_comes_from_the_table() {
        let c = Config::default();
        assert_eq!(c.source_of("voices.dir"), "the default: the user's data folder ($XDG_DATA_HOME/cosy/voices)");
        assert_eq!(c.source_of("runtime.engine_cache"), "the default: the user's cache folder ($XDG_CACHE_HOME/cosy/engines)");
        assert_eq!(c.source_of("runtime.graph_cache"), "the default: <runtime.engine_cache>/graphs");
        assert_eq!(c.source_of("runtime.threads"), "the built-in default");
        let c = Config::load(&LoadOptions { flags: vec![("runtime.graph_cache".into(), "".into())], ..LoadOptions::default() }).unwrap();
        assert_eq!(c.source_of("runtime.graph_cache"), "set by flag runtime.graph_cache (\"\": the default)");
    }

    /// Each key's documented default is the built-in one: set through its own setter, it changes
    /// nothing (the keys whose default is found at run time say what it is instead).
    #[test]
    fn every_keys_default_is_the_built_in_one() {
        let groups: Vec<&str> = crate::vocab::StageGroup::ALL.iter().map(|g| g.as_str()).collect();
        for k in KEYS {
            let a = &k.about;
            assert!(!a.doc.is_empty() && !a.allowed.is_empty(), "{}: doc and allowed values", a.name);
            let Some(default) = a.default else {
                assert!(a.default_is.is_some(), "{}: a default, or what it is", a.name);
                continue;
            };
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {default}")).expect("TOML")["v"].clone();
            let key = a.name.replace(&format!("<{}>", groups.join("|")), "dit").replace("<name>", "alloy");
            let mut c = Config::default();
            c.set(&key, &RawValue::Toml(value), &Origin::Flag(key.clone()), None).unwrap_or_else(|e| panic!("{key} = {default}: {e}"));
            assert_eq!(c, Config::default(), "{key} = {default} is not the default");
        }
    }
}
