//! Outputs, texts and messages end to end (issue 9, item 9), through the real binary on the
//! bundled tiny model:
//! * `-o` into what is not a regular file: `/dev/null` stays a device, a symbolic link stays a link
//!   (its target gets the audio), a FIFO's reader gets the bytes (and a FIFO nobody reads is an
//!   error, not a hang);
//! * everything that can be wrong with an output path, a `--name-template`, `--speed` or the text
//!   is refused before any synthesis: those runs point `--model` at a folder that does not exist,
//!   so a check that came after loading the model would fail with a model error instead;
//! * messages name the user's path (or template, or `--input` line) and say what to do.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{fixture_model, fixture_prompt};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";
const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";
/// Generous: a broken build must not hang the suite, and nothing here measures speed.
const HANG_GUARD: Duration = Duration::from_secs(180);

/// `cosy --model MODEL --provider cpu ARGS` with cwd and HOME = `dir` (null sound output) and no
/// COSY_* variables.
fn cosy_with(dir: &Path, model: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    fs::write(dir.join(".asoundrc"), "pcm.!default { type null }\n").unwrap();
    cmd.env("HOME", dir).env("XDG_RUNTIME_DIR", dir).current_dir(dir).arg("--model").arg(model).args(["--provider", "cpu"]).args(args);
    cmd.output().expect("run cosy")
}

/// With the bundled tiny model.
fn cosy(dir: &Path, args: &[&str]) -> Output {
    cosy_with(dir, &fixture_model(), args)
}

/// With a model folder that does not exist: only checks made before loading the model can pass.
fn cosy_unloaded(dir: &Path, args: &[&str]) -> Output {
    cosy_with(dir, &dir.join("no-model-here"), args)
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

/// Exit 2 and exactly one `cosy: …` line on stderr containing every needle; nothing on stdout.
fn refused(o: &Output, what: &str, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: exit {:?}, stderr {err}", o.status.code());
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: expected one line, got {err}");
    assert!(lines[0].starts_with("cosy: "), "{what}: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "{what}: {:?} lacks {n:?}", lines[0]);
    }
    assert!(!lines[0].contains("model folder"), "{what}: checked only after loading the model: {}", lines[0]);
    assert!(o.stdout.is_empty(), "{what}: stdout {:?}", String::from_utf8_lossy(&o.stdout));
}

fn file_args<'a>(prompt: &'a str, out: &'a str, extra: &[&'a str], text: &'a str) -> Vec<&'a str> {
    let mut v = vec!["file", "--prompt-wav", prompt, "--prompt-text", TRANSCRIPT, "-o", out];
    v.extend_from_slice(extra);
    v.extend(["--", text]);
    v
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn wav_samples(path: &Path) -> usize {
    hound::WavReader::open(path).unwrap_or_else(|e| panic!("{}: not a wav: {e}", path.display())).len() as usize
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(st.success());
}

/// Puts /dev/null back if a regression replaced it (the tests may run as root), and fails.
struct DevNullGuard;

impl Drop for DevNullGuard {
    fn drop(&mut self) {
        let is_device = fs::metadata("/dev/null").is_ok_and(|m| m.file_type().is_char_device());
        if !is_device {
            let _ = fs::remove_file("/dev/null");
            let _ = Command::new("mknod").args(["-m", "666", "/dev/null", "c", "1", "3"]).status();
            if !std::thread::panicking() {
                panic!("/dev/null was replaced by a regular file (restored)");
            }
        }
    }
}

#[test]
fn output_to_dev_null_keeps_the_device() {
    let null = Path::new("/dev/null");
    if !fs::metadata(null).is_ok_and(|m| m.file_type().is_char_device()) {
        eprintln!("SKIP: /dev/null is not a character device here");
        return;
    }
    let _guard = DevNullGuard;
    // The library writers, every format, and the one-shot byte writer.
    for format in [cosy::audio::OutputFormat::Wav16, cosy::audio::OutputFormat::WavF32, cosy::audio::OutputFormat::Pcm16] {
        cosy::audio::write_audio_atomic(null, &[0.25; 4800], 24_000, format).unwrap();
        assert!(fs::metadata(null).unwrap().file_type().is_char_device(), "{format}");
    }
    cosy::output::write_bytes(null, b"{}").unwrap();
    assert!(fs::metadata(null).unwrap().file_type().is_char_device());
    assert!(fs::read_dir("/dev").unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".partial-")));

    let d = tempfile::tempdir().unwrap();
    let p = fixture_prompt();
    ok(&cosy(d.path(), &file_args(p.to_str().unwrap(), "/dev/null", &[], TEXT)), "-o /dev/null");
    let m = fs::symlink_metadata(null).unwrap();
    assert!(m.file_type().is_char_device(), "/dev/null is no longer a character device: {m:?}");
    assert!(fs::read_dir("/dev").unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".partial-")));
}

