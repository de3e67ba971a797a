//! Saved voices: the zero-shot prompt of a recording, computed once and stored, so that
//! `--voice NAME` skips all prompt-audio work (decoding, resampling, whisper mel, speech
//! tokenizer, fbank, campplus, 24 kHz mel, alignment).
//!
//! One file per voice, `<voices.dir>/<NAME>.safetensors`, holding exactly what the synthesis needs
//! from a prompt recording:
//!
//! | tensor | dtype | shape | what |
//! |---|---|---|---|
//! | `speech_token` | int64 | `[L]` | prompt speech tokens after alignment with the mel |
//! | `prompt_feat` | float32 | `[2L, 80]` | the 24 kHz prompt mel, aligned |
//! | `embedding` | float32 | `[192]` | the campplus speaker embedding |
//!
//! and, as safetensors string metadata: `format` (`cosy-voice`), `format_version` (`1`), `name`,
//! `transcript` (the recording's text, stored as text and tokenized again at synthesis time, so
//! the text frontend treats it exactly as a `--prompt-text`), `model_key`, `model` (the model folder
//! the voice was made with, for messages), `frontend_precision`, `source_wav` (file name),
//! `created` (UTC, RFC 3339) and `cosy_version`.
//!
//! **Model key.** A voice is only valid for the model whose frontend produced it. The key is the
//! sha256 of a canonical text listing (1) the sha256 of every variant of the `speech_tokenizer`
//! and `campplus` graphs (they make the tokens and the embedding), (2) the sha256 of the text
//! tokenizer file, and (3) the manifest's `config` section (the model's hyperparameters, which
//! tell a tiny test model from the real one) as canonical JSON (sorted keys). The sha256 values
//! are those the manifest lists (checked against the files by `cosy doctor`). The whole manifest
//! is deliberately not hashed: re-exporting to add a precision variant of the LLM or the DiT, or a
//! newer exporter, changes nothing a voice depends on.
//!
//! Every write goes through a temporary file in the voices folder, fsync and rename.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ndarray::Array2;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};

use crate::error::{Error, InputCode, Result};
use crate::model::ModelDir;
use crate::vocab::check_voice_name;

/// The `format` metadata of a voice file.
pub const VOICE_FORMAT: &str = "cosy-voice";
/// The voice file version this runtime reads and writes.
pub const VOICE_FORMAT_VERSION: &str = "1";
/// File name extension of a voice.
pub const VOICE_EXTENSION: &str = "safetensors";

/// How a voice's pronunciation lexicon is named after it ([`VoiceStore::lexicon_path`]).
pub const LEXICON_SUFFIX: &str = "lexicon.toml";

/// The largest voice file read. A voice holds at most a 30 s prompt: 750 speech tokens, a
/// [1500, 80] mel, a [192] embedding and a few kB of metadata, about 0.5 MB; anything far larger
/// in the voices folder is not a voice, and is never read whole.
pub const MAX_VOICE_FILE_BYTES: u64 = 16 << 20;
/// The values a saved voice's prompt mel (`prompt_feat`) can have: it is a natural log of
/// `clamp(mel, 1e-5)` (the matcha mel of docs/model-format.md), so never below ln 1e-5 = −11.51;
/// a prompt's samples are at most 16 (`frontend::audio::MAX_PROMPT_PEAK`), whose mel (a
/// 1920-point Hann window, Slaney-normalised filters summing to about 0.08) stays under
/// 16 · 960 · 0.08 ≈ 1230, ln ≈ 7.1. Outside −12 to 12 a value was not made by the frontend.
pub const PROMPT_FEAT_RANGE: std::ops::RangeInclusive<f32> = -12.0..=12.0;
/// The values a saved voice's speaker embedding can have: CAM++ ends in a batch norm without
/// affine weights, so each value is about unit-variance over speech (the bundled tiny model's,
/// on tests/fixtures/prompt_24k.wav: within ±2.5), and the flow L2-normalises the vector, so
/// only its direction counts. A value past ±100 (40 times that) is a damaged file, e.g. an
/// exponent bit flipped, and would alone decide the direction.
pub const EMBEDDING_RANGE: std::ops::RangeInclusive<f32> = -100.0..=100.0;

