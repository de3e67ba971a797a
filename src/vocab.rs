//! The shared vocabulary: the names every layer speaks of — the pipeline's stages ([`Stage`],
//! [`STAGES`]), their config groups ([`StageGroup`]), precisions ([`Precision`]), execution
//! providers ([`ProviderKind`]), what a saved voice may be called ([`check_voice_name`]) and
//! OpenAI's voice names ([`OPENAI_VOICES`]).
//!
//! They live here, below everything else, because the configuration (which parses them from
//! `config.toml`), the model folder (whose manifest names stages and precisions), the runtime and
//! the voices all use them: with them in config or model, those modules would import each other.
//! This module depends on nothing of the crate but [`crate::error`]; the layers above import it
//! as vocab → config → model → voice → ….

use std::fmt;

use crate::error::{Error, InputCode, Result};

/// Every stage (graph) the runtime knows, in pipeline order: the names of [`Stage::ALL`].
pub const STAGES: &[&str] = &["campplus", "speech_tokenizer", "llm", "flow_front", "dit", "hift_decode"];

/// The LLM's fixed-shape step over a slot cache written in place (`engine.llm_kv = "static"`):
/// a graph of the `llm` stage beside `llm` itself, configured by `[stages.llm]`.
pub const LLM_STEP_GRAPH: &str = "llm_step";

/// A stage of the pipeline: one graph of the model folder. Its manifest name is [`Stage::name`];
/// its `[stages.*]` config group is [`Stage::group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Campplus,
    SpeechTokenizer,
    Llm,
    FlowFront,
    Dit,
    HiftDecode,
}

impl Stage {
    /// In pipeline order (the order of [`STAGES`]).
    pub const ALL: [Stage; 6] = [Stage::Campplus, Stage::SpeechTokenizer, Stage::Llm, Stage::FlowFront, Stage::Dit, Stage::HiftDecode];

    /// The graph's name in `manifest.json`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Campplus => "campplus",
            Stage::SpeechTokenizer => "speech_tokenizer",
            Stage::Llm => "llm",
            Stage::FlowFront => "flow_front",
            Stage::Dit => "dit",
            Stage::HiftDecode => "hift_decode",
        }
    }

    /// The stage of a manifest graph name.
    pub fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The `[stages.<group>]` config section that sets its provider and precision.
    pub fn group(self) -> StageGroup {
        match self {
            Stage::Llm => StageGroup::Llm,
            Stage::FlowFront => StageGroup::Flow,
            Stage::Dit => StageGroup::Dit,
            Stage::HiftDecode => StageGroup::Hift,
            Stage::Campplus | Stage::SpeechTokenizer => StageGroup::Frontend,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The configurable groups of graphs. `flow` is the flow front end (`flow_front`), `dit` the
/// estimator, `hift` the vocoder (`hift_decode`), `frontend` the two copied graphs (campplus and
/// the speech tokenizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StageGroup {
    Llm,
    Flow,
    Dit,
    Hift,
    Frontend,
}

impl StageGroup {
    pub const ALL: [StageGroup; 5] =
        [StageGroup::Llm, StageGroup::Flow, StageGroup::Dit, StageGroup::Hift, StageGroup::Frontend];
    pub fn as_str(self) -> &'static str {
        match self {
            StageGroup::Llm => "llm",
            StageGroup::Flow => "flow",
            StageGroup::Dit => "dit",
            StageGroup::Hift => "hift",
            StageGroup::Frontend => "frontend",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }
    /// The group a manifest graph (stage) name belongs to.
    pub fn of_graph(graph: &str) -> Option<Self> {
        if graph == LLM_STEP_GRAPH {
            return Some(StageGroup::Llm);
        }
        Stage::parse(graph).map(Stage::group)
    }
}

/// Numeric precision a stage runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
    /// int8 weights (per output channel) with dynamically quantised activations in the MatMul/Gemm
    /// projections only; everything else fp32. A graph variant of its own (CPU, CUDA); TensorRT
    /// refuses it because no calibration is shipped.
    Int8,
}

impl Precision {
    pub const ALL: [Precision; 4] = [Precision::Fp32, Precision::Fp16, Precision::Bf16, Precision::Int8];
    /// The allowed values, for error messages.
    pub const ALLOWED: &'static str = "fp32, fp16, bf16, int8";
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s.trim().to_ascii_lowercase())
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An ONNX Runtime execution provider cosy knows how to configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderKind {
    TensorRt,
    /// TensorRT for RTX: a plugin provider (a library registered with ONNX Runtime at run time,
    /// not built into it) for RTX-class GPUs (`runtime::trt_rtx`).
    TensorRtRtx,
    Cuda,
    Cpu,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 4] = [ProviderKind::TensorRt, ProviderKind::TensorRtRtx, ProviderKind::Cuda, ProviderKind::Cpu];
    /// The short name used in config files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::TensorRt => "tensorrt",
            ProviderKind::TensorRtRtx => "tensorrt-rtx",
            ProviderKind::Cuda => "cuda",
            ProviderKind::Cpu => "cpu",
        }
    }
    /// The name ONNX Runtime uses.
    pub fn ort_name(self) -> &'static str {
        match self {
            ProviderKind::TensorRt => "TensorrtExecutionProvider",
            ProviderKind::TensorRtRtx => "NvTensorRTRTXExecutionProvider",
            ProviderKind::Cuda => "CUDAExecutionProvider",
            ProviderKind::Cpu => "CPUExecutionProvider",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "trt" => Some(ProviderKind::TensorRt),
            "trt-rtx" | "tensorrt_rtx" => Some(ProviderKind::TensorRtRtx),
            _ => Self::ALL.into_iter().find(|p| p.as_str() == s),
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name in a marker file (a folder's `DEFAULT`, naming its default voice or model): `None`
/// when the file does not exist; a name that is not a valid name is `bad(path, name)`.
pub fn read_name_marker(path: &std::path::Path, bad: impl FnOnce(&std::path::Path, &str) -> Error) -> Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let name = text.trim();
    check_voice_name(name).map_err(|_| bad(path, name))?;
    Ok(Some(name.to_string()))
}

/// OpenAI's voice names (its speech API, 2025): clients send these and some accept no other.
/// Here, below the configuration, because `voices.aliases` names them when it refuses an alias;
/// what they resolve to is `app::voices`'s.
pub const OPENAI_VOICES: [&str; 13] =
    ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar"];

/// Refuses saved-voice names that are not a plain file stem: letters, digits, `.`, `_`, `-`; 1–64
/// chars; not starting with `.` or `-`. (Here rather than in [`crate::voice`] because the
/// configuration checks `voices.default` with it.)
pub fn check_voice_name(name: &str) -> Result<()> {
    let ok_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty() || name.len() > 64 || !ok_chars || name.starts_with(['.', '-']) {
        return Err(Error::input(
            InputCode::InvalidVoiceName,
            Some("voice"),
            format!("voice name {name:?} is not allowed; use 1-64 letters, digits, '.', '_' or '-' (not first)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_are_the_manifest_stages() {
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, STAGES);
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.name()), Some(s));
        }
        assert_eq!(Stage::parse("hift"), None);
    }

    #[test]
    fn voice_names() {
        for ok in ["alice", "Bob_2", "v1.0-x"] {
            check_voice_name(ok).unwrap();
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(check_voice_name(bad).is_err(), "{bad:?}");
        }
    }
}
