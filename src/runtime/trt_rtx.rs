//! TensorRT for RTX (`tensorrt-rtx`): a *plugin* execution provider. Unlike CUDA and TensorRT it is
//! not built into ONNX Runtime: its library (`libonnxruntime_providers_nv_tensorrt_rtx.so`, from
//! PyPI's `onnxruntime-ep-nv-tensorrt-rtx-cu12`, bundling TensorRT for RTX, its ONNX parser and the
//! CUDA 12 runtime) is registered with the environment at run time, the environment lists the GPUs
//! it offers (`OrtEpDevice`s), and a session is given one of those devices.
//!
//! It runs on RTX-class GPUs only: compute capability 8.6, 8.9 and 12.0 or newer. Data-centre parts
//! (A100 = 8.0, H100/H200 = 9.0, B200 = 10.0) are refused by TensorRT for RTX itself; cosy checks
//! the capability first so the refusal is one line that names the GPU, the cards it supports and
//! what happens next ([`support`]).
//!
//! Where the plugin is: `runtime.tensorrt_rtx_library` / `COSY_TENSORRT_RTX_LIBRARY`, else beside
//! the loaded `libonnxruntime.so` (where `scripts/setup-trt-rtx.sh` puts it, with the versioned
//! links the wheel's Python helper would make). Its bundled libraries are loaded first with
//! `RTLD_GLOBAL`, as that helper does, because the plugin has no run path to find them by.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::config::Config;
use crate::runtime::env::OrtRuntime;

/// The plugin's file name.
pub const PLUGIN_FILE: &str = "libonnxruntime_providers_nv_tensorrt_rtx.so";
/// The provider name the plugin registers its devices under.
pub const EP_NAME: &str = "NvTensorRTRTXExecutionProvider";
/// The name cosy registers the library under (any name; ONNX Runtime keys registrations by it).
const REGISTRATION_NAME: &str = "cosy-tensorrt-rtx";
/// The file `scripts/setup-trt-rtx.sh` writes beside the plugin: `package==version`.
pub const PACKAGE_FILE: &str = "PACKAGE-TENSORRT-RTX";
/// The bundled libraries the plugin needs by these names, in load order (TensorRT for RTX before
/// its parser, which links against it).
const BUNDLED: [&str; 3] = ["libcudart.so.12", "libtensorrt_rtx.so.1", "libtensorrt_onnxparser_rtx.so.1"];
/// The runtime-cache option of the plugin: the folder it keeps its compiled kernels in.
pub const RUNTIME_CACHE_OPTION: &str = "nv_runtime_cache_path";
/// The cards it supports, as the refusal line names them.
pub const SUPPORTED_CARDS: &str =
    "RTX GPUs of compute capability 8.6, 8.9 or 12.0+ (e.g. RTX 3090, RTX 4090, RTX 5090, RTX A6000/6000 Ada)";

/// A GPU's CUDA compute capability, e.g. 8.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    /// From `nvidia-smi`'s `compute_cap` text, e.g. `"8.6"`.
    pub fn parse(text: &str) -> Option<Self> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(ComputeCapability { major: major.parse().ok()?, minor: minor.parse().ok()? })
    }
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Whether TensorRT for RTX runs on a GPU of this capability: Ampere RTX (8.6), Ada (8.9) and
/// Blackwell RTX and later (12.0+). Not 8.0 (A100), 8.7 (Jetson Orin), 9.0 (H100/H200), 10.x
/// (B200) or 11.x: those are not RTX parts.
pub fn supports(cc: ComputeCapability) -> bool {
    matches!((cc.major, cc.minor), (8, 6) | (8, 9)) || cc.major >= 12
}

