//! Text-in streaming end to end: `cosy file - --bistream` and `cosy say -` (headless: ALSA's
//! null device) reading standard input as it arrives, on the reference model, against the
//! official recordings (tests/fixtures/bistream); the first audio comes before the input closes;
//! bad streamed input gets one clear line.
//!
//! A piece is what one read of standard input returns, and the official code tokenises each
//! piece on its own, so the tests fix the pieces: each is written whole (one write below the
//! pipe's atomic size) and the next only after the event log shows the previous one was read.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{export_reference_model, log_mel_distance, reference_dir, BistreamCase};

/// `cosy --model MODEL` in a clean environment whose HOME plays on ALSA's null device.
fn cosy(model: &Path, home: &Path) -> Command {
    std::fs::write(home.join(".asoundrc"), "pcm.!default { type null }\n").unwrap();
    let mut cmd = crate::common::cosy_command(&home.join("gc"));
    cmd.env("HOME", home).env("XDG_RUNTIME_DIR", home).current_dir(home).arg("--model").arg(model).args(["--provider", "cpu", "--set", "text.normalizer=none"]);
    cmd
}

fn voice_args(case: &BistreamCase, reference: &Path) -> Vec<String> {
    vec![
        "--prompt-wav".into(),
        case.prompt_wav(reference).display().to_string(),
        "--prompt-text".into(),
        case.prompt_text(),
        "--no-text-frontend".into(),
        "--seed".into(),
        case.meta["seed"].as_u64().unwrap_or(0).to_string(),
    ]
}

/// Waits until the event log has a line for which `f` holds (a guard against a hang, not a
/// timing assertion).
fn wait_log(log: &Path, child: &mut Child, what: &str, f: impl Fn(&str) -> bool) -> Vec<String> {
    let started = Instant::now();
    loop {
        let lines: Vec<String> = std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_string).collect();
        if lines.iter().any(|l| f(l)) {
            return lines;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what}: cosy ended ({status}) first; log: {lines:?}");
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{what}: not within 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `cosy say -` with the pieces written one read at a time; its first segment's LLM tokens from
/// its event log.
fn say_pieces(model: &Path, reference: &Path, case: &BistreamCase, close_after_first_audio: bool) -> (Vec<i64>, Vec<String>) {
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("events.log");
    let mut child = cosy(model, home.path())
        .arg("say")
        .arg("-")
        .args(voice_args(case, reference))
        .arg("--event-log")
        .arg(&log)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cosy say -");
    let mut stdin = child.stdin.take().unwrap();
    // The event log exists once the model is loaded.
    let started = Instant::now();
    while !log.exists() {
        assert!(started.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(10));
    }
    for (i, piece) in case.pieces().iter().enumerate() {
        stdin.write_all(piece.as_bytes()).unwrap();
        stdin.flush().unwrap();
        let n = i + 1;
        wait_log(&log, &mut child, "piece read", |l| l.split_whitespace().nth(1) == Some("text_piece") && l.split_whitespace().nth(2) == Some(&n.to_string()));
    }
    if close_after_first_audio {
        // Every piece is in but the input is still open: audio must come now.
        let lines = wait_log(&log, &mut child, "first audio", |l| l.contains(" chunk_ready "));
        assert!(!lines.iter().any(|l| l.contains("text_done")), "the input is still open");
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "cosy say -: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    // The first segment's tokens (those before its `llm_done`): when its speech ends before its
    // text, as the official run does, what it did not take is spoken by the next segments.
    let tokens = lines
        .iter()
        .take_while(|l| l.split_whitespace().nth(1) != Some("llm_done"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"llm_token")).then(|| f[4].parse::<i64>().unwrap())
        })
        .collect();
    (tokens, lines)
}

#[test]
fn say_and_file_from_stdin_match_the_official_bistream() {
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference_model(work.path()) else { return };

    // `cosy say -`, three pieces: the official tokens.
    let case = BistreamCase::load("en_short");
    let (tokens, _) = say_pieces(&model, &reference, &case, false);
    assert_eq!(tokens, case.tokens(), "cosy say - tokens differ from the official bi-streaming");

    // `cosy file - --bistream`, the same pieces: the official audio.
    let home = tempfile::tempdir().unwrap();
    let out_wav = home.path().join("out.wav");
    let mut child = cosy(&model, home.path())
        .args(["file", "-", "--bistream", "--format", "wavf32", "-o"])
        .arg(&out_wav)
        .args(voice_args(&case, &reference))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // One write of the whole text is one piece here; the 1-piece official run gives the same
    // tokens as the 3-piece one for this text (each piece ends at a word).
    child.stdin.take().unwrap().write_all(case.pieces().concat().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let audio = cosy::frontend::audio::load_audio(&out_wav).expect("wav").samples;
    let official = case.audio();
    assert_eq!(audio.len(), official.len());
    let d = log_mel_distance(&audio, &official);
    assert!(d < 0.025, "mean |Δ log-mel| {d}");
}

#[test]
fn say_speaks_before_its_input_closes() {
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference_model(work.path()) else { return };
    // 34 pieces, word by word; the streaming schedule's first chunk comes while stdin is open.
    let case = BistreamCase::load("en_long_stream");
    let (tokens, lines) = say_pieces(&model, &reference, &case, true);
    assert_eq!(tokens, case.tokens(), "tokens differ from the official bi-streaming");
    let first_chunk = lines.iter().position(|l| l.contains(" chunk_ready ")).unwrap();
    let text_done = lines.iter().position(|l| l.contains(" text_done")).unwrap();
    assert!(first_chunk < text_done, "the first audio was ready before the input closed: {lines:?}");
}

#[test]
fn bad_streamed_input_is_one_clear_line() {
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference_model(work.path()) else { return };
    let case = BistreamCase::load("en_short");
    let cases: [(&[u8], &[&str], &str); 4] = [
        (b"", &[], "empty"),
        (b"Hello there \xff\xfe and more.", &[], "invalid UTF-8 at byte 12"),
        (b"The old lighthouse blinked twice before the fog rolled in.", &["--set", "limits.max_text_chars=20"], "limits.max_text_chars"),
        (b"caf\xc3", &[], "inside a UTF-8 character"),
    ];
    for (input, extra, needle) in cases {
        for command in [&["say", "-"][..], &["file", "-", "--bistream", "-o", "x.wav"][..]] {
            let home = tempfile::tempdir().unwrap();
            let mut child = cosy(&model, home.path())
                .args(extra)
                .args(command)
                .args(voice_args(&case, &reference))
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(input).unwrap();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command:?} {needle}: {stderr}");
            let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("cosy:")).collect();
            assert_eq!(lines.len(), 1, "{command:?}: one line: {stderr}");
            assert!(lines[0].contains(needle), "{command:?}: {stderr}");
            assert!(!home.path().join("x.wav").exists(), "no output from a failed run");
        }
    }
    // A cross-lingual voice cannot stream text in.
    let home = tempfile::tempdir().unwrap();
    let out = cosy(&model, home.path())
        .args(["file", "-", "--bistream", "--prompt-wav"])
        .arg(case.prompt_wav(&reference))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cross-lingual"));
}
