//! The TensorRT engine cache: one folder per cache key under the cache root (default `engines/`).
//!
//! The key is everything an engine depends on: the graph's content hash, the precision, the GPU,
//! the ONNX Runtime and TensorRT versions and the optimisation-profile shapes (plus the options
//! that change the build). Its sha256 names the folder `<stage>-<hash16>`, so a changed part
//! gives a new folder and a stale engine is never loaded. `key.json` in the folder holds the key
//! and, once a build finished, the size and sha256 of every file TensorRT wrote; a folder whose
//! `key.json` is missing, unreadable, different, unfinished, or whose files are missing, empty,
//! truncated or altered is removed and rebuilt (with a warning), never loaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::sha256_file;
use crate::runtime::keyed_dir::{self, EntryState};

/// The name of the key file in each cache folder.
pub const KEY_FILE: &str = keyed_dir::ENGINE_MARKER;

/// Everything a TensorRT engine depends on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheKey {
    pub stage: String,
    /// sha256 of the ONNX graph (from the manifest, checked against the file by `cosy doctor`).
    pub graph_sha256: String,
    pub precision: String,
    pub gpu: String,
    pub ort_version: String,
    pub trt_version: String,
    /// `input:min/opt/max` for each profiled input, sorted by input name.
    pub profiles: Vec<String>,
    /// Build options that change the engine (e.g. layer-norm fp32 fallback).
    pub options: Vec<String>,
}

impl CacheKey {
    /// First 16 hex digits of the sha256 of the key's canonical JSON.
    pub fn hash16(&self) -> String {
        keyed_dir::hash16(self)
    }
    /// The folder name: `<stage>-<hash16>`.
    pub fn dir_name(&self) -> String {
        keyed_dir::dir_name(&self.stage, self)
    }
}

/// A file TensorRT wrote into a cache folder.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedFile {
    pub bytes: u64,
    pub sha256: String,
}

/// The content of `key.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyFile {
    pub key: CacheKey,
    /// `false` while a build is in progress (or was interrupted).
    pub complete: bool,
    #[serde(default)]
    pub files: BTreeMap<String, CachedFile>,
    /// The folder is a runtime cache the provider itself rewrites as it runs (TensorRT for RTX's
    /// compiled kernels): its files are not recorded, only the key is checked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_cache: bool,
}

/// One folder in the cache.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub dir: PathBuf,
    pub key: Option<CacheKey>,
    pub state: EntryState,
    pub bytes: u64,
}

/// The cache root folder.
#[derive(Debug, Clone)]
pub struct EngineCache {
    pub root: PathBuf,
    /// Folders under the root that are not engine entries (the optimised-graph cache, by default
    /// `<root>/graphs`).
    exclude: Vec<PathBuf>,
}

