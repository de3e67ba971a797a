//! The prompt-prefix cache on disk (`engine.prompt_cache_disk_bytes`, in
//! `<runtime.engine_cache>/prompt-prefix`): what the in-memory [`super::PrefixStore`] records is
//! also written there, one file per voice, so that the first streaming chunk of the next process
//! (`cosy say`, `cosy file`, a restarted server) reads it instead of solving the prompt's frames
//! again. Reading 360 MB (a 3 s prompt, fp32) from the page cache takes a fraction of the 10 DiT
//! calls it replaces on a CPU (docs/benchmarks.md, "On disk").
//!
//! A file is safetensors (the crate the model's side file and voices use): the cache's tensors and
//! metadata naming the format, the model it belongs to, the voice and a CRC-32 of every tensor's
//! bytes (so a bit flipped on disk is found and the file recorded again, not used). Its name is a hash of both,
//! so another model, precision or provider (a `model` tag: [`PrefixDisk::new`]) never reads it.
//! Files are written to a temporary name and renamed, so a reader sees a whole file or none; the
//! folder is kept under its bound by dropping the least recently used files (by modification
//! time, refreshed on every read). Everything here is best effort: a failure is logged and the
//! cache is recorded again, never an error of the request.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ndarray::{Array, Array2, Array3, Array4, Dimension};
use safetensors::tensor::View;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};

use crate::flow::{DitCacheShape, PrefixCache, PrefixStep};

/// A voice's key ([`super::prefix_key`]; the same type as `PrefixKey`, named here without that
/// module so the two files do not import each other).
type VoiceKey = [u8; 32];

const FORMAT: &str = "cosy-prompt-prefix";
/// 2: the `crc32` of the data (a version-1 file has none: read as another format, recorded again).
const FORMAT_VERSION: &str = "2";
const SUFFIX: &str = "safetensors";
/// A temporary file older than this is a writer that died: removed when the folder is trimmed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// One model's folder of prompt-prefix files.
#[derive(Debug)]
pub struct PrefixDisk {
    dir: PathBuf,
    /// What the files depend on besides the voice: the model folder (its manifest, which lists
    /// every file's sha256), the DiT's precision and provider.
    model: [u8; 32],
    shape: DitCacheShape,
    /// Euler steps a cache holds (the model's `cfm.n_timesteps`).
    steps: usize,
    capacity: u64,
}

/// An f32 array as a safetensors tensor (its bytes made one tensor at a time while writing).
struct F32View<'a> {
    shape: Vec<usize>,
    data: Cow<'a, [f32]>,
}

impl<'a> F32View<'a> {
    fn of<D: Dimension>(a: &'a Array<f32, D>) -> F32View<'a> {
        let data = match a.as_slice() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(a.iter().copied().collect()),
        };
        F32View { shape: a.shape().to_vec(), data }
    }
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        4 * self.data.len()
    }
}

/// The tensors' names in the order their bytes are checksummed: `mel`, then each step's.
fn tensor_names(steps: usize) -> Vec<String> {
    let mut names = vec!["mel".to_string()];
    for i in 0..steps {
        names.extend(["k", "v", "conv1", "conv2"].map(|part| format!("step{i:03}.{part}")));
    }
    names
}

impl PrefixDisk {
    /// `model`: bytes that identify what a cache depends on besides the voice (hashed).
    pub fn new(dir: PathBuf, model: &[u8], shape: DitCacheShape, steps: usize, capacity: u64) -> PrefixDisk {
        PrefixDisk { dir, model: Sha256::digest(model).into(), shape, steps, capacity }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &VoiceKey) -> PathBuf {
        let mut h = Sha256::new();
        h.update(self.model);
        h.update(key);
        self.dir.join(format!("{}.{SUFFIX}", hex::encode(h.finalize())))
    }