/// How to replace a damaged saved voice whose file is `<file_name>.safetensors`.
pub fn remake_advice(file_name: &str) -> String {
    if crate::vocab::check_voice_name(file_name).is_ok() {
        format!("make it again from its recording with `cosy voice add {file_name} --wav FILE --text TEXT --force` (this replaces the file), or delete it")
    } else {
        "delete it, and make the voice again with `cosy voice add NAME --wav FILE --text TEXT`".to_string()
    }
}

/// The largest safetensors header of a voice file read (its JSON: metadata and tensor table).
const MAX_VOICE_HEADER_BYTES: u64 = 1 << 20;

/// What a listing shows of a voice, read from the file's header alone (bounded memory and time,
/// whatever the file): the header is checked as far as it goes — format, version, tensor table —
/// and against the file's size (a truncated file is named as such); the tensor data is not read.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceSummary {
    pub name: String,
    pub transcript: String,
    /// Prompt speech tokens (25 per second of recording).
    pub speech_tokens: usize,
    pub model_key: String,
    pub model: String,
    pub created: String,
}

/// A voice as stored: the prompt's features plus where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedVoice {
    pub name: String,
    /// What is said in the recording.
    pub transcript: String,
    /// Aligned prompt speech tokens `[L]`.
    pub speech_token: Vec<i64>,
    /// Aligned 24 kHz prompt mel `[2L, 80]`.
    pub prompt_feat: Array2<f32>,
    /// Speaker embedding `[192]`.
    pub embedding: Vec<f32>,
    /// [`model_key`] of the model that made it.
    pub model_key: String,
    /// The model folder it was made with (shown in messages only).
    pub model: String,
    /// Precision the frontend graphs ran in when it was made.
    pub frontend_precision: String,
    /// File name of the recording.
    pub source_wav: String,
    /// UTC creation time, RFC 3339.
    pub created: String,
    pub cosy_version: String,
}

/// The model key of a model folder (see the module docs).
pub fn model_key(dir: &ModelDir) -> Result<String> {
    let mut text = String::from("cosy-voice-model-key-1\n");
    for stage in ["speech_tokenizer", "campplus"] {
        let graph = dir.graph(stage)?;
        for (precision, variant) in &graph.variants {
            text.push_str(&format!("{stage} {precision} {}\n", variant.sha256.to_ascii_lowercase()));
        }
    }
    let tokenizer = dir
        .manifest
        .files
        .get("tokenizer")
        .ok_or_else(|| Error::model(&dir.root, "manifest.json lists no tokenizer file"))?;
    text.push_str(&format!("tokenizer {}\n", tokenizer.sha256.to_ascii_lowercase()));
    text.push_str("config ");
    canonical_json(&dir.manifest.config, &mut text);
    text.push('\n');
    Ok(hex::encode(Sha256::digest(text.as_bytes())))
}

