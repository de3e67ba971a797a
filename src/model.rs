//! The exported model folder (docs/model-format.md): `manifest.json` types, loading and validation.
//!
//! Validation has two levels: [`ModelDir::check_files`] (files present, sizes, sha256) needs no
//! ONNX Runtime; [`check_graph_io`] compares a graph's declared inputs/outputs with what an opened
//! session reports, so a renamed input or a changed dtype is caught before any run.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::vocab::{Precision, LLM_STEP_GRAPH, STAGES};

/// The `format` string of a manifest.
pub const FORMAT: &str = "cosy-model";
/// The manifest format version this runtime reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest file name inside a model folder.
pub const MANIFEST: &str = "manifest.json";
/// A file listed by the manifest, relative to the folder.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
}

/// One precision variant of a graph.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Variant {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
    /// External weights (`<graph>.onnx.data`), when the graph is too large for one protobuf.
    #[serde(default)]
    pub data: Option<FileEntry>,
}

impl Variant {
    /// The graph file and its external data as manifest file entries.
    pub fn entries(&self) -> Vec<FileEntry> {
        let mut v = vec![FileEntry { file: self.file.clone(), sha256: self.sha256.clone(), bytes: self.bytes }];
        v.extend(self.data.clone());
        v
    }
}

/// One dimension: a fixed size or the name of a dynamic axis.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Dim {
    Fixed(i64),
    Named(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Named(s) => f.write_str(s),
        }
    }
}

/// A graph input or output as the manifest declares it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// `float32`, `float16`, `int32`, `int64` or `bool`.
    pub dtype: String,
    pub shape: Vec<Dim>,
}

/// TensorRT optimisation profile of one input.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProfileShapes {
    pub min: Vec<i64>,
    pub opt: Vec<i64>,
    pub max: Vec<i64>,
}

/// One stage's graph: I/O contract, variants per precision, TensorRT profiles.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GraphSpec {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// Keyed by precision name (`fp32`, `fp16`, `bf16`).
    pub variants: BTreeMap<String, Variant>,
    #[serde(default)]
    pub trt_profile: BTreeMap<String, ProfileShapes>,
    /// How requests share one call (docs/model-format.md): `none` (batch 1; also folders
    /// exported before batching), `padded_kv` (llm), `kv_slots` (llm_step), `padded_frames` (dit).
    #[serde(default = "no_batching")]
    pub batching: String,
}

fn no_batching() -> String {
    "none".into()
}

impl GraphSpec {
    pub fn variant(&self, precision: Precision) -> Option<&Variant> {
        self.variants.get(precision.as_str())
    }
    /// Whether every input has only fixed dimensions (a CUDA graph can be captured).
    pub fn has_fixed_shapes(&self) -> bool {
        self.inputs.iter().chain(&self.outputs).all(|t| t.shape.iter().all(|d| matches!(d, Dim::Fixed(_))))
    }
}

/// `manifest.json`. Sections the runtime core does not interpret are kept as JSON for the stages
/// that do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    #[serde(default)]
    pub exporter: serde_json::Value,
    #[serde(default)]
    pub source: serde_json::Value,
    #[serde(default)]
    pub config: serde_json::Value,
    #[serde(default)]
    pub constants: serde_json::Value,
    pub graphs: BTreeMap<String, GraphSpec>,
    #[serde(default)]
    pub files: BTreeMap<String, FileEntry>,
    #[serde(default)]
    pub sine_noise: serde_json::Value,
    /// Text-normalisation grammars (`tn/`), absent in folders exported without them.
    #[serde(default)]
    pub tn: serde_json::Value,
}

impl Manifest {
    /// Every file path the manifest names, with its key (`graphs.llm.variants.fp32.file`,
    /// `graphs.llm.variants.fp32.data.file`, `files.tokenizer.file`, `tn.zh.tagger`).
    pub fn file_paths(&self) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        for (stage, g) in &self.graphs {
            for (precision, v) in &g.variants {
                out.push((format!("graphs.{stage}.variants.{precision}.file"), v.file.as_str()));
                if let Some(d) = &v.data {
                    out.push((format!("graphs.{stage}.variants.{precision}.data.file"), d.file.as_str()));
                }
            }
        }
        for (name, e) in &self.files {
            out.push((format!("files.{name}.file"), e.file.as_str()));
        }
        for (lang, roles) in self.tn.as_object().into_iter().flatten() {
            for (role, file) in roles.as_object().into_iter().flatten() {
                if let Some(file) = file.as_str() {
                    out.push((format!("tn.{lang}.{role}"), file));
                }
            }
        }
        out
    }
}

