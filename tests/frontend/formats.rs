//! Prompt audio in the compressed formats the frontend accepts (flac, ogg/vorbis, mp3) decodes to
//! the same audio as the wav it was made from (tests/data/make_audio_formats.py): exactly for
//! flac, closely for the lossy codecs; stereo is averaged to mono as for wav.

use std::path::PathBuf;

use cosy::frontend::audio::{load_at, load_audio, Audio};

fn fixture(ext: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats").join(format!("speechlike.{ext}"))
}

fn wav() -> Audio {
    load_audio(&fixture("wav")).expect("wav decodes")
}

/// Largest normalised cross-correlation of `b` against `a` over lags in `-max_lag..=max_lag`
/// (lossy encoders may add a delay), with the lag that gives it.
fn best_correlation(a: &[f32], b: &[f32], max_lag: isize) -> (f64, isize) {
    let mut best = (f64::MIN, 0);
    for lag in -max_lag..=max_lag {
        let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
        for (i, &x) in a.iter().enumerate() {
            let j = i as isize + lag;
            if j < 0 || j as usize >= b.len() {
                continue;
            }
            let y = b[j as usize];
            ab += f64::from(x) * f64::from(y);
            aa += f64::from(x) * f64::from(x);
            bb += f64::from(y) * f64::from(y);
        }
        let c = ab / (aa.sqrt() * bb.sqrt()).max(1e-12);
        if c > best.0 {
            best = (c, lag);
        }
    }
    best
}

#[test]
fn the_wav_is_stereo_averaged_to_mono() {
    let a = wav();
    assert_eq!(a.sample_rate, 24_000);
    assert_eq!(a.samples.len(), 28_800, "1.2 s at 24 kHz");
    // The right channel is half the left, so the mono mix is 0.75 · left: its peak is about
    // 0.75 · 0.25 · (the harmonic sum's peak) and well above silence.
    let peak = a.samples.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(peak > 0.1 && peak < 0.9, "peak {peak}");
}

#[test]
fn flac_decodes_to_exactly_the_wav_samples() {
    let (w, f) = (wav(), load_audio(&fixture("flac")).expect("flac decodes"));
    assert_eq!(f.sample_rate, w.sample_rate);
    assert_eq!(f.samples.len(), w.samples.len());
    // Exact: flac decodes to the wav's integers, which go through the same int → f32 scaling and mono mix.
    assert!(f.samples.iter().zip(&w.samples).all(|(a, b)| a.to_bits() == b.to_bits()), "lossless");
}

#[test]
fn ogg_vorbis_and_mp3_decode_close_to_the_wav() {
    let w = wav();
    for (ext, min_corr) in [("ogg", 0.99), ("mp3", 0.99)] {
        let a = load_audio(&fixture(ext)).unwrap_or_else(|e| panic!("{ext} decodes: {e}"));
        assert_eq!(a.sample_rate, 24_000, "{ext}");
        let extra = a.samples.len() as isize - w.samples.len() as isize;
        assert!(extra.abs() <= 2_400, "{ext}: {} samples for {} (at most 0.1 s of codec padding)", a.samples.len(), w.samples.len());
        let (corr, lag) = best_correlation(&w.samples, &a.samples, 2_400);
        eprintln!("{ext}: {} samples, correlation {corr:.4} at lag {lag}", a.samples.len());
        assert!(corr >= min_corr, "{ext}: correlation {corr:.4} at lag {lag}");
    }
}

#[test]
fn every_format_reaches_the_16k_tokenizer_path() {
    let reference = load_at(&fixture("wav"), 16_000, Some(30.0)).expect("wav at 16 kHz");
    assert_eq!(reference.len(), 19_200);
    for ext in ["flac", "ogg", "mp3"] {
        let s = load_at(&fixture(ext), 16_000, Some(30.0)).unwrap_or_else(|e| panic!("{ext}: {e}"));
        assert!((s.len() as isize - 19_200).abs() <= 1_600, "{ext}: {} samples at 16 kHz", s.len());
    }
}

#[test]
fn a_cut_off_compressed_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tmp");
    for ext in ["flac", "ogg", "mp3"] {
        let bytes = std::fs::read(fixture(ext)).expect("fixture");
        let cut = dir.path().join(format!("cut.{ext}"));
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
        match load_audio(&cut) {
            Ok(a) => panic!("{ext}: half a file decoded as {} samples without complaint", a.samples.len()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&cut.display().to_string()), "{ext}: {msg}");
                assert!(msg.contains("truncated") || msg.contains("damaged"), "{ext}: {msg}");
                assert_eq!(msg.lines().count(), 1, "{ext}: {msg}");
            }
        }
    }
}

#[test]
fn an_empty_file_says_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let empty = dir.path().join("empty.flac");
    std::fs::write(&empty, b"").expect("write");
    let msg = load_audio(&empty).expect_err("empty file").to_string();
    assert!(msg.contains("empty.flac") && msg.contains("empty file (0 bytes)"), "{msg}");
}

/// 24-bit and float WAV carry the same audio as the 16-bit one (scaled by 2^(bits−1)).
#[test]
fn wav_24_bit_and_float_decode_to_the_same_samples() {
    let w = wav();
    let dir = tempfile::tempdir().expect("tmp");
    let write = |name: &str, spec: hound::WavSpec| -> PathBuf {
        let path = dir.path().join(name);
        let mut out = hound::WavWriter::create(&path, spec).expect("create");
        for &x in &w.samples {
            match spec.sample_format {
                hound::SampleFormat::Int => out.write_sample((x * 8_388_608.0).round() as i32).expect("write"),
                hound::SampleFormat::Float => out.write_sample(x).expect("write"),
            }
        }
        out.finalize().expect("finalize");
        path
    };
    let spec = |bits, sample_format| hound::WavSpec { channels: 1, sample_rate: 24_000, bits_per_sample: bits, sample_format };
    for path in [
        write("s24.wav", spec(24, hound::SampleFormat::Int)),
        write("f32.wav", spec(32, hound::SampleFormat::Float)),
    ] {
        let a = load_audio(&path).expect("decodes");
        assert_eq!(a.sample_rate, 24_000);
        // Exact: the 16-bit samples scaled by powers of two, written and read back.
        assert_eq!(a.samples, w.samples, "{}", path.display());
    }
}