#[test]
fn output_through_a_symlink_writes_its_target_and_keeps_the_link() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    fs::create_dir(dir.join("takes")).unwrap();
    let target = dir.join("takes/final.wav");
    fs::write(&target, b"older take").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("takes/final.wav", dir.join("link.wav")).unwrap();
    let p = fixture_prompt();
    // The ends of the speed range are accepted.
    ok(&cosy(dir, &file_args(p.to_str().unwrap(), "link.wav", &["--speed", "2.0"], TEXT)), "-o link.wav");
    let link = fs::symlink_metadata(dir.join("link.wav")).unwrap();
    assert!(link.file_type().is_symlink(), "the link was replaced: {link:?}");
    assert_eq!(fs::read_link(dir.join("link.wav")).unwrap(), PathBuf::from("takes/final.wav"));
    assert!(wav_samples(&target) > 0);
    assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o640, "the target keeps its mode");
    assert_eq!(entries(&dir.join("takes")), vec!["final.wav"], "no temporary file left beside the target");

    // A link to a file not made yet (also a chain of two links): the file is made where it points.
    std::os::unix::fs::symlink("takes/new.wav", dir.join("hop2.wav")).unwrap();
    std::os::unix::fs::symlink("hop2.wav", dir.join("hop1.wav")).unwrap();
    cosy::audio::write_audio_atomic(&dir.join("hop1.wav"), &[0.5; 100], 24_000, cosy::audio::OutputFormat::Wav16).unwrap();
    assert_eq!(wav_samples(&dir.join("takes/new.wav")), 100);
    assert!(fs::symlink_metadata(dir.join("hop1.wav")).unwrap().file_type().is_symlink());
    assert!(fs::symlink_metadata(dir.join("hop2.wav")).unwrap().file_type().is_symlink());

    // A loop of links is refused, naming the user's path.
    std::os::unix::fs::symlink("loop-b", dir.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", dir.join("loop-b")).unwrap();
    let o = cosy_unloaded(dir, &file_args(p.to_str().unwrap(), "loop-a", &[], TEXT));
    refused(&o, "-o a link loop", &["-o loop-a", "loop of symbolic links"]);
}

#[test]
fn output_into_a_fifo_reaches_its_reader() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let fifo = dir.join("pipe.wav");
    mkfifo(&fifo);
    let (tx, rx) = mpsc::channel();
    let reader_path = fifo.clone();
    std::thread::spawn(move || {
        let bytes = fs::read(&reader_path);
        let _ = tx.send(bytes);
    });
    let p = fixture_prompt();
    ok(&cosy(dir, &file_args(p.to_str().unwrap(), "pipe.wav", &[], TEXT)), "-o FIFO");
    let bytes = rx.recv_timeout(HANG_GUARD).expect("hang guard: the reader got nothing").expect("read the fifo");
    assert!(bytes.len() > 44 && bytes.starts_with(b"RIFF"), "{} bytes", bytes.len());
    let wav = hound::WavReader::new(std::io::Cursor::new(&bytes)).expect("a complete wav");
    assert!(wav.len() > 0);
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    assert!(entries(dir).iter().all(|n| !n.contains(".partial-")), "{:?}", entries(dir));
}

#[test]
fn a_fifo_nobody_reads_is_an_error_not_a_hang() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("nobody.wav");
    mkfifo(&fifo);
    let (tx, rx) = mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(cosy::audio::write_audio_atomic(&path, &[0.0; 480], 24_000, cosy::audio::OutputFormat::Wav16));
    });
    let err = rx.recv_timeout(HANG_GUARD).expect("hang guard: writing a FIFO nobody reads blocked").unwrap_err().to_string();
    assert!(err.contains(&fifo.display().to_string()) && err.contains("no program is reading"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn bad_output_paths_are_refused_before_synthesis_naming_the_path() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    fs::write(dir.join("somefile.txt"), b"x").unwrap();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let long = format!("{}.wav", "n".repeat(300));
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("trailing slash", "out.wav/", vec!["-o out.wav/", "ends with '/'", "give a file name"]),
        ("parent is a file", "somefile.txt/out.wav", vec!["-o somefile.txt/out.wav", "somefile.txt is a file, not a folder"]),
        ("deeper parent is a file", "somefile.txt/a/b.wav", vec!["somefile.txt is a file, not a folder"]),
        ("missing folder", "absent/out.wav", vec!["-o absent/out.wav", "absent does not exist", "create it"]),
        ("a folder", ".", vec!["names a folder"]),
        ("an existing folder", "/tmp", vec!["-o /tmp", "is a folder"]),
        ("name over 255 bytes", &long, vec!["304 bytes", "255-byte limit"]),
    ];
    for (what, out, needles) in cases {
        let o = cosy_unloaded(dir, &file_args(p, out, &[], TEXT));
        refused(&o, what, &needles);
    }
    // --dump naming a file; --config naming a folder.
    let o = cosy_unloaded(dir, &file_args(p, "o.wav", &["--dump", "somefile.txt"], TEXT));
    refused(&o, "--dump FILE", &["--dump somefile.txt", "is a file, not a folder"]);
    let o = cosy_unloaded(dir, &["--config", dir.to_str().unwrap(), "doctor", "--quick"]);
    refused(&o, "--config DIR", &["is a folder", "config file"]);
    let written: Vec<String> = entries(dir).into_iter().filter(|n| !n.starts_with('.')).collect();
    assert_eq!(written, vec!["somefile.txt"], "nothing was written");
    assert!(entries(dir).iter().all(|n| !n.contains(".partial-") && !n.contains("probe")), "{:?}", entries(dir));
}

