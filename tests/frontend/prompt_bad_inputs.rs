//! Prompt audio and saved voices that used to hang, blow up memory, or fail late (issue 9, item
//! 9): odd and absurd sample rates, FIFOs, devices and `/dev/stdin`, folders, too-short and
//! too-long prompts, racing `voice add`, NaN in voices and prompts, a file as `voices.dir`.
//! CLI tests run the real binary on the bundled tiny model; every child runs under a generous
//! hang guard (it is killed and the test fails if it does not end).


use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cosy::frontend::audio::{check_length, Audio, MIN_PROMPT_SECONDS};
use cosy::voice::{SavedVoice, VoiceStore};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";
const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";
/// Hang guard: far above what any of these runs needs (a few seconds each).
const GUARD: Duration = Duration::from_secs(180);

fn prompt() -> PathBuf {
    crate::common::fixture_prompt()
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = crate::common::cosy_at_home(dir);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Waits for `child` under the hang guard; kills it and fails the test if it does not end.
fn finish(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > GUARD {
            child.kill().ok();
            let o = child.wait_with_output().expect("output");
            panic!("{what}: still running after {GUARD:?} (hang); stderr {}", String::from_utf8_lossy(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cosy(dir: &Path, args: &[&str]) -> Output {
    let child = command(dir, args).stdin(Stdio::null()).spawn().expect("run cosy");
    finish(child, &args.join(" "))
}

/// Exit 2, exactly one `cosy: …` line containing every needle, and `out` not written.
fn refuses(o: &Output, what: &str, needles: &[&str], out: &Path) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: exit {:?}, stderr {err}", o.status.code());
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: expected one line, got {err}");
    assert!(lines[0].starts_with("cosy: "), "{what}: {err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{what}: {:?} lacks {needle:?}", lines[0]);
    }
    assert!(!lines[0].contains('\u{1b}'), "{what}: ANSI escapes in {:?}", lines[0]);
    assert!(!out.exists(), "{what}: {} was written", out.display());
    lines[0].to_string()
}

fn succeeds(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: exit {:?}, stderr {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

fn tone(rate: u32, seconds: f64) -> Vec<i16> {
    (0..(rate as f64 * seconds).round() as usize).map(|i| ((i as f32 * 0.05).sin() * 8000.0) as i16).collect()
}

fn write_wav(path: &Path, rate: u32, samples: &[i16]) {
    let spec = hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &s in samples {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
}

fn file_args<'a>(wav: &'a str, out: &'a Path, text: &'a str) -> Vec<&'a str> {
    vec!["file", "--prompt-wav", wav, "--prompt-text", TRANSCRIPT, "-o", out.to_str().unwrap(), text]
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

/// `cat src > fifo` in the background (blocks until a reader opens the FIFO).
fn feed_fifo(src: &Path, fifo: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg("cat \"$1\" > \"$2\"")
        .args(["sh", src.to_str().unwrap(), fifo.to_str().unwrap()])
        .spawn()
        .expect("run sh")
}

fn stop(mut child: Child) {
    child.kill().ok();
    child.wait().ok();
}

// 1. Sample rates --------------------------------------------------------------------------------

#[test]
fn odd_sample_rates_work_and_absurd_ones_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    // 44101 Hz does not reduce against 16 kHz: torchaudio's kernel would take GBs and no end.
    let odd = dir.join("odd_44101.wav");
    write_wav(&odd, 44_101, &tone(44_101, 1.5));
    succeeds(&cosy(dir, &file_args(odd.to_str().unwrap(), &out, TEXT)), "44101 Hz prompt");
    assert!(out.is_file());
    std::fs::remove_file(&out).unwrap();

    // A header claiming 4294967295 Hz, and one just above the 384 kHz bound.
    let huge = dir.join("huge_rate.wav");
    write_wav(&huge, 24_000, &tone(24_000, 1.0));
    let mut bytes = std::fs::read(&huge).unwrap();
    bytes[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&huge, &bytes).unwrap();
    let above = dir.join("above.wav");
    write_wav(&above, 384_001, &tone(384_001, 0.5));
    for (wav, rate) in [(&huge, "4294967295 Hz"), (&above, "384001 Hz")] {
        let w = wav.to_str().unwrap();
        let what = format!("rate {rate}");
        refuses(&cosy(dir, &file_args(w, &out, TEXT)), &what, &[w, rate, "above 384000 Hz"], &out);
        let voice_file = dir.join("voices/v.safetensors");
        refuses(&cosy(dir, &["voice", "add", "v", "--wav", w, "--text", TRANSCRIPT]), &what, &[w, rate], &voice_file);
    }
}

#[test]
fn odd_rates_load_in_bounded_time_at_library_level() {
    let d = tempfile::tempdir().unwrap();
    for rate in [44_101u32, 47_999, 96_001] {
        let p = d.path().join(format!("r{rate}.wav"));
        write_wav(&p, rate, &tone(rate, 2.0));
        for target in [16_000u32, 24_000] {
            let y = cosy::frontend::audio::load_at(&p, target, Some(30.0)).expect("odd rate resamples");
            let expect = (u64::from(target) * u64::from(2 * rate)).div_ceil(u64::from(rate));
            assert_eq!(y.len() as u64, expect, "{rate} -> {target}");
            assert!(y.iter().all(|x| x.is_finite()));
        }
    }
}

// 2./3. What is not a regular file ----------------------------------------------------------------

#[test]
fn a_fifo_without_a_writer_is_refused_not_waited_on_forever() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    let fifo = dir.join("prompt.fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    refuses(&cosy(dir, &file_args(f, &out, TEXT)), "FIFO, no writer", &[f, "FIFO", "nothing writing"], &out);
    let voice_file = dir.join("voices/v.safetensors");
    let o = cosy(dir, &["voice", "add", "v", "--wav", f, "--text", TRANSCRIPT]);
    refuses(&o, "voice add: FIFO, no writer", &[f, "FIFO"], &voice_file);
}

#[test]
fn a_fed_fifo_and_a_piped_stdin_work() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let fifo = dir.join("prompt.fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    // `cosy file` reads the prompt twice (early check, then the pipeline): one read must do.
    let out = dir.join("fifo.wav");
    let writer = feed_fifo(&prompt(), &fifo);
    let o = cosy(dir, &file_args(f, &out, TEXT));
    stop(writer);
    succeeds(&o, "fed FIFO");
    assert!(out.is_file());

    let writer = feed_fifo(&prompt(), &fifo);
    let o = cosy(dir, &["voice", "add", "fifo", "--wav", f, "--text", TRANSCRIPT]);
    stop(writer);
    succeeds(&o, "voice add from a fed FIFO");
    assert!(dir.join("voices/fifo.safetensors").is_file());

    // /dev/stdin, a pipe fed by this test.
    let out = dir.join("stdin.wav");
    let mut child = command(dir, &file_args("/dev/stdin", &out, TEXT)).stdin(Stdio::piped()).spawn().expect("run cosy");
    let bytes = std::fs::read(prompt()).unwrap();
    let mut stdin = child.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || {
        stdin.write_all(&bytes).ok();
    });
    let o = finish(child, "/dev/stdin");
    feeder.join().unwrap();
    succeeds(&o, "prompt on /dev/stdin");
    assert!(out.is_file());
}

#[test]
fn devices_folders_and_empty_streams_get_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    // /dev/zero never ends: the byte bound stops it.
    refuses(&cosy(dir, &file_args("/dev/zero", &out, TEXT)), "/dev/zero", &["/dev/zero", "too large"], &out);
    // /dev/stdin from /dev/null: nothing to read.
    refuses(&cosy(dir, &file_args("/dev/stdin", &out, TEXT)), "empty stdin", &["/dev/stdin", "is empty"], &out);
    // A folder.
    let folder = dir.join("recordings");
    std::fs::create_dir(&folder).unwrap();
    let f = folder.to_str().unwrap();
    refuses(&cosy(dir, &file_args(f, &out, TEXT)), "folder", &[f, "is a folder"], &out);
    let voice_file = dir.join("voices/v.safetensors");
    let o = cosy(dir, &["voice", "add", "v", "--wav", f, "--text", TRANSCRIPT]);
    refuses(&o, "voice add: folder", &[f, "is a folder"], &voice_file);
}

// 4./5. Prompt length ------------------------------------------------------------------------------

#[test]
fn too_short_prompts_are_refused_up_front_with_the_minimum() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    for ms in [10u32, 20, 44] {
        let p = dir.join(format!("p{ms}ms.wav"));
        write_wav(&p, 24_000, &tone(24_000, f64::from(ms) / 1000.0));
        let w = p.to_str().unwrap();
        let what = format!("{ms} ms prompt");
        // One line, no ONNX Runtime log: refused before any model runs.
        refuses(&cosy(dir, &file_args(w, &out, TEXT)), &what, &[w, "at least 0.045 s"], &out);
        refuses(&cosy(dir, &["file", "--prompt-wav", w, "-o", out.to_str().unwrap(), TEXT]), &what, &["at least 0.045 s"], &out);
        let voice_file = dir.join("voices/v.safetensors");
        refuses(&cosy(dir, &["voice", "add", "v", "--wav", w, "--text", TRANSCRIPT]), &what, &["at least 0.045 s"], &voice_file);
    }
    // The minimum itself goes through every stage.
    let p = dir.join("p45ms.wav");
    write_wav(&p, 24_000, &tone(24_000, 0.045));
    succeeds(&cosy(dir, &file_args(p.to_str().unwrap(), &out, TEXT)), "45 ms prompt");
    assert!(out.is_file());
}

#[test]
fn the_minimum_length_is_exact_at_every_rate() {
    let path = Path::new("p.wav");
    let audio = |rate: u32, n: usize| Audio { samples: vec![0.1; n], sample_rate: rate };
    // 720 samples at 16 kHz (3 fbank frames) and 960 at 24 kHz (2 mel frames), counted after
    // resampling (ceil(16000·n/rate)): 1079 samples at 24 kHz become 720 at 16 kHz.
    assert!(check_length(&audio(16_000, 719), path, 30.0).is_err());
    assert!(check_length(&audio(16_000, 720), path, 30.0).is_ok());
    assert!(check_length(&audio(24_000, 1078), path, 30.0).is_err());
    assert!(check_length(&audio(24_000, 1079), path, 30.0).is_ok());
    assert!(check_length(&audio(48_000, 2157), path, 30.0).is_err());
    assert!(check_length(&audio(48_000, 2158), path, 30.0).is_ok());
    let msg = check_length(&audio(44_100, 100), path, 30.0).unwrap_err().to_string();
    assert!(msg.contains(&format!("at least {MIN_PROMPT_SECONDS} s")) && msg.contains("p.wav"), "{msg}");
    // The tokenizer's limit, at 16 kHz as the official check measures it.
    assert!(check_length(&audio(16_000, 480_000), path, 30.0).is_ok());
    let msg = check_length(&audio(16_000, 480_001), path, 30.0).unwrap_err().to_string();
    assert!(msg.contains("at most 30 s"), "{msg}");
}

#[test]
fn prompts_and_sentences_must_fit_the_flow_noise() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    // The tiny model's flow noise is 1500 frames (30 s): a 30.0 s prompt passes the tokenizer's
    // 30 s but leaves no room; refused up front, with the real limit (29.2 s: 40 frames stay for
    // the longest speech of a one-token sentence).
    let p30 = dir.join("p30.wav");
    write_wav(&p30, 24_000, &tone(24_000, 30.0));
    let w = p30.to_str().unwrap();
    for args in [file_args(w, &out, TEXT), vec!["say", "--prompt-wav", w, "--prompt-text", TRANSCRIPT, TEXT]] {
        refuses(&cosy(dir, &args), "30 s prompt", &[w, "is 30 s long; this model takes at most 29.2 s of prompt"], &out);
    }
    let voice_file = dir.join("voices/v.safetensors");
    refuses(&cosy(dir, &["voice", "add", "v", "--wav", w, "--text", TRANSCRIPT]), "voice add: 30 s prompt", &["at most 29.2 s"], &voice_file);
    // 29.2 s fits, leaving 40 frames (20 speech tokens) for the sentence. A forced token count
    // beyond that is refused up front, before the LLM runs.
    let p29 = dir.join("p29.wav");
    write_wav(&p29, 24_000, &tone(24_000, 29.2));
    let w = p29.to_str().unwrap();
    let mut forced = file_args(w, &out, TEXT);
    forced.splice(1..1, ["--min-tokens", "25"]);
    refuses(&cosy(dir, &forced), "29.2 s prompt, 25 forced tokens", &["--min-tokens 25", "room for 20"], &out);
    // Without forcing, the official loop may stop at any step, so the sentence is not refused for
    // what it might become: it runs, capped at the noise. A run that stops in time writes its file;
    // one that reaches the cap is refused naming the sentence (the official code would fail in the
    // flow there) and writes nothing. Over a few sampling seeds both happen on the tiny model; which
    // seed does which is a sampling outcome, so only the set is asserted.
    let mut cut = 0;
    for seed in ["0", "1", "2", "3", "4", "5"] {
        let mut args = file_args(w, &out, TEXT);
        args.splice(1..1, ["--seed", seed]);
        let mut with_sampling = vec!["--set", "sampling.top_k=25", "--set", "sampling.tau_r=0.1"];
        with_sampling.extend(args);
        let o = cosy(dir, &with_sampling);
        if o.status.success() {
            assert!(out.is_file(), "seed {seed}: exit 0 without {}", out.display());
            std::fs::remove_file(&out).unwrap();
        } else {
            refuses(&o, &format!("seed {seed}: capped sentence"), &["sentence 1 of 1", "ran past 0.8 s", "flow noise"], &out);
            cut += 1;
        }
    }
    assert!(cut > 0, "no seed reached the noise cap; the capped path went untested");
}

