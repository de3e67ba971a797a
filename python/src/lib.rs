//! `cosy._cosy`: the native half of the Python package. It translates Python calls into the
//! library's (configuration, voices, request building, the engine, text streams) and the
//! library's errors into Python exceptions; it decides nothing itself. The Python half
//! (`cosy/__init__.py`) wraps these in numpy arrays, iterators and asyncio twins.
//!
//! Every wait on the engine happens with the GIL released, in slices of [`POLL`], so that other
//! Python threads run meanwhile and Ctrl-C (a pending signal) interrupts a wait promptly:
//! the request is then cancelled by dropping its handle.

mod config;
mod errors;
mod streams;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use cosy::app::speech::{build_request, build_streaming_request, SpeechOptions};
use cosy::app::voices::{Recording, VoiceChoice, Voices};
use cosy::config::Config;
use cosy::engine::{BistreamOptions, Engine};
use cosy::request::{Summary, Voice};

use errors::to_py;
use streams::{RequestStream, TextStream};

/// How long one wait lasts before Python gets the GIL back to look at its signals.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// The voice of a call, as the keyword arguments give it.
#[derive(FromPyObject, Default)]
#[pyo3(from_item_all)]
struct VoiceArgs {
    name: Option<String>,
    prompt_wav: Option<PathBuf>,
    prompt_audio: Option<Vec<u8>>,
    prompt_text: Option<String>,
    instruct: Option<String>,
}

/// A saved voice as listed (the Python half's `VoiceInfo`): name, transcript, the reason it
/// cannot be read (then no transcript), whether it is the default, whether it fits the model,
/// seconds of prompt.
type VoiceRow = (String, Option<String>, Option<String>, bool, Option<bool>, f64);

/// One loaded model shared by every Python thread and task (`Send + Sync`).
#[pyclass(module = "cosy._cosy", frozen)]
struct EngineCore {
    engine: Arc<Engine>,
    config: Config,
}

#[pymethods]
impl EngineCore {
    /// Loads the configuration as the `cosy` binary does (defaults, the config file, `COSY_*`,
    /// then `model` and `settings` as flags) and the model.
    /// `llm_gather_first` is the engine's test hook ([`cosy::engine::EngineBuilder::llm_gather_first`]):
    /// the first LLM prefill waits until that many sentences wait, so that a test sees its
    /// requests batched whatever the machine's timing.
    #[new]
    #[pyo3(signature = (model=None, config=None, settings=Vec::new(), ort_library=None, llm_gather_first=0))]
    fn new(
        py: Python<'_>,
        model: Option<String>,
        config: Option<PathBuf>,
        settings: Vec<(String, String)>,
        ort_library: Option<PathBuf>,
        llm_gather_first: usize,
    ) -> PyResult<Self> {
        let config = config::load(model, config, settings, ort_library).map_err(to_py)?;
        let engine = py.detach(|| Engine::builder(&config).llm_gather_first(llm_gather_first).build()).map_err(to_py)?;
        Ok(EngineCore { engine: Arc::new(engine), config })
    }

    /// The ONNX Runtime library loaded (its path, its version and how it was found).
    #[getter]
    fn onnxruntime(&self) -> Option<(PathBuf, String, String)> {
        cosy::runtime::env::current().map(|rt| (rt.library.clone(), rt.version.clone(), rt.found_by.to_string()))
    }

    #[getter]
    fn sample_rate(&self) -> u32 {
        self.engine.sample_rate()
    }

    /// The model folder in use.
    #[getter]
    fn model_dir(&self) -> PathBuf {
        self.config.model_dir.clone()
    }

