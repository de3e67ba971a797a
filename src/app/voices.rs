//! Voices, once for every front end: which voice a request speaks with, and the saved voices
//! (add, list, remove, the default).
//!
//! A name resolves ([`Voices::resolve`]) to the saved voice of that name; else through the alias
//! table of the config (`[voices.aliases]`, e.g. `alloy = "anna"`); else, for one of OpenAI's
//! voice names ([`OPENAI_VOICES`]), to the default voice, so that clients that only know those
//! names (pipecat, LiveKit, the openai SDKs) work. Never silently: [`Resolved::how`] says which
//! voice was used and why, and each front end reports it (a header, a log line, a stderr line).
//! Any other unknown name is an error listing the saved voices.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{Error, InputCode, Result};
use crate::frontend::audio::{check_length, load_audio, Audio, MAX_TOKENIZER_SECONDS};
use crate::frontend::lexicon::Lexicon;
use crate::request::Voice;
pub use crate::vocab::OPENAI_VOICES;
use crate::vocab::check_voice_name as check_name;
use crate::voice::{model_key, DefaultSource, SavedVoice, VoiceStore, VoiceSummary};

/// Speech tokens per second of CosyVoice3's speech tokenizer (s3tokenizer v3: 16 kHz audio,
/// one token per 640 samples): a saved voice's length in seconds.
pub const SPEECH_TOKENS_PER_SECOND: f64 = 25.0;

/// How long a saved voice's recording was, in seconds.
pub fn voice_seconds(voice: &SavedVoice) -> f64 {
    voice.speech_token.len() as f64 / SPEECH_TOKENS_PER_SECOND
}

/// [`voice_seconds`] of a listed voice (its header's token count).
pub fn summary_seconds(voice: &VoiceSummary) -> f64 {
    voice.speech_tokens as f64 / SPEECH_TOKENS_PER_SECOND
}

/// A prompt recording: a file (the CLI) or audio already decoded (an upload).
#[derive(Debug, Clone)]
pub enum Recording {
    File(PathBuf),
    /// `label` names it in messages (`ref_audio`, an upload's file name).
    Memory { audio: Arc<Audio>, label: PathBuf },
}

impl Recording {
    /// Decodes uploaded bytes (any supported format) into a recording named `label`.
    pub fn from_bytes(label: &str, bytes: Vec<u8>) -> Result<Recording> {
        let label = PathBuf::from(label);
        let audio = crate::frontend::audio::decode_bytes(&label, bytes).map_err(audio_error)?;
        Ok(Recording::Memory { audio: Arc::new(audio), label })
    }
}

/// Whether `name` is one of OpenAI's voice names ([`OPENAI_VOICES`]).
pub fn is_openai_voice(name: &str) -> bool {
    OPENAI_VOICES.contains(&name)
}

/// How a request's voice was chosen: what a front end reports (header, log, stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoiceSource {
    /// The prompt recording the request carried.
    Recording,
    /// The saved voice the request named.
    Saved { name: String },
    /// An alias of the config (`voices.aliases.<alias> = "<name>"`).
    Alias { alias: String, name: String },
    /// An OpenAI voice name that is neither a saved voice nor an alias: the default voice.
    OpenAiDefault { asked: String, name: String },
    /// No name given: the default voice.
    Default { name: String },
}

impl VoiceSource {
    /// The saved voice used, if any.
    pub fn voice_name(&self) -> Option<&str> {
        match self {
            VoiceSource::Recording => None,
            VoiceSource::Saved { name } | VoiceSource::Alias { name, .. } | VoiceSource::OpenAiDefault { name, .. } | VoiceSource::Default { name } => {
                Some(name)
            }
        }
    }

    /// Whether the voice used is not the one the request named (an alias, or the default for an
    /// OpenAI name): front ends that stay quiet about the obvious still report these.
    pub fn is_substitute(&self) -> bool {
        matches!(self, VoiceSource::Alias { .. } | VoiceSource::OpenAiDefault { .. })
    }
}

