//! Text-in streaming against the official code: `tests/fixtures/bistream/<case>/` holds what the
//! unmodified official CosyVoice3 code (`inference_zero_shot` / `inference_instruct2` with a text
//! generator, i.e. `Qwen2LM.inference_bistream`) produced on the shared reference tiny model, greedy:
//! the text pieces, the speech tokens it yielded (and its raw tokens with the fill tokens), and the
//! audio. The runtime, fed the same pieces, must yield the same tokens and audio within the golden
//! tolerance (mean |Δ log-mel| 0.025, the reference compare.py's). How the data was recorded:
//! tests/fixtures/bistream/README.md.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cosy::config::{Config, LoadOptions};
use cosy::pipeline::{Request, SynthesisObserver, Synthesizer, Voice};

mod common;
use common::{python, reference_dir};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bistream")
}

fn tokens(path: &Path) -> Vec<i64> {
    let arr = cosy::npy::read(path).expect("npy");
    arr.to_i64(path).expect("integer npy").iter().copied().collect()
}

fn samples(path: &Path) -> Vec<f32> {
    let arr = cosy::npy::read(path).expect("npy");
    arr.to_f32().iter().copied().collect()
}

/// The reference tiny model exported by this repository's exporter.
fn export_reference(into: &Path) -> Option<PathBuf> {
    let reference = reference_dir()?;
    let py = python()?;
    let model = into.join("model");
    let out = std::process::Command::new(py)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx"))
        .args(["-m", "cosy_export", "export"])
        .arg(reference.join("tiny-official"))
        .arg(&model)
        .args(["--precisions", "fp32"])
        .output()
        .expect("run the exporter");
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    Some(model)
}

struct Tokens(Mutex<Vec<i64>>);
impl SynthesisObserver for Tokens {
    fn llm_token(&self, _sentence: usize, _index: usize, token: i64) {
        self.0.lock().unwrap().push(token);
    }
}

/// Mean |Δ| of the two signals' 24 kHz log-mels over the frames both have.
fn log_mel_distance(a: &[f32], b: &[f32]) -> f32 {
    let (ma, mb) = (cosy::frontend::mel::mel_24k(a), cosy::frontend::mel::mel_24k(b));
    let frames = ma.nrows().min(mb.nrows());
    let mut sum = 0f64;
    for f in 0..frames {
        for m in 0..ma.ncols() {
            sum += f64::from((ma[[f, m]] - mb[[f, m]]).abs());
        }
    }
    (sum / (frames * ma.ncols()).max(1) as f64) as f32
}

#[test]
fn bistream_matches_the_official_tokens_and_audio() {
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference(work.path()) else { return };
    let mut opts = LoadOptions::default();
    opts.flags = vec![
        ("model.dir".into(), model.display().to_string()),
        ("runtime.providers".into(), "cpu".into()),
        ("text.normalizer".into(), "none".into()),
        ("runtime.graph_cache_enabled".into(), "false".into()),
    ];
    let config = Config::load(&opts).expect("config");
    let synth = Synthesizer::load(&config).expect("load the exported reference model");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(fixtures()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(cases.len() >= 5, "the recorded cases are there");
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(case.join("meta.json")).unwrap()).unwrap();
        let pieces: Vec<String> = meta["pieces"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
        let prompt_text = meta["prompt_text"].as_str().unwrap().to_string();
        let prompt_wav = meta["prompt_wav"].as_str().unwrap();
        let wav = match Path::new(prompt_wav).file_name().and_then(|n| n.to_str()) {
            Some("prompt_24k_72000.wav") => fixtures().join("prompt_24k_72000.wav"),
            Some(file) => reference.join("prompts").join(file),
            None => panic!("{name}: prompt_wav {prompt_wav}"),
        };
        let voice = match meta["mode"].as_str() {
            Some("zero_shot") => Voice::ZeroShot { wav, transcript: prompt_text },
            Some("instruct2") => Voice::Instruct { wav, instruction: prompt_text },
            other => panic!("{name}: mode {other:?}"),
        };
        let req = Request {
            text: String::new(),
            voice,
            text_frontend: meta["text_frontend"].as_bool().unwrap_or(true),
            speed: 1.0,
            seed: meta["seed"].as_u64(),
            stream: meta["stream"].as_bool().unwrap_or(false),
            ignore_stop_until: None,
        };
        let observer = Tokens(Mutex::new(Vec::new()));
        let mut audio = Vec::new();
        let summary = synth
            .synthesize_bistream(&req, pieces.iter().cloned().map(Ok), &observer, |c| {
                audio.extend_from_slice(c);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = observer.0.into_inner().unwrap();
        let want = tokens(&case.join("llm_token_yielded.npy"));
        assert_eq!(got, want, "{name}: the speech tokens differ from the official bi-streaming output");
        assert_eq!(summary.speech_tokens, want.len(), "{name}");
        let official = samples(&case.join("waveform.npy"));
        assert_eq!(audio.len(), official.len(), "{name}: audio length");
        let d = log_mel_distance(&audio, &official);
        assert!(d < 0.025, "{name}: mean |Δ log-mel| {d} over the golden tolerance 0.025");
        eprintln!("{name}: {} tokens, {} samples, mean |Δ log-mel| {d:.2e}", got.len(), audio.len());
    }
}
