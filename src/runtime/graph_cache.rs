//! The optimised-graph cache: ONNX Runtime's graph optimisation (constant folding, fusions, the
//! CPU's NCHWc layouts) is most of a CPU session's start-up (the full-size DiT: 12.9 s with it, 1.9 s
//! from a graph saved after it). The first CPU session of a graph saves the optimised graph here;
//! later ones load that graph with optimisation disabled.
//!
//! One folder per key under the cache root (default `~/.cache/cosy/engines/graphs/`, [`crate::config::default_engine_cache`]), named `<stage>-<hash16>`
//! (the first 16 hex digits of the sha256 of the key's JSON), holding:
//!
//! - `model.onnx`: the optimised graph, without its large weights;
//! - `model.onnx.data`: every initializer of [`EXTERNAL_MIN_BYTES`] or more, as ONNX external data
//!   (so a graph over protobuf's 2 GB limit saves and loads like a small one);
//! - `graph.json`: the key and the size and sha256 of each file (of 64 blocks spread over a file
//!   larger than 16 MiB: hashing the whole weights would add seconds to every load).
//!
//! The key is everything the optimised graph depends on: the source graph's sha256 (and its
//! external data's), the precision, the providers, the ONNX Runtime version, the CPU architecture
//! and the instruction-set features that change which kernels and layouts the optimiser picks
//! (AVX2 vs AVX-512 block sizes, VNNI/BF16/AMX kernels), and the session options that change the
//! optimiser. ONNX Runtime's documentation says a graph saved at the "all" level may hold
//! hardware-specific layouts and must be reloaded on the same hardware and providers; the key
//! makes another CPU or library use another folder.
//!
//! Only complete entries are ever visible: an entry is written into a `.tmp-…` folder and renamed
//! into place once `graph.json` records its files. Two processes making the same entry at once
//! both succeed; the second rename fails and that process keeps its own (already open) session.
//! An entry that is broken (metadata missing or unreadable, a file missing, empty or of the wrong
//! size, the graph file altered, or one ONNX Runtime cannot load) is removed with a warning and
//! made again; it is never an error for the user. Every load checks the sizes and hashes (a few
//! milliseconds), as do `cosy engines list` and `cosy doctor`.
//!
//! Only CPU-only sessions use it: TensorRT keeps its own engine cache ([`super::engine_cache`]),
//! and a graph saved with the CUDA provider holds the Memcpy nodes ONNX Runtime inserted for it,
//! which do not load back (microsoft/onnxruntime#11348, #17837).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::model::sha256_file;
use crate::runtime::keyed_dir::{self, private_name, EntryState, TMP_PREFIX, TRASH_PREFIX};

/// Files up to this size are hashed whole; larger ones by [`SAMPLE_BLOCKS`] blocks.
pub const FULL_HASH_MAX: u64 = 16 << 20;
/// How many blocks of [`SAMPLE_BYTES`] a large file's sampled hash covers, evenly spread from its
/// first to its last byte.
pub const SAMPLE_BLOCKS: u64 = 64;
pub const SAMPLE_BYTES: u64 = 64 << 10;

/// The metadata file in each entry.
pub const META_FILE: &str = keyed_dir::GRAPH_MARKER;
/// The optimised graph.
pub const MODEL_FILE: &str = "model.onnx";
/// Its external initializers.
pub const DATA_FILE: &str = "model.onnx.data";
/// Initializers of at least this many bytes are saved in [`DATA_FILE`].
pub const EXTERNAL_MIN_BYTES: usize = 1024;
/// The entry layout; part of the key, so a change of layout never loads an old entry.
pub const FORMAT: u32 = 1;

/// ONNX Runtime session config keys that save the optimised graph's initializers as external data.
pub const EXTERNAL_FILE_KEY: &str = "session.optimized_model_external_initializers_file_name";
pub const EXTERNAL_MIN_SIZE_KEY: &str = "session.optimized_model_external_initializers_min_size_in_bytes";

