//! Fuzzing support for `tests/fuzz.rs`: a seeded RNG, a per-thread counting allocator, the case
//! runner (time limit per case, a watchdog for hangs, peak-allocation bound per case, panics
//! caught and reported with the case that made them) and byte mutators.
//!
//! Settings (environment):
//! * `COSY_FUZZ_CASES`: cases per harness (default: each harness's short CI count);
//! * `COSY_FUZZ_SEED`: base seed (default fixed, so CI runs are repeatable);
//! * `COSY_FUZZ_FROM`: index of the first case (with `COSY_FUZZ_CASES=1`, reruns one case);
//! * `COSY_FUZZ_CASE_SECONDS`: per-case time limit (default 5 s, 30 s in debug builds; the
//!   watchdog aborts at 4x);
//! * `COSY_FUZZ_KEEP`: write each case's input under `target/fuzz-cases/` (for one rerun case).
//!
//! Every case draws its input from an RNG seeded by (seed, harness, case index) alone, so a
//! failure is reproduced by the command the report prints.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// RNG

/// SplitMix64 seeding a xoshiro256** generator: fast, good enough, no dependency.
pub struct Rng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        Rng { s: [splitmix(&mut x), splitmix(&mut x), splitmix(&mut x), splitmix(&mut x)] }
    }

    pub fn u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn byte(&mut self) -> u8 {
        self.u64() as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    /// A small length biased towards short (0..=max, log-uniform-ish).
    pub fn len(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let cap = (1usize << self.below(bits as usize + 1)).min(max + 1);
        self.below(cap)
    }

    /// An "interesting" integer: boundaries, powers of two, small values, random.
    pub fn interesting_u64(&mut self) -> u64 {
        match self.below(10) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::MAX >> 1,
            4 => 1 << self.below(64),
            5 => (1u64 << self.below(64)).wrapping_sub(1),
            6 => (1u64 << self.below(64)).wrapping_add(1),
            7 => self.below(256) as u64,
            8 => u32::MAX as u64 - self.below(4) as u64,
            _ => self.u64(),
        }
    }
}

/// Seed of case `index` of harness `name`.
pub fn case_seed(base: u64, name: &str, index: u64) -> u64 {
    let mut h = base ^ 0xC05F_F022;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01B3);
    }
    let mut x = h ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    splitmix(&mut x)
}

// ---------------------------------------------------------------------------------------------
// Counting allocator

/// The global allocator of the fuzz binary: the system allocator, counting the bytes live on
/// each thread and their peak, and refusing (with a message naming the case, then abort) any
/// allocation past a hard cap while a case runs, so a blow-up fails fast instead of taking the
/// machine down.
pub struct CountingAlloc;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    /// Live bytes above which an allocation aborts (usize::MAX: no case running).
    static CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Case index, for the abort message.
    static CASE: Cell<u64> = const { Cell::new(u64::MAX) };
}

fn over_cap(size: usize) -> ! {
    // No allocation from here on: format into a stack buffer.
    let mut buf = [0u8; 160];
    let mut n = 0;
    let mut put = |s: &[u8]| {
        for &b in s {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
    };
    put(b"\nfuzz: allocation of ");
    put(fmt_u64(size as u64).as_slice());
    put(b" bytes past the per-case hard cap in case ");
    put(fmt_u64(CASE.try_with(Cell::get).unwrap_or(u64::MAX)).as_slice());
    put(b" (rerun it with COSY_FUZZ_FROM=<case> COSY_FUZZ_CASES=1)\n");
    let _ = std::io::stderr().write_all(&buf[..n]);
    std::process::abort();
}

struct Digits([u8; 20], usize);
impl Digits {
    fn as_slice(&self) -> &[u8] {
        &self.0[self.1..]
    }
}
fn fmt_u64(mut v: u64) -> Digits {
    let mut d = Digits([0; 20], 20);
    loop {
        d.1 -= 1;
        d.0[d.1] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    d
}

#[inline]
fn grow(by: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(by);
        if now > CAP.try_with(Cell::get).unwrap_or(usize::MAX) {
            over_cap(by);
        }
        live.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now)
            }
        });
    });
}

