//! Audio files: format names, atomic writes (round trips, errors leave nothing behind), the
//! streaming writer's finish/drop rules, raw PCM streaming, and the resampler.

use std::fs::{self, File};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

use cosy::audio::{
    f32_to_i16, write_audio_atomic, write_audio_atomic_with, write_pcm16_stream, OutputFormat, Resampler,
    WavStreamWriter,
};
use cosy::Error;

const RATE: u32 = 24_000;

fn sine(n: usize, freq: f32, rate: u32, amp: f32) -> Vec<f32> {
    (0..n)
        .map(|i| amp * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
        .collect()
}

/// Values that exercise rounding, clamping and NaN.
fn edge_samples() -> Vec<f32> {
    vec![
        0.0,
        1.0,
        -1.0,
        1.5,
        -2.0,
        0.5,
        -0.5,
        1.0 / 32767.0 * 0.49,
        1.0 / 32767.0 * 0.51,
        -1.0 / 32767.0 * 0.51,
        f32::NAN,
        0.25,
    ]
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn format_names_parse_and_unknown_ones_list_the_allowed_set() {
    assert_eq!("wav16".parse::<OutputFormat>().unwrap(), OutputFormat::Wav16);
    assert_eq!("WAVF32".parse::<OutputFormat>().unwrap(), OutputFormat::WavF32);
    assert_eq!("pcm".parse::<OutputFormat>().unwrap(), OutputFormat::Pcm16);
    for f in [OutputFormat::Wav16, OutputFormat::WavF32, OutputFormat::Pcm16] {
        assert_eq!(f.to_string().parse::<OutputFormat>().unwrap(), f);
    }
    for bad in ["mp3", "wav", "", "pcm16le"] {
        let msg = bad.parse::<OutputFormat>().unwrap_err().to_string();
        assert!(msg.contains("wav16, wavf32, pcm"), "{msg}");
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
    }
}

#[test]
fn int16_conversion_rounds_clamps_and_maps_nan_to_zero() {
    let got: Vec<i16> = edge_samples().into_iter().map(f32_to_i16).collect();
    // IEEE-exact: a clamp, one f32 product and a round per sample, the same on every CPU.
    assert_eq!(
        got,
        vec![0, 32767, -32767, 32767, -32767, 16384, -16384, 0, 1, -1, 0, 8192]
    );
}

#[test]
fn wav16_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.wav");
    let samples = edge_samples();
    write_audio_atomic(&path, &samples, RATE, OutputFormat::Wav16).unwrap();
    let mut reader = hound::WavReader::open(&path).unwrap();
    let spec = reader.spec();
    assert_eq!((spec.channels, spec.sample_rate, spec.bits_per_sample), (1, RATE, 16));
    assert_eq!(spec.sample_format, hound::SampleFormat::Int);
    let read: Vec<i16> = reader.samples::<i16>().map(|s| s.unwrap()).collect();
    let expected: Vec<i16> = samples.iter().map(|&x| f32_to_i16(x)).collect();
    assert_eq!(read, expected); // written and read back, same conversion: exact
    assert_eq!(dir_entries(dir.path()), vec!["out.wav"]);
}

#[test]
fn wavf32_round_trip_keeps_values_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.wav");
    let mut samples = sine(1000, 440.0, RATE, 0.8);
    samples.extend([1.5, -3.0, 1e-30]); // float WAV is not clamped
    write_audio_atomic(&path, &samples, 16_000, OutputFormat::WavF32).unwrap();
    let mut reader = hound::WavReader::open(&path).unwrap();
    let spec = reader.spec();
    assert_eq!((spec.channels, spec.sample_rate, spec.bits_per_sample), (1, 16_000, 32));
    assert_eq!(spec.sample_format, hound::SampleFormat::Float);
    let read: Vec<u32> = reader.samples::<f32>().map(|s| s.unwrap().to_bits()).collect();
    let expected: Vec<u32> = samples.iter().map(|x| x.to_bits()).collect();
    assert_eq!(read, expected); // written and read back: exact
}

#[test]
fn pcm_file_is_raw_little_endian_int16() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.pcm");
    write_audio_atomic(&path, &[0.0, 1.0, -1.0, 0.5, -1.0 / 32767.0], RATE, OutputFormat::Pcm16).unwrap();
    // IEEE-exact conversions of these values (0.5 · 32767 = 16383.5 rounds away from zero).
    assert_eq!(
        fs::read(&path).unwrap(),
        vec![0, 0, 0xff, 0x7f, 0x01, 0x80, 0x00, 0x40, 0xff, 0xff]
    );
}

#[test]
fn overwriting_replaces_the_old_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.wav");
    write_audio_atomic(&path, &sine(5000, 300.0, RATE, 0.5), RATE, OutputFormat::Wav16).unwrap();
    write_audio_atomic(&path, &[0.25; 10], RATE, OutputFormat::Wav16).unwrap();
    let read: Vec<i16> = hound::WavReader::open(&path)
        .unwrap()
        .samples::<i16>()
        .map(|s| s.unwrap())
        .collect();
    assert_eq!(read, vec![8192; 10]); // 0.25 · 32767 = 8191.75: exact in f32
    assert_eq!(dir_entries(dir.path()), vec!["out.wav"]);
}