/// Everything an optimised graph depends on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GraphKey {
    /// The entry layout ([`FORMAT`]).
    pub format: u32,
    pub stage: String,
    /// sha256 of the source graph (from the manifest).
    pub graph_sha256: String,
    /// sha256 of the source graph's external data, when it has some.
    pub data_sha256: Option<String>,
    pub precision: String,
    /// The providers registered, in priority order.
    pub providers: Vec<String>,
    pub ort_version: String,
    /// `x86_64`, `aarch64`, …
    pub arch: String,
    /// The instruction-set features that change kernels or layouts ([`cpu_features`]).
    pub cpu_features: Vec<String>,
    /// Session options that change the optimiser's output.
    pub options: Vec<String>,
}

impl GraphKey {
    /// First 16 hex digits of the sha256 of the key's canonical JSON.
    pub fn hash16(&self) -> String {
        keyed_dir::hash16(self)
    }
    /// The folder name: `<stage>-<hash16>`.
    pub fn dir_name(&self) -> String {
        keyed_dir::dir_name(&self.stage, self)
    }
}

/// The content of `graph.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GraphMeta {
    pub key: GraphKey,
    /// The model folder's graph file it was made from (for people reading the file).
    pub source: String,
    /// Every file of the entry but `graph.json`, with its size and hash.
    pub files: BTreeMap<String, GraphFile>,
}

/// A file of an entry as recorded when it was saved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GraphFile {
    pub bytes: u64,
    /// sha256 of the whole file, or (`sampled`) of its size and [`SAMPLE_BLOCKS`] blocks of
    /// [`SAMPLE_BYTES`] spread over it ([`file_digest`]).
    pub sha256: String,
    pub sampled: bool,
}

/// The hash recorded for a file: sha256 of the whole file up to [`FULL_HASH_MAX`] bytes, else of
/// its size (little-endian u64) followed by [`SAMPLE_BLOCKS`] blocks of [`SAMPLE_BYTES`] at evenly
/// spaced offsets (first and last block included). The sampled hash catches truncation, a file
/// replaced by another and blocks zeroed by a crash, in milliseconds; a flipped bit between the
/// samples would go unnoticed, as it would in the model folder itself between `cosy doctor` runs.
pub fn file_digest(path: &Path) -> Result<GraphFile> {
    let bytes = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    if bytes <= FULL_HASH_MAX {
        return Ok(GraphFile { bytes, sha256: sha256_file(path)?, sampled: false });
    }
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    h.update(bytes.to_le_bytes());
    let mut buf = vec![0u8; SAMPLE_BYTES as usize];
    let last = bytes - SAMPLE_BYTES;
    for i in 0..SAMPLE_BLOCKS {
        let offset = last * i / (SAMPLE_BLOCKS - 1);
        f.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(path, e))?;
        f.read_exact(&mut buf).map_err(|e| Error::io(path, e))?;
        h.update(&buf);
    }
    Ok(GraphFile { bytes, sha256: hex::encode(h.finalize()), sampled: true })
}

/// One folder in the cache.
#[derive(Debug, Clone)]
pub struct GraphEntry {
    pub dir: PathBuf,
    pub key: Option<GraphKey>,
    pub state: EntryState,
    pub bytes: u64,
    /// A `.tmp-…` folder whose process is still running (being written now).
    pub in_progress: bool,
}

/// The instruction-set features of this CPU that can change the kernels and layouts ONNX
/// Runtime's optimiser and MLAS pick (thread counts do not change the graph). On x86-64 AMX is
/// read from CPUID directly (its detection macro is not stable Rust).
pub fn cpu_features() -> Vec<String> {
    #[allow(unused_mut)]
    let mut out: Vec<String> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($f:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($f) { out.push($f.to_string()); })*
            };
        }
        detect!(
            "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
            "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni"
        );
        out.extend(amx_features().into_iter().map(str::to_string));
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! detect {
            ($($f:tt),*) => {
                $(if std::arch::is_aarch64_feature_detected!($f) { out.push($f.to_string()); })*
            };
        }
        detect!("neon", "fp16", "dotprod", "i8mm", "bf16", "sve", "sve2");
    }
    out
}

