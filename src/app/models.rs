//! The user's models: list them, add an exported folder under a name, choose the default.
//!
//! A models folder (`$XDG_DATA_HOME/cosy/models`, [`crate::paths::models_dir`]) holds one exported
//! model folder per name (docs/model-format.md) and a `DEFAULT` file naming the one used when no
//! config file, `COSY_MODEL` or `--model` names another ([`crate::paths::default_model`] reads
//! it). An install's bundled tiny random-weight model is listed too, and is the default only
//! while the user has no model of their own. Front ends (`cosy model …`) only translate.

use std::path::{Path, PathBuf};

use crate::error::{Error, InputCode, Result};
use crate::model::ModelDir;
use crate::paths::{self, DEFAULT_MODEL_MARKER};

/// One model as `cosy model list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    pub name: String,
    pub path: PathBuf,
    /// Bytes of every file in the folder (links followed).
    pub bytes: u64,
    /// The precisions its graphs come in (`fp32`, `fp16`, …), from its manifest.
    pub precisions: Vec<String>,
    /// Random weights (the exporter's random mode): noise, not speech.
    pub random: bool,
    /// The bundled tiny model of an install, not one of the user's.
    pub bundled: bool,
    /// The model used when nothing names another.
    pub is_default: bool,
    /// Why the folder cannot be used, when its manifest cannot be read.
    pub problem: Option<String>,
}

/// What [`Models::add`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    pub path: PathBuf,
    /// It became the default (asked for, or the first model).
    pub made_default: bool,
}

/// The user's models folder and the install's bundled model.
#[derive(Debug, Clone)]
pub struct Models {
    pub dir: PathBuf,
    pub bundled: Option<PathBuf>,
}

impl Models {
    /// The models folder of this user and the bundled model of this install.
    pub fn of_user() -> Self {
        Models { dir: paths::models_dir(), bundled: paths::bundled_model() }
    }

    /// Every model folder, the user's by name then the bundled one, with the default marked.
    pub fn list(&self) -> Result<Vec<ModelEntry>> {
        let default = paths::default_model(&self.dir, self.bundled.as_deref())?.0;
        let mut out: Vec<ModelEntry> = paths::model_names(&self.dir)
            .into_iter()
            .map(|name| entry(name.clone(), self.dir.join(&name), false, &default))
            .collect();
        if let Some(b) = &self.bundled {
            out.push(entry(paths::BUNDLED_MODEL.to_string(), b.clone(), true, &default));
        }
        Ok(out)
    }

    /// Adds the exported folder `src` as `name`: copied into the models folder (whole or not at
    /// all: into a temporary folder, then renamed), or with `link` a symbolic link to it (no copy
    /// of several GB). The folder must be a model folder whose files are all there. It becomes the
    /// default when `make_default` or when no default is set yet.
    pub fn add(&self, name: &str, src: &Path, link: bool, force: bool, make_default: bool) -> Result<Added> {
        check_model_name(name)?;
        let model = ModelDir::open(src).map_err(|e| Error::input(InputCode::Invalid, Some("path"), e.to_string()))?;
        let problems = model.check_files(false);
        if let Some(first) = problems.first() {
            return Err(Error::input(
                InputCode::Invalid,
                Some("path"),
                format!("{} is not a complete model folder ({} problem(s); first: {first}); `cosy doctor --model {}` lists them", src.display(), problems.len(), src.display()),
            ));
        }
        let dest = self.dir.join(name);
        let taken = dest.symlink_metadata().is_ok();
        if taken && !force {
            return Err(Error::input(
                InputCode::Invalid,
                Some("name"),
                format!("a model named {name:?} exists already ({}); give another name, or --force to replace it", dest.display()),
            ));
        }
        crate::fsx::create_folder(&self.dir, "the models folder")?;
        // What an add killed midway left behind.
        crate::fsx::clean_temps(&self.dir);
        let src_abs = std::fs::canonicalize(src).map_err(|e| Error::io(src, e))?;
        if std::fs::canonicalize(&dest).ok().as_deref() == Some(src_abs.as_path()) {
            return Err(Error::input(InputCode::Invalid, Some("path"), format!("{} is already the model {name:?}", src.display())));
        }
        // Staged under a temporary name (a copy synced file by file), then put in place by one
        // rename: a crash or a full disk leaves the previous model or the new one, never a part.
        let target = crate::fsx::Dest::new(&dest, format!("model {name:?}"));
        let staging = target.temp_path();
        let staged = if link {
            std::os::unix::fs::symlink(&src_abs, &staging).map_err(|e| target.error(e))
        } else {
            copy_tree(&src_abs, &staging, &target)
        };
        if let Err(e) = staged {
            let _ = remove_any(&staging);
            return Err(e);
        }
        crate::fsx::test_hooks_at("staged");
        let placed = if taken { crate::fsx::exchange(&staging, &dest) } else { std::fs::rename(&staging, &dest) };
        if let Err(e) = placed {
            let _ = remove_any(&staging);
            return Err(target.error(e));
        }
        crate::fsx::test_hooks_at("renamed");
        // After an exchange the staging name holds the previous model.
        remove_any(&staging)?;
        crate::fsx::sync_folder(&self.dir).map_err(|e| target.error(e))?;
        let made_default = make_default || paths::folder_default_model(&self.dir).ok().flatten().is_none();
        if made_default {
            self.set_default(name)?;
        }
        Ok(Added { path: dest, made_default })
    }