    /// Submits a whole-text request; its audio comes from the returned stream. Streaming as
    /// `stream` says, else as `cosy say` does (`live`: streaming unless a speed is set) or as
    /// `cosy file` does (`streaming.enabled`).
    /// `hold_after_first_audio` is the engine's test hook (the request keeps its slot after its
    /// first chunk until it is cancelled; refused unless `debug.test_hooks` is on).
    #[pyo3(signature = (text, voice, speed=1.0, seed=None, stream=None, text_frontend=true, live=false, hold_after_first_audio=false))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        text: String,
        voice: VoiceArgs,
        speed: f64,
        seed: Option<u64>,
        stream: Option<bool>,
        text_frontend: bool,
        live: bool,
        hold_after_first_audio: bool,
    ) -> PyResult<RequestStream> {
        py.detach(|| {
            // The speed first, as the CLI checks it: the same input gets the same first complaint.
            cosy::request::check_speed(speed)?;
            let voice = self.resolve(voice)?;
            let mut options = SpeechOptions::new(text, voice, live || self.config.streaming.enabled);
            options.speed = speed;
            options.seed = seed;
            options.stream = stream;
            options.text_frontend = text_frontend;
            options.test_hooks.hold_after_first_audio = hold_after_first_audio;
            let request = build_request(&self.config, options)?;
            self.engine.submit(request)
        })
        .map(RequestStream::new)
        .map_err(to_py)
    }

    /// Starts a text-in streaming request: text goes in with `write`, audio comes out.
    /// Streaming schedule as `stream` says, else on (as `cosy say -` and the WebSocket).
    #[pyo3(signature = (voice, seed=None, text_frontend=true, normalize_sentences=false, stream=None))]
    fn start_text_stream(
        &self,
        py: Python<'_>,
        voice: VoiceArgs,
        seed: Option<u64>,
        text_frontend: bool,
        normalize_sentences: bool,
        stream: Option<bool>,
    ) -> PyResult<TextStream> {
        py.detach(|| {
            let voice = self.resolve(voice)?;
            let mut options = SpeechOptions::new(String::new(), voice, true);
            options.seed = seed;
            options.stream = stream;
            options.text_frontend = text_frontend;
            let template = build_streaming_request(options)?;
            let stream = cosy::app::text_stream::TextStream::text_in(
                self.engine.clone(),
                &self.config,
                template,
                BistreamOptions { normalize_sentences, ..Default::default() },
                None,
            );
            TextStream::start(stream)
        })
        .map_err(to_py)
    }

    /// The saved voices, each as [`VoiceRow`].
    fn voices_list(&self, py: Python<'_>) -> PyResult<Vec<VoiceRow>> {
        py.detach(|| {
            let voices = Voices::new(&self.config);
            let entries = voices.list(Some(self.engine.voice_key()))?;
            Ok(entries
                .into_iter()
                .map(|e| match e.voice {
                    Ok(v) => {
                        let seconds = cosy::app::voices::summary_seconds(&v);
                        (e.name, Some(v.transcript), None, e.is_default, e.fits_model, seconds)
                    }
                    Err(why) => (e.name, None, Some(why), e.is_default, e.fits_model, 0.0),
                })
                .collect())
        })
        .map_err(to_py)
    }

    /// Makes and saves a voice from a recording (a file or its bytes) and its transcript.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, transcript, prompt_wav=None, prompt_audio=None, replace=false, make_default=false))]
    fn voices_add(
        &self,
        py: Python<'_>,
        name: String,
        transcript: String,
        prompt_wav: Option<PathBuf>,
        prompt_audio: Option<Vec<u8>>,
        replace: bool,
        make_default: bool,
    ) -> PyResult<PathBuf> {
        py.detach(|| {
            let recording = recording_of(prompt_wav, prompt_audio)?.ok_or_else(|| {
                cosy::Error::input(cosy::error::InputCode::MissingRecording, Some("prompt_wav"), "a voice needs a recording: give prompt_wav (a file) or prompt_audio (its bytes)")
            })?;
            let voices = Voices::new(&self.config);
            voices.add(&self.engine, &name, &recording, &transcript, replace, make_default).map(|(_, path)| path)
        })
        .map_err(to_py)
    }

    /// Deletes a saved voice; returns whether it was the folder's default (now cleared).
    fn voices_remove(&self, py: Python<'_>, name: String) -> PyResult<bool> {
        py.detach(|| Voices::new(&self.config).remove(&name).map(|r| r.was_default)).map_err(to_py)
    }

    /// The default voice's name, if there is one.
    fn voices_default(&self, py: Python<'_>) -> PyResult<Option<String>> {
        py.detach(|| Voices::new(&self.config).default_voice().map(|d| d.map(|(name, _)| name))).map_err(to_py)
    }

    /// Makes a saved voice the folder's default; returns the config's `voices.default` when it
    /// names another voice (which still wins).
    fn voices_set_default(&self, py: Python<'_>, name: String) -> PyResult<Option<String>> {
        py.detach(|| Voices::new(&self.config).make_default(&name)).map_err(to_py)
    }

    /// The engine's counters: requests in flight and queued, and its batchers'.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("in_flight", self.engine.in_flight())?;
        d.set_item("queued", self.engine.queued())?;
        let (llm, dit) = self.engine.batch_stats();
        d.set_item("llm_decode_calls", llm.decode_calls)?;
        d.set_item("llm_decode_rows", llm.decode_rows)?;
        d.set_item("llm_max_rows", llm.max_rows)?;
        d.set_item("llm_prefills", llm.prefills)?;
        d.set_item("dit_calls", dit.calls)?;
        d.set_item("dit_requests", dit.requests)?;
        d.set_item("dit_max_requests", dit.max_requests)?;
        Ok(d)
    }
}