/// JSON with object keys sorted, no spaces: the same text for the same value whatever the
/// map type behind `serde_json::Value`.
fn canonical_json(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(map) => {
            let sorted: BTreeMap<&String, &serde_json::Value> = map.iter().collect();
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A saved voice's transcript must say something: the one rule for adding a voice
/// (`app::voices::Voices::check_new`) and for making one (`Synthesizer::make_voice`), checked
/// before any audio work.
pub fn check_transcript(transcript: &str) -> Result<()> {
    if transcript.trim().is_empty() {
        return Err(Error::input(InputCode::InvalidText, Some("ref_text"), "the transcript is empty; give the words spoken in the recording"));
    }
    Ok(())
}

/// UTC now as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339_from_unix(secs)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch (proleptic Gregorian calendar).
pub fn rfc3339_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from a day count (Howard Hinnant's algorithm, era = 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn le_bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le_bytes_i64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl SavedVoice {
    /// The voice file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let l = self.speech_token.len();
        if self.prompt_feat.dim() != (2 * l, self.prompt_feat.ncols()) {
            return Err(Error::invalid(format!(
                "voice {}: prompt_feat has {} frames for {l} tokens (expected {})",
                self.name,
                self.prompt_feat.nrows(),
                2 * l
            )));
        }
        let tokens = le_bytes_i64(&self.speech_token);
        let feat: Vec<f32> = self.prompt_feat.as_standard_layout().iter().copied().collect();
        let feat = le_bytes_f32(&feat);
        let embedding = le_bytes_f32(&self.embedding);
        let view = |dtype, shape: Vec<usize>, data| {
            safetensors::tensor::TensorView::new(dtype, shape, data)
                .map_err(|e| Error::invalid(format!("voice {}: {e}", self.name)))
        };
        let tensors = vec![
            ("speech_token", view(Dtype::I64, vec![l], &tokens)?),
            ("prompt_feat", view(Dtype::F32, vec![self.prompt_feat.nrows(), self.prompt_feat.ncols()], &feat)?),
            ("embedding", view(Dtype::F32, vec![self.embedding.len()], &embedding)?),
        ];
        let meta: HashMap<String, String> = [
            ("format", VOICE_FORMAT),
            ("format_version", VOICE_FORMAT_VERSION),
            ("name", &self.name),
            ("transcript", &self.transcript),
            ("model_key", &self.model_key),
            ("model", &self.model),
            ("frontend_precision", &self.frontend_precision),
            ("source_wav", &self.source_wav),
            ("created", &self.created),
            ("cosy_version", &self.cosy_version),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        safetensors::serialize(tensors, Some(meta)).map_err(|e| Error::invalid(format!("voice {}: {e}", self.name)))
    }

    /// Parses a voice file's bytes (`path` is for messages).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<SavedVoice> {
        let bad = |msg: String| Error::invalid(format!("voice file {}: {msg}; add the voice again (`cosy voice add`)", path.display()));
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a voice file ({e})")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let get = |k: &str| meta.get(k).cloned().ok_or_else(|| bad(format!("metadata {k:?} missing")));
        if get("format")? != VOICE_FORMAT {
            return Err(bad(format!("format is {:?}, expected {VOICE_FORMAT:?}", meta.get("format"))));
        }
        let version = get("format_version")?;
        if version != VOICE_FORMAT_VERSION {
            return Err(bad(format!("format_version {version}, this cosy reads {VOICE_FORMAT_VERSION}")));
        }
        let tensors = SafeTensors::deserialize(bytes).map_err(|e| bad(format!("unreadable ({e})")))?;
        let tensor = |name: &str, dtype: Dtype| -> Result<(Vec<usize>, Vec<u8>)> {
            let t = tensors.tensor(name).map_err(|_| bad(format!("tensor {name:?} missing")))?;
            if t.dtype() != dtype {
                return Err(bad(format!("tensor {name} is {:?}, expected {dtype:?}", t.dtype())));
            }
            Ok((t.shape().to_vec(), t.data().to_vec()))
        };
        let (ts, tb) = tensor("speech_token", Dtype::I64)?;
        let speech_token: Vec<i64> =
            tb.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect();
        let (fs, fb) = tensor("prompt_feat", Dtype::F32)?;
        let feat: Vec<f32> = fb.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4]))).collect();
        let (es, eb) = tensor("embedding", Dtype::F32)?;
        let embedding: Vec<f32> = eb.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4]))).collect();
        let l = speech_token.len();
        let prompt_feat = match (ts.as_slice(), fs.as_slice(), es.as_slice()) {
            ([tl], [frames, mels], [_]) if *tl == l && *frames == 2 * l && l > 0 => {
                Array2::from_shape_vec((*frames, *mels), feat).map_err(|e| bad(e.to_string()))?
            }
            _ => return Err(bad(format!("tensor shapes {ts:?}, {fs:?}, {es:?} do not fit together"))),
        };
        let name = get("name")?;
        // The message names the file the user's name led to, and a command that replaces that
        // very file: the name stored inside may differ (a copied or renamed file).
        let file_name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let damaged = |what: &str, why: String| {
            Error::invalid(format!("voice file {}: its {what} {why} (the file is damaged); {}", path.display(), remake_advice(&file_name)))
        };
        // NaN or inf in the features gives all-zero audio with no error; a value far outside
        // what the frontend makes (an exponent bit flipped) gives noise: refuse the voice.
        for (what, values, range) in [
            ("speaker embedding", embedding.as_slice(), EMBEDDING_RANGE),
            ("prompt mel (prompt_feat)", prompt_feat.as_slice().unwrap_or_default(), PROMPT_FEAT_RANGE),
        ] {
            if values.iter().any(|v| !v.is_finite()) {
                return Err(damaged(what, "has NaN or infinite values".into()));
            }
            if let Some(v) = values.iter().find(|v| !range.contains(v)) {
                return Err(damaged(
                    what,
                    format!("has a value of {v:e}, outside {} to {}, all that the frontend makes", range.start(), range.end()),
                ));
            }
        }
        if let Some(t) = speech_token.iter().find(|t| **t < 0) {
            return Err(damaged("speech tokens", format!("hold {t}, and a speech token is never negative")));
        }
        Ok(SavedVoice {
            name,
            transcript: get("transcript")?,
            speech_token,
            prompt_feat,
            embedding,
            model_key: get("model_key")?,
            model: get("model")?,
            frontend_precision: meta.get("frontend_precision").cloned().unwrap_or_default(),
            source_wav: meta.get("source_wav").cloned().unwrap_or_default(),
            created: get("created")?,
            cosy_version: get("cosy_version")?,
        })
    }

    /// Refuses a voice whose speech tokens are not all below `speech_tokens` (the model's first
    /// stop id: ids under it are speech), naming the voice and how to make it again: deep in the
    /// LLM the same token would only say that an embedding row is missing.
    pub fn check_tokens(&self, speech_tokens: i64) -> Result<()> {
        match self.speech_token.iter().find(|t| !(0..speech_tokens).contains(*t)) {
            None => Ok(()),
            Some(t) => Err(Error::input(
                InputCode::Invalid,
                Some("voice"),
                format!(
                    "voice {:?}: its speech token {t} is outside this model's {speech_tokens} speech tokens (the voice file is damaged); {}",
                    self.name,
                    remake_advice(&self.name)
                ),
            )),
        }
    }

    /// Refuses a voice made for another model, naming both.
    pub fn check_model(&self, key: &str, model: &Path) -> Result<()> {
        if self.model_key == key {
            return Ok(());
        }
        Err(Error::input(InputCode::InvalidVoice, Some("voice"), format!(
            "voice {:?} was made for another model ({}, key {}) than the one in use ({}, key {}); add it again with this model (`cosy voice add {} --wav … --text …`)",
            self.name,
            self.model,
            short(&self.model_key),
            model.display(),
            short(key),
            self.name
        )))
    }
}

