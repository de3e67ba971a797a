//! `side.safetensors` (docs/model-format.md): the tables and small weights the runtime uses
//! directly — LLM embedding tables, the fixed flow noise, the f0 net and the NSF source weights.
//!
//! The file is memory-mapped once. Small tensors are copied out on request ([`SideFile::f32`],
//! [`SideFile::f64`]); the two embedding tables are read row by row straight from the mapping
//! ([`SideEmbeddings`]), so a 151936-row text table costs nothing until a row is looked up.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::llm::EmbeddingLookup;

/// The `format` metadata entry a side file must carry.
pub const SIDE_FORMAT: &str = "cosy-side-1";

/// A memory-mapped `side.safetensors`.
#[derive(Debug)]
pub struct SideFile {
    path: PathBuf,
    mmap: Mmap,
}

/// A tensor copied out of the side file.
#[derive(Debug, Clone, PartialEq)]
pub struct SideTensor<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

impl SideFile {
    /// Maps the file and checks its header and `format` metadata.
    pub fn open(path: &Path) -> Result<SideFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the model folder is read-only input; a file changed under us while mapped
        // would give wrong numbers, not memory unsafety in our code (we only read bytes).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let side = SideFile { path: path.to_path_buf(), mmap };
        let (_, meta) = SafeTensors::read_metadata(&side.mmap)
            .map_err(|e| side.err(format!("not a safetensors file: {e}")))?;
        let format = meta.metadata().as_ref().and_then(|m| m.get("format")).cloned();
        if format.as_deref() != Some(SIDE_FORMAT) {
            return Err(side.err(format!("metadata format is {format:?}, expected {SIDE_FORMAT:?}")));
        }
        Ok(side)
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let name = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Error::model(dir, format!("{name}: {msg}"))
    }

    fn tensors(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.mmap).map_err(|e| self.err(format!("unreadable: {e}")))
    }

    /// Whether `name` is in the file.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors().is_ok_and(|t| t.tensor(name).is_ok())
    }

    /// Shape, dtype and the byte range of a tensor inside the mapping.
    fn locate(&self, name: &str) -> Result<(Vec<usize>, Dtype, usize, usize)> {
        let tensors = self.tensors()?;
        let view = tensors.tensor(name).map_err(|_| self.err(format!("has no tensor {name:?}")))?;
        let data = view.data();
        let start = data.as_ptr() as usize - self.mmap.as_ptr() as usize;
        Ok((view.shape().to_vec(), view.dtype(), start, data.len()))
    }

    fn bytes_of(&self, name: &str, want: Dtype) -> Result<(Vec<usize>, &[u8])> {
        let (shape, dtype, start, len) = self.locate(name)?;
        if dtype != want {
            return Err(self.err(format!("tensor {name} is {dtype:?}, expected {want:?}")));
        }
        Ok((shape, &self.mmap[start..start + len]))
    }

    /// A tensor's shape (its data is not read).
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.locate(name)?.0)
    }

    /// A float32 tensor.
    pub fn f32(&self, name: &str) -> Result<SideTensor<f32>> {
        let (shape, bytes) = self.bytes_of(name, Dtype::F32)?;
        let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok(SideTensor { shape, data })
    }

    /// A float64 tensor.
    pub fn f64(&self, name: &str) -> Result<SideTensor<f64>> {
        let (shape, bytes) = self.bytes_of(name, Dtype::F64)?;
        let data = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        Ok(SideTensor { shape, data })
    }

    /// An int64 tensor.
    pub fn i64(&self, name: &str) -> Result<SideTensor<i64>> {
        let (shape, bytes) = self.bytes_of(name, Dtype::I64)?;
        let data = bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        Ok(SideTensor { shape, data })
    }
}

/// A `[rows, hidden]` float32 table inside the mapping.
#[derive(Debug, Clone, Copy)]
struct TableRef {
    start: usize,
    rows: usize,
}

/// The LLM embedding tables read from the side file: `llm.text_embedding` (dense, or sparse with
/// `llm.text_embedding_ids`) and `llm.speech_embedding`.
#[derive(Debug, Clone)]
pub struct SideEmbeddings {
    side: Arc<SideFile>,
    hidden: usize,
    text: TableRef,
    /// For a sparse text table: the token id of each stored row (ascending).
    text_ids: Option<Vec<i64>>,
    speech: TableRef,
}

impl SideEmbeddings {
    /// Locates both tables and checks that they have the same width.
    pub fn new(side: Arc<SideFile>) -> Result<SideEmbeddings> {
        let table = |name: &str| -> Result<(TableRef, usize)> {
            let (shape, dtype, start, _) = side.locate(name)?;
            match (dtype, shape.as_slice()) {
                (Dtype::F32, &[rows, hidden]) => Ok((TableRef { start, rows }, hidden)),
                _ => Err(side.err(format!("{name} is {dtype:?} {shape:?}, expected F32 [rows, hidden]"))),
            }
        };
        let (text, hidden) = table("llm.text_embedding")?;
        let (speech, speech_hidden) = table("llm.speech_embedding")?;
        if speech_hidden != hidden {
            return Err(side.err(format!(
                "llm.speech_embedding has width {speech_hidden}, llm.text_embedding {hidden}"
            )));
        }
        let text_ids = if side.contains("llm.text_embedding_ids") {
            let ids = side.i64("llm.text_embedding_ids")?;
            if ids.data.len() != text.rows || ids.data.windows(2).any(|w| w[0] >= w[1]) {
                return Err(side.err(format!(
                    "llm.text_embedding_ids must be {} ascending ids, one per stored row",
                    text.rows
                )));
            }
            Some(ids.data)
        } else {
            None
        };
        Ok(SideEmbeddings { side, hidden, text, text_ids, speech })
    }

    fn copy_row(&self, table: TableRef, row: usize, out: &mut [f32]) {
        let width = 4 * self.hidden;
        let at = table.start + row * width;
        let bytes = &self.side.mmap[at..at + width];
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    fn check_out(&self, out: &[f32]) -> Result<()> {
        if out.len() != self.hidden {
            return Err(Error::invalid(format!("embedding row buffer has {} values, hidden is {}", out.len(), self.hidden)));
        }
        Ok(())
    }
}

impl EmbeddingLookup for SideEmbeddings {
    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn text_row(&self, id: i64, out: &mut [f32]) -> Result<()> {
        self.check_out(out)?;
        let row = match &self.text_ids {
            Some(ids) => ids.binary_search(&id).map_err(|_| {
                Error::invalid(format!(
                    "text token id {id} has no row in this model's sparse text embedding (a test folder exported with --sparse-text-embedding)"
                ))
            })?,
            None => usize::try_from(id).ok().filter(|&r| r < self.text.rows).ok_or_else(|| {
                Error::invalid(format!("text token id {id} is outside the {}-row text embedding", self.text.rows))
            })?,
        };
        self.copy_row(self.text, row, out);
        Ok(())
    }

    fn speech_row(&self, id: i64, out: &mut [f32]) -> Result<()> {
        self.check_out(out)?;
        let row = usize::try_from(id).ok().filter(|&r| r < self.speech.rows).ok_or_else(|| {
            Error::invalid(format!("speech token id {id} is outside the {}-row speech embedding", self.speech.rows))
        })?;
        self.copy_row(self.speech, row, out);
        Ok(())
    }
}