#[test]
fn missing_folder_error_names_the_path_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-folder").join("out.wav");
    let err = write_audio_atomic(&path, &[0.0; 10], RATE, OutputFormat::Wav16).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("does not exist") && msg.contains("create it"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(dir_entries(dir.path()).is_empty());
}

#[test]
fn unwritable_folder_error_names_the_path_and_leaves_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).unwrap();
    let probe = locked.join("probe");
    if File::create(&probe).is_ok() {
        // Running as root (or with CAP_DAC_OVERRIDE): permissions cannot be denied here. Use a path
        // whose parent is a regular file instead, which fails for everyone.
        fs::remove_file(&probe).unwrap();
        let file_as_folder = dir.path().join("plainfile");
        fs::write(&file_as_folder, b"x").unwrap();
        let path = file_as_folder.join("out.wav");
        let msg = write_audio_atomic(&path, &[0.0; 10], RATE, OutputFormat::Wav16)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
        assert_eq!(dir_entries(dir.path()), vec!["locked", "plainfile"]);
    } else {
        let path = locked.join("out.wav");
        let msg = write_audio_atomic(&path, &[0.0; 10], RATE, OutputFormat::Wav16)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("not writable"), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
    assert!(dir_entries(&locked).is_empty());
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A file layer that accepts `budget` bytes and then fails like a full disk.
struct FailAfter {
    inner: File,
    budget: usize,
}

impl Write for FailAfter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.budget == 0 {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "No space left on device (simulated)",
            ));
        }
        let n = buf.len().min(self.budget);
        self.budget -= n;
        self.inner.write(&buf[..n])
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Seek for FailAfter {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[test]
fn disk_full_midway_leaves_no_partial_file_and_keeps_an_old_output() {
    let samples = sine(20_000, 440.0, RATE, 0.5);
    for format in [OutputFormat::Wav16, OutputFormat::WavF32, OutputFormat::Pcm16] {
        for budget in [0usize, 10, 44, 1000, 30_000] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("speech.wav");
            let err = write_audio_atomic_with(&path, &samples, RATE, format, |inner| FailAfter { inner, budget })
                .unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains("disk is full"),
                "{format} {budget}: {msg}"
            );
            assert_eq!(msg.lines().count(), 1);
            assert!(
                dir_entries(dir.path()).is_empty(),
                "{format} {budget}: {:?}",
                dir_entries(dir.path())
            );

            // An existing file at the destination stays untouched.
            fs::write(&path, b"previous").unwrap();
            write_audio_atomic_with(&path, &samples, RATE, format, |inner| FailAfter { inner, budget }).unwrap_err();
            assert_eq!(fs::read(&path).unwrap(), b"previous");
            assert_eq!(dir_entries(dir.path()), vec!["speech.wav"]);
        }
    }
}

#[test]
fn streaming_writer_appends_chunks_and_finish_renames_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stream.wav");
    let samples = sine(10_000, 220.0, RATE, 0.9);
    let mut writer = WavStreamWriter::create(&path, RATE, OutputFormat::Wav16).unwrap();
    for chunk in samples.chunks(1234) {
        writer.append(chunk).unwrap();
        // Until finish, only the hidden partial file exists.
        assert!(!path.exists());
    }
    let partial = format!(".stream.wav.partial-{}", std::process::id());
    assert_eq!(dir_entries(dir.path()), vec![partial]);
    assert_eq!(writer.samples_written(), samples.len() as u64);
    writer.finish().unwrap();
    assert_eq!(dir_entries(dir.path()), vec!["stream.wav"]);
    let read: Vec<i16> = hound::WavReader::open(&path)
        .unwrap()
        .samples::<i16>()
        .map(|s| s.unwrap())
        .collect();
    assert_eq!(read, samples.iter().map(|&x| f32_to_i16(x)).collect::<Vec<_>>()); // same conversion: exact
}

#[test]
fn streaming_writer_in_each_format_matches_the_one_shot_writer() {
    let dir = tempfile::tempdir().unwrap();
    let samples = sine(7_777, 1000.0, RATE, 0.7);
    for format in [OutputFormat::Wav16, OutputFormat::WavF32, OutputFormat::Pcm16] {
        let one_shot = dir.path().join(format!("one.{}", format.name()));
        let streamed = dir.path().join(format!("streamed.{}", format.name()));
        write_audio_atomic(&one_shot, &samples, RATE, format).unwrap();
        let mut writer = WavStreamWriter::create(&streamed, RATE, format).unwrap();
        for chunk in samples.chunks(500) {
            writer.append(chunk).unwrap();
        }
        writer.finish().unwrap();
        // One process, the same per-sample conversion on both paths: identical bytes.
        assert_eq!(fs::read(&one_shot).unwrap(), fs::read(&streamed).unwrap(), "{format}");
    }
}