#[inline]
fn shrink(by: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(by)));
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grow(new_size - layout.size());
        } else {
            shrink(layout.size() - new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

/// Bytes live on this thread now.
pub fn live_bytes() -> usize {
    LIVE.with(Cell::get)
}

// ---------------------------------------------------------------------------------------------
// Runner

/// What a case did with its input.
pub enum Outcome {
    /// The library accepted the input.
    Accepted,
    /// The library refused it with an error (its message is checked: one line, not empty).
    Refused(String),
}

/// A harness's limits.
pub struct Spec {
    pub name: &'static str,
    /// Cases when `COSY_FUZZ_CASES` is not set (sized for CI in the debug profile).
    pub default_cases: u64,
    /// Peak bytes a case may allocate above what was live when it started.
    pub mem_bound: usize,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim().replace('_', "");
    let parsed = if let Some((m, e)) = v.split_once(['e', 'E']) {
        m.parse::<u64>().ok().zip(e.parse::<u32>().ok()).map(|(m, e)| m * 10u64.pow(e))
    } else {
        v.parse().ok()
    };
    Some(parsed.unwrap_or_else(|| panic!("{name}={v:?} is not a count")))
}

/// Hard cap on live bytes during a case: this far above the bound, the allocator aborts.
const HARD_CAP: usize = 2 << 30;

/// Runs `case` for each case index; `case` builds its input from the RNG and runs the library.
/// Fails (panics) on the first panic, slow case, error message that is not one line, or case
/// that allocated more than the bound; reports how to rerun that case.
pub fn run(spec: Spec, mut case: impl FnMut(&mut Rng, u64) -> Result<Outcome, String>) {
    let cases = env_u64("COSY_FUZZ_CASES").unwrap_or(spec.default_cases);
    let seed = env_u64("COSY_FUZZ_SEED").unwrap_or(0x5EED);
    let from = env_u64("COSY_FUZZ_FROM").unwrap_or(0);
    // Generous: the slowest cases of 1M take ~0.1 s in release; debug builds are 10-30x slower.
    let default_limit = if cfg!(debug_assertions) { 30.0 } else { 5.0 };
    let limit = Duration::from_secs_f64(
        std::env::var("COSY_FUZZ_CASE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_limit),
    );
    let name = spec.name;
    // Panics are reported below with the case that made them; the default hook's backtrace (with
    // RUST_BACKTRACE set) would allocate hundreds of MiB while symbolising, inside the case.
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}"))));
    let rerun = move |i: u64| {
        format!("COSY_FUZZ_SEED={seed} COSY_FUZZ_FROM={i} COSY_FUZZ_CASES=1 cargo test --test fuzz {name} -- --nocapture")
    };

    // Watchdog: a case running past 4x the limit is a hang; abort with the case to rerun.
    let current = Arc::new(AtomicU64::new(u64::MAX));
    let started_ms = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let watchdog = {
        let (current, started_ms, done) = (current.clone(), started_ms.clone(), done.clone());
        let hang = limit * 4;
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let i = current.load(Ordering::Acquire);
                if i == u64::MAX {
                    continue;
                }
                let since = epoch.elapsed().as_millis() as u64 - started_ms.load(Ordering::Acquire);
                if Duration::from_millis(since) > hang && current.load(Ordering::Acquire) == i {
                    eprintln!("\nfuzz {name}: case {i} has run {since} ms (hang); rerun: {}", rerun(i));
                    std::process::abort();
                }
            }
        })
    };

    println!("fuzz {name}: {cases} cases from {from}, seed {seed}");
    let live_before = live_bytes();
    let t0 = Instant::now();
    let (mut accepted, mut refused) = (0u64, 0u64);
    let mut slowest = (Duration::ZERO, 0u64);
    let mut max_peak = (0usize, 0u64);
    let mut sample_errors: Vec<String> = Vec::new();
    let mut last_report = Instant::now();
    for i in from..from.saturating_add(cases) {
        let mut rng = Rng::new(case_seed(seed, name, i));
        let base = live_bytes();
        PEAK.with(|p| p.set(base));
        CASE.with(|c| c.set(i));
        CAP.with(|c| c.set(base.saturating_add(HARD_CAP)));
        started_ms.store(epoch.elapsed().as_millis() as u64, Ordering::Release);
        current.store(i, Ordering::Release);
        let t = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| case(&mut rng, i)));
        let took = t.elapsed();
        current.store(u64::MAX, Ordering::Release);
        CAP.with(|c| c.set(usize::MAX));
        let peak = PEAK.with(Cell::get).saturating_sub(base);
        match result {
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                done.store(true, Ordering::Relaxed);
                panic!("fuzz {name}: case {i} panicked: {msg}\nrerun: {}", rerun(i));
            }
            Ok(Err(violation)) => {
                done.store(true, Ordering::Relaxed);
                panic!("fuzz {name}: case {i}: {violation}\nrerun: {}", rerun(i));
            }
            Ok(Ok(Outcome::Accepted)) => accepted += 1,
            Ok(Ok(Outcome::Refused(msg))) => {
                refused += 1;
                if msg.trim().is_empty() || msg.contains('\n') {
                    done.store(true, Ordering::Relaxed);
                    panic!("fuzz {name}: case {i}: error message is not one line: {msg:?}\nrerun: {}", rerun(i));
                }
                // A few distinct messages for the summary (told apart by their first 100 characters).
                let head: String = msg.chars().take(100).collect();
                if sample_errors.len() < 6 && !sample_errors.iter().any(|e| e.starts_with(&head)) {
                    sample_errors.push(msg.chars().take(200).collect());
                }
            }
        }
        if took > limit {
            done.store(true, Ordering::Relaxed);
            panic!("fuzz {name}: case {i} took {took:?}, over the {limit:?} limit\nrerun: {}", rerun(i));
        }
        if peak > spec.mem_bound {
            done.store(true, Ordering::Relaxed);
            panic!(
                "fuzz {name}: case {i} allocated a peak of {peak} bytes, over the {} bound\nrerun: {}",
                spec.mem_bound,
                rerun(i)
            );
        }
        if took > slowest.0 {
            slowest = (took, i);
        }
        if peak > max_peak.0 {
            max_peak = (peak, i);
        }
        if last_report.elapsed() > Duration::from_secs(60) {
            last_report = Instant::now();
            let n = i + 1 - from;
            println!("fuzz {name}: {n} cases in {:.0?} ({:.0}/s)", t0.elapsed(), n as f64 / t0.elapsed().as_secs_f64());
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "fuzz {name}: {cases} cases in {secs:.1} s ({:.0}/s): {accepted} accepted, {refused} refused; slowest case {} ({:.1?}); largest peak {} KiB (case {}); live bytes {} KiB before, {} KiB after",
        cases as f64 / secs.max(1e-9),
        slowest.1,
        slowest.0,
        max_peak.0 / 1024,
        max_peak.1,
        live_before / 1024,
        live_bytes() / 1024
    );
    for e in &sample_errors {
        println!("  e.g. {e}");
    }
}