/// What stands between this machine and the provider, as the one line the user sees (without the
/// fallback clause, which the caller adds: [`crate::runtime::factory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// The plugin library is not there.
    NoPlugin { path: PathBuf, found_by: &'static str },
    /// No NVIDIA driver (`libcuda.so.1` does not load) or `nvidia-smi` sees no GPU.
    NoGpu { why: String },
    /// The GPU is not an RTX part.
    Gpu { name: String, cc: ComputeCapability },
    /// The plugin or its libraries would not load or register, or offered no device.
    Plugin { path: PathBuf, why: String },
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsupported::NoPlugin { path, found_by } => write!(
                f,
                "TensorRT for RTX plugin not installed: {} not found ({found_by}); install it with scripts/setup.sh --gpu \
(or point runtime.tensorrt_rtx_library at it); it supports {SUPPORTED_CARDS}",
                path.display()
            ),
            Unsupported::NoGpu { why } => {
                write!(f, "TensorRT for RTX needs an NVIDIA GPU: no NVIDIA GPU/driver ({why}); it supports {SUPPORTED_CARDS}")
            }
            Unsupported::Gpu { name, cc } => write!(
                f,
                "TensorRT for RTX does not support the {name} (compute capability {cc}); it supports {SUPPORTED_CARDS}"
            ),
            Unsupported::Plugin { path, why } => {
                write!(f, "TensorRT for RTX plugin {} cannot be used: {why}; it supports {SUPPORTED_CARDS}", path.display())
            }
        }
    }
}

/// The plugin's path and which setting or rule named it.
pub fn plugin_path(config: &Config, runtime: &OrtRuntime) -> (PathBuf, &'static str) {
    if let Some(p) = &config.runtime.tensorrt_rtx_library {
        return (p.clone(), "runtime.tensorrt_rtx_library");
    }
    let dir = runtime.library.parent().unwrap_or(Path::new("."));
    (dir.join(PLUGIN_FILE), "beside libonnxruntime.so")
}

/// The installed package and version (`onnxruntime-ep-nv-tensorrt-rtx-cu12==0.5.0`) that
/// `scripts/setup-trt-rtx.sh` recorded beside the plugin, if any.
pub fn package_of(plugin: &Path) -> Option<String> {
    let text = std::fs::read_to_string(plugin.parent()?.join(PACKAGE_FILE)).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// Loads the bundled libraries beside the plugin into the global namespace and keeps them loaded,
/// so the plugin's `NEEDED` entries resolve to them. Their initialisers need no GPU: this is what
/// shows, on a machine without one, that the installed files are whole.
pub fn load_bundled(plugin: &Path) -> Result<(), String> {
    static LOADED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let dir = plugin.parent().unwrap_or(Path::new("."));
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    for name in BUNDLED {
        let path = dir.join(name);
        if loaded.contains(&path) {
            continue;
        }
        // SAFETY: these are the plugin's own bundled CUDA runtime and TensorRT for RTX libraries;
        // their initialisers only set up their own state.
        let lib = unsafe {
            libloading::os::unix::Library::open(Some(&path), libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL)
        }
        .map_err(|e| format!("cannot load its bundled {name}: {} (reinstall with scripts/setup-trt-rtx.sh)", loader_error(&e)))?;
        // Kept for the life of the process: the plugin, once registered, calls into them.
        std::mem::forget(lib);
        loaded.push(path);
    }
    Ok(())
}

/// Whether the NVIDIA driver's `libcuda.so.1` loads; the loader's message when not.
pub fn driver() -> Result<(), String> {
    // SAFETY: the driver library's initialisers are benign; it is unloaded again right away (the
    // plugin loads it itself when registered).
    unsafe { libloading::Library::new("libcuda.so.1") }.map(drop).map_err(|e| loader_error(&e))
}

/// The dynamic loader's own words (`libcuda.so.1: cannot open shared object file: …`), which
/// libloading keeps as the error's source behind a bare "dlopen failed".
fn loader_error(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    }
}