#[test]
fn name_templates_are_bounded_and_checked_before_synthesis() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    fs::write(dir.join("lines.txt"), "First line here.\n\nSecond line here.\n").unwrap();
    fs::create_dir(dir.join("out")).unwrap();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let long = format!("{}{{index}}.wav", "t".repeat(260));
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("huge width", "{index:0999999999}.wav", vec!["{index:0999999999}.wav", "too wide", "at most 9"]),
        ("width 10", "{index:10}.wav", vec!["too wide"]),
        ("width beyond u64", "{index:99999999999999999999999}.wav", vec!["too wide"]),
        ("malformed placeholder", "{index:x}-{index}.wav", vec!["{index:0N}"]),
        ("a path", "sub/{index}.wav", vec!["not a path"]),
        ("over 255 bytes", &long, vec!["--name-template", "ttttt{index}.wav", "255-byte limit"]),
    ];
    for (what, template, needles) in cases {
        let o = cosy_unloaded(
            dir,
            &["file", "--prompt-wav", p, "--input", "lines.txt", "-o", "out", "--name-template", template],
        );
        refused(&o, what, &needles);
    }
    assert!(entries(&dir.join("out")).is_empty());
}

#[test]
fn speed_outside_half_to_double_is_refused_with_the_range() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    for speed in ["1e-6", "0.001", "0.49", "2.01", "100", "NaN", "inf", "-1", "0"] {
        let flag = format!("--speed={speed}");
        let o = cosy_unloaded(dir, &file_args(p, "o.wav", &[&flag], TEXT));
        refused(&o, &format!("file {flag}"), &["--speed", "0.5 to 2.0"]);
        let o = cosy_unloaded(dir, &["say", "--prompt-wav", p, &flag, TEXT]);
        refused(&o, &format!("say {flag}"), &["--speed", "0.5 to 2.0"]);
    }
    for cmd in ["file", "say"] {
        let o = cosy_unloaded(dir, &[cmd, "--help"]);
        ok(&o, "--help");
        let help = String::from_utf8_lossy(&o.stdout).replace('\n', " ");
        assert!(help.contains("0.5 to 2.0"), "{cmd} --help does not give the speed range: {help}");
    }
    assert!(cosy::request::check_speed(0.5).is_ok() && cosy::request::check_speed(2.0).is_ok());
}

#[test]
fn invisible_and_emoji_only_texts_are_refused_accurately() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let invisible = [
        "\u{200B}",
        "\u{200C}\u{200D}",
        "\u{2060}",
        "\u{FEFF}",
        " \u{200B} \u{200B}\n\u{FEFF} ",
        "\u{200B}\u{200C}\u{200D}\u{2060}\u{FEFF}\u{180E}\u{FE0F}",
    ];
    for text in invisible {
        let o = cosy_unloaded(dir, &file_args(p, "o.wav", &[], text));
        refused(&o, &format!("file {text:?}"), &["empty", "invisible"]);
        let o = cosy_unloaded(dir, &["say", "--prompt-wav", p, "--", text]);
        refused(&o, &format!("say {text:?}"), &["empty"]);
    }
    for text in ["😀🎉", "👍🏽", "❤️", "👨‍👩‍👧", "\u{200B}.\u{200B}", "🙂 !"] {
        let o = cosy_unloaded(dir, &file_args(p, "o.wav", &[], text));
        refused(&o, &format!("file {text:?}"), &["nothing speakable", "emoji"]);
    }
    // Words with invisible characters in them are speech.
    assert!(cosy::request::check_speakable("a\u{200B}b").is_ok());
    assert!(cosy::request::check_speakable("1️⃣").is_ok());
    assert!(!dir.join("o.wav").exists());
}