#[test]
fn streaming_writer_dropped_without_finish_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cancelled.wav");
    fs::write(&path, b"older take").unwrap();
    {
        let mut writer = WavStreamWriter::create(&path, RATE, OutputFormat::WavF32).unwrap();
        writer.append(&sine(4800, 440.0, RATE, 0.5)).unwrap();
        assert_eq!(dir_entries(dir.path()).len(), 2);
    }
    assert_eq!(dir_entries(dir.path()), vec!["cancelled.wav"]);
    assert_eq!(fs::read(&path).unwrap(), b"older take");
}

#[test]
fn streaming_writer_failure_is_reported_once_and_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.wav");
    let mut writer = WavStreamWriter::create_with(&path, RATE, OutputFormat::Wav16, |inner| FailAfter {
        inner,
        budget: 3000,
    })
    .unwrap();
    let chunk = sine(1000, 440.0, RATE, 0.5); // 2000 bytes per chunk
    writer.append(&chunk).unwrap();
    let msg = writer.append(&chunk).unwrap_err().to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("disk is full"),
        "{msg}"
    );
    let again = writer.append(&chunk).unwrap_err().to_string();
    assert!(again.contains("already failed"), "{again}");
    assert!(writer.finish().is_err());
    assert!(dir_entries(dir.path()).is_empty());
}

#[test]
fn pcm_stream_writes_each_chunk_as_raw_int16() {
    let mut out = Vec::new();
    write_pcm16_stream(&mut out, &[0.5, -0.5]).unwrap();
    write_pcm16_stream(&mut out, &[]).unwrap();
    write_pcm16_stream(&mut out, &[1.0]).unwrap();
    assert_eq!(out, vec![0x00, 0x40, 0x00, 0xc0, 0xff, 0x7f]); // IEEE-exact conversions
}

#[test]
fn pcm_stream_to_a_full_device_is_a_clear_error() {
    let Ok(full) = fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("no /dev/full on this system; skipped");
        return;
    };
    let err = write_pcm16_stream(&full, &sine(100_000, 440.0, RATE, 0.5)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("<stdout>: ") && msg.contains("full"), "{msg}");
    assert_eq!(msg.lines().count(), 1);
}

#[test]
fn resampler_identity_passes_samples_through() {
    let input = sine(1000, 440.0, RATE, 0.5);
    let mut r = Resampler::new(RATE, RATE);
    let mut out = r.process(&input[..300]);
    out.extend(r.process(&input[300..]));
    out.extend(r.flush());
    assert_eq!(out, input); // identity rates copy the samples
}

#[test]
fn resampler_reproduces_a_sine_at_other_rates() {
    let n = 24_000;
    let input = sine(n, 1000.0, RATE, 0.5);
    for out_rate in [48_000u32, 44_100, 16_000, 22_050] {
        let mut r = Resampler::new(RATE, out_rate);
        let mut out = Vec::new();
        for chunk in input.chunks(1000) {
            out.extend(r.process(chunk));
        }
        out.extend(r.flush());
        assert_eq!(
            out.len(),
            (n as u64 * out_rate as u64).div_ceil(RATE as u64) as usize,
            "{out_rate}"
        );
        let expected = sine(out.len(), 1000.0, out_rate, 0.5);
        // Away from the edges (where the input starts/ends abruptly) the output is the same sine.
        let margin = out_rate as usize / 100;
        let max_err = out[margin..out.len() - margin]
            .iter()
            .zip(&expected[margin..out.len() - margin])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max_err < 2e-3, "{out_rate}: max error {max_err}");
    }
}

#[test]
fn resampler_output_does_not_depend_on_chunking() {
    let input = sine(5000, 3000.0, RATE, 0.9);
    let mut whole = Resampler::new(RATE, 44_100);
    let mut reference = whole.process(&input);
    reference.extend(whole.flush());
    let mut chunked = Resampler::new(RATE, 44_100);
    let mut out = Vec::new();
    for chunk in input.chunks(7) {
        out.extend(chunked.process(chunk));
    }
    out.extend(chunked.flush());
    // Exact on any CPU: one process, and each output sample is the same f64 sum over the same taps
    // in the same order however the input was chunked.
    assert_eq!(out, reference);
}

#[test]
fn downsampling_removes_content_above_the_new_nyquist() {
    // 10 kHz cannot exist at 16 kHz (Nyquist 8 kHz): it must be filtered, not aliased to 6 kHz.
    let input = sine(24_000, 10_000.0, RATE, 0.5);
    let mut r = Resampler::new(RATE, 16_000);
    let mut out = r.process(&input);
    out.extend(r.flush());
    let rms = (out[800..15_200].iter().map(|x| x * x).sum::<f32>() / 14_400.0).sqrt();
    assert!(rms < 0.01, "aliased energy rms {rms}");
}