/// A temporary folder for case files: in `/dev/shm` (memory) when there is one, since rewriting
/// a file a million times on a disk file system waits on writeback, else the default temp folder.
pub fn case_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("cosy-fuzz-").tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("a temporary folder")
}

/// With `COSY_FUZZ_KEEP` set (use it with a rerun of one case), writes the case's input to
/// `target/fuzz-cases/<harness>-<case>.<ext>` for a regression test or a look with other tools.
pub fn keep(name: &str, case: u64, ext: &str, bytes: &[u8]) {
    if std::env::var_os("COSY_FUZZ_KEEP").is_none() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-cases");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{case}.{ext}"));
    match std::fs::write(&path, bytes) {
        Ok(()) => println!("fuzz {name}: case {case} input kept in {}", path.display()),
        Err(e) => println!("fuzz {name}: cannot keep case {case} in {}: {e}", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// Byte mutators

/// Applies 1..=`max_ops` random byte-level mutations (flips, interesting values, inserts,
/// deletes, duplicated or spliced ranges, truncation), keeping the result at most `max_len`.
pub fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, max_ops: usize, max_len: usize, other: Option<&[u8]>) {
    let ops = rng.range(1, max_ops);
    for _ in 0..ops {
        let n = data.len();
        match rng.below(12) {
            0 if n > 0 => {
                let i = rng.below(n);
                data[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                data[i] = *rng.pick(&[0u8, 1, 0x7F, 0x80, 0xFF, 0xFE, b'0', b'9', b' ', b'\n']);
            }
            2 if n > 0 => {
                let i = rng.below(n);
                data[i] = rng.byte();
            }
            3 if n >= 2 => {
                // An interesting 16/32/64-bit value, little- or big-endian.
                let width = *rng.pick(&[2usize, 4, 8]);
                if n >= width {
                    let at = rng.below(n - width + 1);
                    let v = rng.interesting_u64();
                    let bytes = if rng.chance(1, 2) { v.to_le_bytes() } else { v.to_be_bytes() };
                    let src = if rng.chance(1, 2) { &bytes[..width] } else { &bytes[8 - width..] };
                    data[at..at + width].copy_from_slice(src);
                }
            }
            4 if n > 0 => {
                // Add or subtract a small number to a byte (counts, lengths).
                let i = rng.below(n);
                data[i] = data[i].wrapping_add(rng.range(1, 35) as u8).wrapping_sub(if rng.chance(1, 2) { 36 } else { 0 });
            }
            5 => {
                let at = rng.below(n + 1);
                let len = rng.len(64);
                let ins = rng.bytes(len);
                data.splice(at..at, ins);
            }
            6 if n > 0 => {
                let at = rng.below(n);
                let len = rng.len(n - at).max(1);
                data.drain(at..at + len);
            }
            7 if n > 0 => {
                // Duplicate a range somewhere else.
                let at = rng.below(n);
                let len = rng.len(n - at).clamp(1, 4096);
                let chunk = data[at..at + len].to_vec();
                let to = rng.below(n + 1);
                data.splice(to..to, chunk);
            }
            8 if n > 0 => {
                data.truncate(rng.below(n));
            }
            9 => {
                if let Some(o) = other.filter(|o| !o.is_empty()) {
                    let at = rng.below(o.len());
                    let len = rng.len(o.len() - at).clamp(1, 4096);
                    let to = rng.below(n + 1);
                    let end = (to + len).min(n);
                    data.splice(to..end, o[at..at + len].iter().copied());
                }
            }
            10 if n > 0 => {
                // Overwrite a run with one repeated byte.
                let at = rng.below(n);
                let len = rng.len(n - at).clamp(1, 256);
                let r = rng.byte();
                let b = *rng.pick(&[0u8, 0xFF, r]);
                data[at..at + len].fill(b);
            }
            _ if n > 0 => {
                // Swap two bytes.
                let (a, b) = (rng.below(n), rng.below(n));
                data.swap(a, b);
            }
            _ => data.push(rng.byte()),
        }
    }
    data.truncate(max_len);
}
