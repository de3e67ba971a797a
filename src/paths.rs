//! Where cosy's files live when no setting names them: the one place that decides it.
//!
//! On Linux these are the XDG base directories (through the `dirs` crate, which reads
//! `$XDG_CONFIG_HOME`, `$XDG_DATA_HOME`, `$XDG_CACHE_HOME` and falls back to `~/.config`,
//! `~/.local/share`, `~/.cache`):
//!
//! | what | where |
//! |---|---|
//! | config file | `--config`, `$COSY_CONFIG`, `./config.toml` (a project folder), `$XDG_CONFIG_HOME/cosy/config.toml`, `/etc/cosy/config.toml` |
//! | models | `$XDG_DATA_HOME/cosy/models/NAME`, the default named by `models/DEFAULT` (`cosy model use`); with no model there, the bundled tiny one of an install (`<prefix>/share/cosy/models/tiny`) |
//! | voices | `$XDG_DATA_HOME/cosy/voices` |
//! | ONNX Runtime | `<prefix>/lib/cosy/` beside the executable, then `$XDG_DATA_HOME/cosy/lib/` (see `runtime::env`) |
//! | caches | `$XDG_CACHE_HOME/cosy/engines` (TensorRT engines, `graphs/` for optimised graphs) |
//! | the local server's socket | `$XDG_RUNTIME_DIR/cosy/cosy.sock`, else `/tmp/cosy-UID/cosy.sock` (`cosy serve` listens there, `cosy say` looks there) |
//!
//! A config file's relative paths stay relative to that file (`config::toml_file::read_leaves`, `Setting::path`); so a
//! checkout's `config.toml` keeps `models/`, `voices/` beside it. Nothing here is ever relative to
//! the current folder, so a run from anywhere writes nothing there unless asked to.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::vocab::check_voice_name;

/// The file in the models folder that names the default model (`cosy model use NAME`), as the
/// voices folder's `DEFAULT` names the default voice.
pub const DEFAULT_MODEL_MARKER: &str = "DEFAULT";

/// The system-wide config file, read when no other is found.
pub const SYSTEM_CONFIG: &str = "/etc/cosy/config.toml";

/// The name of a project folder's config file, looked for in the current folder.
pub const PROJECT_CONFIG: &str = "config.toml";

/// The bundled tiny random-weight model's name in an install (`<prefix>/share/cosy/models/tiny`).
pub const BUNDLED_MODEL: &str = "tiny";

/// A folder of the user's, absolute: `dirs` gives `None` without a home folder, and a relative
/// `$XDG_*` value is ignored by the XDG spec (and by `dirs`); then `fallback`.
fn user_dir(found: Option<PathBuf>, fallback: &str) -> PathBuf {
    found.filter(|d| d.is_absolute()).unwrap_or_else(|| PathBuf::from(fallback)).join("cosy")
}

/// `$XDG_CONFIG_HOME/cosy` (else `~/.config/cosy`; `/etc/cosy` with no home folder).
pub fn config_home() -> PathBuf {
    dirs::config_dir().filter(|d| d.is_absolute()).map_or_else(|| PathBuf::from("/etc/cosy"), |d| d.join("cosy"))
}

/// `$XDG_DATA_HOME/cosy` (else `~/.local/share/cosy`; `/var/lib/cosy` with no home folder).
pub fn data_home() -> PathBuf {
    user_dir(dirs::data_dir(), "/var/lib")
}

/// `$XDG_CACHE_HOME/cosy` (else `~/.cache/cosy`; `/var/cache/cosy` with no home folder).
pub fn cache_home() -> PathBuf {
    user_dir(dirs::cache_dir(), "/var/cache")
}

/// The user's models folder: one exported model folder per name.
pub fn models_dir() -> PathBuf {
    data_home().join("models")
}

/// The user's voices folder (the default `voices.dir`).
pub fn voices_dir() -> PathBuf {
    data_home().join("voices")
}

/// The default TensorRT engine cache (the optimised-graph cache is its `graphs/` folder).
pub fn engine_cache_dir() -> PathBuf {
    cache_home().join("engines")
}

/// Where `cosy serve` listens for the user's own commands (`server.socket = "auto"`) and where
/// `cosy say` and `cosy file` look for it (`say.server = ""`): `$XDG_RUNTIME_DIR/cosy/cosy.sock`
/// (the session's private runtime folder), else `/tmp/cosy-UID/cosy.sock` (a folder of the user's
/// own, mode 0700, which the server checks before it listens there).
pub fn local_socket() -> PathBuf {
    let folder = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(runtime) => PathBuf::from(runtime).join("cosy"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => std::env::temp_dir().join(format!("cosy-{}", unsafe { libc::getuid() })),
    };
    folder.join("cosy.sock")
}