/// The name and compute capability of GPU `device_id` as `nvidia-smi` reports them (asked once
/// per process and GPU: every stage's session checks it, and `nvidia-smi` takes a while).
pub fn gpu(device_id: u32) -> Result<(String, ComputeCapability), String> {
    static SEEN: Mutex<BTreeMap<u32, Result<(String, ComputeCapability), String>>> = Mutex::new(BTreeMap::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    seen.entry(device_id).or_insert_with(|| query_gpu(device_id)).clone()
}

fn query_gpu(device_id: u32) -> Result<(String, ComputeCapability), String> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=index,name,compute_cap", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("nvidia-smi: {e}"))?;
    if !out.status.success() {
        return Err(format!("nvidia-smi: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() >= 3 && f[0].parse::<u32>().ok() == Some(device_id) {
            let cc = ComputeCapability::parse(f[2]).ok_or_else(|| format!("nvidia-smi: compute capability {:?}", f[2]))?;
            return Ok((f[1].to_string(), cc));
        }
    }
    Err(format!("nvidia-smi lists no GPU {device_id}"))
}

/// Registers the plugin with the environment (once per process; later calls return the first
/// call's outcome, since ONNX Runtime refuses a second registration under the same name).
fn register_library(runtime: &OrtRuntime, plugin: &Path) -> Result<(), String> {
    static REGISTERED: Mutex<Option<Result<(), String>>> = Mutex::new(None);
    let mut g = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.as_ref() {
        return r.clone();
    }
    let r = runtime.env.register_ep_library(REGISTRATION_NAME, plugin).map_err(|e| e.to_string());
    *g = Some(r.clone());
    r
}

/// Checks everything in order and registers the plugin: the library is there, its bundled
/// libraries load, there is a driver and a GPU `device_id` of a supported capability, and the
/// plugin registers and offers that GPU. Returns the index of the device among the environment's
/// devices for [`EP_NAME`] (ONNX Runtime lists one per GPU, in CUDA order).
pub fn prepare(config: &Config, runtime: &OrtRuntime) -> Result<usize, Unsupported> {
    let (path, found_by) = plugin_path(config, runtime);
    if !path.is_file() {
        return Err(Unsupported::NoPlugin { path, found_by });
    }
    load_bundled(&path).map_err(|why| Unsupported::Plugin { path: path.clone(), why })?;
    driver().map_err(|e| Unsupported::NoGpu { why: e })?;
    let device_id = config.runtime.device_id;
    let (name, cc) = gpu(device_id).map_err(|why| Unsupported::NoGpu { why })?;
    if !supports(cc) {
        return Err(Unsupported::Gpu { name, cc });
    }
    register_library(runtime, &path).map_err(|why| Unsupported::Plugin { path: path.clone(), why })?;
    let offered = runtime.env.devices().filter(|d| d.ep().ok() == Some(EP_NAME)).count();
    if (device_id as usize) < offered {
        Ok(device_id as usize)
    } else {
        Err(Unsupported::Plugin { path, why: format!("it offers {offered} GPU(s), not GPU {device_id} ({name})") })
    }
}

/// The environment's device for [`EP_NAME`] number `index` (from [`prepare`]).
pub fn device(runtime: &OrtRuntime, index: usize) -> Option<ort::device::Device<'_>> {
    runtime.env.devices().filter(|d| d.ep().ok() == Some(EP_NAME)).nth(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(text: &str) -> ComputeCapability {
        ComputeCapability::parse(text).unwrap()
    }

    #[test]
    fn rtx_capabilities_are_supported_and_data_centre_ones_are_not() {
        for ok in ["8.6", "8.9", "12.0", "12.1"] {
            assert!(supports(cc(ok)), "{ok}");
        }
        // A100, Jetson Orin, H100/H200, B200, Thor, Turing (RTX 2080), Volta.
        for no in ["8.0", "8.7", "9.0", "10.0", "11.0", "7.5", "7.0"] {
            assert!(!supports(cc(no)), "{no}");
        }
        assert_eq!(ComputeCapability::parse("9"), None);
        assert_eq!(ComputeCapability::parse("x.0"), None);
        assert_eq!(cc(" 12.0\n").to_string(), "12.0");
    }

    #[test]
    fn the_refusal_names_the_gpu_and_the_cards_it_supports() {
        let line = Unsupported::Gpu { name: "NVIDIA H200".into(), cc: cc("9.0") }.to_string();
        assert_eq!(
            line,
            "TensorRT for RTX does not support the NVIDIA H200 (compute capability 9.0); it supports \
RTX GPUs of compute capability 8.6, 8.9 or 12.0+ (e.g. RTX 3090, RTX 4090, RTX 5090, RTX A6000/6000 Ada)"
        );
        let none = Unsupported::NoGpu { why: "libcuda.so.1: cannot open shared object file".into() }.to_string();
        assert!(none.contains("no NVIDIA GPU/driver (libcuda.so.1"), "{none}");
        assert!(none.contains("RTX 4090"), "{none}");
        for line in [line, none] {
            assert!(!line.contains('\n'), "{line}");
        }
    }
}