#[test]
fn profile_checks_its_outputs_first_and_refuses_one_file_for_both() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("p.json"), b"keep").unwrap();
    std::os::unix::fs::symlink("p.json", dir.join("alias.json")).unwrap();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let profile = |extra: &[&str]| {
        let mut args = vec!["profile", "--prompt-wav", p, "--runs", "1", "--warmup", "0"];
        args.extend_from_slice(extra);
        cosy_unloaded(dir, &args)
    };
    for (json, trace) in [("p.json", "p.json"), ("p.json", "./p.json"), ("p.json", "sub/../p.json"), ("alias.json", "p.json")] {
        let o = profile(&["--json", json, "--trace", trace]);
        refused(&o, &format!("--json {json} --trace {trace}"), &["same file", json, trace]);
    }
    let o = profile(&["--json", "missing/p.json"]);
    refused(&o, "--json into a missing folder", &["--json missing/p.json", "does not exist"]);
    let o = profile(&["--trace", "missing/t.json"]);
    refused(&o, "--trace into a missing folder", &["--trace missing/t.json", "does not exist"]);
    let o = profile(&["--trace", "t.json/"]);
    refused(&o, "--trace with a trailing slash", &["--trace t.json/", "ends with '/'"]);
    let o = profile(&["\u{200B}"]);
    refused(&o, "profile: invisible text", &["empty"]);
    assert_eq!(fs::read(dir.join("p.json")).unwrap(), b"keep");
}

#[test]
fn an_input_line_over_the_limit_is_named_by_its_line_number() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    fs::write(dir.join("lines.txt"), "Short one.\n\nThis third line is much longer than the limit.\n").unwrap();
    let p = fixture_prompt();
    let o = cosy_unloaded(
        dir,
        &["--set", "limits.max_text_chars=20", "file", "--prompt-wav", p.to_str().unwrap(), "--input", "lines.txt"],
    );
    refused(&o, "long --input line", &["--input lines.txt line 3:", "limits.max_text_chars"]);
    fs::write(dir.join("lines.txt"), "Fine.\n🎉🎉\n").unwrap();
    let o = cosy_unloaded(dir, &["file", "--prompt-wav", p.to_str().unwrap(), "--input", "lines.txt"]);
    refused(&o, "emoji --input line", &["--input lines.txt line 2:", "nothing speakable"]);
}

/// With sampling over the whole vocabulary, seed 0 makes the tiny random LLM stop at its first
/// step for "Hi.": the message says which sentence (number and text), not "this sentence".
#[test]
fn a_sentence_without_speech_tokens_is_named() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = fixture_prompt();
    let o = cosy(
        dir,
        &[
            "--set", "sampling.top_k=6761", "--set", "sampling.top_p=1.0", "file", "--prompt-wav", p.to_str().unwrap(),
            "--seed", "0", "--no-text-frontend", "-o", "o.wav", "--", "Hi.",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("sentence 1 of 1 (\"Hi.\")") && err.contains("no speech tokens"), "{err}");
    // It says what the user can change: the seed (another one speaks this very text) or the text.
    assert!(err.contains("try another seed (--seed N") && err.contains("reword"), "{err}");
    let o = cosy(
        dir,
        &[
            "--set", "sampling.top_k=6761", "--set", "sampling.top_p=1.0", "file", "--prompt-wav", p.to_str().unwrap(),
            "--seed", "5", "--no-text-frontend", "-o", "o5.wav", "--", "Hi.",
        ],
    );
    ok(&o, "another seed speaks the same text");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!dir.join("o.wav").exists());
}

/// A UTF-8 byte-order mark at the start of an `--input` file or of standard input is not text:
/// the audio is the same as without it (kept, its bytes became the first text tokens).
#[test]
fn a_byte_order_mark_is_not_spoken() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let common = ["--prompt-wav", p, "--prompt-text", TRANSCRIPT, "--min-tokens", "6", "--seed", "3"];
    fs::write(dir.join("bom.txt"), format!("\u{feff}{TEXT}\n")).unwrap();
    fs::write(dir.join("plain.txt"), format!("{TEXT}\n")).unwrap();
    for (input, out) in [("bom.txt", "with"), ("plain.txt", "without")] {
        fs::create_dir(dir.join(out)).unwrap();
        let mut args = vec!["file", "--input", input, "-o", out];
        args.extend(common);
        ok(&cosy(dir, &args), input);
    }
    let with = fs::read(dir.join("with/000.wav")).unwrap();
    assert!(with == fs::read(dir.join("without/000.wav")).unwrap(), "--input: the mark changed the audio");
    // Standard input, read whole.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", dir).env("XDG_RUNTIME_DIR", dir).current_dir(dir).arg("--model").arg(fixture_model()).args(["--provider", "cpu", "file", "-o", "stdin.wav"]);
    cmd.args(common).arg("-").stdin(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("\u{feff}{TEXT}").as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    ok(&o, "stdin");
    assert!(fs::read(dir.join("stdin.wav")).unwrap() == with, "stdin: the mark changed the audio");
}