/// AMX tile, bf16 and int8 support (CPUID leaf 7, EDX bits 24, 22, 25).
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
fn amx_features() -> Vec<&'static str> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only when leaf 0 says it exists.
    let edx = unsafe {
        if __cpuid(0).eax >= 7 {
            __cpuid_count(7, 0).edx
        } else {
            0
        }
    };
    [(24, "amx-tile"), (22, "amx-bf16"), (25, "amx-int8")]
        .into_iter()
        .filter(|(bit, _)| edx & (1 << bit) != 0)
        .map(|(_, name)| name)
        .collect()
}

/// The cache root folder.
#[derive(Debug, Clone)]
pub struct GraphCache {
    pub root: PathBuf,
}

impl GraphCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        GraphCache { root: root.into() }
    }

    pub fn dir_for(&self, key: &GraphKey) -> PathBuf {
        self.root.join(key.dir_name())
    }

    /// Checks a folder against the key it should hold: the metadata, and every file's size and
    /// hash ([`file_digest`]).
    pub fn check(&self, dir: &Path, expected: Option<&GraphKey>) -> EntryState {
        match check_entry(dir, expected) {
            Ok(()) => EntryState::Valid,
            Err(why) => EntryState::Corrupt(why),
        }
    }

    /// The saved optimised graph for `key`, when a sound entry holds it. A broken entry is removed
    /// with a warning (the caller then makes it again).
    pub fn lookup(&self, key: &GraphKey) -> Option<PathBuf> {
        let dir = self.dir_for(key);
        if !dir.exists() {
            return None;
        }
        match self.check(&dir, Some(key)) {
            EntryState::Valid => Some(dir.join(MODEL_FILE)),
            EntryState::Incomplete => None,
            EntryState::Corrupt(why) => {
                self.discard(&dir, &why);
                None
            }
        }
    }

    /// Removes a broken entry with a warning saying why. It is first renamed out of the way, so no
    /// process sees it half removed; failures are warnings (the entry is made anew beside it).
    pub fn discard(&self, dir: &Path, why: &str) {
        tracing::warn!("optimised-graph cache {}: {why}; removing it and optimising again", dir.display());
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let trash = self.root.join(private_name(TRASH_PREFIX, &name));
        let target = if std::fs::rename(dir, &trash).is_ok() { trash } else { dir.to_path_buf() };
        if let Err(e) = std::fs::remove_dir_all(&target) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("optimised-graph cache: cannot remove {}: {e}", target.display());
            }
        }
    }

    /// Starts a new entry for `key` made from the graph file `source`: a private temporary folder
    /// that ONNX Runtime saves into ([`PendingGraph::model_path`]); [`PendingGraph::commit`] puts it
    /// in place. An error means the cache folder cannot be written.
    pub fn begin(&self, key: &GraphKey, source: &str) -> Result<PendingGraph> {
        crate::fsx::create_folder(&self.root, "the cache folder")?;
        let tmp = self.root.join(private_name(TMP_PREFIX, &key.dir_name()));
        // The temporary folder is ours: a failure names the entry it was to become.
        std::fs::create_dir(&tmp).map_err(|e| crate::fsx::Dest::new(self.dir_for(key), "a cache entry").error(e))?;
        Ok(PendingGraph { tmp, dir: self.dir_for(key), key: key.clone(), source: source.to_string(), done: false })
    }

    /// Every folder under the root, checked without an expected key. Folders of the TensorRT
    /// engine cache (with its `key.json`) are skipped, in case both caches share one folder.
    pub fn entries(&self) -> Result<Vec<GraphEntry>> {
        let mut out = Vec::new();
        for (dir, name) in keyed_dir::subdirs(&self.root, META_FILE)? {
            let bytes = keyed_dir::dir_size(&dir);
            if let Some(rest) = name.strip_prefix(TMP_PREFIX) {
                out.push(GraphEntry { dir, key: None, state: EntryState::Incomplete, bytes, in_progress: writer_alive(rest) });
                continue;
            }
            if name.starts_with(TRASH_PREFIX) {
                let state = EntryState::Corrupt("left over from a removal".into());
                out.push(GraphEntry { dir, key: None, state, bytes, in_progress: false });
                continue;
            }
            let key = keyed_dir::read_marker::<GraphMeta>(&dir, META_FILE).ok().map(|m| m.key);
            let state = self.check(&dir, None);
            out.push(GraphEntry { dir, key, state, bytes, in_progress: false });
        }
        Ok(out)
    }
}