/// Refuses a manifest file path (at manifest key `key`) that is empty, absolute, or leaves the
/// model folder once `.` and `..` are resolved (`../../etc/passwd`): a manifest names files of
/// its own folder only, and nothing outside it is ever opened on its word.
fn check_inside(root: &Path, key: &str, file: &str) -> Result<()> {
    use std::path::Component;
    let refuse = |why: &str| {
        Err(Error::model(root, format!("{MANIFEST}: {key} = {file:?} {why}; a manifest names files inside its model folder (re-export the model)")))
    };
    if file.trim().is_empty() {
        return refuse("is empty");
    }
    let mut depth = 0usize;
    for part in Path::new(file).components() {
        match part {
            Component::Prefix(_) | Component::RootDir => return refuse("is an absolute path"),
            Component::CurDir => {}
            Component::ParentDir if depth == 0 => return refuse("leaves the model folder"),
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
        }
    }
    if depth == 0 {
        return refuse("is the model folder itself, not a file in it");
    }
    Ok(())
}

/// A model folder whose manifest parsed and has the right format and version.
#[derive(Debug, Clone)]
pub struct ModelDir {
    pub root: PathBuf,
    pub manifest: Manifest,
}

impl ModelDir {
    /// Reads `manifest.json` and checks format and version (not the files; see [`Self::check_files`]).
    pub fn open(root: &Path) -> Result<ModelDir> {
        if !root.is_dir() {
            return Err(Error::model(
                root,
                "is not a folder (set model.dir in config.toml, COSY_MODEL or --model, or add one with `cosy model add NAME PATH`; make one from the official checkpoint with `scripts/export.sh SRC DST` in the cosy checkout, see README \"Using a real checkpoint\")",
            ));
        }
        let path = root.join(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::model(root, format!("cannot read {MANIFEST}: {e}")))?;
        let head: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::model(root, format!("{MANIFEST} is not valid JSON: {e}")))?;
        let format = head.get("format").and_then(|v| v.as_str()).unwrap_or("");
        if format != FORMAT {
            return Err(Error::model(root, format!("{MANIFEST}: format is {format:?}, expected {FORMAT:?}")));
        }
        let version = head.get("format_version").and_then(|v| v.as_u64());
        if version != Some(u64::from(FORMAT_VERSION)) {
            let shown = version.map_or("missing".to_string(), |v| v.to_string());
            return Err(Error::model(
                root,
                format!("{MANIFEST}: format_version is {shown}, this cosy reads version {FORMAT_VERSION} (re-export the model with the matching exporter)"),
            ));
        }
        let manifest: Manifest = serde_json::from_value(head)
            .map_err(|e| Error::model(root, format!("{MANIFEST} does not match format version 1: {e}")))?;
        let dir = ModelDir { root: root.to_path_buf(), manifest };
        dir.check_structure()?;
        Ok(dir)
    }

    fn check_structure(&self) -> Result<()> {
        for (key, file) in self.manifest.file_paths() {
            check_inside(&self.root, &key, file)?;
        }
        for (stage, g) in &self.manifest.graphs {
            // llm_step: the LLM's optional fixed-shape step (engine.llm_kv), beside the stages.
            if !STAGES.contains(&stage.as_str()) && stage != LLM_STEP_GRAPH {
                return Err(Error::model(&self.root, format!("{MANIFEST}: unknown stage {stage:?}; known: {}, {LLM_STEP_GRAPH}", STAGES.join(", "))));
            }
            if g.variants.is_empty() {
                return Err(Error::model(&self.root, format!("{MANIFEST}: stage {stage} has no variants")));
            }
            for name in g.variants.keys() {
                if Precision::parse(name).is_none() {
                    return Err(Error::model(&self.root, format!("{MANIFEST}: stage {stage}: unknown variant {name:?}; allowed: {}", Precision::ALLOWED)));
                }
            }
            for t in g.inputs.iter().chain(&g.outputs) {
                if !DTYPES.contains(&t.dtype.as_str()) {
                    return Err(Error::model(&self.root, format!("{MANIFEST}: stage {stage}: tensor {} has dtype {:?}; allowed: {}", t.name, t.dtype, DTYPES.join(", "))));
                }
            }
            for (input, p) in &g.trt_profile {
                let Some(spec) = g.inputs.iter().find(|t| &t.name == input) else {
                    return Err(Error::model(&self.root, format!("{MANIFEST}: stage {stage}: trt_profile names {input:?}, which is not an input")));
                };
                let rank = spec.shape.len();
                if p.min.len() != rank || p.opt.len() != rank || p.max.len() != rank {
                    return Err(Error::model(&self.root, format!("{MANIFEST}: stage {stage}: trt_profile of {input} does not have rank {rank}")));
                }
            }
        }
        Ok(())
    }

    /// The graph of a stage.
    pub fn graph(&self, stage: &str) -> Result<&GraphSpec> {
        self.manifest.graphs.get(stage).ok_or_else(|| {
            let have: Vec<&str> = self.manifest.graphs.keys().map(String::as_str).collect();
            Error::model(&self.root, format!("has no stage {stage:?} (manifest lists: {})", have.join(", ")))
        })
    }

    /// Absolute path of a manifest-relative file.
    pub fn path_of(&self, file: &str) -> PathBuf {
        self.root.join(file)
    }

    /// Absolute path of the file the manifest lists under `key` (`"tokenizer"`, `"side"`).
    pub fn listed_file(&self, key: &str) -> Result<PathBuf> {
        self.manifest
            .files
            .get(key)
            .map(|f| self.path_of(&f.file))
            .ok_or_else(|| Error::model(&self.root, format!("manifest.json lists no {key} file")))
    }

    /// Stages the runtime knows that the manifest does not list.
    pub fn missing_stages(&self) -> Vec<&'static str> {
        STAGES.iter().copied().filter(|s| !self.manifest.graphs.contains_key(*s)).collect()
    }

    /// Every file the manifest lists, with a label saying what it is.
    pub fn listed_files(&self) -> Vec<(String, FileEntry)> {
        let mut out = Vec::new();
        for (stage, g) in &self.manifest.graphs {
            for (prec, v) in &g.variants {
                for e in v.entries() {
                    out.push((format!("stage {stage} ({prec})"), e));
                }
            }
        }
        for (name, e) in &self.manifest.files {
            out.push((format!("file {name}"), e.clone()));
        }
        out
    }

    /// Checks that every listed file exists with the listed size and (if `hash`) sha256.
    /// Returns one message per problem; empty means all good.
    pub fn check_files(&self, hash: bool) -> Vec<String> {
        let mut problems = Vec::new();
        for (label, e) in self.listed_files() {
            if let Err(p) = check_file(&self.root, &e, hash) {
                problems.push(format!("{label}: {p}"));
            }
        }
        problems
    }
}