/// `anna`, `anna (alias of alloy)`, `me (default voice, for alloy)`, `me (default voice)`,
/// `prompt recording`: one line, ASCII when the names are (they are: see `check_voice_name`).
impl fmt::Display for VoiceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VoiceSource::Recording => write!(f, "prompt recording"),
            VoiceSource::Saved { name } => write!(f, "{name}"),
            VoiceSource::Alias { alias, name } => write!(f, "{name} (alias of {alias})"),
            VoiceSource::OpenAiDefault { asked, name } => write!(f, "{name} (default voice, for {asked})"),
            VoiceSource::Default { name } => write!(f, "{name} (default voice)"),
        }
    }
}

/// A resolved voice and how it was chosen.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub voice: Voice,
    pub how: VoiceSource,
}

/// A name a request may use beyond the saved voices (an alias, an OpenAI name) and what it
/// resolves to now ([`Voices::extra_names`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraName {
    pub id: String,
    /// `"alias"` (of the config) or `"default"` (an OpenAI name: the default voice).
    pub via: &'static str,
    /// The alias's voice, or the default voice (`None`: there is no default).
    pub target: Option<String>,
    /// Whether `target` is a saved voice now (a request for `id` works).
    pub available: bool,
}

/// The languages every voice speaks: CosyVoice3's nine (its README: Chinese, English, Japanese,
/// Korean, German, Spanish, French, Italian, Russian; Chinese dialects besides), as ISO 639-1 codes
/// for front ends that list them (the Wyoming `info`). A saved voice is a timbre, not a language.
pub const VOICE_LANGUAGES: [&str; 9] = ["zh", "en", "ja", "ko", "de", "es", "fr", "it", "ru"];

/// What a request says about its voice, as a front end received it.
#[derive(Debug, Clone, Default)]
pub struct VoiceChoice {
    /// A saved voice's name; `None` = the default voice (unless a recording is given).
    pub name: Option<String>,
    pub recording: Option<Recording>,
    /// What the recording says (zero-shot); without it, and without an instruction, the voice is
    /// cross-lingual.
    pub transcript: Option<String>,
    /// A style instruction (instruct mode), with a recording or a saved voice.
    pub instruction: Option<String>,
}

/// `resolve` never chooses a recording by name.
fn unreachable_recording() -> Result<SavedVoice> {
    Err(Error::Runtime("voice resolution: a recording has no saved voice".into()))
}

/// An audio problem as an input error about the prompt recording (`ref_audio` in the HTTP API).
fn audio_error(e: Error) -> Error {
    match e {
        Error::Input { message, .. } => Error::input(InputCode::InvalidAudio, Some("ref_audio"), message),
        other => other,
    }
}

/// Loads (a file) and checks a prompt recording: readable, long enough for every stage, at most
/// `max_seconds` (the model's limit, [`Voices::prompt_limit`]; the pipeline checks it again).
pub fn check_recording(recording: &Recording, max_seconds: f64) -> Result<Arc<Audio>> {
    let (audio, label) = match recording {
        Recording::File(path) => (Arc::new(load_audio(path).map_err(audio_error)?), path.as_path()),
        Recording::Memory { audio, label } => (audio.clone(), label.as_path()),
    };
    check_length(&audio, label, max_seconds).map_err(audio_error)?;
    Ok(audio)
}

/// Refuses a prompt transcript (`param` "ref_text") or instruction ("instructions") longer than
/// `limit` characters (`limits.max_prompt_text_chars`): the one rule for every front end (the
/// prompt recording is seconds long; a longer text is not what it says, and it would only cost the
/// LLM's prefill).
pub fn check_prompt_text(param: &'static str, text: &str, limit: usize) -> Result<()> {
    let n = text.chars().count();
    if n <= limit {
        return Ok(());
    }
    let (what, fix) = if param == "instructions" {
        ("instruction", "give a shorter instruction")
    } else {
        ("prompt transcript", "give the words the recording says")
    };
    Err(Error::input(
        InputCode::TextTooLong,
        Some(param),
        format!("the {what} has {n} characters, more than the limit of {limit} (limits.max_prompt_text_chars); {fix}"),
    ))
}

/// The voices folder of a configuration, and its default.
pub struct Voices {
    store: VoiceStore,
    /// `voices.default` in the config (beats the folder's marker).
    configured_default: Option<String>,
    /// `[voices.aliases]`: another name for a saved voice (`alloy = "anna"`).
    aliases: BTreeMap<String, String>,
    model_dir: PathBuf,
    /// The model's prompt limit, read from its folder once ([`Voices::prompt_limit`]).
    prompt_limit: std::sync::OnceLock<f64>,
    /// `limits.max_prompt_text_chars` ([`check_prompt_text`]).
    max_prompt_text_chars: usize,
}