/// `cosy file --show-text` prints each sentence exactly as the model gets it (issue 32, point 6),
/// after Markdown is read, and synthesises nothing; `--no-markdown` gives the text as written.
#[test]
fn show_text_prints_the_sentences_the_model_gets() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let reply = "**Bold** claim: see [the docs](https://example.com/a_b?x=1) 😀 and `cargo build`. Then - item one\n- item two";
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text"], reply));
    ok(&o, "--show-text");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Bold claim: see the docs and cargo build. Then - item one.\\nitem two.\n");
    assert!(!dir.path().join("out.wav").exists(), "nothing is synthesised");
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text", "--no-markdown"], reply));
    ok(&o, "--show-text --no-markdown");
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("**Bold**") && shown.contains("x=one") && shown.contains("😀"), "as written, numbers normalised: {shown}");
    // Plain text is unchanged by the Markdown reading.
    let plain = "1. Hello, Mr. Smith: it's 5 * 3, snake_case_name and C# too.";
    let with = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text"], plain));
    let without = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text", "--no-markdown"], plain));
    ok(&with, "plain text");
    assert_eq!(String::from_utf8_lossy(&with.stdout), String::from_utf8_lossy(&without.stdout));
}

/// The normalisation switches on the command line (issue 32, point 2): `--normalize` turns
/// categories on and off (repeatable), off leaves that category's text as written, as
/// `--show-text` shows; an unknown category is refused naming the categories.
#[test]
fn show_text_follows_the_normalize_switches() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let text = "Call +1 555-0123 about the 5 km run at https://example.com, 3 items 😀.";
    let shown = |extra: &[&str]| {
        let mut flags = vec!["--show-text"];
        flags.extend_from_slice(extra);
        let o = cosy(dir.path(), &file_args(prompt, "out.wav", &flags, text));
        ok(&o, &format!("{extra:?}"));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(shown(&["--normalize", "numbers=off,phone=on"]), "Call plus 1, 5 5 5, 0 1 2 3 about the 5 kilometers run at example dot com, 3 items.\n");
    assert_eq!(shown(&["--normalize", "numbers=off", "--normalize", "urls=off,units=off,symbols=keep"]), format!("{text}\n"));
    assert_eq!(shown(&["--normalize", "numbers=off", "--no-markdown"]), format!("{text}\n"), "--no-markdown: the whole layer off");
    let spelt = shown(&["--normalize", "phone=on"]);
    assert!(spelt.contains("plus one, five five five, zero one two three") && spelt.contains("five kilometers"), "numbers spelt out: {spelt}");
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text", "--normalize", "dates=off"], text));
    refused(&o, "an unknown category", &["dates", "markdown, numbers, urls, phone, units, symbols"]);
}

/// `text.lexicon` (issue 32, point 4): whole words replaced before the official frontend, as
/// `--show-text` shows; `cosy lexicon check` names the entries whose phonemes the tokenizer lacks,
/// and a bad lexicon file is one line naming the file and line.
#[test]
fn lexicon_replaces_words_and_check_names_bad_entries() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let good = dir.path().join("good.toml");
    fs::write(&good, "[words]\ncosy = \"cozy\"\nNguyen = { cmu = \"W IH1 N\" }\n\"行\" = { pinyin = \"hang2\" }\n").unwrap();
    let set = format!("text.lexicon={}", good.display());
    let text = "Cosy greets Nguyen, not cosyness. 银行";
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--set", &set, "--show-text"], text));
    ok(&o, "--show-text with a lexicon");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "cozy greets [W][IH1][N], not cosyness。银[h][áng]。\n");
    // English text has its numbers spelt out, but not the stress digits of the phoneme tokens.
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--set", &set, "--show-text"], "Nguyen won 2 games."));
    ok(&o, "--show-text of English text with a lexicon");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[W][IH1][N] won two games.\n");

    let o = cosy(dir.path(), &["lexicon", "check", good.to_str().unwrap()]);
    ok(&o, "lexicon check of a good file");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");

    let bad = dir.path().join("bad.toml");
    fs::write(&bad, "[words]\nfine = { cmu = \"F AY1 N\" }\nodd = { cmu = \"Q AA1\" }\n\"哦\" = { pinyin = \"zzz\" }\n").unwrap();
    let o = cosy(dir.path(), &["lexicon", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let b = bad.display();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{b}: line 3: \"odd\": not in the tokenizer: [Q]\n{b}: line 4: \"哦\": not in the tokenizer: [zz]\n")
    );

    let broken = dir.path().join("broken.toml");
    fs::write(&broken, "[words]\nfine = \"ok\"\nodd = { cmuu = \"K\" }\n").unwrap();
    let o = cosy(dir.path(), &["lexicon", "check", broken.to_str().unwrap()]);
    refused(&o, "a bad lexicon file", &[&format!("lexicon {} line 3: \"odd\": unknown field \"cmuu\"", broken.display())]);
    let set = format!("text.lexicon={}", broken.display());
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--set", &set, "--show-text"], text));
    refused(&o, "file with a bad lexicon", &[&format!("lexicon {} line 3", broken.display())]);
}