/// The dtype names a manifest may use.
pub const DTYPES: &[&str] = &["float32", "float16", "int32", "int64", "bool"];

/// Checks one listed file: present, size, and (if `hash`) sha256.
pub fn check_file(root: &Path, e: &FileEntry, hash: bool) -> std::result::Result<(), String> {
    let path = root.join(&e.file);
    let meta = std::fs::metadata(&path).map_err(|_| format!("{} is missing", e.file))?;
    if meta.is_dir() {
        let expected = if e.file.ends_with(".onnx") { "an .onnx graph file" } else { "a file" };
        return Err(format!("{} is a folder, expected {expected} of {} bytes", e.file, e.bytes));
    }
    if meta.len() != e.bytes {
        return Err(format!("{} has {} bytes, manifest says {}", e.file, meta.len(), e.bytes));
    }
    if hash {
        let got = sha256_file(&path).map_err(|err| format!("{}: {err}", e.file))?;
        if !got.eq_ignore_ascii_case(&e.sha256) {
            return Err(format!("{} sha256 mismatch: file {got}, manifest {}", e.file, e.sha256));
        }
    }
    Ok(())
}

/// Lower-case hex sha256 of a file, read in blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// The manifest dtype name of an ONNX Runtime element type.
pub fn dtype_name(t: ort::value::TensorElementType) -> String {
    use ort::value::TensorElementType as T;
    match t {
        T::Float32 => "float32".into(),
        T::Float16 => "float16".into(),
        T::Bfloat16 => "bfloat16".into(),
        T::Float64 => "float64".into(),
        T::Int32 => "int32".into(),
        T::Int64 => "int64".into(),
        T::Bool => "bool".into(),
        other => other.to_string(),
    }
}