    /// The cache of `key` from disk; `None` when there is none, or it is unreadable (then removed).
    pub fn load(&self, key: &VoiceKey) -> Option<PrefixCache> {
        let path = self.path(key);
        let file = std::fs::File::open(&path).ok()?;
        match self.read(&file, key) {
            Ok(cache) => {
                // Recently used: trimming drops the oldest modification times first.
                let _ = file.set_modified(SystemTime::now()).or_else(|_| {
                    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_modified(SystemTime::now()))
                });
                Some(cache)
            }
            Err(why) => {
                tracing::warn!(file = %path.display(), "prompt-prefix cache file {why}: removed, the voice's cache is recorded again");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn read(&self, file: &std::fs::File, key: &VoiceKey) -> Result<PrefixCache, String> {
        // SAFETY: files here are written under a temporary name and renamed, never changed in
        // place, so the mapped bytes do not change while they are read (a removal does not
        // touch a mapping).
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| format!("cannot be mapped ({e})"))?;
        let (_, header) = SafeTensors::read_metadata(&map).map_err(|e| format!("is not safetensors ({e})"))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let want = |k: &str, v: &str| meta.get(k).map(String::as_str) == Some(v);
        if !want("format", FORMAT) || !want("format_version", FORMAT_VERSION) {
            return Err(format!("is not {FORMAT} version {FORMAT_VERSION}"));
        }
        if !want("model", &hex::encode(self.model)) || !want("voice", &hex::encode(key)) {
            return Err("belongs to another model or voice".into());
        }
        let frames: usize = meta.get("frames").and_then(|f| f.parse().ok()).filter(|&f| f > 0).ok_or("has no frame count")?;
        let tensors = SafeTensors::deserialize(&map).map_err(|e| format!("is unreadable ({e})"))?;
        let mut crc = crc32fast::Hasher::new();
        for name in tensor_names(self.steps) {
            crc.update(tensors.tensor(&name).map_err(|_| format!("lacks tensor {name}"))?.data());
        }
        if !want("crc32", &format!("{:08x}", crc.finalize())) {
            return Err("has data that does not match its checksum (damaged on disk)".into());
        }
        let values = |name: &str, shape: &[usize]| -> Result<Vec<f32>, String> {
            let t = tensors.tensor(name).map_err(|_| format!("lacks tensor {name}"))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape {
                return Err(format!("has tensor {name} as {:?} {:?}, expected F32 {shape:?}", t.dtype(), t.shape()));
            }
            Ok(t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        };
        let s = self.shape;
        let kv = [s.depth, 2, frames, s.inner];
        let conv = [2, s.conv_context, s.dim];
        let bad_shape = |e: ndarray::ShapeError| e.to_string();
        let mut steps = Vec::with_capacity(self.steps);
        for i in 0..self.steps {
            steps.push(PrefixStep {
                k: Array4::from_shape_vec(kv, values(&format!("step{i:03}.k"), &kv)?).map_err(bad_shape)?,
                v: Array4::from_shape_vec(kv, values(&format!("step{i:03}.v"), &kv)?).map_err(bad_shape)?,
                conv1: Array3::from_shape_vec(conv, values(&format!("step{i:03}.conv1"), &conv)?).map_err(bad_shape)?,
                conv2: Array3::from_shape_vec(conv, values(&format!("step{i:03}.conv2"), &conv)?).map_err(bad_shape)?,
            });
        }
        if tensors.len() != 4 * self.steps + 1 {
            return Err(format!("has {} tensors, expected {}", tensors.len(), 4 * self.steps + 1));
        }
        let mel_rows = meta.get("mel_rows").and_then(|f| f.parse().ok()).ok_or("has no mel row count")?;
        let mel = Array2::from_shape_vec((mel_rows, frames), values("mel", &[mel_rows, frames])?).map_err(bad_shape)?;
        Ok(PrefixCache { frames, steps, mel })
    }

    /// Writes `cache` as the file of `key` (whole or not at all), then trims the folder.
    pub fn save(&self, key: &VoiceKey, cache: &PrefixCache) -> Result<(), String> {
        if cache.steps.len() != self.steps {
            return Err(format!("{} steps, this model has {}", cache.steps.len(), self.steps));
        }
        if cache.bytes() as u64 > self.capacity {
            return Ok(()); // larger than the whole bound: not kept
        }
        let path = self.path(key);
        let mut views = vec![F32View::of(&cache.mel)];
        for step in &cache.steps {
            views.extend([F32View::of(&step.k), F32View::of(&step.v), F32View::of(&step.conv1), F32View::of(&step.conv2)]);
        }
        let mut crc = crc32fast::Hasher::new();
        for view in &views {
            crc.update(&view.data());
        }
        let tensors: Vec<(String, F32View<'_>)> = tensor_names(self.steps).into_iter().zip(views).collect();
        let meta: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("format_version", FORMAT_VERSION.to_string()),
            ("model", hex::encode(self.model)),
            ("voice", hex::encode(key)),
            ("frames", cache.frames.to_string()),
            ("mel_rows", cache.mel.nrows().to_string()),
            ("crc32", format!("{:08x}", crc.finalize())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let dest = crate::fsx::Dest::new(&path, "a prompt-prefix cache file");
        // Processes sharing the folder take turns; one that waited finds the file written.
        dest.locked(|| {
            if path.is_file() {
                return Ok(());
            }
            dest.write_to_path(|temp| {
                safetensors::serialize_to_file(tensors, Some(meta), temp).map_err(|e| match e {
                    safetensors::SafeTensorError::IoError(e) => e,
                    other => std::io::Error::other(other),
                })
            })
        })
        .map_err(|e| e.to_string())?;
        self.trim();
        Ok(())
    }

    /// Drops the least recently used files until the folder holds at most `capacity` bytes, and
    /// temporary files of writers that died.
    fn trim(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let now = SystemTime::now();
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if crate::fsx::is_temp_name(&name) || name.ends_with(".tmp") {
                if now.duration_since(modified).is_ok_and(|age| age > STALE_TEMP) {
                    let _ = std::fs::remove_file(&path);
                }
            } else if name.ends_with(SUFFIX) && meta.is_file() {
                files.push((modified, meta.len(), path));
            }
        }
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, bytes, path) in files {
            if total <= self.capacity {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> DitCacheShape {
        DitCacheShape { depth: 2, inner: 3, dim: 2, conv_context: 2 }
    }

    fn cache(frames: usize, seed: f32) -> PrefixCache {
        let s = shape();
        let step = |i: usize| PrefixStep {
            k: Array4::from_shape_fn((s.depth, 2, frames, s.inner), |(a, b, c, d)| seed + (a * 1000 + b * 100 + c * 10 + d + i) as f32),
            v: Array4::from_elem((s.depth, 2, frames, s.inner), seed - i as f32),
            conv1: Array3::from_elem((2, s.conv_context, s.dim), 0.5 + i as f32),
            conv2: Array3::from_elem((2, s.conv_context, s.dim), -0.25),
        };
        PrefixCache { frames, steps: (0..3).map(step).collect(), mel: Array2::from_elem((4, frames), seed * 2.0) }
    }

    fn same(a: &PrefixCache, b: &PrefixCache) -> bool {
        a.frames == b.frames
            && a.mel == b.mel
            && a.steps.len() == b.steps.len()
            && a.steps.iter().zip(&b.steps).all(|(x, y)| x.k == y.k && x.v == y.v && x.conv1 == y.conv1 && x.conv2 == y.conv2)
    }

    #[test]
    fn a_saved_cache_reads_back_the_same_only_for_its_model_and_voice() {
        let dir = tempfile::tempdir().unwrap();
        let disk = PrefixDisk::new(dir.path().join("p"), b"model A", shape(), 3, 1 << 30);
        let original = cache(5, 1.5);
        assert!(disk.load(&[7; 32]).is_none(), "nothing saved yet");
        disk.save(&[7; 32], &original).unwrap();
        // The same bits back (a file of this machine: no arithmetic between write and read).
        assert!(same(&disk.load(&[7; 32]).expect("saved"), &original));
        assert!(disk.load(&[8; 32]).is_none(), "another voice");
        let other = PrefixDisk::new(dir.path().join("p"), b"model B", shape(), 3, 1 << 30);
        assert!(other.load(&[7; 32]).is_none(), "another model (precision, provider) never reads it");
        let fewer_steps = PrefixDisk::new(dir.path().join("p"), b"model A", shape(), 2, 1 << 30);
        assert!(fewer_steps.save(&[7; 32], &original).is_err(), "a cache of another step count is refused");
    }

    #[test]
    fn a_damaged_file_is_removed_and_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let disk = PrefixDisk::new(dir.path().to_path_buf(), b"m", shape(), 3, 1 << 30);
        disk.save(&[1; 32], &cache(4, 0.0)).unwrap();
        let path = disk.path(&[1; 32]);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(disk.load(&[1; 32]).is_none());
        assert!(!path.exists(), "the damaged file was removed");
        std::fs::write(&path, b"not a cache").unwrap();
        assert!(disk.load(&[1; 32]).is_none());
        assert!(!path.exists());
        // One bit flipped in the data (the header intact, the file whole): found by the checksum.
        let data_start = 8 + usize::try_from(u64::from_le_bytes(bytes[..8].try_into().unwrap())).unwrap();
        for at in [data_start, bytes.len() - 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x40;
            std::fs::write(&path, &flipped).unwrap();
            assert!(disk.load(&[1; 32]).is_none(), "a bit flipped at byte {at} of {}", bytes.len());
            assert!(!path.exists(), "the damaged file was removed");
        }
        std::fs::write(&path, &bytes).unwrap();
        assert!(disk.load(&[1; 32]).is_some(), "the file as written reads");
    }

    #[test]
    fn the_folder_keeps_its_bound_least_recently_used_out_first() {
        let dir = tempfile::tempdir().unwrap();
        let probe = PrefixDisk::new(dir.path().join("probe"), b"m", shape(), 3, 1 << 30);
        probe.save(&[0; 32], &cache(4, 0.0)).unwrap();
        let one = std::fs::metadata(probe.path(&[0; 32])).unwrap().len();
        let disk = PrefixDisk::new(dir.path().join("p"), b"m", shape(), 3, 2 * one + one / 2);
        disk.save(&[1; 32], &cache(4, 1.0)).unwrap();
        disk.save(&[2; 32], &cache(4, 2.0)).unwrap();
        // Modification times set apart (a file system's clock may not tell two quick writes apart).
        let at = |key: &VoiceKey, secs: u64| {
            let f = std::fs::OpenOptions::new().write(true).open(disk.path(key)).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
        };
        at(&[1; 32], 2_000);
        at(&[2; 32], 1_000); // 2 is now the least recently used
        disk.save(&[3; 32], &cache(4, 3.0)).unwrap();
        assert!(!disk.path(&[2; 32]).exists(), "the least recently used file went");
        assert!(disk.path(&[1; 32]).exists() && disk.path(&[3; 32]).exists());
        // Larger than the whole bound: not written, nothing dropped.
        let small = PrefixDisk::new(dir.path().join("p"), b"m", shape(), 3, one / 2);
        small.save(&[4; 32], &cache(4, 4.0)).unwrap();
        assert!(!small.path(&[4; 32]).exists());
    }
}