/// One saved voice as listed.
#[derive(Debug, Clone)]
pub struct VoiceEntry {
    pub name: String,
    /// The voice as its file's header describes it (read in bounded memory), or why it cannot be
    /// used: a damaged or truncated file, a dangling link, a file that is not a voice.
    pub voice: std::result::Result<VoiceSummary, String>,
    pub is_default: bool,
    /// Whether it was made for the model in use (`None` when that is not known, or the file is
    /// broken).
    pub fits_model: Option<bool>,
    /// Its pronunciation lexicon's file, if it has one.
    pub lexicon: Option<PathBuf>,
}

/// What removing a voice did.
#[derive(Debug, Clone)]
pub struct Removed {
    pub path: PathBuf,
    /// It was the folder's default voice, which is now cleared (a default naming a removed voice
    /// would only fail later, far from here).
    pub was_default: bool,
}

impl Voices {
    pub fn new(config: &Config) -> Voices {
        Voices {
            store: VoiceStore::new(&config.voices.dir),
            configured_default: config.voices.default.clone(),
            aliases: config.voices.aliases.clone(),
            model_dir: config.model_dir.clone(),
            prompt_limit: std::sync::OnceLock::new(),
            max_prompt_text_chars: config.limits.max_prompt_text_chars,
        }
    }

    /// The longest prompt recording the configured model takes ([`crate::engine::max_prompt_seconds_of`]),
    /// so that the first refusal names the model's real limit; the speech tokenizer's 30 s when
    /// the model folder cannot be read (loading it then says why).
    pub fn prompt_limit(&self) -> f64 {
        *self.prompt_limit.get_or_init(|| crate::engine::max_prompt_seconds_of(&self.model_dir).unwrap_or(MAX_TOKENIZER_SECONDS))
    }

    pub fn store(&self) -> &VoiceStore {
        &self.store
    }

    /// The default voice's name and where it was set, if any.
    pub fn default_voice(&self) -> Result<Option<(String, DefaultSource)>> {
        self.store.default_name(self.configured_default.as_deref())
    }

    /// The key saved voices must carry for the configured model folder, read from its manifest
    /// without loading it (`None` when the folder cannot be opened: the model loader reports that,
    /// with its context).
    pub fn model_key_on_disk(&self) -> Option<String> {
        crate::model::ModelDir::open(&self.model_dir).ok().and_then(|d| model_key(&d).ok())
    }