/// A voice's own lexicon (issue 32, point 4): `cosy voice add … --lexicon FILE` checks it and
/// copies it beside the voice; it applies over the global one (its entries win) when that voice
/// speaks, `voice list` names it, and it goes with the voice.
#[test]
fn a_voice_lexicon_applies_over_the_global_one() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let voices = dir.path().join("voices");
    let set_dir = format!("voices.dir={}", voices.display());
    let global = dir.path().join("global.toml");
    fs::write(&global, "[words]\ncosy = \"cozy\"\nNguyen = { cmu = \"W IH1 N\" }\n").unwrap();
    let set_global = format!("text.lexicon={}", global.display());
    let own = dir.path().join("anna.toml");
    fs::write(&own, "[words]\nCOSY = \"koh see\"\n").unwrap();
    let bad = dir.path().join("bad.toml");
    fs::write(&bad, "[words]\nodd = { cmuu = \"K\" }\n").unwrap();
    let add = |lexicon: &Path| cosy(dir.path(), &["--set", &set_dir, "voice", "add", "anna", "--wav", prompt, "--text", TRANSCRIPT, "--lexicon", lexicon.to_str().unwrap()]);
    refused(&add(&bad), "a bad voice lexicon", &[&format!("lexicon {} line 2", bad.display())]);
    assert!(!voices.join("anna.safetensors").exists(), "nothing is saved with a bad lexicon");
    ok(&add(&own), "voice add --lexicon");
    assert_eq!(fs::read_to_string(voices.join("anna.lexicon.toml")).unwrap(), fs::read_to_string(&own).unwrap());
    let text = "Cosy greets Nguyen.";
    let o = cosy(dir.path(), &["--set", &set_dir, "--set", &set_global, "file", "--voice", "anna", "-o", "out.wav", "--show-text", "--", text]);
    ok(&o, "--show-text with a voice lexicon");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "koh see greets [W][IH1][N].\n", "the voice's entry wins, the global one's others stay");
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--set", &set_global, "--show-text"], text));
    ok(&o, "--show-text without the voice");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "cozy greets [W][IH1][N].\n");
    let o = cosy(dir.path(), &["--set", &set_dir, "voice", "list"]);
    ok(&o, "voice list");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("[lexicon {}]", voices.join("anna.lexicon.toml").display())), "{}", String::from_utf8_lossy(&o.stdout));
    ok(&cosy(dir.path(), &["--set", &set_dir, "voice", "rm", "anna"]), "voice rm");
    assert!(!voices.join("anna.lexicon.toml").exists(), "the lexicon goes with its voice");
}

