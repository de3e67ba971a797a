//! A long-form job (`cosy file BOOK`): chapters of text spoken sentence by sentence into a job
//! folder, so that a run stopped anywhere (Ctrl-C, `kill -9`, a power cut) continues where it
//! stopped and gives the same audio as a run that was never stopped (docs/long-form.md,
//! "Resumable jobs").
//!
//! * The sentences are the engine's own ([`Engine::plan_text`], paragraph by paragraph: a
//!   chapter is longer than one request may be); the plan is kept in the folder.
//! * Each sentence is a request of its own ([`crate::request::Normalization::as_planned`]: said
//!   as planned, not read again) with its own seed, [`sentence_seed`] of the job's seed and its
//!   index, so its audio never depends on what ran before it in this process.
//! * Each finished sentence's samples are one file, written through [`crate::fsx::Dest`] (a file
//!   present is complete); its header carries the sample count and a checksum, so a damaged or
//!   truncated file is found and the sentence said again.
//! * The manifest (`job.json`) holds a fingerprint of the input and of every option that changes
//!   the audio; a run with another input is refused, naming what changed.
//! * Several sentences are in flight at once ([`JobSpec::in_flight`]) through the engine's
//!   batching; the result is handed back in order.
//!
//! Nothing here writes the final output: [`Job::run`] gives back where each sentence's samples
//! are, in order ([`Finished`]); the caller encodes them and writes captions.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::error::{Error, InputCode, Result};
use crate::fsx::{Dest, FolderLock};
use crate::pipeline::Spoken;
use crate::request::{Request, SynthesisObserver, Voice};

/// The version of the job folder's layout; a folder of another version is refused.
pub const JOB_FORMAT: u32 = 1;

/// The manifest's file name in the job folder.
pub const MANIFEST_FILE: &str = "job.json";
/// The sentence plan's file name.
pub const PLAN_FILE: &str = "plan.json";
/// The folder of the finished sentences' samples.
pub const AUDIO_FOLDER: &str = "audio";

/// A sentence file's first bytes: the magic, the sample count (u64, little-endian), the SHA-256
/// of the sample bytes; then the samples (f32, little-endian, mono, the engine's rate).
const SENTENCE_MAGIC: &[u8; 8] = b"COSYSNT1";
const SENTENCE_HEADER: usize = 8 + 8 + 32;

/// What a job says: its chapters and the request every sentence is made from.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// `(title, text)` of each chapter, in order.
    pub chapters: Vec<(String, String)>,
    /// The request each sentence is made from (voice, speed, normalisation, text frontend, test
    /// hooks); its `text`, `seed` and `stream` are not used (sentences are said whole, offline).
    pub request: Request,
    /// The job's seed; sentence `k` is sampled with [`sentence_seed`]`(seed, k)`.
    pub seed: u64,
    /// Further settings that change the audio and that the engine does not carry in the request
    /// (the text settings of the configuration: normaliser, Markdown reading, lexicon), named as
    /// the user knows them; a change is refused naming the setting.
    pub settings: Vec<(String, String)>,
    /// Sentences in flight at once (at least 1; the engine's slots and queue bound it). Not part
    /// of the fingerprint: any number gives the same sentences (docs/long-form.md says how exact).
    pub in_flight: usize,
}

