//! The command-line probe's findings (issue 30, point 5), by class, through the real binary on
//! the bundled tiny model: each bad input is refused with one `cosy: …` line naming the thing and
//! the fix, exit 2 (an input, config or model error), and nothing written.
//! * checks of sense, not only of form: a text of only `<|endofprompt|>`, a manifest's
//!   `noise_frames = 0`, a voice file whose features are off by orders of magnitude (prompt
//!   recordings far too quiet or far past full scale: tests/cli/say_bad_inputs.rs);
//! * limits on every text and count: `--prompt-text`, `--instruct`, `voice add --text`, a saved
//!   voice's transcript, `profile --warmup` / `--runs`;
//! * errors raised deep inside keep the user's words: a voice with an impossible token, a voices
//!   folder that cannot be written, a graph path that is a folder, `voice rm ../x`;
//! * the same problem, the same exit: invalid UTF-8 on standard input and through `--input`;
//! * nothing silently ignored: a folder named `./config.toml`, CR-only line ends, a manifest path
//!   that leaves the model folder.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";
const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";

fn prompt() -> PathBuf {
    crate::common::fixture_prompt()
}

/// `cosy ARGS` at home in `dir` on the bundled model, `stdin` fed to it.
fn cosy_fed(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = crate::common::cosy_at_home(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cosy");
    child.stdin.take().expect("stdin").write_all(stdin).expect("feed stdin");
    child.wait_with_output().expect("cosy output")
}

fn cosy(dir: &Path, args: &[&str]) -> Output {
    cosy_fed(dir, args, b"")
}

/// With a model folder that does not exist: only checks made before loading pass.
fn cosy_unloaded(dir: &Path, args: &[&str]) -> Output {
    let set = format!("model.dir={}", dir.join("no-model-here").display());
    let mut all = vec!["--set", set.as_str()];
    all.extend_from_slice(args);
    cosy(dir, &all)
}

/// Exit 2 and one `cosy: …` line holding every needle; nothing on stdout. Returns the line.
fn refused(o: &Output, what: &str, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: exit {:?}, stderr {err}", o.status.code());
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: expected one line, got {err}");
    assert!(lines[0].starts_with("cosy: "), "{what}: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "{what}: {:?} lacks {n:?}", lines[0]);
    }
    assert!(o.stdout.is_empty(), "{what}: stdout {:?}", String::from_utf8_lossy(&o.stdout));
    lines[0].to_string()
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

#[test]
fn texts_with_nothing_to_speak_and_prompt_texts_past_the_limit_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    // Only a special token: nothing to speak (it was synthesised with exit 0).
    for text in ["<|endofprompt|>", "Speak slowly.<|endofprompt|>"] {
        let o = cosy_unloaded(dir, &["file", "--prompt-wav", p, "-o", "o.wav", "--", text]);
        refused(&o, text, &["nothing to speak", "<|endofprompt|>"]);
    }
    // A 21,000-character transcript or instruction, wherever it is given.
    let long = "a".repeat(21_000);
    let cases: [(&[&str], &str); 3] = [
        (&["file", "--prompt-wav", p, "--prompt-text", &long, "-o", "o.wav", TEXT], "--prompt-text: the prompt transcript has 21000 characters"),
        (&["file", "--prompt-wav", p, "--instruct", &long, "-o", "o.wav", TEXT], "--instruct: the instruction has 21000 characters"),
        (&["voice", "add", "v", "--wav", p, "--text", &long], "--text: the prompt transcript has 21000 characters"),
    ];
    for (args, needle) in cases {
        refused(&cosy_unloaded(dir, args), needle, &[needle, "limits.max_prompt_text_chars"]);
    }
    assert!(!dir.join("o.wav").exists() && !dir.join("voices/v.safetensors").exists());
}

#[test]
fn profile_runs_are_capped_naming_the_cap() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    for (flag, value, cap) in [("--warmup", "1000000", "100"), ("--runs", "1001", "1000")] {
        let o = cosy_unloaded(dir, &["profile", "--prompt-wav", p, flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag) && err.contains(&format!("more than the cap of {cap}")), "{flag} {value}: {err}");
    }
}

#[test]
fn invalid_utf8_is_an_input_error_on_stdin_and_through_input() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    let bad = b"ok \xff\xfe text\n";
    std::fs::write(dir.join("bad.txt"), bad).unwrap();
    let o = cosy_fed(dir, &["file", "--prompt-wav", p, "-o", "o.wav", "-"], bad);
    refused(&o, "stdin", &["<stdin>: invalid UTF-8 at byte 3; send UTF-8 text"]);
    let o = cosy_fed(dir, &["file", "--prompt-wav", p, "--input", "-"], bad);
    refused(&o, "--input -", &["<stdin>: invalid UTF-8 at byte 3"]);
    let o = cosy(dir, &["file", "--prompt-wav", p, "--input", "bad.txt"]);
    refused(&o, "--input FILE", &["--input bad.txt: invalid UTF-8 at byte 3; send UTF-8 text"]);
    assert!(!dir.join("o.wav").exists() && !dir.join("000.wav").exists());
}

