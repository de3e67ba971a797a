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
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::model::sha256_file;

/// The name of the key file in each cache folder.
pub const KEY_FILE: &str = "key.json";

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
        let json = serde_json::to_vec(self).unwrap_or_default();
        let digest = Sha256::digest(&json);
        hex::encode(digest)[..16].to_string()
    }
    /// The folder name: `<stage>-<hash16>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.stage, self.hash16())
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
}

/// The state of one cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// Complete and every recorded file checks out.
    Valid,
    /// No `key.json` yet written or the build did not finish.
    Incomplete,
    /// Something is wrong; the message says what.
    Corrupt(String),
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
    /// `engines/graphs`).
    exclude: Vec<PathBuf>,
}

impl EngineCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        EngineCache { root: root.into(), exclude: Vec::new() }
    }

    /// The same cache, with `dir` (a folder that may lie under the root) not taken for an entry.
    pub fn excluding(mut self, dir: &Path) -> Self {
        self.exclude.push(dir.to_path_buf());
        self
    }

    fn is_excluded(&self, dir: &Path) -> bool {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let d = canon(dir);
        self.exclude.iter().any(|x| canon(x) == d)
            // The optimised-graph cache's entries and its temporary folders, should both caches
            // share one folder.
            || dir.join(crate::runtime::graph_cache::META_FILE).exists()
            || dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
    }

    pub fn dir_for(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.dir_name())
    }

    /// Checks a folder against the key it should hold.
    pub fn check(&self, dir: &Path, expected: Option<&CacheKey>) -> EntryState {
        let key_path = dir.join(KEY_FILE);
        let text = match std::fs::read_to_string(&key_path) {
            Ok(t) => t,
            Err(_) => return EntryState::Corrupt(format!("{KEY_FILE} is missing")),
        };
        let kf: KeyFile = match serde_json::from_str(&text) {
            Ok(k) => k,
            Err(e) => return EntryState::Corrupt(format!("{KEY_FILE} is unreadable: {e}")),
        };
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name != kf.key.dir_name() {
            return EntryState::Corrupt(format!("{KEY_FILE} holds a key for {}, not {name}", kf.key.dir_name()));
        }
        if let Some(want) = expected {
            if &kf.key != want {
                return EntryState::Corrupt(format!("{KEY_FILE} holds a different key"));
            }
        }
        if !kf.complete {
            return EntryState::Incomplete;
        }
        if kf.files.is_empty() {
            return EntryState::Corrupt("no engine files were recorded".into());
        }
        for (file, rec) in &kf.files {
            let p = dir.join(file);
            let Ok(meta) = std::fs::metadata(&p) else {
                return EntryState::Corrupt(format!("{file} is missing"));
            };
            if meta.len() == 0 {
                return EntryState::Corrupt(format!("{file} is empty"));
            }
            if meta.len() != rec.bytes {
                return EntryState::Corrupt(format!("{file} has {} bytes, {} were recorded (truncated?)", meta.len(), rec.bytes));
            }
            match sha256_file(&p) {
                Ok(h) if h == rec.sha256 => {}
                Ok(_) => return EntryState::Corrupt(format!("{file} does not match its recorded sha256")),
                Err(e) => return EntryState::Corrupt(format!("{file}: {e}")),
            }
        }
        EntryState::Valid
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
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        write_key_file(&dir, &KeyFile { key: key.clone(), complete: false, files: BTreeMap::new() })?;
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
        write_key_file(&dir, &KeyFile { key: key.clone(), complete, files })?;
        Ok(complete)
    }

    /// Every folder under the root, checked (without an expected key).
    pub fn entries(&self) -> Result<Vec<CacheEntry>> {
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(Error::io(&self.root, e)),
        };
        for entry in rd.flatten() {
            let dir = entry.path();
            if !dir.is_dir() || self.is_excluded(&dir) {
                continue;
            }
            let key = std::fs::read_to_string(dir.join(KEY_FILE))
                .ok()
                .and_then(|t| serde_json::from_str::<KeyFile>(&t).ok())
                .map(|k| k.key);
            let state = self.check(&dir, None);
            out.push(CacheEntry { bytes: dir_size(&dir), dir, key, state });
        }
        out.sort_by(|a, b| a.dir.cmp(&b.dir));
        Ok(out)
    }
}

fn write_key_file(dir: &Path, kf: &KeyFile) -> Result<()> {
    let path = dir.join(KEY_FILE);
    let tmp = dir.join(format!("{KEY_FILE}.tmp"));
    let text = serde_json::to_string_pretty(kf).map_err(|e| Error::Runtime(e.to_string()))?;
    // Write then rename, so a crash never leaves a half-written key file.
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
}

/// Total size of the files in a folder (not recursive).
pub fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}