/// The seed sentence `index` of a job is sampled with: SplitMix64 over the job's seed and the
/// index, so neighbouring sentences get unrelated streams and sentence `k`'s audio depends only
/// on the job's seed and `k`.
pub fn sentence_seed(seed: u64, index: usize) -> u64 {
    let mut z = seed ^ (index as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a run stands ([`Job::run`]'s callback, after each finished sentence).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Chapters whose every sentence is done.
    pub chapters_done: usize,
    pub chapters_total: usize,
    pub sentences_done: usize,
    pub sentences_total: usize,
    /// The audio made so far (sentences and pauses of the finished sentences' chapters), seconds.
    pub audio_seconds: f64,
    /// The time left at the rate measured in this run (`None` until a sentence was made).
    pub eta: Option<Duration>,
}

/// A finished job, in order: where each sentence's samples are.
#[derive(Debug, Clone)]
pub struct Finished {
    pub sample_rate: u32,
    pub chapters: Vec<FinishedChapter>,
}

/// One chapter of a finished job.
#[derive(Debug, Clone)]
pub struct FinishedChapter {
    pub title: String,
    pub parts: Vec<Part>,
}

/// One part of a chapter's audio, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// A sentence: its text as the model got it, its index in the job, its sample count and the
    /// file of its samples ([`Part::samples`] reads it).
    Sentence { index: usize, text: String, samples: usize, path: PathBuf },
    /// Exact silence from a pause tag.
    Pause { samples: usize },
}

impl Part {
    /// How many samples this part is.
    pub fn len(&self) -> usize {
        match self {
            Part::Sentence { samples, .. } | Part::Pause { samples } => *samples,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This part's samples (zeros for a pause), checked against the file's header.
    pub fn samples(&self) -> Result<Vec<f32>> {
        match self {
            Part::Pause { samples } => Ok(vec![0.0; *samples]),
            Part::Sentence { path, .. } => read_sentence(path)?
                .ok_or_else(|| Error::Runtime(format!("{}: the sentence's samples are damaged or missing; run the job again to remake it", path.display()))),
        }
    }
}

/// The manifest (`job.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    format: u32,
    /// SHA-256 over everything below: one value to compare first.
    fingerprint: String,
    chapters: Vec<ChapterPrint>,
    /// Every option that changes the audio, by name.
    options: BTreeMap<String, String>,
    sample_rate: u32,
    sentences: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct ChapterPrint {
    title_sha256: String,
    text_sha256: String,
}

/// The sentence plan (`plan.json`): each chapter's parts, sentences numbered across the job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Plan {
    chapters: Vec<PlannedChapter>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct PlannedChapter {
    title: String,
    parts: Vec<PlannedPart>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum PlannedPart {
    Sentence(String),
    Pause(usize),
}

/// An open job folder, held by this process until dropped.
pub struct Job {
    dir: PathBuf,
    spec: JobSpec,
    plan: Plan,
    sample_rate: u32,
    /// The job's sentences, by index: their texts.
    sentences: Vec<String>,
    /// The sentences with a complete file: their sample counts.
    done: BTreeMap<usize, usize>,
    /// Each sentence's chapter.
    chapter_of: Vec<usize>,
    /// Whether this open resumed a job made before.
    resumed: bool,
    _lock: FolderLock,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

/// What identifies a voice's sound: its recording's or saved features' bytes, and its transcript
/// or instruction (a path alone would not notice a new recording under the same name).
fn voice_identity(voice: &Voice) -> Result<String> {
    let mut h = Sha256::new();
    match voice {
        Voice::ZeroShot { wav, transcript } => {
            h.update(b"zero-shot\0");
            h.update(std::fs::read(wav).map_err(|e| io_error(wav, e))?);
            h.update(transcript.as_bytes());
        }
        Voice::CrossLingual { wav } => {
            h.update(b"cross-lingual\0");
            h.update(std::fs::read(wav).map_err(|e| io_error(wav, e))?);
        }
        Voice::Instruct { wav, instruction } => {
            h.update(b"instruct\0");
            h.update(std::fs::read(wav).map_err(|e| io_error(wav, e))?);
            h.update(instruction.as_bytes());
        }
        Voice::Saved { voice, instruction, lexicon } => {
            // The features, not the file: a voice made again from the same recording is the same voice.
            h.update(b"saved\0");
            // Its own lexicon changes what is said: a job is not resumed with another.
            h.update(format!("{lexicon:?}").as_bytes());
            h.update(voice.transcript.as_bytes());
            h.update(b"\0");
            h.update(voice.model_key.as_bytes());
            for t in &voice.speech_token {
                h.update(t.to_le_bytes());
            }
            for x in voice.prompt_feat.iter().chain(&voice.embedding) {
                h.update(x.to_le_bytes());
            }
            h.update(instruction.as_deref().unwrap_or("").as_bytes());
        }
        Voice::Recording { audio, transcript, instruction, .. } => {
            h.update(b"recording\0");
            h.update(audio.sample_rate.to_le_bytes());
            for x in &audio.samples {
                h.update(x.to_le_bytes());
            }
            h.update(transcript.as_deref().unwrap_or("").as_bytes());
            h.update(b"\0");
            h.update(instruction.as_deref().unwrap_or("").as_bytes());
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// The options of `spec` that change the audio, by the names a refusal gives.
fn options_of(spec: &JobSpec, engine: &Engine) -> Result<BTreeMap<String, String>> {
    let r = &spec.request;
    let mut options = BTreeMap::new();
    options.insert("the model".to_string(), engine.voice_key().to_string());
    options.insert("the voice".to_string(), voice_identity(&r.voice)?);
    options.insert("the seed".to_string(), spec.seed.to_string());
    options.insert("the speed".to_string(), r.speed.to_string());
    options.insert("the text frontend".to_string(), r.text_frontend.to_string());
    options.insert("Markdown reading".to_string(), format!("{:?}", r.normalization.markdown));
    options.insert("the test hooks".to_string(), format!("{:?} {:?} {:?}", r.test_hooks.min_tokens, r.test_hooks.max_tokens, r.ignore_stop_until));
    for (name, value) in &spec.settings {
        options.insert(name.clone(), value.clone());
    }
    Ok(options)
}

fn chapter_prints(spec: &JobSpec) -> Vec<ChapterPrint> {
    spec.chapters
        .iter()
        .map(|(title, text)| ChapterPrint { title_sha256: sha256_hex(title.as_bytes()), text_sha256: sha256_hex(text.as_bytes()) })
        .collect()
}

fn fingerprint(chapters: &[ChapterPrint], options: &BTreeMap<String, String>, sample_rate: u32) -> String {
    let mut h = Sha256::new();
    h.update(JOB_FORMAT.to_le_bytes());
    h.update(sample_rate.to_le_bytes());
    for c in chapters {
        h.update(c.title_sha256.as_bytes());
        h.update(c.text_sha256.as_bytes());
    }
    for (name, value) in options {
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(value.as_bytes());
        h.update(b"\0");
    }
    hex::encode(h.finalize())
}

/// What differs between the job folder's manifest and this input, in words (`chapter 3's text
/// changed`, `the seed changed`); `None` when nothing does.
fn what_changed(old: &Manifest, new: &Manifest) -> Option<String> {
    if old.format != new.format {
        return Some(format!("it is of job format {}, this cosy writes {}", old.format, new.format));
    }
    if old.chapters.len() != new.chapters.len() {
        return Some(format!("it has {} chapters, this input {}", old.chapters.len(), new.chapters.len()));
    }
    for (i, (a, b)) in old.chapters.iter().zip(&new.chapters).enumerate() {
        if a.title_sha256 != b.title_sha256 {
            return Some(format!("chapter {}'s title changed", i + 1));
        }
        if a.text_sha256 != b.text_sha256 {
            return Some(format!("chapter {}'s text changed", i + 1));
        }
    }
    let names: BTreeSet<&String> = old.options.keys().chain(new.options.keys()).collect();
    for name in names {
        if old.options.get(name) != new.options.get(name) {
            return Some(format!("{name} changed"));
        }
    }
    if old.sample_rate != new.sample_rate {
        return Some("the output sample rate changed".to_string());
    }
    (old.fingerprint != new.fingerprint || old.sentences != new.sentences).then(|| "its fingerprint differs".to_string())
}

/// A chapter's paragraphs: its text cut at blank lines (a line of blanks too; any line end,
/// `frontend::text::split_lines`), since a chapter is longer than one request may be and a
/// paragraph ends a sentence anyway.
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines: Vec<&str> = Vec::new();
    for line in crate::frontend::text::split_lines(text).chain(std::iter::once("")) {
        if !line.trim().is_empty() {
            lines.push(line);
        } else if !lines.is_empty() {
            out.push(lines.join("\n").trim().to_string());
            lines.clear();
        }
    }
    out
}

/// The sentences of every chapter as the engine would say them ([`Engine::plan_text`], paragraph
/// by paragraph); a paragraph with nothing to say (a row of asterisks) is left out, a chapter with
/// nothing at all is refused.
fn plan_chapters(spec: &JobSpec, engine: &Engine) -> Result<Plan> {
    let mut chapters = Vec::with_capacity(spec.chapters.len());
    for (c, (title, text)) in spec.chapters.iter().enumerate() {
        let mut parts = Vec::new();
        for (p, paragraph) in paragraphs(text).iter().enumerate() {
            if crate::request::check_speakable(paragraph).is_err() || crate::frontend::text::is_only_punctuation(paragraph) {
                continue;
            }
            let mut req = spec.request.clone();
            req.text = paragraph.clone();
            let spoken = engine.plan_text(&req).map_err(|e| match e {
                Error::Input { code, param, message } => Error::Input {
                    code,
                    param,
                    message: format!("chapter {} ({:?}), paragraph {}: {message}", c + 1, crate::request::shorten(title, 40), p + 1),
                },
                other => other,
            })?;
            for item in spoken {
                parts.push(match item {
                    Spoken::Sentence(text) => PlannedPart::Sentence(text),
                    Spoken::Pause { samples } => PlannedPart::Pause(samples),
                    // A job's sentences are each a request at the job's speed: a speed of their
                    // own would have to be kept in the plan and its fingerprint (not done yet).
                    Spoken::Speed(_) => {
                        return Err(Error::input(
                            InputCode::InvalidText,
                            Some("input"),
                            format!(
                                "chapter {} ({:?}), paragraph {}: <prosody rate> is not read in a book (it is said at one speed); remove it, or give --speed",
                                c + 1,
                                crate::request::shorten(title, 40),
                                p + 1
                            ),
                        ))
                    }
                });
            }
        }
        if !parts.iter().any(|p| matches!(p, PlannedPart::Sentence(_))) {
            return Err(Error::input(
                InputCode::InvalidText,
                Some("input"),
                format!("chapter {} ({:?}) has nothing to say; give it some text or leave it out", c + 1, crate::request::shorten(title, 40)),
            ));
        }
        chapters.push(PlannedChapter { title: title.clone(), parts });
    }
    Ok(Plan { chapters })
}

/// The samples of a sentence file, or `None` when it is missing, truncated or damaged (its
/// length or checksum does not match its header).
pub fn read_sentence(path: &Path) -> Result<Option<Vec<f32>>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, e)),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| io_error(path, e))?;
    if bytes.len() < SENTENCE_HEADER || &bytes[..8] != SENTENCE_MAGIC {
        return Ok(None);
    }
    let mut count = [0u8; 8];
    count.copy_from_slice(&bytes[8..16]);
    let count = u64::from_le_bytes(count);
    let body = &bytes[SENTENCE_HEADER..];
    if body.len() as u64 != count.saturating_mul(4) || Sha256::digest(body).as_slice() != &bytes[16..SENTENCE_HEADER] {
        return Ok(None);
    }
    Ok(Some(body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
}

/// A sentence file's bytes ([`read_sentence`] reads them).
fn sentence_bytes(samples: &[f32]) -> Vec<u8> {
    let body: Vec<u8> = samples.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut bytes = Vec::with_capacity(SENTENCE_HEADER + body.len());
    bytes.extend_from_slice(SENTENCE_MAGIC);
    bytes.extend_from_slice(&(samples.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&Sha256::digest(&body));
    bytes.extend_from_slice(&body);
    bytes
}

/// Stops the requests in flight once the run is told to stop.
struct StopFlag(Arc<AtomicBool>);
impl SynthesisObserver for StopFlag {
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Job {
    /// Opens the job folder `dir` for `spec`: makes it (plan and manifest) when it is new or
    /// empty, or resumes it when its manifest was made for the same input and options. Refused:
    /// a folder made for another input (naming what changed), a folder that holds other files,
    /// a folder another run holds.
    pub fn open(dir: &Path, spec: JobSpec, engine: &Engine) -> Result<Job> {
        let manifest_dest = Dest::new(dir.join(MANIFEST_FILE), format!("the job manifest of {}", dir.display()));
        let lock = manifest_dest.try_hold()?.ok_or_else(|| {
            Error::input(
                InputCode::Conflict,
                None,
                format!("the job folder {} is in use by another run; wait for it to finish, or use another job folder", dir.display()),
            )
        })?;
        let sample_rate = engine.sample_rate();
        let chapters = chapter_prints(&spec);
        let options = options_of(&spec, engine)?;
        let print = fingerprint(&chapters, &options, sample_rate);
        let manifest_path = dir.join(MANIFEST_FILE);
        let existing = match std::fs::read(&manifest_path) {
            Ok(bytes) => Some(serde_json::from_slice::<Manifest>(&bytes).map_err(|e| {
                Error::input(
                    InputCode::Invalid,
                    None,
                    format!("the job folder {} has a damaged {MANIFEST_FILE} ({e}); delete the folder, or use another job folder", dir.display()),
                )
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(&manifest_path, e)),
        };
        let (plan, resumed) = match existing {
            Some(old) => {
                let new = Manifest { format: JOB_FORMAT, fingerprint: print, chapters, options, sample_rate, sentences: old.sentences };
                if let Some(change) = what_changed(&old, &new) {
                    return Err(Error::input(
                        InputCode::Conflict,
                        None,
                        format!("the job folder {} was made for another input ({change}); delete it, or use another job folder", dir.display()),
                    ));
                }
                let plan_path = dir.join(PLAN_FILE);
                let plan = std::fs::read(&plan_path)
                    .map_err(|e| io_error(&plan_path, e))
                    .and_then(|b| serde_json::from_slice::<Plan>(&b).map_err(|e| Error::invalid(format!("{}: {e}; delete the job folder, or use another one", plan_path.display()))))?;
                (plan, true)
            }
            None => {
                // A new job: the folder must hold nothing of anyone else's.
                let others: Vec<String> = std::fs::read_dir(dir)
                    .map_err(|e| io_error(dir, e))?
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != crate::fsx::LOCK_FILE && n != AUDIO_FOLDER && n != PLAN_FILE && !crate::fsx::is_temp_name(n))
                    .collect();
                if let Some(first) = others.first() {
                    return Err(Error::input(
                        InputCode::Conflict,
                        None,
                        format!("{} is not a job folder (it has no {MANIFEST_FILE} and holds {first:?}); give an empty or a new folder", dir.display()),
                    ));
                }
                // What a run killed before its manifest left (a plan, sentences) is not trusted.
                let _ = std::fs::remove_dir_all(dir.join(AUDIO_FOLDER));
                let plan = plan_chapters(&spec, engine)?;
                let sentences = plan.chapters.iter().flat_map(|c| &c.parts).filter(|p| matches!(p, PlannedPart::Sentence(_))).count();
                let plan_json = serde_json::to_vec_pretty(&plan).map_err(|e| Error::Runtime(format!("job plan: {e}")))?;
                Dest::new(dir.join(PLAN_FILE), format!("the job plan of {}", dir.display())).write(&plan_json)?;
                let manifest = Manifest { format: JOB_FORMAT, fingerprint: print, chapters, options, sample_rate, sentences };
                let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Runtime(format!("job manifest: {e}")))?;
                // The manifest last: a folder with one is a whole job.
                manifest_dest.write(&json)?;
                (plan, false)
            }
        };
        crate::fsx::clean_temps(&dir.join(AUDIO_FOLDER));
        let sentences: Vec<String> = plan
            .chapters
            .iter()
            .flat_map(|c| &c.parts)
            .filter_map(|p| match p {
                PlannedPart::Sentence(s) => Some(s.clone()),
                PlannedPart::Pause(_) => None,
            })
            .collect();
        let chapter_of = plan
            .chapters
            .iter()
            .enumerate()
            .flat_map(|(c, chapter)| chapter.parts.iter().filter(|p| matches!(p, PlannedPart::Sentence(_))).map(move |_| c))
            .collect();
        let mut job = Job { dir: dir.to_path_buf(), spec, plan, sample_rate, sentences, done: BTreeMap::new(), chapter_of, resumed, _lock: lock };
        for k in 0..job.sentences.len() {
            if let Some(samples) = read_sentence(&job.sentence_path(k))? {
                job.done.insert(k, samples.len());
            }
        }
        Ok(job)
    }

    /// Whether this job was made by an earlier run (and is being resumed).
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// How many sentences the job has, and how many are done.
    pub fn sentences(&self) -> (usize, usize) {
        (self.done.len(), self.sentences.len())
    }

    /// The file of sentence `index`'s samples.
    pub fn sentence_path(&self, index: usize) -> PathBuf {
        self.dir.join(AUDIO_FOLDER).join(format!("{index:06}.f32"))
    }

    /// Says every sentence not done yet, [`JobSpec::in_flight`] at a time, each into its file;
    /// `progress` hears after each one and may stop the run (`ControlFlow::Break`: the requests in
    /// flight are cancelled, what is finished stays, and the run ends with [`Error::Cancelled`]).
    /// Gives back the whole job in order once every sentence is done.
    pub fn run(&mut self, engine: &Engine, mut progress: impl FnMut(&Progress) -> ControlFlow<()>) -> Result<Finished> {
        let todo: Vec<usize> = (0..self.sentences.len()).filter(|k| !self.done.contains_key(k)).collect();
        let (running, queue) = engine.limits();
        let workers = self.spec.in_flight.clamp(1, (running + queue).max(1)).min(todo.len().max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Mutex::new(todo.iter().copied());
        let started = Instant::now();
        // The finished sentences are this side's alone while the workers share `self`.
        let done = std::mem::take(&mut self.done);
        let mut tally = Tally::of(self, done);
        let (tx, rx) = crossbeam_channel::unbounded::<(usize, Result<usize>)>();
        let outcome = std::thread::scope(|scope| -> Result<()> {
            for _ in 0..workers {
                let tx = tx.clone();
                let (stop, next) = (&stop, &next);
                let this = &*self;
                scope.spawn(move || loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some(k) = next.lock().unwrap_or_else(|p| p.into_inner()).next() else { return };
                    let result = this.say_sentence(engine, k, stop);
                    let failed = result.is_err();
                    if tx.send((k, result)).is_err() || failed {
                        return;
                    }
                });
            }
            drop(tx);
            let mut first_error = None;
            for (k, result) in rx {
                match result {
                    Ok(samples) => {
                        tally.add(self, k, samples);
                        let report = tally.progress(self, started.elapsed());
                        if progress(&report).is_break() && !stop.swap(true, Ordering::Relaxed) {
                            first_error.get_or_insert(Error::Cancelled);
                        }
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        // A request cancelled because the run stopped is not the run's error.
                        if first_error.is_none() || matches!(first_error, Some(Error::Cancelled)) && !matches!(e, Error::Cancelled) {
                            first_error = Some(e);
                        }
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        });
        self.done = tally.done;
        outcome?;
        self.finished()
    }

    /// One sentence: its own request and seed, its samples into its file.
    fn say_sentence(&self, engine: &Engine, k: usize, stop: &Arc<AtomicBool>) -> Result<usize> {
        let mut req = self.spec.request.clone();
        req.text = self.sentences[k].clone();
        req.seed = Some(sentence_seed(self.spec.seed, k));
        req.stream = false;
        req.normalization.as_planned = true;
        let handle = engine.submit_observed(req, Some(Arc::new(StopFlag(stop.clone()))))?;
        let (samples, _summary) = handle.wait()?;
        Dest::new(self.sentence_path(k), format!("sentence {} of the job {}", k + 1, self.dir.display())).write(&sentence_bytes(&samples))?;
        Ok(samples.len())
    }

    /// The job in order, every sentence's file checked again (one damaged since is an error that
    /// says to run the job again).
    fn finished(&mut self) -> Result<Finished> {
        let mut chapters = Vec::with_capacity(self.plan.chapters.len());
        let mut k = 0;
        for chapter in &self.plan.chapters {
            let mut parts = Vec::with_capacity(chapter.parts.len());
            for part in &chapter.parts {
                parts.push(match part {
                    PlannedPart::Pause(samples) => Part::Pause { samples: *samples },
                    PlannedPart::Sentence(text) => {
                        let path = self.sentence_path(k);
                        let samples = match read_sentence(&path)? {
                            Some(samples) => samples.len(),
                            None => {
                                self.done.remove(&k);
                                return Err(Error::Runtime(format!(
                                    "{}: sentence {} of the job was damaged after it was made; run the job again to remake it",
                                    path.display(),
                                    k + 1
                                )));
                            }
                        };
                        k += 1;
                        Part::Sentence { index: k - 1, text: text.clone(), samples, path }
                    }
                });
            }
            chapters.push(FinishedChapter { title: chapter.title.clone(), parts });
        }
        Ok(Finished { sample_rate: self.sample_rate, chapters })
    }
}

/// A run's count of what is done, kept as sentences finish (a book has thousands: nothing is
/// counted again per sentence).
struct Tally {
    /// The finished sentences' sample counts.
    done: BTreeMap<usize, usize>,
    /// Sentences not done yet, per chapter.
    left_in_chapter: Vec<usize>,
    chapters_done: usize,
    /// The finished sentences' samples and the pauses of the finished chapters.
    samples: usize,
    made_at_start: usize,
}

impl Tally {
    fn of(job: &Job, done: BTreeMap<usize, usize>) -> Tally {
        let mut tally = Tally { left_in_chapter: vec![0; job.plan.chapters.len()], chapters_done: 0, samples: 0, made_at_start: 0, done: BTreeMap::new() };
        for &c in &job.chapter_of {
            tally.left_in_chapter[c] += 1;
        }
        for (k, samples) in done {
            tally.add(job, k, samples);
        }
        tally.made_at_start = tally.done.len();
        tally
    }

    fn add(&mut self, job: &Job, k: usize, samples: usize) {
        if self.done.insert(k, samples).is_some() {
            return;
        }
        self.samples += samples;
        let c = job.chapter_of[k];
        self.left_in_chapter[c] -= 1;
        if self.left_in_chapter[c] == 0 {
            self.chapters_done += 1;
            self.samples += job.plan.chapters[c].parts.iter().map(|p| if let PlannedPart::Pause(n) = p { *n } else { 0 }).sum::<usize>();
        }
    }

    /// Where the job stands, `elapsed` after this run started.
    fn progress(&self, job: &Job, elapsed: Duration) -> Progress {
        let made = self.done.len() - self.made_at_start;
        let left = job.sentences.len() - self.done.len();
        Progress {
            chapters_done: self.chapters_done,
            chapters_total: job.plan.chapters.len(),
            sentences_done: self.done.len(),
            sentences_total: job.sentences.len(),
            audio_seconds: self.samples as f64 / f64::from(job.sample_rate),
            eta: (made > 0).then(|| elapsed.mul_f64(left as f64 / made as f64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_seeds_differ_by_index_and_seed() {
        let seeds: BTreeSet<u64> = (0..1000).map(|k| sentence_seed(1986, k)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_ne!(sentence_seed(1, 0), sentence_seed(2, 0));
        assert_eq!(sentence_seed(7, 3), sentence_seed(7, 3));
    }

    #[test]
    fn a_sentence_file_reads_back_and_damage_is_found() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("000000.f32");
        let samples = vec![0.25f32, -0.5, 1.0];
        std::fs::write(&path, sentence_bytes(&samples)).expect("write");
        assert_eq!(read_sentence(&path).expect("read"), Some(samples.clone()));
        let bytes = sentence_bytes(&samples);
        std::fs::write(&path, &bytes[..bytes.len() - 2]).expect("truncate");
        assert_eq!(read_sentence(&path).expect("read"), None, "a truncated file");
        let mut flipped = bytes.clone();
        flipped[SENTENCE_HEADER] ^= 1;
        std::fs::write(&path, &flipped).expect("flip");
        assert_eq!(read_sentence(&path).expect("read"), None, "a damaged file");
        assert_eq!(read_sentence(&dir.path().join("absent")).expect("read"), None);
    }

    #[test]
    fn what_changed_names_the_first_difference() {
        let print = |t: &str| ChapterPrint { title_sha256: sha256_hex(b"t"), text_sha256: sha256_hex(t.as_bytes()) };
        let options: BTreeMap<String, String> = [("the seed".to_string(), "1".to_string())].into();
        let old = Manifest { format: 1, fingerprint: "a".into(), chapters: vec![print("x"), print("y")], options: options.clone(), sample_rate: 24000, sentences: 2 };
        assert_eq!(what_changed(&old, &old.clone()), None);
        let mut new = old.clone();
        new.chapters[1] = print("z");
        assert_eq!(what_changed(&old, &new).as_deref(), Some("chapter 2's text changed"));
        let mut new = old.clone();
        new.options.insert("the seed".into(), "2".into());
        assert_eq!(what_changed(&old, &new).as_deref(), Some("the seed changed"));
        let mut new = old.clone();
        new.chapters.pop();
        assert_eq!(what_changed(&old, &new).as_deref(), Some("it has 2 chapters, this input 1"));
    }

    #[test]
    fn paragraphs_are_cut_at_blank_lines() {
        let got = paragraphs("One. Two.\n\n\n  Three.\r\n \r\nFour.\rstill four.\n\n");
        assert_eq!(got, ["One. Two.", "Three.", "Four.\nstill four."]);
    }
}
