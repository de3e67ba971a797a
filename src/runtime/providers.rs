//! What the machine and the loaded library offer: providers compiled in, GPUs, TensorRT version.

use std::process::Command;

use ort::ep::{self, ExecutionProvider};
use ort::session::Session;

use crate::vocab::ProviderKind;
use crate::runtime::env::OrtRuntime;

/// Whether the loaded ONNX Runtime was built with this provider (says nothing about drivers or
/// GPUs; see [`try_register`]).
pub fn compiled_in(kind: ProviderKind) -> bool {
    let r = match kind {
        ProviderKind::Cpu => return true,
        ProviderKind::Cuda => ep::CUDA::is_available(),
        ProviderKind::TensorRt => ep::TensorRT::is_available(),
        // A plugin: never built in; ONNX Runtime 1.31 can register it (`runtime::trt_rtx`).
        ProviderKind::TensorRtRtx => return true,
    };
    r.unwrap_or(false)
}

/// Registers the provider with default options on a throw-away session builder: this loads the
/// provider's shared library and its CUDA/TensorRT dependencies, so it catches most reasons a
/// provider cannot be used (a missing GPU shows up only when a session is made).
pub fn try_register(rt: &OrtRuntime, kind: ProviderKind) -> Result<(), String> {
    if kind == ProviderKind::TensorRtRtx {
        // A plugin needs the configuration to be found: `runtime::trt_rtx::prepare`.
        return Err("a plugin provider: checked by runtime::trt_rtx::prepare".into());
    }
    let mut builder = Session::builder(&rt.env).map_err(|e| e.to_string())?;
    let r = match kind {
        ProviderKind::Cpu => ep::CPU::default().register(&mut builder),
        ProviderKind::Cuda => ep::CUDA::default().register(&mut builder),
        ProviderKind::TensorRt => ep::TensorRT::default().register(&mut builder),
        ProviderKind::TensorRtRtx => return Ok(()),
    };
    r.map_err(|e| e.to_string())
}

/// A GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub memory_mib: u64,
    pub driver: String,
}

/// The NVIDIA GPUs `nvidia-smi` sees (empty when there is none or no driver).
pub fn gpus() -> Vec<GpuInfo> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() < 4 {
                return None;
            }
            Some(GpuInfo {
                index: f[0].parse().ok()?,
                name: f[1].to_string(),
                memory_mib: f[2].parse().unwrap_or(0),
                driver: f[3].to_string(),
            })
        })
        .collect()
}

/// The name of GPU `device_id`, or `"no-gpu"`.
pub fn gpu_name(device_id: u32) -> String {
    gpus().into_iter().find(|g| g.index == device_id).map_or_else(|| "no-gpu".to_string(), |g| g.name)
}

/// The TensorRT version of the `libnvinfer` the dynamic loader finds, e.g. `10.9.0`.
pub fn tensorrt_version() -> Option<String> {
    for name in ["libnvinfer.so.10", "libnvinfer.so"] {
        // SAFETY: libnvinfer's initialisers only register plugins; `getInferLibVersion` is a plain
        // C function taking nothing and returning an int in every TensorRT release.
        let v = unsafe {
            let Ok(lib) = libloading::Library::new(name) else { continue };
            let Ok(f) = lib.get::<unsafe extern "C" fn() -> i32>(b"getInferLibVersion") else { continue };
            f()
        };
        if v > 0 {
            // 10.x encodes major*10000 + minor*100 + patch.
            return Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100));
        }
    }
    None
}