/// Compares the manifest's I/O of a stage with what an opened session reports: names, dtypes,
/// ranks and fixed dimensions. A dimension the manifest names (dynamic) must be dynamic in the
/// file; a fixed one may be fixed or dynamic there but not a different number.
pub fn check_graph_io(stage: &str, spec: &GraphSpec, inputs: &[ort::value::Outlet], outputs: &[ort::value::Outlet]) -> Vec<String> {
    let mut problems = Vec::new();
    for (kind, declared, actual) in [("input", &spec.inputs, inputs), ("output", &spec.outputs, outputs)] {
        for d in declared.iter() {
            let Some(a) = actual.iter().find(|a| a.name() == d.name) else {
                let names: Vec<&str> = actual.iter().map(|a| a.name()).collect();
                problems.push(format!("stage {stage}: {kind} {:?} is not in the graph (graph has: {})", d.name, names.join(", ")));
                continue;
            };
            let ty = a.dtype();
            let (Some(et), Some(shape)) = (ty.tensor_type(), ty.tensor_shape()) else {
                problems.push(format!("stage {stage}: {kind} {} is not a tensor in the graph", d.name));
                continue;
            };
            let got = dtype_name(et);
            if got != d.dtype {
                problems.push(format!("stage {stage}: {kind} {} has dtype {got} in the graph, manifest says {}", d.name, d.dtype));
            }
            if shape.len() != d.shape.len() {
                problems.push(format!("stage {stage}: {kind} {} has rank {} in the graph, manifest says {}", d.name, shape.len(), d.shape.len()));
                continue;
            }
            for (i, (want, &have)) in d.shape.iter().zip(shape.iter()).enumerate() {
                let ok = match want {
                    Dim::Fixed(n) => have < 0 || have == *n,
                    Dim::Named(_) => have < 0,
                };
                if !ok {
                    problems.push(format!("stage {stage}: {kind} {} dim {i} is {have} in the graph, manifest says {want}", d.name));
                }
            }
        }
        for a in actual {
            if !declared.iter().any(|d| d.name == a.name()) {
                problems.push(format!("stage {stage}: graph {kind} {:?} is not in the manifest", a.name()));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest names files of its own folder only: an absolute path, or one that leaves the
    /// folder once `..` is resolved, is refused naming the manifest key (issue 30: the fixture's
    /// tokenizer path set to `../../../../etc/passwd` was opened, only its size stopped it).
    #[test]
    fn manifest_paths_outside_the_model_folder_are_refused_naming_the_key() {
        let root = Path::new("/models/tiny");
        for file in ["../../../../etc/passwd", "/etc/passwd", "a/../../x", "..", "", ".", "a/.."] {
            let e = check_inside(root, "files.tokenizer.file", file).expect_err(file);
            let text = e.to_string();
            assert!(matches!(e, Error::Model { .. }), "{text}");
            assert!(text.contains("files.tokenizer.file") && text.contains("inside its model folder"), "{text}");
        }
        for file in ["tokenizer.json", "./tn/zh_tn_tagger.fst", "tn/../tokenizer.json", "a/b/../c.onnx"] {
            assert!(check_inside(root, "files.tokenizer.file", file).is_ok(), "{file}");
        }
    }

    /// A listed file that is a folder says so (it was "has 4096 bytes").
    #[test]
    fn a_listed_file_that_is_a_folder_is_named_as_a_folder() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("llm.fp32.onnx")).unwrap();
        let entry = FileEntry { file: "llm.fp32.onnx".into(), sha256: String::new(), bytes: 479_744 };
        let why = check_file(d.path(), &entry, false).expect_err("a folder");
        assert_eq!(why, "llm.fp32.onnx is a folder, expected an .onnx graph file of 479744 bytes");
    }
}
