//! Loading ONNX Runtime and the one process-wide `Environment`.
//!
//! `ort` (load-dynamic) would load the library lazily on first use and panic if it is missing or
//! too old. We find the library ourselves, read its version with a plain `dlopen`, refuse it with
//! a message that says how to fix it, and only then hand it to `ort::init_from`.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

use crate::config::Config;
use crate::error::{Error, Result};

/// The oldest ONNX Runtime minor version (1.x) cosy works with (ort's `api-31` feature).
pub const MIN_ORT_MINOR: u32 = 31;

/// How to get a suitable library; appended to every load error.
pub const ORT_FIX: &str = "fix: install cosy with its library (scripts/install.sh puts it in <prefix>/lib/cosy/), \
run scripts/setup-ort.sh (CPU) or scripts/setup-ort.sh --gpu (CUDA + TensorRT) in a checkout, \
or point runtime.ort_library in config.toml / COSY_ORT_LIBRARY / ORT_DYLIB_PATH at libonnxruntime.so 1.31 or newer";

/// The loaded library and the environment every session shares.
pub struct OrtRuntime {
    pub env: Environment,
    /// Absolute path of the library that was loaded.
    pub library: PathBuf,
    /// Its version string, e.g. `1.31.1`.
    pub version: String,
    /// Which setting named it or where it was found (`runtime.ort_library`, `ORT_DYLIB_PATH`,
    /// `beside the executable (<prefix>/lib/cosy)`, …: [`locate_library`]).
    pub found_by: &'static str,
}

impl std::fmt::Debug for OrtRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtRuntime").field("library", &self.library).field("version", &self.version).finish()
    }
}

static RUNTIME: OnceLock<OrtRuntime> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// The file name ONNX Runtime's loader is known by.
const LIB_NAME: &str = "libonnxruntime.so";