    /// The voice of a request, and how it was chosen. `model_key` is the loaded model's (or
    /// [`Self::model_key_on_disk`]): a saved voice made for another model is refused before any
    /// work. A name is, in this order: a saved voice; an alias of the config; one of OpenAI's
    /// names ([`OPENAI_VOICES`]), which means the default voice; else unknown (an error listing
    /// the saved voices).
    pub fn resolve(&self, choice: VoiceChoice, model_key: Option<&str>) -> Result<Resolved> {
        let VoiceChoice { name, recording, transcript, instruction } = choice;
        for (param, value) in [("ref_text", &transcript), ("instructions", &instruction)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(Error::input(
                    InputCode::InvalidText,
                    Some(param),
                    format!("the {} is empty; leave it out or give the text", if param == "ref_text" { "prompt transcript" } else { "instruction" }),
                ));
            }
            if let Some(text) = value {
                check_prompt_text(param, text, self.max_prompt_text_chars)?;
            }
        }
        if transcript.is_some() && instruction.is_some() {
            return Err(Error::input(
                InputCode::Conflict,
                Some("instructions"),
                "give a prompt transcript (zero-shot: what the recording says) or an instruction (instruct mode), not both",
            ));
        }
        if let Some(recording) = recording {
            if name.is_some() {
                return Err(Error::input(
                    InputCode::Conflict,
                    Some("voice"),
                    "give a saved voice or a prompt recording, not both",
                ));
            }
            let audio = check_recording(&recording, self.prompt_limit())?;
            let voice = match recording {
                Recording::File(wav) => match (transcript, instruction) {
                    (Some(transcript), _) => Voice::ZeroShot { wav, transcript },
                    (None, Some(instruction)) => Voice::Instruct { wav, instruction },
                    (None, None) => Voice::CrossLingual { wav },
                },
                Recording::Memory { label, .. } => Voice::Recording { audio, label, transcript, instruction },
            };
            return Ok(Resolved { voice, how: VoiceSource::Recording });
        }
        if transcript.is_some() {
            return Err(Error::input(
                InputCode::MissingRecording,
                Some("ref_audio"),
                "a prompt transcript describes a prompt recording, which is missing; give both (CLI --prompt-wav, HTTP ref_audio)",
            ));
        }
        let how = self.choose(name.as_deref())?;
        let saved = match &how {
            VoiceSource::Saved { name } => self.load_saved(name, model_key),
            VoiceSource::Alias { alias, name } => self.load_saved(name, model_key).map_err(|e| match e {
                Error::Input { code: InputCode::VoiceNotFound, param, message } => Error::Input {
                    code: InputCode::VoiceNotFound,
                    param,
                    message: format!(
                        "voice {alias:?} is an alias (voices.aliases.{alias} = {name:?} in the config) of a voice that is not there: {message}; \
                         fix the alias, or save the voice {name:?}"
                    ),
                },
                Error::Input { code, param, message } => Error::Input {
                    code,
                    param,
                    message: format!("voice {alias:?} (alias of {name:?}, voices.aliases.{alias} in the config): {message}"),
                },
                other => other,
            }),
            VoiceSource::OpenAiDefault { name, .. } | VoiceSource::Default { name } => {
                self.load_saved(name, model_key).map_err(|e| self.about_default(name, e))
            }
            VoiceSource::Recording => unreachable_recording(),
        }?;
        let lexicon = match how.voice_name() {
            Some(name) => self.voice_lexicon(name)?.map(Arc::new),
            None => None,
        };
        Ok(Resolved { voice: Voice::Saved { voice: Arc::new(saved), instruction, lexicon }, how })
    }

    /// Which saved voice a name (or no name) means, and why; nothing is read but the folder.
    fn choose(&self, name: Option<&str>) -> Result<VoiceSource> {
        let Some(name) = name else {
            return Ok(VoiceSource::Default { name: self.default_name(None)? });
        };
        check_name(name)?;
        if self.store.path_of(name).exists() {
            return Ok(VoiceSource::Saved { name: name.to_string() });
        }
        if let Some(target) = self.aliases.get(name) {
            return Ok(VoiceSource::Alias { alias: name.to_string(), name: target.clone() });
        }
        if is_openai_voice(name) {
            return Ok(VoiceSource::OpenAiDefault { asked: name.to_string(), name: self.default_name(Some(name))? });
        }
        // Not there: the store's error lists the saved voices.
        Ok(VoiceSource::Saved { name: name.to_string() })
    }

    /// The default voice's name, or the error that there is none (`for_name`: the OpenAI name
    /// that asked for it).
    fn default_name(&self, for_name: Option<&str>) -> Result<String> {
        match self.default_voice()? {
            Some((name, _)) => Ok(name),
            None => {
                let what = match for_name {
                    Some(asked) => format!(
                        "voice {asked:?} (an OpenAI voice name) means the default voice, and there is none: map it to a saved voice \
                         in the config ([voices.aliases] {asked} = \"NAME\"), save a voice named {asked}, or save a default"
                    ),
                    None => "no voice given and no default voice: name a saved voice or give a prompt recording, or save a default".into(),
                };
                Err(Error::input(
                    InputCode::NoVoice,
                    Some("voice"),
                    format!("{what} (`cosy voice add NAME --wav FILE --text TEXT --default`; voices in {})", self.store.dir.display()),
                ))
            }
        }
    }

    /// A problem with the default voice, saying where the default was set.
    fn about_default(&self, name: &str, e: Error) -> Error {
        let source = self.default_voice().ok().flatten().map(|(_, s)| s);
        match (source, e) {
            (Some(source), Error::Input { code, param, message }) => {
                let from = match source {
                    DefaultSource::Config => "voices.default in the config".to_string(),
                    DefaultSource::Folder(p) => p.display().to_string(),
                };
                Error::Input { code, param, message: format!("default voice {name:?} (from {from}): {message}; pick another with `cosy voice default NAME`") }
            }
            (_, e) => e,
        }
    }

    /// The names a request may use besides the saved voices (`saved`): the aliases of the config
    /// and OpenAI's voice names, each with the voice it resolves to now. A saved voice of the
    /// same name wins, so such names are left out.
    pub fn extra_names(&self, saved: &[String]) -> Vec<ExtraName> {
        let default = self.default_voice().ok().flatten().map(|(n, _)| n);
        let there = |name: &Option<String>| name.as_ref().is_some_and(|n| saved.contains(n));
        let mut out: Vec<ExtraName> = Vec::new();
        for (alias, target) in &self.aliases {
            if !saved.contains(alias) {
                let target = Some(target.clone());
                out.push(ExtraName { id: alias.clone(), via: "alias", available: there(&target), target });
            }
        }
        for name in OPENAI_VOICES {
            if !saved.iter().any(|s| s == name) && !self.aliases.contains_key(name) {
                out.push(ExtraName { id: name.to_string(), via: "default", available: there(&default), target: default.clone() });
            }
        }
        out
    }

    /// A saved voice by name, checked against `model_key` when given, and its transcript against
    /// `limits.max_prompt_text_chars` as a request's would be ([`check_prompt_text`]: a file
    /// saved under a higher limit, or edited, is held to the same rule).
    pub fn load_saved(&self, name: &str, model_key: Option<&str>) -> Result<SavedVoice> {
        let saved = self.store.load(name)?;
        if let Some(key) = model_key {
            saved.check_model(key, &self.model_dir)?;
        }
        check_prompt_text("ref_text", &saved.transcript, self.max_prompt_text_chars).map_err(|e| match e {
            Error::Input { code, message, .. } => Error::Input {
                code,
                param: Some("voice"),
                message: format!(
                    "saved voice {name:?} ({}): {message}; make it again with a shorter transcript (`cosy voice add {name} --wav FILE --text TEXT --force`)",
                    self.store.path_of(name).display()
                ),
            },
            other => other,
        })?;
        Ok(saved)
    }

    /// Voice `name`'s pronunciation lexicon, if it has one (`NAME.lexicon.toml`); a mistake in
    /// it is one line naming the file and line, as the global one's.
    pub fn voice_lexicon(&self, name: &str) -> Result<Option<Lexicon>> {
        let path = self.store.lexicon_path(name);
        if !path.exists() {
            return Ok(None);
        }
        Lexicon::load(&path).map(Some)
    }

    /// The lexicon file `path` for a voice, read and checked (`cosy voice add --lexicon`): its text,
    /// to save with [`Voices::save_lexicon`] once the voice is made.
    pub fn read_lexicon(path: &Path) -> Result<String> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Lexicon::parse(&text, &path.display().to_string())?;
        Ok(text)
    }

    /// Gives voice `name` the lexicon `text` (from [`Voices::read_lexicon`]).
    pub fn save_lexicon(&self, name: &str, text: &str) -> Result<PathBuf> {
        self.store.save_lexicon(name, text)
    }

    /// Refuses a voice name or a transcript before any audio work: a name that is not allowed,
    /// one that is taken (unless `replace`), an empty transcript.
    pub fn check_new(&self, name: &str, transcript: &str, replace: bool) -> Result<()> {
        check_name(name).map_err(|e| e.about("name"))?;
        self.store.check_dir()?;
        if self.store.path_of(name).exists() && !replace {
            return Err(Error::input(
                InputCode::VoiceExists,
                Some("name"),
                format!(
                    "voice {name:?} already exists ({}); remove it first (`cosy voice rm {name}`), or replace it (--force, or overwrite=true over HTTP)",
                    self.store.path_of(name).display()
                ),
            ));
        }
        crate::voice::check_transcript(transcript)?;
        check_prompt_text("ref_text", transcript, self.max_prompt_text_chars)
    }

    /// Makes and saves voice `name` from `recording` and its transcript with `engine`'s frontend;
    /// optionally makes it the folder's default. Nothing is written when anything fails.
    pub fn add(&self, engine: &Engine, name: &str, recording: &Recording, transcript: &str, replace: bool, make_default: bool) -> Result<(SavedVoice, PathBuf)> {
        self.check_new(name, transcript, replace)?;
        let audio = check_recording(recording, engine.max_prompt_seconds())?;
        let label = match recording {
            Recording::File(p) => p.as_path(),
            Recording::Memory { label, .. } => label.as_path(),
        };
        let voice = engine.make_voice(name, &audio, label, transcript).map_err(audio_error)?;
        let path = self.store.save(&voice, replace)?;
        // A voice made again is a new voice: the old one's lexicon goes with it.
        if replace {
            self.store.remove_lexicon(name)?;
        }
        if make_default {
            self.store.set_default(name)?;
        }
        Ok((voice, path))
    }

    /// Every saved voice, sorted by name, each with its problem when it cannot be read.
    pub fn list(&self, model_key: Option<&str>) -> Result<Vec<VoiceEntry>> {
        let default = self.default_voice().ok().flatten().map(|(n, _)| n);
        Ok(self
            .store
            .names()?
            .into_iter()
            .map(|name| {
                // The header only: a stray multi-GB file costs a few bytes of reading.
                let voice = self.store.summary(&name).map_err(|e| e.to_string());
                let fits_model = match (&voice, model_key) {
                    (Ok(v), Some(k)) => Some(v.model_key == k),
                    _ => None,
                };
                let lexicon = Some(self.store.lexicon_path(&name)).filter(|p| p.exists());
                VoiceEntry { is_default: default.as_deref() == Some(name.as_str()), name, voice, fits_model, lexicon }
            })
            .collect())
    }

    /// Makes saved voice `name` the voices folder's default (it must exist and be readable).
    /// Returns the config's `voices.default` when it names another voice: that one still wins
    /// (`VoiceStore::default_name`), and the caller says so.
    pub fn make_default(&self, name: &str) -> Result<Option<String>> {
        self.store.set_default(name)?;
        Ok(self.configured_default.clone().filter(|c| c != name))
    }

    /// Deletes saved voice `name`; when it was the folder's default, the default is cleared.
    pub fn remove(&self, name: &str) -> Result<Removed> {
        let path = self.store.remove(name)?;
        let was_default = self.store.folder_default().ok().flatten().as_deref() == Some(name);
        if was_default {
            self.store.clear_default()?;
        }
        Ok(Removed { path, was_default })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `limits.max_prompt_text_chars` bounds the transcript and the instruction wherever they come
    /// from (a request's `ref_text` / `instructions`, `--prompt-text` / `--instruct`, `voice add`),
    /// before anything is read, naming the field and the key.
    #[test]
    fn prompt_texts_past_the_limit_are_refused_naming_the_field_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.voices.dir = dir.path().to_path_buf();
        config.limits.max_prompt_text_chars = 10;
        let voices = Voices::new(&config);
        let long = "é".repeat(11);
        let too_long = |e: Error, field: &str| match e {
            Error::Input { code: InputCode::TextTooLong, param: Some(p), message } => {
                assert_eq!(p, field);
                assert!(message.contains("11 characters") && message.contains("limits.max_prompt_text_chars"), "{message}");
            }
            other => panic!("not a too-long {field}: {other}"),
        };
        for (transcript, instruction, field) in [(Some(long.clone()), None, "ref_text"), (None, Some(long.clone()), "instructions")] {
            let choice = VoiceChoice { name: None, recording: Some(Recording::File(dir.path().join("unread.wav"))), transcript, instruction };
            too_long(voices.resolve(choice, None).expect_err("longer than the limit"), field);
        }
        too_long(voices.check_new("anna", &long, false).expect_err("longer than the limit"), "ref_text");
        assert!(check_prompt_text("ref_text", &"é".repeat(10), 10).is_ok(), "at the limit");
        assert!(voices.check_new("anna", &"é".repeat(10), false).is_ok());
        // A saved voice's transcript too (a file saved under a higher limit, or edited), naming
        // the voice and its file.
        let saved = SavedVoice { transcript: long.clone(), ..crate::voice::tests::voice("anna") };
        voices.store().save(&saved, false).unwrap();
        let e = voices.load_saved("anna", None).expect_err("a saved transcript past the limit");
        assert!(matches!(&e, Error::Input { code: InputCode::TextTooLong, param: Some("voice"), .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("saved voice \"anna\"") && text.contains("anna.safetensors") && text.contains("11 characters"), "{text}");
        let choice = VoiceChoice { name: Some("anna".into()), ..VoiceChoice::default() };
        assert!(voices.resolve(choice, None).is_err(), "resolving it is refused the same way");
    }
}
