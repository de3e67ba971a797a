//! Parity of the prompt features with the official golden intermediates
//! (`shared/reference/golden/<case>/`), and the audio loader's errors.

use std::path::{Path, PathBuf};

use cosy::frontend::align::align_prompt;
use cosy::frontend::audio::{load_at, load_audio, MAX_TOKENIZER_SECONDS};
use cosy::frontend::features::{kaldi_fbank_cmn, mel_24k, whisper_log_mel};
use cosy::npy;
use ndarray::{Array2, ArrayD};

use crate::common::shared_dir;

const CASES: [&str; 5] = ["en", "zh", "num", "p16k", "stream"];

fn prompt_of(reference: &Path, case: &str) -> PathBuf {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference.join("golden").join(case).join("meta.json")).unwrap())
            .unwrap();
    reference.join(meta["prompt_wav"].as_str().unwrap())
}

fn golden(reference: &Path, case: &str, name: &str) -> ArrayD<f32> {
    let p = reference.join("golden").join(case).join(name);
    npy::read(&p).unwrap().to_f32()
}

/// Max |a - b| after dropping leading batch dims of size 1; panics on a shape mismatch.
fn max_abs(ours: &Array2<f32>, gold: &ArrayD<f32>, what: &str) -> f32 {
    let gshape: Vec<usize> = gold.shape().iter().copied().skip_while(|&d| d == 1).collect();
    assert_eq!(ours.shape(), gshape.as_slice(), "{what}: shape");
    ours.iter().zip(gold.iter()).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

#[test]
fn prompt_features_match_golden() {
    let Some(shared) = shared_dir() else { return };
    let reference = shared.join("reference");
    let mut worst = [0.0f32; 4];
    for case in CASES {
        let wav = prompt_of(&reference, case);
        let wav16 = load_at(&wav, 16000, Some(MAX_TOKENIZER_SECONDS)).unwrap();
        let wav24 = load_at(&wav, 24000, None).unwrap();

        let whisper = whisper_log_mel(&wav16);
        let e_whisper = max_abs(&whisper, &golden(&reference, case, "whisper_mel.npy"), "whisper_mel");
        let fbank = kaldi_fbank_cmn(&wav16);
        let e_fbank = max_abs(&fbank, &golden(&reference, case, "campplus_fbank.npy"), "campplus_fbank");
        let mel = mel_24k(&wav24);
        let e_mel = max_abs(&mel, &golden(&reference, case, "prompt_feat_raw.npy"), "prompt_feat_raw");

        // Alignment against the golden tokens: the aligned mel must equal prompt_feat.npy.
        let raw_tokens = npy::read(&reference.join("golden").join(case).join("prompt_speech_token_raw.npy")).unwrap();
        let raw_tokens: Vec<i64> = raw_tokens.to_i64(Path::new("raw")).unwrap().iter().copied().collect();
        let (tokens, aligned) = align_prompt(&raw_tokens, &mel);
        let gold_tokens = npy::read(&reference.join("golden").join(case).join("prompt_speech_token.npy")).unwrap();
        let gold_tokens: Vec<i64> = gold_tokens.to_i64(Path::new("tok")).unwrap().iter().copied().collect();
        assert_eq!(tokens, gold_tokens, "{case}: aligned tokens"); // integer-only: the golden tokens cut to length
        let e_feat = max_abs(&aligned, &golden(&reference, case, "prompt_feat.npy"), "prompt_feat");

        println!(
            "{case:>6}: whisper_mel {e_whisper:.3e}  campplus_fbank {e_fbank:.3e}  prompt_feat_raw {e_mel:.3e}  prompt_feat {e_feat:.3e}"
        );
        for (w, e) in worst.iter_mut().zip([e_whisper, e_fbank, e_mel, e_feat]) {
            *w = w.max(e);
        }
        assert!(e_whisper <= 2e-4, "{case}: whisper_mel max-abs {e_whisper}");
        assert!(e_fbank <= 2e-3, "{case}: campplus_fbank max-abs {e_fbank}");
        assert!(e_mel <= 5e-3, "{case}: prompt_feat_raw max-abs {e_mel}");
        assert!(e_feat <= 5e-3, "{case}: prompt_feat max-abs {e_feat}");
    }
    println!("worst: whisper {:.3e} fbank {:.3e} mel {:.3e} feat {:.3e}", worst[0], worst[1], worst[2], worst[3]);
}

#[test]
fn decodes_both_reference_prompts() {
    let Some(shared) = shared_dir() else { return };
    let p24 = load_audio(&shared.join("reference/prompts/prompt_24k.wav")).unwrap();
    assert_eq!((p24.sample_rate, p24.samples.len()), (24000, 74400));
    let p16 = load_audio(&shared.join("reference/prompts/prompt_16k.wav")).unwrap();
    assert_eq!((p16.sample_rate, p16.samples.len()), (16000, 40000));
}

fn write_wav_i16(path: &Path, rate: u32, channels: u16, samples: &[i16]) {
    let spec = hound::WavSpec { channels, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &s in samples {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
}

fn expect_input_error(path: &Path, needle: &str) {
    match load_audio(path) {
        Err(cosy::Error::Input { message: msg, .. }) => {
            assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
            assert!(msg.contains(&path.display().to_string()), "message {msg:?} does not name the file");
            assert!(!msg.contains('\n'), "message is not one line: {msg:?}");
        }
        other => panic!("{}: expected an input error with {needle:?}, got {other:?}", path.display()),
    }
}

#[test]
fn stereo_is_averaged() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("stereo.wav");
    // Interleaved L/R: L = ±16384 (±0.5), R = ∓8192 (∓0.25) → mean ±0.125 (the sign alternates
    // frame by frame: a constant is no signal, refused since issue 30).
    let samples: Vec<i16> = (0..2000).flat_map(|i| if i % 2 == 0 { [16384i16, -8192] } else { [-16384, 8192] }).collect();
    write_wav_i16(&p, 16000, 2, &samples);
    let a = load_audio(&p).unwrap();
    assert_eq!(a.samples.len(), 2000);
    assert!(a.samples.iter().enumerate().all(|(i, &x)| (x - if i % 2 == 0 { 0.125 } else { -0.125 }).abs() < 1e-7));
}

#[test]
fn bad_inputs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tone: Vec<i16> = (0..16000).map(|i| ((i as f32 * 0.05).sin() * 8000.0) as i16).collect();

    let missing = dir.path().join("missing.wav");
    expect_input_error(&missing, "cannot open");

    let garbage = dir.path().join("garbage.wav");
    std::fs::write(&garbage, b"this is not audio at all, just some text bytes").unwrap();
    expect_input_error(&garbage, "not a readable audio file");

    let empty = dir.path().join("empty.wav");
    write_wav_i16(&empty, 16000, 1, &[]);
    expect_input_error(&empty, "no samples");

    let low = dir.path().join("low.wav");
    write_wav_i16(&low, 8000, 1, &tone);
    expect_input_error(&low, "below 16000 Hz");

    let silent = dir.path().join("silent.wav");
    write_wav_i16(&silent, 16000, 1, &vec![0i16; 16000]);
    expect_input_error(&silent, "silent");

    let full = dir.path().join("full.wav");
    write_wav_i16(&full, 16000, 1, &tone);
    let bytes = std::fs::read(&full).unwrap();
    let truncated = dir.path().join("truncated.wav");
    std::fs::write(&truncated, &bytes[..bytes.len() - 10001]).unwrap();
    expect_input_error(&truncated, "truncated");

    // 31 s at 16 kHz: fine to load, refused for the speech tokenizer.
    let long = dir.path().join("long.wav");
    let long_tone: Vec<i16> = (0..16000 * 31).map(|i| ((i as f32 * 0.05).sin() * 8000.0) as i16).collect();
    write_wav_i16(&long, 16000, 1, &long_tone);
    assert!(load_at(&long, 16000, None).is_ok());
    match load_at(&long, 16000, Some(MAX_TOKENIZER_SECONDS)) {
        Err(cosy::Error::Input { message: msg, .. }) => assert!(msg.contains("at most 30 s"), "{msg}"),
        other => panic!("expected a length error, got {other:?}"),
    }
}