/// The first 12 hex digits of a key.
pub fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

/// The voices folder.
#[derive(Debug, Clone)]
pub struct VoiceStore {
    pub dir: PathBuf,
}

impl VoiceStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        VoiceStore { dir: dir.into() }
    }

    /// The file of voice `name`.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{VOICE_EXTENSION}"))
    }

    /// The pronunciation lexicon of voice `name`, beside its file (`NAME.lexicon.toml`;
    /// docs/text.md): not a voice file, so never listed as one.
    pub fn lexicon_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{LEXICON_SUFFIX}"))
    }

    /// Writes voice `name`'s lexicon (its text, already checked) atomically, replacing one there.
    pub fn save_lexicon(&self, name: &str, text: &str) -> Result<PathBuf> {
        check_voice_name(name)?;
        let path = self.lexicon_path(name);
        self.create_dir()?;
        crate::fsx::Dest::new(&path, format!("the lexicon of voice {name:?}")).unwritable_fix(self.unwritable_fix()).write(text.as_bytes())?;
        Ok(path)
    }

    /// Deletes voice `name`'s lexicon, if it has one; whether it had.
    pub fn remove_lexicon(&self, name: &str) -> Result<bool> {
        let path = self.lexicon_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Names of the stored voices, sorted (an absent folder has none).
    pub fn names(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.not_a_folder().unwrap_or_else(|| Error::io(&self.dir, e))),
        };
        let mut names = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io(&self.dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some(VOICE_EXTENSION) {
                continue;
            }
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                if check_voice_name(stem).is_ok() {
                    names.push(stem.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn unknown(&self, name: &str) -> Result<Error> {
        let names = self.names()?;
        let have = if names.is_empty() {
            format!("there are no saved voices in {}", self.dir.display())
        } else {
            format!("saved voices in {}: {}", self.dir.display(), names.join(", "))
        };
        Ok(Error::input(
            InputCode::VoiceNotFound,
            Some("voice"),
            format!("voice {name:?} not found; {have} (save one first, e.g. `cosy voice add NAME --wav FILE --text TEXT`)"),
        ))
    }

    /// Reads voice `name`; an unknown name lists the voices there are. A file larger than any
    /// voice ([`MAX_VOICE_FILE_BYTES`]) is refused before it is read.
    pub fn load(&self, name: &str) -> Result<SavedVoice> {
        check_voice_name(name)?;
        let path = self.path_of(name);
        let file = match self.open_voice_file(&path) {
            Ok(f) => f,
            Err(Some(e)) => return Err(e),
            Err(None) => return Err(self.unknown(name)?),
        };
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_VOICE_FILE_BYTES + 1), &mut bytes)
            .map_err(|e| Error::io(&path, e))?;
        SavedVoice::from_bytes(&bytes, &path)
    }

    /// Opens a voice file after checking what it is: `Err(None)` when there is nothing of that
    /// name, `Err(Some(_))` for a dangling symbolic link, a folder, or a file too large to be a
    /// voice (each named as such).
    fn open_voice_file(&self, path: &Path) -> std::result::Result<std::fs::File, Option<Error>> {
        let not_voice = |why: String| {
            Some(Error::invalid(format!(
                "{}: {why}; remove it from the voices folder, or add the voice again (`cosy voice add`)",
                path.display()
            )))
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(match std::fs::symlink_metadata(path) {
                    Ok(_) => {
                        let target = std::fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_default();
                        not_voice(format!("a symbolic link to {target:?}, which does not exist"))
                    }
                    Err(_) => None,
                });
            }
            Err(e) => return Err(Some(self.not_a_folder().unwrap_or_else(|| Error::io(path, e)))),
        };
        if !meta.is_file() {
            return Err(not_voice("not a file".into()));
        }
        if meta.len() > MAX_VOICE_FILE_BYTES {
            return Err(not_voice(format!(
                "not a voice file ({} bytes; a voice file is under {} MiB)",
                meta.len(),
                MAX_VOICE_FILE_BYTES >> 20
            )));
        }
        std::fs::File::open(path).map_err(|e| Some(Error::io(path, e)))
    }

    /// What a listing shows of voice `name`, from its header alone ([`VoiceSummary`]).
    pub fn summary(&self, name: &str) -> Result<VoiceSummary> {
        check_voice_name(name)?;
        let path = self.path_of(name);
        let mut file = match self.open_voice_file(&path) {
            Ok(f) => f,
            Err(Some(e)) => return Err(e),
            Err(None) => return Err(self.unknown(name)?),
        };
        let size = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        let bad = |msg: String| Error::invalid(format!("voice file {}: {msg}; add the voice again (`cosy voice add`)", path.display()));
        let mut len = [0u8; 8];
        std::io::Read::read_exact(&mut file, &mut len).map_err(|_| bad(format!("not a voice file ({size} bytes, no header)")))?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_VOICE_HEADER_BYTES || header_len + 8 > size {
            return Err(bad(format!("not a voice file (its first bytes announce a {header_len}-byte header in a {size}-byte file)")));
        }
        let mut header = vec![0u8; header_len as usize];
        std::io::Read::read_exact(&mut file, &mut header).map_err(|e| Error::io(&path, e))?;
        let header: serde_json::Value =
            serde_json::from_slice(&header).map_err(|e| bad(format!("not a voice file (header: {e})")))?;
        let meta = header.get("__metadata__").and_then(|m| m.as_object());
        let get = |k: &str| {
            meta.and_then(|m| m.get(k)).and_then(|v| v.as_str()).map(str::to_string).ok_or_else(|| bad(format!("metadata {k:?} missing")))
        };
        if get("format")? != VOICE_FORMAT {
            return Err(bad(format!("format is {:?}, expected {VOICE_FORMAT:?}", get("format")?)));
        }
        let version = get("format_version")?;
        if version != VOICE_FORMAT_VERSION {
            return Err(bad(format!("format_version {version}, this cosy reads {VOICE_FORMAT_VERSION}")));
        }
        // The tensor table: the three tensors, shapes that fit together, data inside the file.
        let tensor = |name: &str, dtype: &str| -> Result<(Vec<u64>, u64)> {
            let t = header.get(name).ok_or_else(|| bad(format!("tensor {name:?} missing")))?;
            if t.get("dtype").and_then(|d| d.as_str()) != Some(dtype) {
                return Err(bad(format!("tensor {name} is not {dtype}")));
            }
            let shape: Vec<u64> =
                t.get("shape").and_then(|s| s.as_array()).map(|a| a.iter().filter_map(|d| d.as_u64()).collect()).unwrap_or_default();
            let end = t.get("data_offsets").and_then(|o| o.get(1)).and_then(|e| e.as_u64()).ok_or_else(|| bad(format!("tensor {name}: no data offsets")))?;
            Ok((shape, end))
        };
        let (ts, t_end) = tensor("speech_token", "I64")?;
        let (fs, f_end) = tensor("prompt_feat", "F32")?;
        let (es, e_end) = tensor("embedding", "F32")?;
        let tokens = match (ts.as_slice(), fs.as_slice(), es.as_slice()) {
            ([l], [frames, _], [_]) if *frames == 2 * l && *l > 0 => *l,
            _ => return Err(bad(format!("tensor shapes {ts:?}, {fs:?}, {es:?} do not fit together"))),
        };
        let needed = 8 + header_len + t_end.max(f_end).max(e_end);
        if size < needed {
            return Err(bad(format!("truncated: {size} bytes, its header describes {needed}")));
        }
        Ok(VoiceSummary {
            name: get("name")?,
            transcript: get("transcript")?,
            speech_tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
            model_key: get("model_key")?,
            model: get("model")?,
            created: get("created")?,
        })
    }

    /// Writes `voice` atomically; an existing voice of that name is kept unless `replace`. Two
    /// processes saving the same new name at once cannot both succeed: the file is written under
    /// a temporary name and then hard-linked to its final name, which fails if that name exists
    /// (with `replace`, it is renamed over it, atomically).
    pub fn save(&self, voice: &SavedVoice, replace: bool) -> Result<PathBuf> {
        check_voice_name(&voice.name)?;
        let path = self.path_of(&voice.name);
        let exists = || {
            Error::input(
                InputCode::VoiceExists,
                Some("name"),
                format!(
                    "voice {:?} already exists ({}); remove it first (`cosy voice rm {}`), or replace it (--force, or overwrite=true over HTTP)",
                    voice.name,
                    path.display(),
                    voice.name
                ),
            )
        };
        if path.exists() && !replace {
            return Err(exists());
        }
        let bytes = voice.to_bytes()?;
        self.create_dir()?;
        // What writers killed mid-save left behind (ignored by readers all the same).
        crate::fsx::clean_temps(&self.dir);
        let dest = crate::fsx::Dest::new(&path, format!("voice {:?}", voice.name)).unwritable_fix(self.unwritable_fix());
        if replace {
            dest.write(&bytes)?;
        } else if !dest.write_new(&bytes)? {
            return Err(exists());
        }
        Ok(path)
    }

    /// Creates the voices folder, saying so plainly when `voices.dir` (or a folder above it) is a
    /// file.
    fn create_dir(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| self.not_a_folder().unwrap_or_else(|| self.cannot_write(e)))
    }

    /// The error for a voices folder that cannot be created (read-only, full, not ours): it
    /// names the folder and the fix.
    fn cannot_write(&self, e: std::io::Error) -> Error {
        crate::fsx::Dest::new(&self.dir, "the voices folder").unwritable_fix(self.unwritable_fix()).error(e)
    }

    /// The fix for a voices folder that is read-only or not ours.
    fn unwritable_fix(&self) -> String {
        format!(
            "make the voices folder {} writable, or set voices.dir to a folder you can write (--set voices.dir=PATH, \
             COSY_VOICES or config.toml)",
            self.dir.display()
        )
    }

    /// Refuses a `voices.dir` that is (or lies under) a file; an absent folder is fine (it is
    /// created on the first save).
    pub fn check_dir(&self) -> Result<()> {
        self.not_a_folder().map_or(Ok(()), Err)
    }

    /// The error for a `voices.dir` that is (or lies under) a file, if it does.
    fn not_a_folder(&self) -> Option<Error> {
        let file = self.dir.ancestors().find(|p| !p.as_os_str().is_empty() && p.exists() && !p.is_dir())?;
        let where_ = if file == self.dir { String::new() } else { format!(" ({} is a file)", file.display()) };
        Some(Error::invalid(format!(
            "voices.dir {} is a file, not a folder{where_}; set voices.dir to a folder (--set voices.dir=PATH or \
             config.toml), or move the file away",
            self.dir.display()
        )))
    }

    /// Deletes voice `name`, and its lexicon with it.
    pub fn remove(&self, name: &str) -> Result<PathBuf> {
        check_voice_name(name)?;
        let path = self.path_of(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.remove_lexicon(name)?;
                Ok(path)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(self.unknown(name)?),
            Err(e) => Err(Error::io(&path, e)),
        }
    }
}

