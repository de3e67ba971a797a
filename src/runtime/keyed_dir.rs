//! The folder layout both runtime caches share: a cache root holding one folder per key, named
//! `<stage>-<hash16>` (the first 16 hex digits of the sha256 of the key's JSON), each with a
//! marker file (JSON: the key and the size and hash of every file recorded) that says whose entry
//! it is and whether it is sound.
//!
//! The TensorRT engine cache ([`super::engine_cache`], marker [`ENGINE_MARKER`]) and the
//! optimised-graph cache ([`super::graph_cache`], marker [`GRAPH_MARKER`]) may share one root (the
//! graphs live under `<engine cache>/graphs` by default, and both settings can name the same folder), so
//! each must skip the other's entries; the markers of both are named here, so that neither cache
//! needs the other. Folders whose name starts with `.` are work folders (an entry being written,
//! `.tmp-…`, or being removed, `.trash-…`, see [`private_name`]), never entries.
//!
//! What differs stays in each cache: what the key holds, how a file's hash is taken, when an
//! entry is complete.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The marker file of a TensorRT engine cache entry.
pub const ENGINE_MARKER: &str = "key.json";
/// The marker file of an optimised-graph cache entry.
pub const GRAPH_MARKER: &str = "graph.json";
/// Every cache's marker: a folder holding one of them is that cache's entry.
const MARKERS: [&str; 2] = [ENGINE_MARKER, GRAPH_MARKER];

/// The name prefix of a folder being written (`.tmp-<name>-<pid>-<n>`).
pub const TMP_PREFIX: &str = ".tmp-";
/// The name prefix of a folder being removed (`.trash-<name>-<pid>-<n>`).
pub const TRASH_PREFIX: &str = ".trash-";

/// The state of one cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// Complete and every recorded file checks out.
    Valid,
    /// Not finished: a build that did not finish (or has not yet), or an entry still being written.
    Incomplete,
    /// Something is wrong; the message says what.
    Corrupt(String),
}

/// First 16 hex digits of the sha256 of a key's canonical JSON.
pub fn hash16(key: &impl Serialize) -> String {
    let json = serde_json::to_vec(key).unwrap_or_default();
    hex::encode(Sha256::digest(&json))[..16].to_string()
}

/// The folder name of a key: `<stage>-<hash16>`.
pub fn dir_name(stage: &str, key: &impl Serialize) -> String {
    format!("{stage}-{}", hash16(key))
}

/// Whether a folder name is a work folder (being written or removed), not an entry.
pub fn is_work_folder(name: &str) -> bool {
    name.starts_with('.')
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// A folder name unique to this process for a work folder: `<prefix><name>-<pid>-<n>`.
pub fn private_name(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}-{}-{}", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed))
}

/// Reads and parses an entry's marker file. The error is what is wrong with it, for
/// [`EntryState::Corrupt`].
pub fn read_marker<M: DeserializeOwned>(dir: &Path, marker: &str) -> std::result::Result<M, String> {
    let text = std::fs::read_to_string(dir.join(marker)).map_err(|_| format!("{marker} is missing"))?;
    serde_json::from_str(&text).map_err(|e| format!("{marker} is unreadable: {e}"))
}

/// Checks the key a marker holds: its folder name (`held_dir_name`) is the folder's, and it is the
/// `expected` key when one is given.
pub fn check_key<K: PartialEq>(
    dir: &Path,
    marker: &str,
    held: &K,
    held_dir_name: &str,
    expected: Option<&K>,
) -> std::result::Result<(), String> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name != held_dir_name {
        return Err(format!("{marker} holds a key for {held_dir_name}, not {name}"));
    }
    if expected.is_some_and(|want| held != want) {
        return Err(format!("{marker} holds a different key"));
    }
    Ok(())
}

/// Checks one file a marker records: present, not empty, of the recorded size, and with the
/// recorded hash (`matches` computes it and compares).
pub fn check_file(
    dir: &Path,
    file: &str,
    bytes: u64,
    matches: impl FnOnce(&Path) -> Result<bool>,
) -> std::result::Result<(), String> {
    let p = dir.join(file);
    let Ok(meta) = std::fs::metadata(&p) else {
        return Err(format!("{file} is missing"));
    };
    if meta.len() == 0 {
        return Err(format!("{file} is empty"));
    }
    if meta.len() != bytes {
        return Err(format!("{file} has {} bytes, {bytes} were recorded (truncated?)", meta.len()));
    }
    match matches(&p) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{file} does not match its recorded sha256")),
        Err(e) => Err(format!("{file}: {e}")),
    }
}

/// Writes a marker file as pretty JSON, through a temporary file and a rename, so that a crash
/// never leaves a half-written marker.
pub fn write_marker(dir: &Path, marker: &str, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Runtime(e.to_string()))?;
    crate::fsx::Dest::new(dir.join(marker), "a cache marker").write(text.as_bytes())
}

/// The folders under `root` that may be entries of the cache whose marker is `marker`: every
/// sub-folder but those holding another cache's marker, as (path, name), sorted by path. A root
/// that does not exist has none.
pub fn subdirs(root: &Path, marker: &str) -> Result<Vec<(PathBuf, String)>> {
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(root, e)),
    };
    let mut out: Vec<(PathBuf, String)> = rd
        .flatten()
        .map(|e| (e.path(), e.file_name().to_string_lossy().into_owned()))
        .filter(|(dir, _)| dir.is_dir() && !MARKERS.iter().any(|m| *m != marker && dir.join(m).exists()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Total size of the files in a folder (not recursive).
pub fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}