impl EngineCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        EngineCache { root: root.into(), exclude: Vec::new() }
    }

    /// The engine cache of `config` (`runtime.engine_cache`), without the other caches that may
    /// lie in it: the optimised graphs and the DiT prompt-prefix files.
    pub fn of_config(config: &crate::config::Config) -> Self {
        EngineCache::new(config.runtime.engine_cache.clone()).excluding(&config.graph_cache_folder()).excluding(&config.prompt_cache_dir())
    }

    /// The same cache, with `dir` (a folder that may lie under the root) not taken for an entry.
    pub fn excluding(mut self, dir: &Path) -> Self {
        self.exclude.push(dir.to_path_buf());
        self
    }

    fn is_excluded(&self, dir: &Path, name: &str) -> bool {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let d = canon(dir);
        // The optimised-graph cache's temporary folders, should both caches share one folder (its
        // entries are skipped by `keyed_dir::subdirs`).
        self.exclude.iter().any(|x| canon(x) == d) || keyed_dir::is_work_folder(name)
    }

    pub fn dir_for(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.dir_name())
    }

    /// Checks a folder against the key it should hold.
    pub fn check(&self, dir: &Path, expected: Option<&CacheKey>) -> EntryState {
        match check_entry(dir, expected) {
            Ok(state) => state,
            Err(why) => EntryState::Corrupt(why),
        }
    }

    /// Makes the folder for `key` ready for a session: a valid folder is kept (its engines will
    /// load); anything else is removed with a warning and started afresh, with `key.json` marked
    /// incomplete until [`Self::finish`] records what the build wrote. Returns the folder and
    /// whether it already held valid engines.
    pub fn prepare(&self, key: &CacheKey) -> Result<(PathBuf, bool)> {
        let dir = self.dir_for(key);
        if dir.exists() {
            match self.check(&dir, Some(key)) {
                EntryState::Valid => return Ok((dir, true)),
                EntryState::Incomplete => {
                    tracing::warn!("engine cache {}: an earlier build did not finish; rebuilding", dir.display())
                }
                EntryState::Corrupt(why) => {
                    tracing::warn!("engine cache {}: {why}; removing it and rebuilding", dir.display())
                }
            }
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        crate::fsx::create_folder(&dir, "the cache folder")?;
        keyed_dir::write_marker(&dir, KEY_FILE, &KeyFile { key: key.clone(), complete: false, files: BTreeMap::new(), runtime_cache: false })?;
        Ok((dir, false))
    }

    /// Makes the folder for `key` ready as a provider's runtime cache ([`KeyFile::runtime_cache`]):
    /// a folder with the same key is kept as it is, anything else is removed with a warning and
    /// started afresh. Returns the folder and whether it already held files besides `key.json`.
    pub fn prepare_runtime_cache(&self, key: &CacheKey) -> Result<(PathBuf, bool)> {
        let dir = self.dir_for(key);
        if dir.exists() {
            match self.check(&dir, Some(key)) {
                EntryState::Valid => {
                    let held = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?.flatten().any(|e| e.file_name() != KEY_FILE);
                    return Ok((dir, held));
                }
                EntryState::Incomplete => tracing::warn!("runtime cache {}: not a runtime cache; starting afresh", dir.display()),
                EntryState::Corrupt(why) => tracing::warn!("runtime cache {}: {why}; removing it and starting afresh", dir.display()),
            }
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        crate::fsx::create_folder(&dir, "the cache folder")?;
        keyed_dir::write_marker(&dir, KEY_FILE, &KeyFile { key: key.clone(), complete: true, files: BTreeMap::new(), runtime_cache: true })?;
        Ok((dir, false))
    }

    /// Records the files now in the folder (sizes and sha256) and marks it complete. A folder in
    /// which nothing was written (TensorRT builds dynamic-shape engines on the first run) stays
    /// incomplete; call this again after that run.
    pub fn finish(&self, key: &CacheKey) -> Result<bool> {
        let dir = self.dir_for(key);
        let mut files = BTreeMap::new();
        let rd = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let p = entry.path();
            if name == KEY_FILE || !p.is_file() {
                continue;
            }
            let bytes = std::fs::metadata(&p).map_err(|e| Error::io(&p, e))?.len();
            files.insert(name, CachedFile { bytes, sha256: sha256_file(&p)? });
        }
        let complete = files.values().any(|f| f.bytes > 0);
        keyed_dir::write_marker(&dir, KEY_FILE, &KeyFile { key: key.clone(), complete, files, runtime_cache: false })?;
        Ok(complete)
    }

    /// Every folder under the root, checked (without an expected key). Folders of the
    /// optimised-graph cache (with its `graph.json`) are skipped, in case both caches share one
    /// folder.
    pub fn entries(&self) -> Result<Vec<CacheEntry>> {
        let mut out = Vec::new();
        for (dir, name) in keyed_dir::subdirs(&self.root, KEY_FILE)? {
            if self.is_excluded(&dir, &name) {
                continue;
            }
            let key = keyed_dir::read_marker::<KeyFile>(&dir, KEY_FILE).ok().map(|k| k.key);
            let state = self.check(&dir, None);
            out.push(CacheEntry { bytes: keyed_dir::dir_size(&dir), dir, key, state });
        }
        Ok(out)
    }
}

/// [`EngineCache::check`]: `Err` says what is wrong.
fn check_entry(dir: &Path, expected: Option<&CacheKey>) -> std::result::Result<EntryState, String> {
    let kf: KeyFile = keyed_dir::read_marker(dir, KEY_FILE)?;
    keyed_dir::check_key(dir, KEY_FILE, &kf.key, &kf.key.dir_name(), expected)?;
    if kf.runtime_cache {
        return Ok(if kf.complete { EntryState::Valid } else { EntryState::Incomplete });
    }
    if !kf.complete {
        return Ok(EntryState::Incomplete);
    }
    if kf.files.is_empty() {
        return Err("no engine files were recorded".into());
    }
    for (file, rec) in &kf.files {
        keyed_dir::check_file(dir, file, rec.bytes, |p| Ok(sha256_file(p)? == rec.sha256))?;
    }
    Ok(EntryState::Valid)
}
