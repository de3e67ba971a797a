//! `cosy file BOOK` end to end (issue 33), through the real binary on the bundled tiny model,
//! each sentence cut to a few speech tokens by the test hooks (what is checked is where the
//! audio goes, not what it sounds like):
//! * an EPUB 3 of 20 chapters written by the test: mp3, opus and flac with the chapters
//!   `ffprobe -show_chapters` reads (titles, starts from the captions' exact samples), the book's
//!   title and author; `--split chapters` the same audio, one file a chapter and a playlist;
//! * captions (SRT, WebVTT, JSON) whose every cue is the sentence's samples, read back by ffmpeg;
//! * a job killed with SIGKILL at a sentence's write (fsx's `COSY_TEST_KILL_AT`, no timing) and
//!   run again gives the same bytes as a run never stopped; a changed book is refused;
//! * a Markdown book's headings are its chapters; bad books are one line each, nothing written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::ffmpeg::decode_file;
use crate::common::{epub, fixture_model, fixture_prompt};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";

/// `cosy file ARGS` with a zero-shot voice, a fixed seed and sentences of 3 speech tokens, in
/// `dir` (cwd and HOME), with `env` set.
fn cosy_file(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    let prompt = fixture_prompt();
    cmd.env("HOME", dir).env("XDG_RUNTIME_DIR", dir).current_dir(dir).envs(env.iter().copied());
    // No optimised-graph or prompt-prefix cache files: they are written through fsx too, and the
    // kill hook must count the job's writes only.
    cmd.arg("--model").arg(fixture_model()).args(["--provider", "cpu", "--set", "debug.test_hooks=true"]);
    cmd.args(["--set", "runtime.graph_cache_enabled=false", "--set", "engine.prompt_cache_disk_bytes=0", "file"]);
    cmd.arg("--prompt-wav").arg(&prompt).args(["--prompt-text", TRANSCRIPT, "--seed", "7", "--min-tokens", "3", "--max-tokens", "3", "--local"]);
    cmd.args(args);
    cmd.output().expect("run cosy")
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

/// `ffprobe -show_chapters -show_format` of `path` as JSON.
fn probe(path: &Path) -> serde_json::Value {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-of", "json", "-show_chapters", "-show_format", "-show_streams"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("ffprobe cannot run ({e}): scripts/setup.sh installs ffmpeg"));
    assert!(out.status.success(), "ffprobe {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("ffprobe JSON")
}

/// The files in `dir` (names), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).expect("read dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn book(dir: &Path, chapters: usize) -> (PathBuf, Vec<(String, String)>) {
    let chapters = epub::alice_chapters(chapters);
    let path = dir.join("alice.epub");
    epub::write_epub3(&path, "Alice's Adventures in Wonderland", "Lewis Carroll", &epub::as_pairs(&chapters));
    (path, chapters)
}

/// One EPUB of 20 chapters said once (into a kept job folder), then written again from that job
/// in each format: the chapters where the captions put them, the same audio in every format.
#[test]
fn an_epub_becomes_audio_with_chapters_in_every_format_and_captions_to_the_sample() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let (path, chapters) = book(d, 20);
    let book = path.to_str().expect("utf-8 path");
    let o = cosy_file(d, &[book, "-o", "alice.flac", "--job", "job", "--captions", "alice.json"], &[]);
    ok(&o, "flac");
    let captions: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("alice.json")).expect("captions")).expect("JSON");
    let rate = captions["sample_rate"].as_u64().expect("rate");
    let total = captions["samples"].as_u64().expect("samples");
    let starts: Vec<u64> = captions["chapters"].as_array().expect("chapters").iter().map(|c| c["start_sample"].as_u64().expect("start")).collect();
    assert_eq!(starts.len(), 20, "{captions}");
    // The audio is the captions' length, sample for sample.
    let flac = decode_file(&d.join("alice.flac"));
    assert_eq!(flac.len() as u64, total);
    // Cues lie end to end within their chapters, none empty, in order.
    let cues = captions["sentences"].as_array().expect("sentences");
    assert!(cues.len() >= 20, "{captions}");
    let mut last_end = 0;
    for cue in cues {
        let (start, end) = (cue["start_sample"].as_u64().expect("start"), cue["end_sample"].as_u64().expect("end"));
        assert!(last_end <= start && start < end, "{cue}");
        last_end = end;
    }
    assert_eq!(last_end, total, "the last sentence ends the audio (no pause in this book)");
    for (c, start) in starts.iter().enumerate() {
        assert!(cues.iter().any(|cue| cue["start_sample"].as_u64() == Some(*start)), "chapter {c} starts with a sentence");
    }
    // Every format from the same job: ffprobe reads the chapters' titles and starts (to the
    // millisecond: the marks' unit), the title and the author.
    for name in ["alice.flac", "alice.mp3", "alice.opus"] {
        if name != "alice.flac" {
            ok(&cosy_file(d, &[book, "-o", name, "--job", "job"], &[]), name);
        }
        let v = probe(&d.join(name));
        let found = v["chapters"].as_array().expect("chapters");
        assert_eq!(found.len(), 20, "{name}: {v}");
        for (i, (chapter, (title, _))) in found.iter().zip(&chapters).enumerate() {
            assert_eq!(chapter["tags"]["title"].as_str(), Some(title.as_str()), "{name}: {chapter}");
            let at: f64 = chapter["start_time"].as_str().expect("start_time").parse().expect("seconds");
            let want = starts[i] as f64 / rate as f64;
            assert!((at - want).abs() <= 0.0015, "{name}: chapter {i} at {at}, the captions say {want}");
        }
        // mp3 and flac tags are the file's, Ogg Opus's the stream's (OpusTags), as ffprobe reads them.
        let tags = if name.ends_with(".opus") { &v["streams"][0]["tags"] } else { &v["format"]["tags"] };
        let tag = |k: &str| tags.as_object().and_then(|t| t.iter().find(|(key, _)| key.eq_ignore_ascii_case(k))).and_then(|(_, v)| v.as_str().map(str::to_owned));
        assert_eq!(tag("title").as_deref(), Some("Alice's Adventures in Wonderland"), "{name}: {tags}");
        assert_eq!(tag("artist").as_deref(), Some("Lewis Carroll"), "{name}: {tags}");
        let decoded = decode_file(&d.join(name)).len() as i64;
        assert!((decoded - total as i64).abs() <= 2, "{name}: {decoded} samples decoded, {total} made");
    }
    // One file a chapter: the same audio, cut where the chapters start; the playlist last.
    ok(&cosy_file(d, &[book, "-o", "split", "--split", "chapters", "--format", "flac", "--job", "job"], &[]), "split");
    let files = names(&d.join("split"));
    assert_eq!(files.len(), 21, "{files:?}");
    assert!(files.iter().any(|f| f.ends_with(".m3u8")), "{files:?}");
    let mut joined = Vec::new();
    for f in files.iter().filter(|f| f.ends_with(".flac")) {
        joined.extend(decode_file(&d.join("split").join(f)));
    }
    assert!(joined == flac, "the chapters' files are the book's audio, cut");
    // SRT and WebVTT: ffmpeg reads them; each cue's times are its samples to the millisecond.
    ok(&cosy_file(d, &[book, "-o", "alice.wav", "--job", "job", "--captions", "alice.srt"], &[]), "srt");
    ok(&cosy_file(d, &[book, "-o", "alice.wav", "--job", "job", "--captions", "alice.vtt"], &[]), "vtt");
    let srt = std::fs::read_to_string(d.join("alice.srt")).expect("srt");
    let ms = |samples: u64, sep: char| {
        let ms = (samples * 1000 + rate / 2) / rate;
        format!("{:02}:{:02}:{:02}{sep}{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
    };
    let blocks: Vec<&str> = srt.split("\n\n").filter(|b| !b.trim().is_empty()).collect();
    assert_eq!(blocks.len(), cues.len(), "{srt}");
    for (block, cue) in blocks.iter().zip(cues) {
        let timing = block.lines().nth(1).expect("timing line");
        let (s, e) = (cue["start_sample"].as_u64().expect("s"), cue["end_sample"].as_u64().expect("e"));
        assert_eq!(timing, format!("{} --> {}", ms(s, ','), ms(e, ',')), "{block}");
    }
    for captions in ["alice.srt", "alice.vtt"] {
        let out = Command::new("ffmpeg").args(["-v", "error", "-nostdin", "-i"]).arg(d.join(captions)).args(["-f", "srt", "-"]).output().expect("ffmpeg");
        assert!(out.status.success() && out.stderr.is_empty(), "{captions}: {}", String::from_utf8_lossy(&out.stderr));
        let back = String::from_utf8_lossy(&out.stdout);
        assert_eq!(back.matches(" --> ").count(), cues.len(), "{captions}: {back}");
    }
    // The derived job folder of a run without --job is gone once the book is written.
    ok(&cosy_file(d, &[book, "-o", "again.wav"], &[]), "no --job");
    assert!(!d.join("again.wav.cosy-job").exists());
    assert!(decode_file(&d.join("again.wav")) == decode_file(&d.join("alice.wav")), "the same book, the same audio");
}