/// The file in the voices folder that names the default voice (`cosy voice default NAME`). It
/// lives with the voices, not in config.toml, so that every process sharing the folder (several
/// server replicas on one volume, say) agrees on it; `voices.default` in the config overrides it.
pub const DEFAULT_MARKER: &str = "DEFAULT";

/// Where the default voice's name came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultSource {
    /// `voices.default` in the configuration.
    Config,
    /// The voices folder's [`DEFAULT_MARKER`] file.
    Folder(PathBuf),
}

impl VoiceStore {
    /// The marker file naming the default voice.
    pub fn default_marker(&self) -> PathBuf {
        self.dir.join(DEFAULT_MARKER)
    }

    /// The default voice named in the voices folder, if any.
    pub fn folder_default(&self) -> Result<Option<String>> {
        crate::vocab::read_name_marker(&self.default_marker(), |path, name| {
            Error::invalid(format!("{}: {name:?} is not a voice name; set the default again with `cosy voice default NAME`", path.display()))
        })
    }

    /// The default voice: `configured` (`voices.default`) when set, else the folder's marker.
    pub fn default_name(&self, configured: Option<&str>) -> Result<Option<(String, DefaultSource)>> {
        if let Some(name) = configured {
            return Ok(Some((name.to_string(), DefaultSource::Config)));
        }
        Ok(self.folder_default()?.map(|n| (n, DefaultSource::Folder(self.default_marker()))))
    }