/// A pause tag (issue 32, point 3) is exact silence: the wav of a text with `[pause:0.5s]` is the
/// wav of the same text with `[pause:0ms]` (the same stretches, no silence) with exactly
/// round(0.5 × rate) zero samples put in where the first stretch's audio ends. A bad tag is one
/// line naming its place, and nothing is written.
#[test]
fn pause_tags_give_exact_silence() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let read = |name: &str| -> (u32, Vec<i16>) {
        let wav = hound::WavReader::open(dir.path().join(name)).expect("a wav");
        let rate = wav.spec().sample_rate;
        (rate, wav.into_samples::<i16>().map(|s| s.expect("sample")).collect())
    };
    let o = cosy(dir.path(), &file_args(prompt, "none.wav", &["--seed", "7"], "The fog rolled in. [pause:0ms] The light blinked twice."));
    ok(&o, "[pause:0ms]");
    let o = cosy(dir.path(), &file_args(prompt, "half.wav", &["--seed", "7"], "The fog rolled in. [pause:0.5s] The light blinked twice."));
    ok(&o, "[pause:0.5s]");
    let (rate, none) = read("none.wav");
    let (_, half) = read("half.wav");
    let silence = (0.5 * f64::from(rate)).round() as usize;
    assert_eq!(half.len(), none.len() + silence, "exactly the pause's samples are added");
    let first_difference = none.iter().zip(&half).position(|(a, b)| a != b).expect("the pause is inside the audio");
    // The pause starts where the first stretch's audio ends: at the first difference, or just
    // before it when that audio ends in zeros itself.
    let start = (first_difference.saturating_sub(silence)..=first_difference)
        .find(|&k| half[..k] == none[..k] && half[k..k + silence].iter().all(|&s| s == 0) && half[k + silence..] == none[k..])
        .expect("the 0.5 s pause is the other wav with that many zeros put in one place");
    assert!(start > 0 && start < none.len(), "between the two stretches' audio: {start} of {}", none.len());

    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &[], "Wait [pause:half] for it."));
    refused(&o, "a bad pause tag", &["pause tag \"[pause:half]\" at character 6 is not a pause"]);
    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &[], "Wait [pause:11s] for it."));
    refused(&o, "a pause too long", &["pause tag [pause:11s] at character 6 is longer than the longest pause, 10 s"]);
    assert!(!dir.path().join("bad.wav").exists(), "nothing is written for a bad tag");
}

/// SSML (issue 32, point 3): a text starting `<speak>` is read as the SSML subset, its breaks
/// exact pauses; bad markup is one line naming its place, and nothing is said.
#[test]
fn ssml_is_read_when_the_text_starts_with_speak() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let ssml = r#"<speak>Call <sub alias="the consortium">W3C</sub>.<break time="250ms"/>Say <phoneme alphabet="cmu" ph="T AH M EY T OW">tomato</phoneme>.</speak>"#;
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text"], ssml));
    ok(&o, "--show-text of SSML");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Call the consortium.\n[pause: 6000 samples of silence]\nSay [T][AH][M][EY][T][OW].\n");
    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &[], "<speak>Hi <break time=\"1s\"></speak>"));
    refused(&o, "bad SSML", &["invalid SSML"]);
    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &[], "<speak>Hi\n<emphasis>x</emphasis></speak>"));
    refused(&o, "unsupported SSML", &["invalid SSML at line 2, column 1: <emphasis> is not in the SSML cosy reads"]);
    assert!(!dir.path().join("bad.wav").exists(), "nothing is said for bad markup");
}

/// `<prosody rate>` (issue 32, point 3): its stretch is its own sentences at that speed (a mel
/// time-stretch, as `--speed`): the audio of a `rate="50%"` text is longer than the same text's
/// plain, with the same seed; asked to stream, it is refused in its own name.
#[test]
fn prosody_rate_stretches_its_sentences() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let samples = |name: &str| hound::WavReader::open(dir.path().join(name)).expect("a wav").len();
    let plain = "<speak>The fog rolled in over the bay.</speak>";
    let slow = "<speak><prosody rate=\"50%\">The fog rolled in over the bay.</prosody></speak>";
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text"], slow));
    ok(&o, "--show-text of a prosody rate");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[speed: 0.5]\nThe fog rolled in over the bay.\n");
    ok(&cosy(dir.path(), &file_args(prompt, "plain.wav", &["--seed", "7"], plain)), "plain SSML");
    ok(&cosy(dir.path(), &file_args(prompt, "slow.wav", &["--seed", "7"], slow)), "rate 50%");
    let (plain, slow) = (samples("plain.wav"), samples("slow.wav"));
    assert!(slow > plain * 3 / 2, "rate 50% stretches the audio: {slow} samples against {plain}");
    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &["--stream"], "<speak>One. <prosody rate=\"slow\">Two.</prosody></speak>"));
    refused(&o, "a prosody rate, streamed", &["<prosody rate> 0.75 at speed 1: speed 0.75 works only without streaming"]);
}

