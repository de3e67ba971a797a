//! A newcomer's first commands and the configuration behind them, end to end on the bundled tiny
//! model: the default voice (`cosy say "Hello"` with no voice flags), ALSA's own error prints
//! silenced, `streaming.enabled` as the default schedule of `file`, and manifest values that no
//! inference can run with refused on load with one line (never a panic).

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{fixture_model as model, fixture_prompt as prompt, one_line_error};

const TRANSCRIPT: &str = "This recording is the voice prompt.";
const NULL_DEFAULT: &str = "pcm.!default { type null }\n";
/// A default output on a card that does not exist, whatever the machine has. Named by a string, so
/// that ALSA's card lookup fails and prints its own "ALSA lib ... Cannot get card index" line, as
/// it does on a machine without sound.
const NO_DEVICE: &str = "pcm.!default { type hw; card \"nosuchcard\"; device 0 }\n";

/// `cosy --provider cpu ARGS` with HOME and cwd = `dir` (its `.asoundrc` picks the sound output),
/// voices in `dir/voices`, no COSY_* from the outside; `model` when given.
fn cosy_in(dir: &Path, model_dir: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", dir).env("XDG_RUNTIME_DIR", dir).current_dir(dir);
    if let Some(m) = model_dir {
        cmd.arg("--model").arg(m);
    }
    cmd.args(["--provider", "cpu", "--set"])
        .arg(format!("voices.dir={}", dir.join("voices").display()))
        .args(args)
        .output()
        .expect("run cosy")
}

fn cosy(dir: &Path, args: &[&str]) -> Output {
    cosy_in(dir, Some(&model()), args)
}

