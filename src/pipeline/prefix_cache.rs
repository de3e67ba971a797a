//! The per-voice prompt-prefix cache of the DiT (docs/model-format.md "dit prompt cache"): the
//! keys, values and positional-conv context of a voice's leading prompt frames at every Euler
//! step, recorded (a solve of those frames alone) by the first streaming chunk that runs with that voice and used by it and every
//! later non-final chunk of any request with the same voice (`crate::flow::solve_cfm_prefixed`).
//! Bounded by bytes (`engine.prompt_cache_bytes`), least recently used out first. With a
//! [`PrefixDisk`] below it, what is recorded is also written to disk (in the background; the
//! store waits for those writes when dropped) and a voice missing here is read from there.

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::prefix_disk::PrefixDisk;
use crate::flow::{DitCacheShape, PrefixCache};
use crate::request::PromptFeatures;

/// What identifies a voice for the cache: a hash of everything the prefix depends on (the flow's
/// prompt tokens, prompt mel and speaker embedding). The model and DiT variant are fixed per
/// store (one store per loaded engine).
pub type PrefixKey = [u8; 32];

/// The key of a voice's prompt.
pub fn prefix_key(prompt: &PromptFeatures) -> PrefixKey {
    let mut h = Sha256::new();
    h.update((prompt.speech_token.len() as u64).to_le_bytes());
    for t in &prompt.speech_token {
        h.update(t.to_le_bytes());
    }
    h.update((prompt.feat.len() as u64).to_le_bytes());
    for v in prompt.feat.iter() {
        h.update(v.to_bits().to_le_bytes());
    }
    for v in &prompt.embedding {
        h.update(v.to_bits().to_le_bytes());
    }
    h.finalize().into()
}

/// Counters for `cosy profile` and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub bytes: usize,
    /// Misses here that the disk had.
    pub disk_hits: u64,
    /// Caches written to disk.
    pub disk_writes: u64,
}

struct Entry {
    key: PrefixKey,
    cache: Arc<PrefixCache>,
    bytes: usize,
    last_used: u64,
}

#[derive(Default)]
struct Lru {
    entries: Vec<Entry>,
    bytes: usize,
    clock: u64,
    hits: u64,
    misses: u64,
    disk_hits: u64,
}

/// The in-memory cache of one loaded DiT, bounded by bytes, over an optional disk folder.
pub struct PrefixStore {
    shape: DitCacheShape,
    capacity: usize,
    lru: Mutex<Lru>,
    disk: Option<Arc<PrefixDisk>>,
    /// Disk writes under way (joined on drop, so a short `cosy say` leaves its file behind).
    writes: Mutex<Vec<std::thread::JoinHandle<bool>>>,
    /// Disk reads started by [`PrefixStore::prefetch`], by voice.
    reads: Mutex<Vec<(PrefixKey, crossbeam_channel::Receiver<Option<PrefixCache>>)>>,
    disk_writes: Arc<std::sync::atomic::AtomicU64>,
    #[cfg(test)]
    read_hook: Option<ReadHook>,
}

/// Test hook: orders the background reads of [`PrefixStore::prefetch`] against `get` and
/// `prefetch` without timing. Each read waits for a token on `start` before reading, and sends its
/// key on `done` once its result is in its channel.
#[cfg(test)]
#[derive(Clone)]
struct ReadHook {
    start: crossbeam_channel::Receiver<()>,
    done: crossbeam_channel::Sender<PrefixKey>,
}

impl PrefixStore {
    pub fn new(shape: DitCacheShape, capacity: usize) -> PrefixStore {
        PrefixStore {
            shape,
            capacity,
            lru: Mutex::new(Lru::default()),
            disk: None,
            writes: Mutex::new(Vec::new()),
            reads: Mutex::new(Vec::new()),
            disk_writes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            #[cfg(test)]
            read_hook: None,
        }
    }

    /// Also keeps what is recorded on `disk`, and reads from it what is not kept here.
    pub fn with_disk(mut self, disk: PrefixDisk) -> PrefixStore {
        self.disk = Some(Arc::new(disk));
        self
    }

    pub fn shape(&self) -> DitCacheShape {
        self.shape
    }