/// `--ssml` (issue 32, point 3): the text is SSML without `<speak>` too, read as if inside one;
/// its errors are placed in the text as given. Without it, the same text is not SSML.
#[test]
fn ssml_flag_reads_a_text_without_speak_as_ssml() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let prompt = prompt.to_str().unwrap();
    let ssml = r#"Call <sub alias="the consortium">W3C</sub>.<break time="250ms"/>Say <phoneme alphabet="cmu" ph="T AH M EY T OW">tomato</phoneme>."#;
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--ssml", "--show-text"], ssml));
    ok(&o, "--show-text --ssml");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Call the consortium.\n[pause: 6000 samples of silence]\nSay [T][AH][M][EY][T][OW].\n");
    let o = cosy(dir.path(), &file_args(prompt, "out.wav", &["--show-text"], ssml));
    ok(&o, "--show-text of the same text without --ssml");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("consortium"), "not SSML without --ssml: {}", String::from_utf8_lossy(&o.stdout));
    let o = cosy(dir.path(), &file_args(prompt, "bad.wav", &["--ssml"], "Hi\n<b>x</b>"));
    refused(&o, "bad SSML with --ssml", &["invalid SSML at line 2, column 1: <b> is not in the SSML cosy reads"]);
    assert!(!dir.path().join("bad.wav").exists(), "nothing is said for bad markup");
}

/// Issue 33, point 2: `cosy file` writes every format the server has, chosen by `--format` or
/// by the extension of `-o`; each decodes (ffmpeg) to the wav's length: flac and pcm to its very
/// samples, mp3 (LAME's Info frame: ffmpeg trims the encoder delay and padding) and Ogg Opus
/// (pre-skip and end trimming; ffmpeg's 48 → 24 kHz resampling) to within 2 samples (exact
/// when this was written).
#[test]
fn every_format_by_extension_or_flag() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = fixture_prompt();
    let p = p.to_str().unwrap();
    let seed = ["--seed", "7"];
    ok(&cosy(dir, &file_args(p, "ref.wav", &seed, TEXT)), "-o ref.wav");
    let want: Vec<i16> = hound::WavReader::open(dir.join("ref.wav")).unwrap().into_samples::<i16>().map(Result::unwrap).collect();
    let runs: [(&str, &[&str], bool); 7] = [
        ("out.flac", &[], true),
        ("out.pcm", &[], true),
        ("out.mp3", &[], false),
        ("out.opus", &[], false),
        ("out.ogg", &[], false),
        ("flac-by-flag.audio", &["--format", "flac"], true),
        ("by-flag.wav", &["--format", "wav"], true),
    ];
    for (out, flags, lossless) in runs {
        let mut extra = seed.to_vec();
        extra.extend_from_slice(flags);
        ok(&cosy(dir, &file_args(p, out, &extra, TEXT)), out);
        let path = dir.join(out);
        // (`.audio` is no extension ffmpeg knows: it reads the content.)
        let got = crate::common::ffmpeg::decode_file(&path);
        if lossless {
            assert!(got == want, "{out}: {} samples, not the wav's {}", got.len(), want.len());
        } else {
            assert!(got.len().abs_diff(want.len()) <= 2, "{out}: {} samples decoded, the wav has {}", got.len(), want.len());
        }
    }
    let magic = |name: &str, n: usize| fs::read(dir.join(name)).unwrap()[..n].to_vec();
    assert_eq!(magic("out.ogg", 4), b"OggS");
    assert_eq!(magic("flac-by-flag.audio", 4), b"fLaC");
    assert_eq!(magic("by-flag.wav", 4), b"RIFF");

    // Without -o, the default name takes the format's extension.
    ok(&cosy(dir, &["file", "--prompt-wav", p, "--prompt-text", TRANSCRIPT, "--format", "flac", "--", TEXT]), "--format flac without -o");
    assert_eq!(magic("out.flac", 4), b"fLaC");
    assert!(!dir.join("out.wav").exists());

    // With --input, the default file names take the format's extension.
    fs::write(dir.join("lines.txt"), format!("{TEXT}\n")).unwrap();
    fs::create_dir(dir.join("lines")).unwrap();
    ok(&cosy(dir, &["file", "--prompt-wav", p, "--prompt-text", TRANSCRIPT, "--input", "lines.txt", "-o", "lines", "--format", "opus"]), "--input --format opus");
    assert_eq!(entries(&dir.join("lines")), vec!["000.opus"]);
    assert_eq!(fs::read(dir.join("lines/000.opus")).unwrap()[..4], *b"OggS");

    // An extension that says one format and --format another; an encoded format on stdout.
    let o = cosy_unloaded(dir, &file_args(p, "book.mp3", &["--format", "flac"], TEXT));
    refused(&o, "-o book.mp3 --format flac", &["-o book.mp3 is an mp3 by its extension, but --format flac asks for a flac", "book.flac"]);
    let o = cosy_unloaded(dir, &file_args(p, "-", &["--format", "mp3"], TEXT));
    refused(&o, "-o - --format mp3", &["-o - streams raw pcm", "-o FILE.mp3"]);
    assert!(!dir.join("book.mp3").exists() && !dir.join("book.flac").exists());
}