/// [`GraphCache::check`]: `Err` says what is wrong.
fn check_entry(dir: &Path, expected: Option<&GraphKey>) -> std::result::Result<(), String> {
    let meta: GraphMeta = keyed_dir::read_marker(dir, META_FILE)?;
    keyed_dir::check_key(dir, META_FILE, &meta.key, &meta.key.dir_name(), expected)?;
    if !meta.files.contains_key(MODEL_FILE) {
        return Err(format!("{META_FILE} records no {MODEL_FILE}"));
    }
    for (file, rec) in &meta.files {
        // Names come from the metadata file: only plain names inside the folder.
        if file.is_empty() || file.contains(['/', '\\']) || file == ".." || file == "." {
            return Err(format!("{META_FILE} names a file outside the entry: {file:?}"));
        }
        keyed_dir::check_file(dir, file, rec.bytes, |p| Ok(file_digest(p)? == *rec))?;
    }
    Ok(())
}

/// Whether the process that is writing a `.tmp-<name>-<pid>-<n>` folder still runs.
fn writer_alive(rest: &str) -> bool {
    let mut parts = rest.rsplitn(3, '-');
    let _serial = parts.next();
    match parts.next().and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// An entry being made: a temporary folder, removed again unless [`Self::commit`] put it in place.
#[derive(Debug)]
pub struct PendingGraph {
    tmp: PathBuf,
    dir: PathBuf,
    key: GraphKey,
    source: String,
    done: bool,
}

impl PendingGraph {
    /// Where ONNX Runtime is to save the optimised graph.
    pub fn model_path(&self) -> PathBuf {
        self.tmp.join(MODEL_FILE)
    }

    /// The folder the entry will have.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records the files ONNX Runtime saved and renames the folder into place. `Ok(false)`: another
    /// process put the same entry there first (ours is dropped; both are the same graph).
    pub fn commit(mut self) -> Result<bool> {
        let mut files = BTreeMap::new();
        let rd = std::fs::read_dir(&self.tmp).map_err(|e| Error::io(&self.tmp, e))?;
        for entry in rd.flatten() {
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == META_FILE || !p.is_file() {
                continue;
            }
            // On disk before the folder gets its final name: a power cut never leaves an entry
            // whose files were not all written.
            std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(|e| self.storage_error(e))?;
            files.insert(name, file_digest(&p)?);
        }
        if files.get(MODEL_FILE).is_none_or(|f| f.bytes == 0) {
            return Err(Error::Runtime(format!("ONNX Runtime saved no optimised graph in {}", self.tmp.display())));
        }
        let meta = GraphMeta { key: self.key.clone(), source: self.source.clone(), files };
        keyed_dir::write_marker(&self.tmp, META_FILE, &meta)?;
        match std::fs::rename(&self.tmp, &self.dir) {
            Ok(()) => {
                self.done = true;
                let root = self.dir.parent().unwrap_or(Path::new("."));
                crate::fsx::sync_folder(root).map_err(|e| self.storage_error(e))?;
                Ok(true)
            }
            // A folder already there (another process's entry, complete by construction).
            Err(_) if self.dir.join(META_FILE).exists() => Ok(false),
            Err(e) => Err(self.storage_error(e)),
        }
    }

    /// A write of this entry that failed, named by its final folder.
    fn storage_error(&self, e: std::io::Error) -> Error {
        crate::fsx::Dest::new(&self.dir, "a cache entry").error(e)
    }
}

impl Drop for PendingGraph {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}