    /// Whether an entry of `bytes` can be kept at all (larger ones are not recorded).
    pub fn fits(&self, bytes: usize) -> bool {
        bytes <= self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // The map holds no invariant a panicking holder could break half-way that matters more
        // than losing the cache: keep serving.
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts reading the cache of `key` from disk in the background, unless it is kept here or
    /// being read: called when a streaming request's voice is known, so that the read overlaps
    /// the LLM's first tokens instead of delaying the first chunk (1.6 GB for a 10 s prompt).
    pub fn prefetch(&self, key: &PrefixKey) {
        let Some(disk) = self.disk.clone() else { return };
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        // Reads that finished without a chunk asking for them (a request too short for a
        // non-final chunk, or cancelled) go into the bounded memory cache, not kept aside.
        reads.retain(|(k, rx)| match rx.try_recv() {
            Ok(Some(cache)) => {
                if self.keep(*k, Arc::new(cache)) {
                    self.lock().disk_hits += 1;
                }
                false
            }
            Ok(None) | Err(crossbeam_channel::TryRecvError::Disconnected) => false,
            Err(crossbeam_channel::TryRecvError::Empty) => true,
        });
        if self.lock().entries.iter().any(|e| &e.key == key) {
            return;
        }
        if reads.iter().any(|(k, _)| k == key) {
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let k = *key;
        #[cfg(test)]
        let hook = self.read_hook.clone();
        let spawned = std::thread::Builder::new().name("prefix-read".into()).spawn(move || {
            #[cfg(test)]
            if let Some(hook) = &hook {
                let _ = hook.start.recv();
            }
            let _ = tx.send(disk.load(&k));
            #[cfg(test)]
            if let Some(hook) = &hook {
                let _ = hook.done.send(k);
            }
        });
        if spawned.is_ok() {
            reads.push((*key, rx));
        }
    }

    /// The cache of `key`, if kept here or on disk (counts a hit or a miss here, and a disk hit);
    /// waits for a read [`PrefixStore::prefetch`] started.
    pub fn get(&self, key: &PrefixKey) -> Option<Arc<PrefixCache>> {
        if let Some(found) = self.get_kept(key) {
            return Some(found);
        }
        let disk = self.disk.as_ref()?;
        let started = {
            let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
            reads.iter().position(|(k, _)| k == key).map(|i| reads.swap_remove(i).1)
        };
        let loaded = match started {
            // A reader that died sends nothing: read here.
            Some(rx) => rx.recv().unwrap_or_else(|_| disk.load(key)),
            None => disk.load(key),
        };
        let cache = Arc::new(loaded?);
        self.keep(*key, cache.clone());
        self.lock().disk_hits += 1;
        tracing::debug!(frames = cache.frames, "read the voice's DiT prompt-prefix cache from disk");
        Some(cache)
    }

    fn get_kept(&self, key: &PrefixKey) -> Option<Arc<PrefixCache>> {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        let found = lru.entries.iter_mut().find(|e| &e.key == key).map(|e| {
            e.last_used = now;
            e.cache.clone()
        });
        if found.is_some() {
            lru.hits += 1;
        } else {
            lru.misses += 1;
        }
        found
    }

    /// Keeps `cache` under `key` (a newly recorded one: also written to disk, in the background).
    pub fn insert(&self, key: PrefixKey, cache: Arc<PrefixCache>) {
        if !self.keep(key, cache.clone()) {
            return; // two requests with a new voice recorded it at once: the first one is written
        }
        let Some(disk) = self.disk.clone() else { return };
        let written = self.disk_writes.clone();
        let spawned = std::thread::Builder::new().name("prefix-disk".into()).spawn(move || match disk.save(&key, &cache) {
            Ok(()) => {
                written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                true
            }
            Err(why) => {
                tracing::warn!(folder = %disk.dir().display(), "prompt-prefix cache not written to disk: {why}");
                false
            }
        });
        match spawned {
            Ok(handle) => {
                let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
                writes.retain(|h| !h.is_finished());
                writes.push(handle);
            }
            Err(e) => tracing::warn!("prompt-prefix cache not written to disk: no thread ({e})"),
        }
    }

    /// Waits for the disk writes under way.
    pub fn flush(&self) {
        let writes = std::mem::take(&mut *self.writes.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in writes {
            let _ = handle.join();
        }
    }

    /// Keeps `cache` under `key` in memory, dropping the least recently used entries until it
    /// fits; an entry larger than the whole bound is not kept. `false` when `key` was kept already
    /// (the first one stays).
    fn keep(&self, key: PrefixKey, cache: Arc<PrefixCache>) -> bool {
        let bytes = cache.bytes();
        if bytes > self.capacity {
            return true;
        }
        let mut lru = self.lock();
        if lru.entries.iter().any(|e| e.key == key) {
            return false;
        }
        while lru.bytes + bytes > self.capacity {
            let Some(oldest) = lru.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else { break };
            let gone = lru.entries.swap_remove(oldest);
            lru.bytes -= gone.bytes;
        }
        lru.clock += 1;
        let last_used = lru.clock;
        lru.bytes += bytes;
        lru.entries.push(Entry { key, cache, bytes, last_used });
        true
    }

    pub fn stats(&self) -> PrefixStats {
        let lru = self.lock();
        PrefixStats {
            hits: lru.hits,
            misses: lru.misses,
            entries: lru.entries.len(),
            bytes: lru.bytes,
            disk_hits: lru.disk_hits,
            disk_writes: self.disk_writes.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Drop for PrefixStore {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::PrefixStep;
    use ndarray::{Array2, Array3, Array4};

    fn cache(frames: usize) -> PrefixCache {
        let step = PrefixStep {
            k: Array4::zeros((1, 2, frames, 2)),
            v: Array4::zeros((1, 2, frames, 2)),
            conv1: Array3::zeros((2, 1, 2)),
            conv2: Array3::zeros((2, 1, 2)),
        };
        PrefixCache { frames, steps: vec![step], mel: Array2::zeros((80, frames)) }
    }

    #[test]
    fn least_recently_used_goes_first_and_the_bound_holds() {
        let shape = DitCacheShape { depth: 1, inner: 2, dim: 2, conv_context: 1 };
        let one = cache(10).bytes();
        let store = PrefixStore::new(shape, 2 * one);
        store.insert([1; 32], Arc::new(cache(10)));
        store.insert([2; 32], Arc::new(cache(10)));
        assert!(store.get(&[1; 32]).is_some()); // 1 is now newer than 2
        store.insert([3; 32], Arc::new(cache(10)));
        assert!(store.get(&[2; 32]).is_none(), "the least recently used entry was dropped");
        assert!(store.get(&[1; 32]).is_some() && store.get(&[3; 32]).is_some());
        let s = store.stats();
        assert_eq!((s.entries, s.bytes, s.hits, s.misses), (2, 2 * one, 3, 1));
        store.insert([4; 32], Arc::new(cache(30))); // larger than the bound: not kept, nothing dropped
        assert!(store.get(&[4; 32]).is_none());
        assert_eq!(store.stats().entries, 2);
    }

    /// A store whose background reads wait for a token on the returned sender and report their
    /// key on the returned receiver when their result is ready.
    fn held_reads(mut store: PrefixStore) -> (PrefixStore, crossbeam_channel::Sender<()>, crossbeam_channel::Receiver<PrefixKey>) {
        let (start_tx, start) = crossbeam_channel::unbounded();
        let (done, done_rx) = crossbeam_channel::unbounded();
        store.read_hook = Some(ReadHook { start, done });
        (store, start_tx, done_rx)
    }

    /// A guard against a hang only (the read is a small file): never reached when the code is right.
    const HANG: std::time::Duration = std::time::Duration::from_secs(120);

    #[test]
    fn a_voice_on_disk_is_read_prefetched_or_not_and_kept() {
        let shape = DitCacheShape { depth: 1, inner: 2, dim: 2, conv_context: 1 };
        let dir = tempfile::tempdir().unwrap();
        let disk = || PrefixDisk::new(dir.path().to_path_buf(), b"model", shape, 1, 1 << 20);
        disk().save(&[1; 32], &cache(10)).unwrap();
        disk().save(&[2; 32], &cache(20)).unwrap();
        // The read is held until `get` is under way, so `get` (not a second prefetch) takes its
        // result: the counters below do not depend on which thread ran first.
        let (store, start, _done) = held_reads(PrefixStore::new(shape, 1 << 20).with_disk(disk()));
        store.prefetch(&[1; 32]);
        store.prefetch(&[1; 32]); // already being read: not twice
        assert_eq!(store.reads.lock().unwrap().len(), 1, "one read for the voice");
        start.send(()).unwrap();
        assert_eq!(store.get(&[1; 32]).expect("prefetched").frames, 10);
        assert_eq!(store.get(&[2; 32]).expect("read when asked").frames, 20);
        assert!(store.get(&[3; 32]).is_none(), "on disk neither");
        let s = store.stats();
        assert_eq!((s.entries, s.disk_hits, s.misses, s.disk_writes), (2, 2, 3, 0), "{s:?}");
        assert!(store.get(&[1; 32]).is_some());
        assert_eq!(store.stats().hits, 1, "kept in memory after the read");
        // What is recorded is written (the write is waited for on flush/drop).
        store.insert([4; 32], Arc::new(cache(5)));
        store.flush();
        assert_eq!(store.stats().disk_writes, 1);
        assert_eq!(disk().load(&[4; 32]).expect("written").frames, 5);
        // A prefetched read no chunk asked for is not kept aside: the next prefetch moves it
        // into the bounded memory cache.
        disk().save(&[5; 32], &cache(7)).unwrap();
        let (store, start, done) = held_reads(PrefixStore::new(shape, 1 << 20).with_disk(disk()));
        store.prefetch(&[5; 32]);
        start.send(()).unwrap();
        assert_eq!(done.recv_timeout(HANG), Ok([5; 32]), "the read finished");
        assert_eq!(store.stats().entries, 0, "not kept before the next prefetch");
        store.prefetch(&[6; 32]); // another voice's request
        assert_eq!((store.stats().entries, store.stats().disk_hits), (1, 1));
        assert_eq!(store.get(&[5; 32]).expect("kept").frames, 7);
    }
}