/// Where the library is looked for, in order, when no setting names it: beside the executable
/// (`<prefix>/lib/cosy/`, as `scripts/install.sh` and the tarball lay it out, then the
/// executable's own folder), a checkout's `.ort/` (beside the config file, in the current folder,
/// or above the executable's `target/<profile>/`, where `scripts/setup-ort.sh` puts it), then the
/// user's data folder (`$XDG_DATA_HOME/cosy/lib/`). The GPU build's provider libraries
/// (`libonnxruntime_providers_*.so`) are loaded by ONNX Runtime from the same folder as it.
pub fn library_candidates(config: &Config) -> Vec<(PathBuf, &'static str)> {
    let mut out: Vec<(PathBuf, &'static str)> = Vec::new();
    let exe_dir = crate::paths::exe_dir();
    if let Some(dir) = &exe_dir {
        if let Some(prefix) = dir.parent() {
            out.push((prefix.join("lib").join("cosy").join(LIB_NAME), "beside the executable (<prefix>/lib/cosy)"));
        }
        out.push((dir.join(LIB_NAME), "beside the executable (its own folder)"));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(dir) = config.source_file.as_ref().and_then(|f| f.parent()) {
        roots.push(dir.to_path_buf());
    }
    roots.push(PathBuf::from("."));
    if let Some(dir) = &exe_dir {
        // target/<profile>/cosy (or target/<profile>/deps/… for a test) -> the checkout above.
        roots.extend(dir.ancestors().take(4).map(Path::to_path_buf));
    }
    for r in roots {
        out.push((r.join(".ort").join(LIB_NAME), "a checkout's .ort (scripts/setup-ort.sh)"));
    }
    out.push((crate::paths::data_home().join("lib").join(LIB_NAME), "the user's data folder ($XDG_DATA_HOME/cosy/lib)"));
    out
}

/// The library to load and how it was found: `runtime.ort_library` / `COSY_ORT_LIBRARY`, then
/// `$ORT_DYLIB_PATH`, then the first of [`library_candidates`] that exists, then the system's
/// library path (what `dlopen("libonnxruntime.so")` finds: `ldconfig`'s folders,
/// `$LD_LIBRARY_PATH`). Found nowhere: the first candidate, so the error names where it belongs.
pub fn locate_library(config: &Config) -> (PathBuf, &'static str) {
    if let Some(named) = config.ort_library_setting() {
        return named;
    }
    let candidates = library_candidates(config);
    if let Some((p, how)) = candidates.iter().find(|(p, _)| p.exists()) {
        return (p.clone(), how);
    }
    if let Some(p) = system_library() {
        return (p, "the system's library path");
    }
    candidates
        .into_iter()
        .next()
        .map(|(p, _)| (p, "not found beside the executable, in .ort, the user's data folder or the system's library path"))
        .unwrap_or_else(|| (PathBuf::from(LIB_NAME), "not found"))
}

/// The file the dynamic loader finds for `libonnxruntime.so` on the system's library path, if any:
/// loaded by name, then asked where it came from (`dladdr`), then unloaded.
fn system_library() -> Option<PathBuf> {
    // SAFETY: as in `probe_library`: libonnxruntime's initialisers are benign.
    let lib = unsafe { libloading::Library::new(LIB_NAME) }.ok()?;
    // SAFETY: only the symbol's address is used, to ask the loader which file holds it.
    let sym: libloading::Symbol<unsafe extern "C" fn()> = unsafe { lib.get(b"OrtGetApiBase") }.ok()?;
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the loader's tables; `info` is a plain out-parameter.
    let found = unsafe { libc::dladdr(*sym as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader while the library is loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    drop(lib);
    let path = PathBuf::from(path);
    path.is_absolute().then_some(path)
}

/// Reads the version of an ONNX Runtime library without keeping it loaded and checks it.
pub fn probe_library(path: &Path, found_by: &str) -> Result<String> {
    if !path.exists() {
        return Err(Error::Library(format!(
            "ONNX Runtime library not found at {} (from {found_by}); {ORT_FIX}",
            path.display()
        )));
    }
    // SAFETY: loading a shared library runs its initialisers; libonnxruntime's are benign, and
    // this is the same library ort loads right after.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
        Error::Library(format!("cannot load ONNX Runtime library {}: {e}; {ORT_FIX}", path.display()))
    })?;
    // SAFETY: OrtGetApiBase has this signature in every ONNX Runtime release; the returned
    // struct and string are static inside the library, which stays loaded while we read them.
    let version = unsafe {
        let get_base: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            lib.get(b"OrtGetApiBase").map_err(|_| {
                Error::Library(format!("{} is not an ONNX Runtime library (no OrtGetApiBase); {ORT_FIX}", path.display()))
            })?;
        let base = get_base();
        if base.is_null() {
            return Err(Error::Library(format!("{}: OrtGetApiBase returned null; {ORT_FIX}", path.display())));
        }
        let v = ((*base).GetVersionString)();
        if v.is_null() {
            return Err(Error::Library(format!("{}: no version string; {ORT_FIX}", path.display())));
        }
        CStr::from_ptr(v).to_string_lossy().into_owned()
    };
    let minor = version.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
    if !version.starts_with("1.") || minor < MIN_ORT_MINOR {
        return Err(Error::Library(format!(
            "ONNX Runtime at {} is version {version}; cosy needs 1.{MIN_ORT_MINOR} or newer; {ORT_FIX}",
            path.display()
        )));
    }
    Ok(version)
}

/// Loads ONNX Runtime as the configuration says (once per process) and returns the shared runtime.
pub fn init(config: &Config) -> Result<&'static OrtRuntime> {
    let (path, how) = locate_library(config);
    init_from(&path, how)
}

/// Loads the library at `path` (once per process). Later calls return the runtime loaded first;
/// one that names a different library gets a warning, since a process cannot switch libraries.
pub fn init_from(path: &Path, found_by: &'static str) -> Result<&'static OrtRuntime> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = RUNTIME.get() {
        let same = std::fs::canonicalize(path).map(|p| p == rt.library).unwrap_or(false);
        if !same {
            tracing::warn!(
                "ONNX Runtime is already loaded from {}; ignoring {}",
                rt.library.display(),
                path.display()
            );
        }
        return Ok(rt);
    }
    let version = probe_library(path, found_by)?;
    let library = std::fs::canonicalize(path).map_err(|e| Error::io(path, e))?;
    let builder = ort::init_from(&library)
        .map_err(|e| Error::Library(format!("cannot load {}: {e}; {ORT_FIX}", library.display())))?;
    let env = builder
        .with_name("cosy")
        .with_telemetry(false)
        .build()
        .map_err(|e| Error::Library(format!("cannot create the ONNX Runtime environment: {e}")))?;
    tracing::debug!("ONNX Runtime {version} loaded from {}", library.display());
    Ok(RUNTIME.get_or_init(|| OrtRuntime { env, library, version, found_by }))
}

/// The runtime if it was already initialised.
pub fn current() -> Option<&'static OrtRuntime> {
    RUNTIME.get()
}