// 6. Two `voice add` of one name at once -------------------------------------------------------------

fn voice(name: &str, salt: f32) -> SavedVoice {
    let l = 5;
    SavedVoice {
        name: name.into(),
        transcript: format!("take {salt}"),
        speech_token: vec![1, 2, 3, 4, 5],
        prompt_feat: ndarray::Array2::from_elem((2 * l, 80), salt),
        embedding: vec![salt; 192],
        model_key: "ab".repeat(32),
        model: "/m".into(),
        frontend_precision: "fp32".into(),
        source_wav: "a.wav".into(),
        created: "2024-01-02T03:04:05Z".into(),
        cosy_version: "0".into(),
    }
}

#[test]
fn concurrent_saves_of_one_new_name_let_exactly_one_win() {
    let d = tempfile::tempdir().unwrap();
    let store = VoiceStore::new(d.path().join("voices"));
    for round in 0..40 {
        let name = format!("v{round}");
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<(f32, Result<PathBuf, String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = [1.0f32, 2.0]
                .into_iter()
                .map(|salt| {
                    let (store, barrier, v) = (&store, &barrier, voice(&name, salt));
                    s.spawn(move || {
                        barrier.wait();
                        (salt, store.save(&v, false).map_err(|e| e.to_string()))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<f32> = results.iter().filter(|(_, r)| r.is_ok()).map(|(s, _)| *s).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let loser = results.iter().find_map(|(_, r)| r.as_ref().err()).unwrap();
        assert!(loser.contains("already exists"), "round {round}: {loser}");
        // The file is the winner's, whole.
        assert_eq!(store.load(&name).unwrap().embedding[0], winners[0], "round {round}");
    }
    // --force replaces (atomically) and both replacing saves succeed.
    let results: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = [3.0f32, 4.0].into_iter().map(|salt| {
            let store = &store;
            s.spawn(move || store.save(&voice("v0", salt), true).is_ok())
        }).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results, vec![true, true]);
    assert!([3.0, 4.0].contains(&store.load("v0").unwrap().embedding[0]));
    // No temporary files are left behind.
    let stray: Vec<_> = std::fs::read_dir(&store.dir).unwrap().filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect();
    assert!(stray.is_empty(), "{stray:?}");
}

// 7. NaN / inf -----------------------------------------------------------------------------------------

#[test]
fn nan_in_a_voice_or_a_prompt_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = dir.join("o.wav");
    let p = prompt();
    succeeds(&cosy(dir, &["voice", "add", "good", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]), "voice add");
    let store = VoiceStore::new(dir.join("voices"));
    let good = store.load("good").unwrap();
    let mut nan_embedding = good.clone();
    nan_embedding.name = "nanemb".into();
    nan_embedding.embedding[7] = f32::NAN;
    let mut inf_feat = good.clone();
    inf_feat.name = "inffeat".into();
    inf_feat.prompt_feat[[3, 5]] = f32::INFINITY;
    for v in [&nan_embedding, &inf_feat] {
        // Written past the store (as a damaged file would be): `save` writes what it is given.
        std::fs::write(store.path_of(&v.name), v.to_bytes().unwrap()).unwrap();
        let o = cosy(dir, &["file", "--voice", &v.name, "-o", out.to_str().unwrap(), TEXT]);
        let line = refuses(&o, &format!("voice {}", v.name), &[&v.name, "NaN or infinite", "--force"], &out);
        assert!(line.contains(&format!("cosy voice add {}", v.name)), "{line}");
    }
    // A damaged file copied under another name: the message names the file the user's name led
    // to, and a command that replaces that file, not the name stored inside.
    std::fs::copy(store.path_of("nanemb"), store.path_of("copy")).unwrap();
    let o = cosy(dir, &["file", "--voice", "copy", "-o", out.to_str().unwrap(), TEXT]);
    let copy = store.path_of("copy");
    let line = refuses(&o, "renamed damaged voice", &[&copy.display().to_string(), "NaN or infinite"], &out);
    assert!(line.contains("cosy voice add copy --wav FILE --text TEXT --force") && !line.contains("nanemb"), "{line}");
    // A float wav with NaN (or inf) samples.
    for (name, bad) in [("nan.wav", f32::NAN), ("inf.wav", f32::INFINITY)] {
        let path = dir.join(name);
        let spec = hound::WavSpec { channels: 1, sample_rate: 24_000, bits_per_sample: 32, sample_format: hound::SampleFormat::Float };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for i in 0..48_000 {
            w.write_sample(if i == 1000 { bad } else { (i as f32 * 0.05).sin() * 0.3 }).unwrap();
        }
        w.finalize().unwrap();
        let wp = path.to_str().unwrap();
        refuses(&cosy(dir, &file_args(wp, &out, TEXT)), name, &[wp, "NaN or infinite"], &out);
    }
}

// 8. voices.dir is a file ------------------------------------------------------------------------------

#[test]
fn a_file_as_voices_dir_is_named_as_a_file() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let file = dir.join("not_a_folder");
    std::fs::write(&file, "x").unwrap();
    let set = format!("voices.dir={}", file.display());
    let f = file.to_str().unwrap();
    let p = prompt();
    let out = dir.join("o.wav");
    let o = cosy(dir, &["--set", &set, "voice", "add", "v", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]);
    refuses(&o, "voice add", &[f, "is a file, not a folder"], &out);
    refuses(&cosy(dir, &["--set", &set, "voice", "list"]), "voice list", &[f, "is a file, not a folder"], &out);
    refuses(&cosy(dir, &["--set", &set, "file", "--voice", "v", "-o", out.to_str().unwrap(), TEXT]), "file --voice", &[f, "is a file"], &out);
    // A folder under a file, at library level too.
    let store = VoiceStore::new(file.join("sub"));
    let msg = store.save(&voice("v", 1.0), false).unwrap_err().to_string();
    assert!(msg.contains("is a file, not a folder") && msg.contains(f), "{msg}");
}