/// Killed at a sentence's write three times (fsx's crash hook `STEP:N`: the N-th write to reach
/// that step; a new job first writes its plan and manifest, a resumed one only sentences), then
/// run to the end: the same bytes as a run never stopped; nothing at the output's path meanwhile;
/// a changed book is refused with what changed.
#[test]
fn a_killed_book_resumes_to_the_same_bytes_and_a_changed_one_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let (path, _) = book(d, 3);
    let book = path.to_str().expect("utf-8 path");
    ok(&cosy_file(d, &[book, "-o", "whole.flac", "--job", "whole-job"], &[]), "uninterrupted");
    let whole = std::fs::read(d.join("whole.flac")).expect("whole");
    let kept = |job: &Path| names(&job.join("audio")).iter().filter(|n| n.ends_with(".f32")).count();
    // New job: plan, manifest, two sentences renamed into place, killed after the second's rename.
    // Resumed: one more sentence, the next killed before it is synced; then before it is renamed.
    for (kill_at, sentences) in [("renamed:4", 2), ("written:2", 3), ("synced:1", 3)] {
        let out = cosy_file(d, &[book, "-o", "resumed.flac", "--job", "job"], &[("COSY_TEST_KILL_AT", kill_at)]);
        assert!(out.status.code().is_none(), "killed at {kill_at}: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(!d.join("resumed.flac").exists(), "no output before the book is done");
        assert_eq!(kept(&d.join("job")), sentences, "killed at {kill_at}");
    }
    let o = cosy_file(d, &[book, "-o", "resumed.flac", "--job", "job"], &[]);
    ok(&o, "resumed");
    assert!(String::from_utf8_lossy(&o.stderr).contains("resuming"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(d.join("resumed.flac")).expect("resumed") == whole, "a resumed book is the uninterrupted one, byte for byte");
    // The same job folder for a changed book: refused, naming the chapter.
    let chapters = epub::alice_chapters(3);
    let mut changed = chapters.clone();
    changed[1].1.push_str(" And then the cat grinned.");
    epub::write_epub3(&path, "Alice's Adventures in Wonderland", "Lewis Carroll", &epub::as_pairs(&changed));
    let o = cosy_file(d, &[book, "-o", "resumed.flac", "--job", "job"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("was made for another input") && err.contains("chapter 2"), "{err}");
}

/// A Markdown book: its repeated heading level makes the chapters; a book that cannot be read is
/// one line, before the model loads, and nothing is written.
#[test]
fn a_markdown_book_has_its_headings_as_chapters_and_bad_books_are_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    std::fs::write(d.join("notes.md"), "# Notes\n\n## Down the Rabbit-Hole\n\nAlice was *very* tired.\n\n## The Pool of Tears\n\nCuriouser and curiouser, cried Alice.\n").expect("write");
    ok(&cosy_file(d, &["notes.md", "-o", "notes.opus"], &[]), "markdown");
    let v = probe(&d.join("notes.opus"));
    let titles: Vec<&str> = v["chapters"].as_array().expect("chapters").iter().filter_map(|c| c["tags"]["title"].as_str()).collect();
    assert_eq!(titles, ["Down the Rabbit-Hole", "The Pool of Tears"], "{v}");
    std::fs::write(d.join("broken.epub"), b"PK\x03\x04 not really a zip").expect("write");
    std::fs::write(d.join("binary.txt"), [0u8, 1, 2, 3, 0xff, 0xfe, 0, 0]).expect("write");
    for (input, says) in [("broken.epub", "broken.epub"), ("binary.txt", "binary.txt")] {
        let o = cosy_file(d, &["--book", input, "-o", "out.mp3"], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{input}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{input}: {err}");
        assert!(lines[0].contains(says), "{input}: {err}");
        assert!(!d.join("out.mp3").exists(), "{input}: nothing written");
    }
}
