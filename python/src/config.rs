//! The configuration of a Python engine: the binary's rules (built-in defaults, then the config
//! file — `config`, else `$COSY_CONFIG`, else `./config.toml`, else the user's, else the
//! system's — then `COSY_*`, then the keyword settings), into the library's keys.
//!
//! The same config file also holds `cosy serve`'s sections (`[server]`, `[wyoming]`) and the
//! server has variables of its own; those are the server's to check, and an engine in Python
//! serves nothing, so they are accepted here and not read (a misspelt library key is still
//! refused). ONNX Runtime comes from the `onnxruntime` Python package (its path is found by the
//! Python half) unless a setting or `ORT_DYLIB_PATH` names a library.

use std::path::PathBuf;

use cosy::config::{About, Config, KeyTable, LoadOptions, Origin, RawValue, Renamed, Setting};

/// The variables of the binary's own keys (config.toml's `[server]`, `[wyoming]` and `[say]`; the
/// package's tests hold this list against that file).
const SERVER_VARIABLES: &[&str] = &["COSY_BIND", "COSY_API_KEY", "COSY_WYOMING", "COSY_WYOMING_ZEROCONF", "COSY_SERVER"];

/// `[server]`, `[wyoming]` and `[say]`: any key, accepted and left alone.
struct ServerSections;

static SERVER_KEYS: [About; 3] = [
    About {
        name: "server.<key>",
        allowed: "any value (cosy serve's key, not read by the Python engine)",
        default: None,
        default_is: Some("cosy serve's"),
        env: None,
        doc: "cosy serve's settings",
    },
    About {
        name: "wyoming.<key>",
        allowed: "any value (cosy serve's key, not read by the Python engine)",
        default: None,
        default_is: Some("cosy serve's"),
        env: None,
        doc: "cosy serve's Wyoming settings",
    },
    About {
        name: "say.<key>",
        allowed: "any value (the cosy command's key, not read by the Python engine)",
        default: None,
        default_is: Some("the cosy command's"),
        env: None,
        doc: "where cosy say and cosy file find a running cosy serve",
    },
];

impl KeyTable for ServerSections {
    fn about(&self) -> Vec<&'static About> {
        SERVER_KEYS.iter().collect()
    }

    fn renamed(&self) -> &'static [Renamed] {
        &[]
    }

    fn set(&mut self, _index: usize, _setting: &Setting<'_>) -> cosy::Result<()> {
        Ok(())
    }
}

/// Loads the configuration; `model` and `settings` act as the binary's `--model` and `--set`.
/// `ort_library` (the onnxruntime package's library) is used when nothing else names one.
pub(crate) fn load(model: Option<String>, config_file: Option<PathBuf>, settings: Vec<(String, String)>, ort_library: Option<PathBuf>) -> cosy::Result<Config> {
    let mut options = LoadOptions::from_process_env();
    options.env.retain(|(name, _)| !SERVER_VARIABLES.contains(&name.as_str()));
    options.config_file = config_file;
    options.default_file = Some(PathBuf::from("config.toml"));
    options.user_files = true;
    if let Some(m) = model {
        options.flags.push(("model.dir".into(), m));
    }
    options.flags.extend(settings);
    let mut config = Config::load_with(&options, &mut [&mut ServerSections])?;
    if let (None, Some(library)) = (config.ort_library_setting(), ort_library) {
        let value = RawValue::Text(library.display().to_string());
        config.set("runtime.ort_library", &value, &Origin::Flag("the onnxruntime Python package".into()), None)?;
    }
    Ok(config)
}