    /// Makes the model `name` of the models folder the default.
    pub fn set_default(&self, name: &str) -> Result<PathBuf> {
        check_model_name(name)?;
        let dir = self.dir.join(name);
        if !dir.join(crate::model::MANIFEST).is_file() {
            let known = paths::model_names(&self.dir);
            let known = if known.is_empty() { "none yet: `cosy model add NAME PATH`".to_string() } else { known.join(", ") };
            return Err(Error::input(
                InputCode::Invalid,
                Some("name"),
                format!("no model named {name:?} in {} (models: {known})", self.dir.display()),
            ));
        }
        ModelDir::open(&dir)?;
        let marker = self.dir.join(DEFAULT_MODEL_MARKER);
        crate::fsx::Dest::new(&marker, "the default-model marker").write(format!("{name}\n").as_bytes())?;
        Ok(marker)
    }
}

/// Model names follow the voice names' rule (1-64 letters, digits, '.', '_', '-'; not first '.'
/// or '-'): a folder name that cannot escape the models folder.
pub fn check_model_name(name: &str) -> Result<()> {
    crate::vocab::check_voice_name(name).map_err(|_| {
        Error::input(
            InputCode::Invalid,
            Some("name"),
            format!("model name {name:?} is not allowed; use 1-64 letters, digits, '.', '_' or '-' (not first)"),
        )
    })?;
    if name == DEFAULT_MODEL_MARKER {
        return Err(Error::input(InputCode::Invalid, Some("name"), format!("{name:?} is the models folder's marker file; choose another name")));
    }
    Ok(())
}

fn entry(name: String, path: PathBuf, bundled: bool, default: &Path) -> ModelEntry {
    let (precisions, random, problem) = match ModelDir::open(&path) {
        Ok(m) => {
            let mut p: Vec<String> = m.manifest.graphs.values().flat_map(|g| g.variants.keys().cloned()).collect();
            p.sort();
            p.dedup();
            (p, m.manifest.source.get("random").is_some(), None)
        }
        Err(e) => (Vec::new(), false, Some(e.to_string())),
    };
    ModelEntry { bytes: tree_bytes(&path), is_default: path == default, name, path, precisions, random, bundled, problem }
}

/// Bytes of the files under `dir` (links followed; unreadable entries count 0).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => tree_bytes(&p),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        })
        .sum()
}

/// Copies the folder `src` to `dst`, every file and folder synced; a write that fails is
/// named by `target` (the model's final folder, not the staging one).
fn copy_tree(src: &Path, dst: &Path, target: &crate::fsx::Dest) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(|e| target.error(e))?;
    for e in std::fs::read_dir(src).map_err(|e| Error::io(src, e))? {
        let e = e.map_err(|e| Error::io(src, e))?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let meta = std::fs::metadata(&from).map_err(|err| Error::io(&from, err))?;
        if meta.is_dir() {
            copy_tree(&from, &to, target)?;
        } else {
            let mut reader = std::fs::File::open(&from).map_err(|err| Error::io(&from, err))?;
            let mut writer = std::fs::File::create(&to).map_err(|err| target.error(err))?;
            std::io::copy(&mut reader, &mut writer).and_then(|_| writer.sync_all()).map_err(|err| target.error(err))?;
        }
    }
    crate::fsx::sync_folder(dst).map_err(|e| target.error(e))
}

/// Removes a file, a link or a folder, if there is one.
fn remove_any(p: &Path) -> Result<()> {
    let Ok(meta) = p.symlink_metadata() else { return Ok(()) };
    let r = if meta.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
    r.map_err(|e| Error::io(p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny")
    }

    #[test]
    fn add_copies_or_links_and_the_first_model_becomes_the_default() {
        let d = tempfile::tempdir().unwrap();
        let models = Models { dir: d.path().join("models"), bundled: Some(tiny()) };
        let listed = models.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].bundled && listed[0].is_default && listed[0].random, "{listed:?}");
        let added = models.add("a", &tiny(), false, false, false).unwrap();
        assert!(added.made_default && added.path.join("manifest.json").is_file());
        let linked = models.add("b", &tiny(), true, false, false).unwrap();
        assert!(!linked.made_default && linked.path.symlink_metadata().unwrap().file_type().is_symlink());
        let listed = models.list().unwrap();
        let names: Vec<(&str, bool)> = listed.iter().map(|m| (m.name.as_str(), m.is_default)).collect();
        assert_eq!(names, [("a", true), ("b", false), ("tiny", false)], "the bundled model is no longer the default");
        assert!(listed[0].bytes > 0 && listed[0].precisions.contains(&"fp32".to_string()), "{listed:?}");
        models.set_default("b").unwrap();
        assert_eq!(paths::default_model(&models.dir, None).unwrap().0, models.dir.join("b"));
        let e = models.add("a", &tiny(), false, false, false).unwrap_err().to_string();
        assert!(e.contains("exists already") && e.contains("--force"), "{e}");
        models.add("a", &tiny(), true, true, false).unwrap();
        for bad in ["../x", "", "DEFAULT"] {
            assert!(models.add(bad, &tiny(), true, false, false).is_err(), "{bad}");
        }
        let e = models.set_default("nope").unwrap_err().to_string();
        assert!(e.contains("a, b"), "{e}");
        let e = models.add("c", d.path(), false, false, false).unwrap_err().to_string();
        assert!(e.contains("manifest.json"), "{e}");
        let leftovers: Vec<_> = std::fs::read_dir(&models.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 3, "a, b, DEFAULT: no staging folder left: {leftovers:?}");
    }
}