    /// Makes the saved voice `name` the folder's default (it must exist).
    pub fn set_default(&self, name: &str) -> Result<PathBuf> {
        check_voice_name(name)?;
        if !self.path_of(name).is_file() {
            return Err(self.unknown(name)?);
        }
        // A default that cannot be read would only fail later, in every request without a voice.
        self.summary(name)?;
        let path = self.default_marker();
        crate::fsx::Dest::new(&path, "the default-voice marker").unwritable_fix(self.unwritable_fix()).write(format!("{name}\n").as_bytes())?;
        Ok(path)
    }

    /// Forgets the folder's default voice; `true` when there was one.
    pub fn clear_default(&self) -> Result<bool> {
        let path = self.default_marker();
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(&path, e)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_from_unix(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_from_unix(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    /// A voice with plausible features (within what the frontend makes), for tests.
    pub(crate) fn voice(name: &str) -> SavedVoice {
        SavedVoice {
            name: name.into(),
            transcript: "Hello.".into(),
            speech_token: vec![0, 6560, 3],
            prompt_feat: Array2::from_shape_fn((6, 80), |(i, j)| -11.51 + (i * 80 + j) as f32 * 0.03),
            embedding: (0..192).map(|i| (i as f32 - 96.0) / 40.0).collect(),
            model_key: "ab".repeat(32),
            model: "/m".into(),
            frontend_precision: "fp32".into(),
            source_wav: "a.wav".into(),
            created: "2024-01-02T03:04:05Z".into(),
            cosy_version: "0".into(),
        }
    }

    /// A voice file whose features are off by orders of magnitude (an exponent bit flipped) or
    /// whose tokens are negative is refused as damaged, naming the file and how to make it again
    /// (issue 30: they were used, giving noise or an error deep in the LLM).
    #[test]
    fn features_outside_what_the_frontend_makes_are_refused_naming_the_file() {
        let path = Path::new("/v/anna.safetensors");
        let good = voice("anna");
        assert_eq!(SavedVoice::from_bytes(&good.to_bytes().unwrap(), path).unwrap(), good, "plausible values load");
        let flip = |v: f32| f32::from_bits(v.to_bits() ^ (1 << 29));
        let mut embedding = good.clone();
        embedding.embedding[5] = flip(embedding.embedding[5]);
        let mut feat = good.clone();
        // -0.5 with its top exponent bit set: -8.5e37.
        feat.prompt_feat[[2, 7]] = f32::from_bits((-0.5f32).to_bits() ^ (1 << 30));
        let mut token = good.clone();
        token.speech_token[1] = -3;
        for (bad, needle) in [(embedding, "speaker embedding has a value of"), (feat, "prompt mel (prompt_feat) has a value of"), (token, "hold -3")] {
            let e = SavedVoice::from_bytes(&bad.to_bytes().unwrap(), path).expect_err(needle);
            let text = e.to_string();
            assert!(text.contains("/v/anna.safetensors") && text.contains(needle), "{text}");
            assert!(text.contains("cosy voice add anna --wav FILE --text TEXT --force"), "{text}");
        }
        // Tokens are checked against the model's speech tokens (its first stop id).
        assert!(good.check_tokens(6561).is_ok());
        let e = good.check_tokens(6000).expect_err("6560 is past 6000 speech tokens").to_string();
        assert!(e.contains("voice \"anna\": its speech token 6560 is outside this model's 6000 speech tokens") && e.contains("cosy voice add anna"), "{e}");
    }

    /// A voices folder that cannot be written is named with the fix, not the temporary file a
    /// save goes through (sysfs refuses new files even to root, so this holds as any user).
    #[test]
    fn an_unwritable_voices_folder_is_named_not_its_temporary_file() {
        let store = VoiceStore::new("/sys");
        let e = store.save(&voice("anna"), false).expect_err("sysfs takes no voice file");
        let text = e.to_string();
        assert!(text.contains("writing voice \"anna\" (/sys/anna.safetensors)"), "{text}");
        assert!(text.contains("make the voices folder /sys writable") && text.contains("voices.dir"), "{text}");
        assert!(!text.contains(".tmp"), "{text}");
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"d":[1,2.5,"x"],"c":null}}"#).unwrap();
        let mut s = String::new();
        canonical_json(&a, &mut s);
        assert_eq!(s, r#"{"a":{"c":null,"d":[1,2.5,"x"]},"b":1}"#);
    }
}