/// The folder holding the running executable, symbolic links resolved (so `/usr/local/bin/cosy`
/// linking to `/opt/cosy/bin/cosy` gives `/opt/cosy/bin`).
pub fn exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    exe.parent().map(Path::to_path_buf)
}

/// The install prefix's shared data (`<prefix>/share/cosy`, `<prefix>` = the executable's folder's
/// parent), if the executable is installed that way (`scripts/install.sh`, the tarball).
pub fn install_share() -> Option<PathBuf> {
    let share = exe_dir()?.parent()?.join("share").join("cosy");
    share.is_dir().then_some(share)
}

/// The bundled tiny random-weight model of an install, if there is one.
pub fn bundled_model() -> Option<PathBuf> {
    let m = install_share()?.join("models").join(BUNDLED_MODEL);
    m.join("manifest.json").is_file().then_some(m)
}

/// Which config file is read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChoice {
    /// The file, or `None`: built-in defaults.
    pub file: Option<PathBuf>,
    /// Why this file (or why none), for `cosy doctor`.
    pub why: String,
}

/// The error for a config file path that is there but is not a file (a folder, a socket …):
/// `named` (by `--config` or `COSY_CONFIG`), or one cosy looks for (`./config.toml`, the user's,
/// the system's), which is never skipped without a word.
fn not_a_config_file(p: &Path, named: bool) -> Option<Error> {
    let meta = std::fs::metadata(p).ok().filter(|m| !m.is_file())?;
    let what = if meta.is_dir() { "a folder" } else { "not a regular file" };
    Some(Error::Config(if named {
        format!("config file {} is {what}; give the path of a config file (e.g. {})", p.display(), p.join("config.toml").display())
    } else {
        let shown = if p.is_relative() && !p.starts_with(".") { format!("./{}", p.display()) } else { p.display().to_string() };
        format!("config file {shown} is {what}, where cosy looks for its config file; move it away, or name a config file with --config FILE")
    }))
}

/// The config file a command reads: `named` (`--config`, else `$COSY_CONFIG`, already chosen by
/// the caller, `how` says which), else `project` (`./config.toml`, a project folder) when it
/// exists, else, when `user_files`, `$XDG_CONFIG_HOME/cosy/config.toml`, then
/// [`SYSTEM_CONFIG`]. A named file must exist; the others are skipped when absent.
pub fn choose_config(named: Option<(PathBuf, &str)>, project: Option<&Path>, user_files: bool) -> Result<ConfigChoice> {
    if let Some((p, how)) = named {
        if p.to_string_lossy().trim().is_empty() {
            return Err(Error::Config(
                "the config file named (--config or COSY_CONFIG) is empty; give a file path, or leave it out for ./config.toml".into(),
            ));
        }
        if let Some(e) = not_a_config_file(&p, true) {
            return Err(e);
        }
        if !p.is_file() {
            return Err(Error::Config(format!("config file {} does not exist", p.display())));
        }
        return Ok(ConfigChoice { file: Some(p), why: format!("named by {how}") });
    }
    let mut looked = Vec::new();
    if let Some(p) = project {
        if let Some(e) = not_a_config_file(p, false) {
            return Err(e);
        }
        if p.is_file() {
            return Ok(ConfigChoice {
                file: Some(p.to_path_buf()),
                why: "./config.toml in the current folder (a project folder)".into(),
            });
        }
        looked.push(p.to_path_buf());
    }
    if user_files {
        let user = config_home().join("config.toml");
        if let Some(e) = not_a_config_file(&user, false) {
            return Err(e);
        }
        if user.is_file() {
            return Ok(ConfigChoice { file: Some(user), why: "the user's config file ($XDG_CONFIG_HOME/cosy)".into() });
        }
        looked.push(user);
        let system = PathBuf::from(SYSTEM_CONFIG);
        if let Some(e) = not_a_config_file(&system, false) {
            return Err(e);
        }
        if system.is_file() {
            return Ok(ConfigChoice { file: Some(system), why: "the system's config file".into() });
        }
        looked.push(system);
    }
    // `./config.toml`: the project file is looked for in the current folder.
    let looked: Vec<String> =
        looked.iter().map(|p| if p.is_relative() { format!("./{}", p.display()) } else { p.display().to_string() }).collect();
    let why = if looked.is_empty() {
        "none (built-in defaults)".to_string()
    } else {
        format!("none found (looked for {}): built-in defaults", looked.join(", "))
    };
    Ok(ConfigChoice { file: None, why })
}

