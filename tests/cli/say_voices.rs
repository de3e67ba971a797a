//! Saved voices end to end on the bundled tiny model: `cosy voice add/list/rm`, `--voice NAME`
//! skipping all prompt-audio work with output bit-identical to the equivalent `--prompt-wav` run,
//! bit-exact storage, refusal of voices made for another model and of unknown names.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cosy::voice::{SavedVoice, VoiceStore};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";
const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";

use crate::common::{fixture_model as model, fixture_prompt as prompt};

/// `cosy --model MODEL --provider cpu --set voices.dir=<dir>/voices ARGS`, cwd = `dir`, no COSY_*.
fn cosy_with(model: &Path, dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    // XDG_RUNTIME_DIR: no running server is found (the model is loaded here, as these tests check).
    cmd.current_dir(dir)
        .env("XDG_RUNTIME_DIR", dir)
        .arg("--model")
        .arg(model)
        .args(["--provider", "cpu", "--set"])
        .arg(format!("voices.dir={}", dir.join("voices").display()))
        .args(args)
        .output()
        .expect("run cosy")
}

fn cosy(dir: &Path, args: &[&str]) -> Output {
    cosy_with(&model(), dir, args)
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "cosy failed ({:?}): {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit 2, one `cosy: …` line on stderr; returns it.
fn refused(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: exit {:?}: {err}", o.status.code());
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: expected one line: {err}");
    assert!(lines[0].starts_with("cosy: "), "{what}: {err}");
    lines[0].to_string()
}

fn add(dir: &Path, name: &str) -> Output {
    let p = prompt();
    cosy(dir, &["voice", "add", name, "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT])
}

fn npy_i64(path: &Path) -> Vec<i64> {
    cosy::npy::read(path).expect("npy").to_i64(path).expect("ints").iter().copied().collect()
}

fn npy_f32(path: &Path) -> Vec<f32> {
    cosy::npy::read(path).expect("npy").to_f32().iter().copied().collect()
}

#[test]
fn voice_synthesis_skips_prompt_audio_and_is_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = ok(&add(dir, "narrator"));
    assert!(out.contains("saved voice narrator"), "{out}");
    let file = dir.join("voices/narrator.safetensors");
    assert!(file.is_file());
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("voices")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the voice file, no temporary files: {leftovers:?}");

    let p = prompt();
    let run = |name: &str, voice: &[&str]| {
        let wav = dir.join(format!("{name}.wav"));
        let dump = dir.join(name);
        let mut args = vec!["file", "--min-tokens", "60", "--stream", "-o", wav.to_str().unwrap(), "--dump", dump.to_str().unwrap()];
        args.extend_from_slice(voice);
        args.push("--");
        args.push(TEXT);
        ok(&cosy(dir, &args));
        (std::fs::read(&wav).unwrap(), dump)
    };
    let (wav_prompt, dump_prompt) = run("from_wav", &["--prompt-wav", p.to_str().unwrap(), "--prompt-text", TRANSCRIPT]);
    let (wav_voice, dump_voice) = run("from_voice", &["--voice", "narrator"]);

    // No prompt-audio work with a saved voice: none of its intermediates exist.
    for f in ["whisper_mel.npy", "campplus_fbank.npy", "prompt_speech_token_raw.npy", "prompt_feat_raw.npy"] {
        assert!(dump_prompt.join(f).is_file(), "the --prompt-wav run dumps {f}");
        assert!(!dump_voice.join(f).exists(), "the --voice run must not compute {f}");
    }
    for f in ["prompt_speech_token.npy", "speech_token.npy", "llm_token_raw.npy", "prompt_text_token.npy"] {
        assert_eq!(npy_i64(&dump_voice.join(f)), npy_i64(&dump_prompt.join(f)), "{f}");
    }
    // Bit-identical on any CPU: one binary on one machine, and the voice holds the very prompt tensors
    // the --prompt-wav run computes, so everything after them is the same computation.
    for f in ["prompt_feat.npy", "speaker_embedding.npy", "waveform.npy"] {
        let (a, b) = (npy_f32(&dump_voice.join(f)), npy_f32(&dump_prompt.join(f)));
        assert_eq!(a.len(), b.len(), "{f}");
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{f} differs");
    }
    assert!(wav_voice == wav_prompt, "the --voice WAV must be bit-identical to the --prompt-wav WAV");
    assert!(wav_voice.len() > 44 + 2 * 4800, "the WAV holds audio");

    // The stored tensors are exactly the prompt features of the recording (written and read back).
    let saved = VoiceStore::new(dir.join("voices")).load("narrator").unwrap();
    assert_eq!(saved.speech_token, npy_i64(&dump_prompt.join("prompt_speech_token.npy")));
    let feat: Vec<f32> = saved.prompt_feat.iter().copied().collect();
    assert_eq!(feat.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
               npy_f32(&dump_prompt.join("prompt_feat.npy")).iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(saved.prompt_feat.dim(), (2 * saved.speech_token.len(), 80));
    assert_eq!(saved.embedding.len(), 192);
    assert_eq!(saved.embedding, npy_f32(&dump_prompt.join("speaker_embedding.npy")));
    assert_eq!(saved.transcript, TRANSCRIPT);
    assert_eq!(saved.name, "narrator");
    assert_eq!(saved.cosy_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(saved.source_wav, "prompt_24k.wav");
    assert_eq!(saved.model_key.len(), 64);
    let dir_model = cosy::model::ModelDir::open(&model()).unwrap();
    assert_eq!(saved.model_key, cosy::voice::model_key(&dir_model).unwrap());
    assert!(saved.created.ends_with('Z') && saved.created.len() == 20, "{}", saved.created);

    // An instruct request may use the saved voice too.
    let o = cosy(dir, &["file", "--voice", "narrator", "--instruct", "Please say a sentence as loudly as possible.", "-o", dir.join("i.wav").to_str().unwrap(), TEXT]);
    ok(&o);
}

#[test]
fn stored_tensors_round_trip_bit_exact() {
    let d = tempfile::tempdir().unwrap();
    let store = VoiceStore::new(d.path().join("v"));
    let l = 7;
    // Values whose bits matter: subnormals, negative zero, the ends of what a prompt mel may hold
    // (`PROMPT_FEAT_RANGE`: a value past it is a damaged file, refused since issue 30).
    let top = *cosy::voice::PROMPT_FEAT_RANGE.end();
    let feat: Vec<f32> = (0..2 * l * 80)
        .map(|i| match i % 5 {
            0 => f32::from_bits(i as u32 + 1),
            1 => -0.0,
            2 => top / (i as f32 + 1.0),
            3 => -(i as f32).sqrt() / 3.0,
            _ => 1e-30 * i as f32,
        })
        .collect();
    let voice = SavedVoice {
        name: "x.y-z_1".into(),
        transcript: "Ünïcödé, \"quotes\" and <|endofprompt|> 你好".into(),
        speech_token: vec![0, 6560, 1, 4000, 2, 3, i64::from(i32::MAX)],
        prompt_feat: ndarray::Array2::from_shape_vec((2 * l, 80), feat).unwrap(),
        embedding: (0..192).map(|i| (i as f32 * 0.37).sin()).collect(),
        model_key: "ab".repeat(32),
        model: "/some/model".into(),
        frontend_precision: "fp32".into(),
        source_wav: "a.wav".into(),
        created: "2024-01-02T03:04:05Z".into(),
        cosy_version: "9.9.9".into(),
    };
    let path = store.save(&voice, false).unwrap();
    let back = store.load("x.y-z_1").unwrap(); // written and read back: exact
    assert_eq!(back.speech_token, voice.speech_token);
    assert_eq!(back.prompt_feat.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), voice.prompt_feat.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(back.embedding.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), voice.embedding.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(back, voice);
    // Not replaced without asking; replaced when asked.
    let err = store.save(&voice, false).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
    store.save(&voice, true).unwrap();
    assert_eq!(store.names().unwrap(), vec!["x.y-z_1".to_string()]);
    // A damaged file is refused with a clear message naming it.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = store.load("x.y-z_1").unwrap_err().to_string();
    assert!(err.contains("x.y-z_1.safetensors") && err.contains("voice add"), "{err}");
    // Inconsistent shapes are refused on save.
    let mut bad = voice.clone();
    bad.speech_token.pop();
    assert!(store.save(&bad, true).is_err());
}

#[test]
fn list_add_twice_remove_and_unknown_names() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let out = ok(&cosy(dir, &["voice", "list"]));
    assert!(out.contains("no saved voices"), "{out}");
    ok(&add(dir, "alice"));
    ok(&add(dir, "bob"));
    let out = ok(&cosy(dir, &["voice", "list"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("alice ") && lines[1].starts_with("bob "), "{out}");
    assert!(out.contains(TRANSCRIPT) && !out.contains("another model"), "{out}");

    let line = refused(&add(dir, "alice"), "add twice");
    assert!(line.contains("already exists") && line.contains("--force"), "{line}");
    let p = prompt();
    ok(&cosy(dir, &["voice", "add", "alice", "--force", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]));
    let line = refused(&cosy(dir, &["voice", "add", "../evil", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]), "bad name");
    assert!(line.contains("not allowed"), "{line}");
    let line = refused(&cosy(dir, &["voice", "add", "quiet", "--wav", p.to_str().unwrap(), "--text", "  "]), "empty transcript");
    assert!(line.contains("transcript"), "{line}");
    assert!(!dir.join("voices/quiet.safetensors").exists());

    let out_wav = dir.join("o.wav");
    let line = refused(&cosy(dir, &["file", "--voice", "carol", "-o", out_wav.to_str().unwrap(), TEXT]), "unknown voice");
    // The same words as the server's 404, prefixed with the flag it is about.
    assert!(line.contains("--voice: voice \"carol\" not found") && line.contains("alice, bob"), "{line}");
    assert!(!out_wav.exists());

    ok(&cosy(dir, &["voice", "rm", "alice"]));
    assert!(!dir.join("voices/alice.safetensors").exists());
    let line = refused(&cosy(dir, &["voice", "rm", "alice"]), "rm twice");
    assert!(line.contains("voice \"alice\" not found") && line.contains("bob"), "{line}");
    let line = refused(&cosy(dir, &["say", "--device", "null", "--voice", "alice", TEXT]), "say unknown voice");
    assert!(line.contains("voice \"alice\" not found"), "{line}");
}

/// A copy of the tiny model whose manifest describes another model (one more config entry), so
/// its model key differs while every graph still loads.
fn other_model(dir: &Path) -> PathBuf {
    let other = dir.join("other-model");
    std::fs::create_dir_all(&other).unwrap();
    for e in std::fs::read_dir(model()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), other.join(e.file_name())).unwrap();
    }
    let m = std::fs::read_to_string(other.join("manifest.json")).unwrap();
    let changed = m.replacen("\"config\": {", "\"config\": {\n  \"variant\": \"another\",", 1);
    assert_ne!(m, changed);
    std::fs::write(other.join("manifest.json"), changed).unwrap();
    other
}

#[test]
fn a_voice_made_for_another_model_is_refused_naming_both() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let other = other_model(dir);
    // The copy really is a working model: a voice made with it is fine for it.
    let p = prompt();
    ok(&cosy_with(&other, dir, &["voice", "add", "theirs", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]));
    ok(&add(dir, "ours"));
    let out_wav = dir.join("o.wav");
    let o = cosy(dir, &["file", "--voice", "theirs", "-o", out_wav.to_str().unwrap(), TEXT]);
    let line = refused(&o, "voice from another model");
    assert!(line.contains("another model"), "{line}");
    assert!(line.contains(&other.display().to_string()), "names the voice's model: {line}");
    assert!(line.contains(&model().display().to_string()), "names the model in use: {line}");
    assert!(!out_wav.exists());
    let line = refused(&cosy_with(&other, dir, &["say", "--device", "null", "--voice", "ours", TEXT]), "say, other model");
    assert!(line.contains("another model"), "{line}");
    let listed = ok(&cosy(dir, &["voice", "list"]));
    let theirs = listed.lines().find(|l| l.starts_with("theirs ")).expect("listed");
    let ours = listed.lines().find(|l| l.starts_with("ours ")).expect("listed");
    assert!(theirs.contains("[made for another model]") && !ours.contains("another model"), "{listed}");
    // The library refuses it as well (not only the CLI's early check).
    let saved = VoiceStore::new(dir.join("voices")).load("theirs").unwrap();
    let key = cosy::voice::model_key(&cosy::model::ModelDir::open(&model()).unwrap()).unwrap();
    assert!(saved.check_model(&key, &model()).is_err());
    assert_ne!(saved.model_key, key);
}

/// A listing reads each file's header only: a 3 GB stray file, a dangling link, a truncated voice
/// and another model's voice are each described as what they are, in bounded memory, one line
/// each, and the default mark stays on the default even when it is broken.
#[test]
fn a_listing_reads_headers_only_and_names_every_broken_entry() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(&add(dir, "good"));
    let [huge, dangling, cut, foreign] = crate::common::broken_voices(&dir.join("voices"), "good");
    // `voice default` refuses a broken voice; a default that broke afterwards is still listed as one.
    let line = refused(&cosy(dir, &["voice", "default", cut]), "broken default");
    assert!(line.contains("truncated"), "{line}");
    std::fs::write(dir.join("voices/DEFAULT"), format!("{cut}\n")).unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir).arg("--model").arg(model()).args(["--provider", "cpu", "--set"]);
    cmd.arg(format!("voices.dir={}", dir.join("voices").display())).args(["voice", "list"]);
    let (out, peak) = crate::common::run_measuring_peak_memory(&cmd);
    let listed = ok(&out);
    // Reading the 3 GB file whole would take 3 GB; the headers take a few kB (the process itself
    // is a few tens of MB).
    assert!(peak < 100 << 20, "voice list peaked at {} MB:\n{listed}", peak >> 20);
    let line = |name: &str| -> String {
        let lines: Vec<&str> = listed.lines().filter(|l| l.split_whitespace().next() == Some(name)).collect();
        assert_eq!(lines.len(), 1, "one line for {name}:\n{listed}");
        lines[0].to_string()
    };
    assert_eq!(listed.lines().count(), 5, "{listed}");
    assert!(line("good").contains(TRANSCRIPT) && !line("good").contains('['), "{listed}");
    assert!(line(huge).contains("[unusable:") && line(huge).contains("not a voice file"), "{listed}");
    assert!(line(dangling).contains("symbolic link") && line(dangling).contains("does not exist"), "{listed}");
    assert!(line(cut).contains("truncated") && line(cut).contains("(default: requests without a voice fail"), "{listed}");
    assert!(line(foreign).contains("[made for another model]") && line(foreign).contains(TRANSCRIPT), "{listed}");
    assert!(!line(foreign).contains("(default"), "{listed}");

    // Loading them for speech is bounded the same way, with the same words.
    let out_wav = dir.join("o.wav");
    let huge_refused = refused(&cosy(dir, &["file", "--voice", huge, "-o", out_wav.to_str().unwrap(), TEXT]), "huge voice");
    assert!(huge_refused.contains("not a voice file") && huge_refused.contains("huge.safetensors"), "{huge_refused}");
    let dangling_refused = refused(&cosy(dir, &["file", "--voice", dangling, "-o", out_wav.to_str().unwrap(), TEXT]), "dangling");
    assert!(dangling_refused.contains("symbolic link"), "{dangling_refused}");
    assert!(!out_wav.exists());
}