impl EngineCore {
    /// The request's voice through the application layer's rules (a saved name, the default, a
    /// recording and its transcript, an instruction).
    fn resolve(&self, v: VoiceArgs) -> cosy::Result<Voice> {
        let voices = Voices::new(&self.config);
        let choice = VoiceChoice {
            name: v.name,
            recording: recording_of(v.prompt_wav, v.prompt_audio)?,
            transcript: v.prompt_text,
            instruction: v.instruct,
        };
        Ok(voices.resolve(choice, Some(self.engine.voice_key()))?.voice)
    }
}

/// A recording from a file or from its bytes (any format the CLI reads); not both.
fn recording_of(path: Option<PathBuf>, bytes: Option<Vec<u8>>) -> cosy::Result<Option<Recording>> {
    match (path, bytes) {
        (Some(_), Some(_)) => Err(cosy::Error::input(
            cosy::error::InputCode::Conflict,
            Some("prompt_audio"),
            "give the recording once: prompt_wav (a file) or prompt_audio (its bytes), not both",
        )),
        (Some(p), None) => Ok(Some(Recording::File(p))),
        (None, Some(b)) => Recording::from_bytes("prompt_audio", b).map(Some),
        (None, None) => Ok(None),
    }
}

/// A request's summary as the server's `speech.audio.done` event has it, plus each sentence's
/// place in the audio.
pub(crate) fn summary_dict<'py>(py: Python<'py>, s: &Summary, sample_rate: u32) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let usage = PyDict::new(py);
    usage.set_item("input_tokens", s.text_tokens)?;
    usage.set_item("output_tokens", s.speech_tokens)?;
    usage.set_item("total_tokens", s.text_tokens + s.speech_tokens)?;
    d.set_item("usage", usage)?;
    d.set_item("audio_seconds", s.samples as f64 / f64::from(sample_rate))?;
    d.set_item("sample_rate", sample_rate)?;
    d.set_item("samples", s.samples)?;
    d.set_item("chunks", s.chunks)?;
    let stages = PyDict::new(py);
    stages.set_item("queue", s.stages.queue)?;
    stages.set_item("load", s.stages.load)?;
    stages.set_item("frontend", s.stages.frontend)?;
    stages.set_item("llm", s.stages.llm)?;
    stages.set_item("flow", s.stages.flow)?;
    stages.set_item("hift", s.stages.hift)?;
    d.set_item("stages", stages)?;
    let spans: Vec<(String, usize, usize)> = s.spans.iter().map(|sp| (sp.text.clone(), sp.start, sp.samples)).collect();
    d.set_item("sentences", spans)?;
    Ok(d)
}

/// Samples as little-endian f32 bytes (numpy reads them without a copy per element).
pub(crate) fn samples_bytes<'py>(py: Python<'py>, samples: &[f32]) -> Bound<'py, PyBytes> {
    PyBytes::new_with(py, samples.len() * 4, |buf| {
        for (out, s) in buf.chunks_exact_mut(4).zip(samples) {
            out.copy_from_slice(&s.to_le_bytes());
        }
        Ok(())
    })
    .unwrap_or_else(|_| PyBytes::new(py, &[]))
}

#[pymodule]
fn _cosy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EngineCore>()?;
    m.add_class::<RequestStream>()?;
    m.add_class::<TextStream>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