/// The default model named by a models folder's [`DEFAULT_MODEL_MARKER`], if any.
pub fn folder_default_model(models: &Path) -> Result<Option<String>> {
    crate::vocab::read_name_marker(&models.join(DEFAULT_MODEL_MARKER), |path, name| {
        Error::Config(format!("{}: {name:?} is not a model name; set the default again with `cosy model use NAME`", path.display()))
    })
}

/// The model folders (those with a `manifest.json`) in a models folder, by name.
pub fn model_names(models: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(models) else { return Vec::new() };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("manifest.json").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| check_voice_name(n).is_ok())
        .collect();
    names.sort();
    names
}

/// The model folder used when no config file, environment or flag sets `model.dir`, and why:
/// the models folder's default (its `DEFAULT` file, `cosy model use`); else its only model; else,
/// with no model there at all, the bundled tiny model of an install (noise, not speech); else
/// `<models>/cosyvoice3`, which does not exist (`cosy doctor` says how to add one).
pub fn default_model(models: &Path, bundled: Option<&Path>) -> Result<(PathBuf, String)> {
    if let Some(name) = folder_default_model(models)? {
        let why = format!("the default model named by {} (`cosy model use`)", models.join(DEFAULT_MODEL_MARKER).display());
        return Ok((models.join(name), why));
    }
    let names = model_names(models);
    if let [only] = names.as_slice() {
        return Ok((models.join(only), "the only model in the user's models folder".into()));
    }
    if names.is_empty() {
        if let Some(b) = bundled {
            return Ok((
                b.to_path_buf(),
                "the bundled tiny random-weight model (no model in the user's models folder): noise, not speech".into(),
            ));
        }
    }
    let why = if names.is_empty() {
        format!("no model in {} yet: `cosy model add NAME PATH`, or scripts/export.sh SRC", models.display())
    } else {
        format!("{} models in {} and none is the default: `cosy model use NAME`", names.len(), models.display())
    };
    Ok((models.join("cosyvoice3"), why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("manifest.json"), "{}").unwrap();
    }

    #[test]
    fn default_model_prefers_the_marker_then_the_only_model_then_the_bundled_one() {
        let d = tempfile::tempdir().unwrap();
        let models = d.path().join("models");
        let bundled = d.path().join("share/tiny");
        let (p, why) = default_model(&models, Some(&bundled)).unwrap();
        assert_eq!(p, bundled, "{why}");
        assert!(why.contains("noise"), "{why}");
        model(&models, "a");
        assert_eq!(default_model(&models, Some(&bundled)).unwrap().0, models.join("a"), "another model wins over the bundled one");
        model(&models, "b");
        let (p, why) = default_model(&models, Some(&bundled)).unwrap();
        assert_eq!(p, models.join("cosyvoice3"));
        assert!(why.contains("cosy model use"), "{why}");
        std::fs::write(models.join(DEFAULT_MODEL_MARKER), "b\n").unwrap();
        assert_eq!(default_model(&models, None).unwrap().0, models.join("b"));
        std::fs::write(models.join(DEFAULT_MODEL_MARKER), "../x\n").unwrap();
        assert!(default_model(&models, None).unwrap_err().to_string().contains("cosy model use"));
    }

    #[test]
    fn a_named_config_file_must_exist_and_an_absent_project_file_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let e = choose_config(Some((d.path().join("no.toml"), "--config")), None, false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = choose_config(Some((d.path().to_path_buf(), "--config")), None, false).unwrap_err();
        assert!(e.to_string().contains("is a folder"), "{e}");
        let c = choose_config(None, Some(&d.path().join("config.toml")), false).unwrap();
        assert_eq!(c.file, None);
        assert!(c.why.contains("looked for"), "{}", c.why);
        std::fs::write(d.path().join("config.toml"), "").unwrap();
        let c = choose_config(None, Some(&d.path().join("config.toml")), false).unwrap();
        assert_eq!(c.file, Some(d.path().join("config.toml")));
        assert!(c.why.contains("project folder"), "{}", c.why);
    }

    /// A folder where cosy looks for a config file (`./config.toml`, the user's, the system's) is
    /// an error naming it, never skipped as if nothing were there.
    #[test]
    fn a_folder_named_config_toml_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let project = d.path().join("config.toml");
        std::fs::create_dir(&project).unwrap();
        let e = choose_config(None, Some(&project), false).expect_err("a folder is not a config file");
        let text = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(text.contains(&format!("config file {} is a folder", project.display())), "{text}");
    }
}