fn home(asoundrc: &str) -> tempfile::TempDir {
    let h = tempfile::tempdir().unwrap();
    std::fs::write(h.path().join(".asoundrc"), asoundrc).unwrap();
    h
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "cosy failed ({:?}): {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn add_voice(dir: &Path, name: &str, extra: &[&str]) -> Output {
    let p = prompt();
    let mut args = vec!["voice", "add", name, "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT];
    args.extend_from_slice(extra);
    cosy(dir, &args)
}

#[test]
fn without_a_default_voice_say_names_cosy_voice_add() {
    let h = home(NULL_DEFAULT);
    for cmd in [vec!["say", "Hello"], vec!["file", "Hello", "-o", "x.wav"], vec!["profile", "Hello", "--runs", "1"]] {
        let line = one_line_error(&cosy(h.path(), &cmd), &cmd.join(" "));
        assert!(line.contains("cosy voice add") && line.contains("--default"), "{line}");
    }
    assert!(!h.path().join("x.wav").exists(), "no output on refusal");
    let line = one_line_error(&cosy(h.path(), &["say", "--prompt-text", "x", "Hello"]), "--prompt-text alone");
    assert!(line.contains("--prompt-wav"), "{line}");
}

#[test]
fn the_default_voice_is_used_when_no_voice_is_given() {
    let h = home(NULL_DEFAULT);
    ok(&add_voice(h.path(), "me", &["--default"]));
    assert!(ok(&cosy(h.path(), &["voice", "default"])).starts_with("me "), "voice default shows it");
    let list = ok(&cosy(h.path(), &["voice", "list"]));
    assert!(list.lines().any(|l| l.starts_with("me ") && l.ends_with("(default)")), "{list}");

    // The newcomer's command: no flags at all (the null device stands in for a sound card).
    ok(&cosy(h.path(), &["say", "Hello"]));

    // `file` with the default voice writes what `--voice me` writes: the same binary, input and
    // seed on the same machine run the same float operations in the same order, so the files are
    // identical bytes.
    ok(&cosy(h.path(), &["file", "Hello there.", "-o", "default.wav"]));
    ok(&cosy(h.path(), &["file", "Hello there.", "--voice", "me", "-o", "named.wav"]));
    let a = std::fs::read(h.path().join("default.wav")).unwrap();
    let b = std::fs::read(h.path().join("named.wav")).unwrap();
    assert!(a.len() > 44 && a == b, "the default voice is voice me");

    // `cosy voice default NAME` switches; the config's voices.default overrides the folder.
    ok(&add_voice(h.path(), "other", &[]));
    ok(&cosy(h.path(), &["voice", "default", "other"]));
    assert!(ok(&cosy(h.path(), &["voice", "default"])).starts_with("other "));
    let shown = ok(&cosy(h.path(), &["--set", "voices.default=me", "voice", "default"]));
    assert!(shown.starts_with("me ") && shown.contains("config"), "{shown}");
    let line = one_line_error(&cosy(h.path(), &["--set", "voices.default=ghost", "say", "Hello"]), "unknown default");
    assert!(line.contains("ghost") && line.contains("voices.default"), "{line}");
    let line = one_line_error(&cosy(h.path(), &["voice", "default", "ghost"]), "default to an unknown voice");
    assert!(line.contains("ghost"), "{line}");

    // Removing the default voice forgets it, so the next run says how to make one.
    ok(&cosy(h.path(), &["voice", "rm", "other"]));
    assert!(ok(&cosy(h.path(), &["voice", "default"])).starts_with("no default voice"));
    ok(&cosy(h.path(), &["voice", "default", "me"]));
    ok(&cosy(h.path(), &["voice", "default", "--clear"]));
    let line = one_line_error(&cosy(h.path(), &["say", "Hello"]), "cleared default");
    assert!(line.contains("cosy voice add"), "{line}");
}

#[test]
fn without_a_sound_card_say_prints_one_line_and_no_alsa_noise() {
    let h = home(NO_DEVICE);
    let p = prompt();
    let o = cosy(h.path(), &["say", "--prompt-wav", p.to_str().unwrap(), "--prompt-text", TRANSCRIPT, "Hello"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("ALSA lib"), "ALSA printed its own errors: {err}");
    let line = one_line_error(&o, "no sound card");
    assert!(line.contains("cosy file"), "{line}");
    // Listing devices touches every card, and prints nothing of ALSA's either.
    let o = cosy(h.path(), &["say", "--list-devices"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("ALSA lib"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn streaming_enabled_is_the_default_schedule_of_file() {
    let h = home(NULL_DEFAULT);
    let p = prompt();
    // 60 forced tokens: more than one streaming chunk, so the two schedules differ.
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec!["file", "--prompt-wav", p.to_str().unwrap(), "--prompt-text", TRANSCRIPT, "--min-tokens", "60"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", out, "Hello there, this is a test."]);
        ok(&cosy(h.path(), &args));
        std::fs::read(h.path().join(out)).unwrap()
    };
    let offline = run("offline.wav", &[]);
    let streamed = run("stream.wav", &["--stream"]);
    let by_config = run("config.wav", &["--set", "streaming.enabled=true"]);
    let overridden = run("no-stream.wav", &["--set", "streaming.enabled=true", "--no-stream"]);
    assert_ne!(offline, streamed, "the schedules must differ for this test to mean anything");
    // Same binary, input and seed on one machine: identical bytes (see the default-voice test).
    assert!(by_config == streamed, "streaming.enabled=true streams");
    assert!(overridden == offline, "--no-stream wins over the config");
    // A speed needs whole sentences: with streaming.enabled it quietly makes them (as `say` does),
    // while an explicit --stream with a speed is refused.
    ok(&cosy(h.path(), &["--set", "streaming.enabled=true", "file", "--prompt-wav", p.to_str().unwrap(), "--speed", "1.1", "-o", "s.wav", "Hi."]));
    one_line_error(
        &cosy(h.path(), &["file", "--prompt-wav", p.to_str().unwrap(), "--speed", "1.1", "--stream", "-o", "t.wav", "Hi."]),
        "--stream with --speed",
    );
}

/// A writable copy of the fixture with `edit` applied to its manifest.
fn broken_model(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = crate::common::writable_model_dir().expect("fixture model");
    crate::common::edit_manifest(dir.path(), edit);
    dir
}

#[test]
fn manifest_values_no_inference_can_run_with_are_refused_on_load() {
    let h = home(NULL_DEFAULT);
    let p = prompt();
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 7] = [
        ("cfm.n_timesteps", |m| m["constants"]["cfm"]["n_timesteps"] = 0.into()),
        ("sample_rate", |m| m["config"]["sample_rate"] = 0.into()),
        ("samples_per_frame", |m| m["constants"]["samples_per_frame"] = 0.into()),
        ("token_text_ratio", |m| {
            m["constants"]["min_token_text_ratio"] = 20.0.into();
            m["constants"]["max_token_text_ratio"] = 2.0.into();
        }),
        ("token_hop_len", |m| m["constants"]["streaming"]["token_hop_len"] = 0.into()),
        ("token_max_hop_len", |m| m["constants"]["streaming"]["token_max_hop_len"] = 5.into()),
        ("top_p", |m| m["constants"]["sampling"]["top_p"] = 0.0.into()),
    ];
    for (key, edit) in cases {
        let dir = broken_model(edit);
        let o = cosy_in(h.path(), Some(dir.path()), &["file", "--prompt-wav", p.to_str().unwrap(), "-o", "x.wav", "Hello."]);
        let line = one_line_error(&o, key);
        assert!(line.contains("manifest.json") && line.contains(key), "{key}: {line}");
        assert!(!h.path().join("x.wav").exists(), "{key}: no output");
        // `cosy doctor` names the same problem.
        let o = cosy_in(h.path(), Some(dir.path()), &["doctor", "--quick"]);
        assert!(!o.status.success(), "{key}: doctor must report it");
        assert!(String::from_utf8_lossy(&o.stdout).contains(key), "{key}: {}", String::from_utf8_lossy(&o.stdout));
    }
}