#[test]
fn a_lone_cr_ends_an_input_line() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    // Each line is checked (and named) on its own: the emoji line is line 2.
    std::fs::write(dir.join("cr.txt"), "Fine.\r🎉🎉\r").unwrap();
    let o = cosy_unloaded(dir, &["file", "--prompt-wav", p, "--input", "cr.txt"]);
    refused(&o, "CR lines", &["--input cr.txt line 2:", "nothing speakable"]);
    // One utterance per line, a file each.
    std::fs::write(dir.join("cr.txt"), format!("{TEXT}\r{TEXT}\r")).unwrap();
    std::fs::create_dir(dir.join("out")).unwrap();
    let o = cosy(dir, &["file", "--prompt-wav", p, "--min-tokens", "6", "--seed", "3", "--input", "cr.txt", "-o", "out"]);
    ok(&o, "CR lines");
    assert!(dir.join("out/000.wav").is_file() && dir.join("out/001.wav").is_file() && !dir.join("out/002.wav").exists());
}

#[test]
fn a_folder_named_config_toml_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    std::fs::create_dir(dir.join("config.toml")).unwrap();
    refused(&cosy(dir, &["voice", "list"]), "./config.toml folder", &["config file ./config.toml is a folder", "--config"]);
}

#[test]
fn voice_commands_name_their_own_argument() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    for args in [&["voice", "rm", "../x"][..], &["voice", "default", "../x"]] {
        let line = refused(&cosy(dir, args), &args.join(" "), &["cosy: NAME: voice name \"../x\" is not allowed"]);
        assert!(!line.contains("--voice"), "{line}");
    }
}

/// A copy of the bundled model with `break_it` applied.
fn broken_model(break_it: impl FnOnce(&Path)) -> tempfile::TempDir {
    let m = crate::common::writable_model_dir().expect("the bundled model");
    break_it(m.path());
    m
}

#[test]
fn a_broken_model_folder_is_named_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    let folder_graph = broken_model(|m| {
        std::fs::remove_file(m.join("campplus.onnx")).unwrap();
        std::fs::create_dir(m.join("campplus.onnx")).unwrap();
    });
    let escaping = broken_model(|m| crate::common::edit_manifest(m, |v| v["files"]["tokenizer"]["file"] = "../../../../etc/passwd".into()));
    let absolute = broken_model(|m| crate::common::edit_manifest(m, |v| v["graphs"]["llm"]["variants"]["fp32"]["file"] = "/etc/passwd".into()));
    let no_noise = broken_model(|m| crate::common::edit_manifest(m, |v| v["constants"]["noise_frames"] = 0.into()));
    let other_noise = broken_model(|m| crate::common::edit_manifest(m, |v| v["constants"]["noise_frames"] = 1499.into()));
    let cases: [(&tempfile::TempDir, &[&str]); 5] = [
        (&folder_graph, &["campplus.onnx is a folder, expected an .onnx graph file"]),
        (&escaping, &["files.tokenizer.file = \"../../../../etc/passwd\" leaves the model folder"]),
        (&absolute, &["graphs.llm.variants.fp32.file = \"/etc/passwd\" is an absolute path"]),
        (&no_noise, &["constants.noise_frames = 0 is invalid"]),
        (&other_noise, &["constants.noise_frames = 1499, but side.safetensors's flow.noise has 1500 frames"]),
    ];
    for (model, needles) in cases {
        let set = format!("model.dir={}", model.path().display());
        let o = cosy(dir, &["--set", &set, "file", "--prompt-wav", p, "-o", "o.wav", TEXT]);
        refused(&o, needles[0], needles);
        assert!(!dir.join("o.wav").exists());
    }
}

#[test]
fn damaged_voices_and_unwritable_voice_folders_are_named_with_the_fix() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let p = prompt();
    let p = p.to_str().unwrap();
    ok(&cosy(dir, &["voice", "add", "good", "--wav", p, "--text", TRANSCRIPT]), "voice add");
    let store = cosy::voice::VoiceStore::new(dir.join("voices"));
    let good = store.load("good").unwrap();
    let save_as = |name: &str, edit: &dyn Fn(&mut cosy::voice::SavedVoice)| {
        let mut v = good.clone();
        v.name = name.into();
        edit(&mut v);
        // Written past the store, as a damaged file would be.
        std::fs::write(store.path_of(name), v.to_bytes().unwrap()).unwrap();
    };
    // An exponent bit flipped in the embedding (2.0 becomes 2^65): it was used, and made noise.
    save_as("flipped", &|v| v.embedding[3] = f32::from_bits(2.0f32.to_bits() ^ (1 << 29)));
    // A token past the model's speech tokens: it failed deep in the LLM without naming the voice.
    save_as("token", &|v| v.speech_token[2] = 9999);
    save_as("long", &|v| v.transcript = "a".repeat(2001));
    let cases: [(&str, &[&str]); 3] = [
        ("flipped", &["flipped.safetensors", "speaker embedding has a value of", "cosy voice add flipped --wav FILE --text TEXT --force"]),
        ("token", &["voice \"token\": its speech token 9999 is outside this model's 6561 speech tokens", "cosy voice add token"]),
        ("long", &["saved voice \"long\"", "2001 characters", "limits.max_prompt_text_chars", "cosy voice add long"]),
    ];
    for (name, needles) in cases {
        let o = cosy(dir, &["file", "--voice", name, "-o", "o.wav", TEXT]);
        refused(&o, name, needles);
        assert!(!dir.join("o.wav").exists());
    }
    // A voices folder nothing can be written to (sysfs refuses new files even to root): the
    // folder and the fix, not the temporary file the save went through.
    let o = cosy(dir, &["--set", "voices.dir=/sys", "voice", "add", "v", "--wav", p, "--text", TRANSCRIPT]);
    let line = refused(&o, "unwritable voices folder", &["writing voice \"v\" (/sys/v.safetensors)", "make the voices folder /sys writable", "voices.dir"]);
    assert!(!line.contains(".tmp"), "{line}");
}
