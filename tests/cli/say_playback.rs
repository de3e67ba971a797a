//! `cosy say` end to end on the bundled tiny model (tests/fixtures/tiny), played through ALSA's
//! null device. Every test spawns the built binary as its own process with HOME pointing to a
//! temporary folder whose `.asoundrc` makes the default PCM the null device (ALSA reads its
//! configuration once per process), so nothing here needs a sound card.
//!
//! Streaming is checked by the order of events in the hidden `--event-log` (one line per event,
//! numbered by the sequence counter the device callback shares), not by wall time.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TRANSCRIPT: &str = "Good evening, this recording captures my natural voice.";
const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";

use crate::common::{fixture_model as model, fixture_prompt as prompt};

/// A HOME whose ALSA default output is `asoundrc`.
fn home(asoundrc: &str) -> tempfile::TempDir {
    let h = tempfile::tempdir().unwrap();
    std::fs::write(h.path().join(".asoundrc"), asoundrc).unwrap();
    h
}

const NULL_DEFAULT: &str = "pcm.!default { type null }\n";
/// A default output that does not exist, whatever the machine has.
const NO_DEVICE: &str = "pcm.!default { type hw; card 99; device 0 }\n";

/// `cosy --model tiny --provider cpu ARGS` in a clean environment (no COSY_*, cwd = HOME, so no
/// config.toml is picked up).
fn cosy_cmd(home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", home).env("XDG_RUNTIME_DIR", home).current_dir(home);
    cmd.arg("--model").arg(model()).args(["--provider", "cpu"]).args(args);
    cmd
}

fn cosy(home: &Path, args: &[&str]) -> Output {
    cosy_cmd(home, args).output().expect("run cosy")
}

fn say_args<'a>(prompt: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["say", "--prompt-wav", prompt, "--prompt-text", TRANSCRIPT];
    v.extend_from_slice(extra);
    v.push("--");
    v.push(TEXT);
    v
}

/// Event-log lines sorted by sequence number: (seq, event, args).
fn events(path: &Path) -> Vec<(u64, String, Vec<String>)> {
    let text = std::fs::read_to_string(path).expect("event log");
    let mut out: Vec<(u64, String, Vec<String>)> = text
        .lines()
        .map(|l| {
            let mut parts = l.split_whitespace().map(str::to_string);
            let seq = parts.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad line {l:?}"));
            let name = parts.next().unwrap_or_else(|| panic!("bad line {l:?}"));
            (seq, name, parts.collect())
        })
        .collect();
    out.sort_by_key(|e| e.0);
    let mut seqs: Vec<u64> = out.iter().map(|e| e.0).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), out.len(), "sequence numbers are unique");
    out
}

fn first(ev: &[(u64, String, Vec<String>)], name: &str) -> Option<u64> {
    ev.iter().find(|e| e.1 == name).map(|e| e.0)
}

fn ok(o: &Output) {
    assert!(o.status.success(), "cosy failed ({:?}): {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

/// The first audio reaches the device while the LLM is still decoding (`--no-buffering`: played
/// as soon as it comes, whatever the machine's speed; the buffering rule has its own tests below).
/// `--min-tokens 400` makes
/// the random tiny LLM decode 400 tokens, so the streaming schedule has several chunks; the first
/// chunk needs ~28 tokens, and the device must have pulled its samples before the LLM emitted its
/// last token. An implementation that waited for the LLM (offline) fails this on every run,
/// whatever the speed of the machine. (The LLM keeps decoding while the first chunk is vocoded; on
/// this fixture that takes the time of ~50 tokens, so 400 leaves a wide margin on a loaded machine.)
#[test]
fn say_plays_while_the_llm_is_still_decoding() {
    let h = home(NULL_DEFAULT);
    let log = h.path().join("events.txt");
    let p = prompt();
    let l = log.to_str().unwrap().to_string();
    let o = cosy(h.path(), &say_args(p.to_str().unwrap(), &["--no-buffering", "--min-tokens", "400", "--event-log", &l]));
    ok(&o);
    let ev = events(&log);
    assert!(first(&ev, "buffer_hold").is_none() && first(&ev, "buffer_open").is_none(), "--no-buffering decides nothing");
    let tokens: Vec<usize> =
        ev.iter().filter(|e| e.1 == "llm_token").map(|e| e.2[1].parse::<usize>().unwrap()).collect();
    assert!(tokens.len() >= 400, "--min-tokens 400 gave {} tokens", tokens.len());
    assert_eq!(tokens, (0..tokens.len()).collect::<Vec<_>>(), "tokens logged in order");
    let done = ev.iter().find(|e| e.1 == "llm_done").expect("llm_done");
    assert_eq!(done.2[1].parse::<usize>().unwrap(), tokens.len());
    assert_ne!(done.2[2], "cancelled");
    let pushed: Vec<u64> = ev.iter().filter(|e| e.1 == "chunk_pushed").map(|e| e.0).collect();
    assert!(pushed.len() >= 2, "expected several streaming chunks, got {}", pushed.len());
    let ready1 = first(&ev, "chunk_ready").unwrap();
    let device = first(&ev, "device_first_samples").expect("the device pulled audio");
    let llm_done = done.0;
    assert!(ready1 < device, "device got samples before the first chunk existed: {ev:?}");
    assert!(pushed[0] < llm_done, "first chunk pushed after the LLM finished (not streaming)");
    assert!(device < llm_done, "device got its first samples only after the LLM finished (not streaming)");
    // The first audio comes before the LLM's last token, not just before its done event.
    let last_token = ev.iter().filter(|e| e.1 == "llm_token").map(|e| e.0).max().unwrap();
    assert!(device < last_token);
    // Everything was pushed and played out, in order.
    let play_done = first(&ev, "playback_done").expect("playback_done");
    assert!(pushed.iter().all(|&s| s < play_done));
    assert_eq!(ev.last().unwrap().1, "playback_done");
    assert!(o.stderr.is_empty(), "no output on stderr by default: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn say_plays_on_a_named_device_and_with_a_saved_voice() {
    let h = home("");
    let p = prompt();
    // `--device null` needs no .asoundrc.
    ok(&cosy(h.path(), &say_args(p.to_str().unwrap(), &["--device", "null"])));
    let voices = h.path().join("voices");
    let set = format!("voices.dir={}", voices.display());
    ok(&cosy(h.path(), &["--set", &set, "voice", "add", "me", "--wav", p.to_str().unwrap(), "--text", TRANSCRIPT]));
    let log = h.path().join("ev.txt");
    let o = cosy(h.path(), &["--set", &set, "say", "--device", "null", "--voice", "me", "--event-log", log.to_str().unwrap(), TEXT]);
    ok(&o);
    let ev = events(&log);
    assert!(first(&ev, "device_first_samples").is_some());
    assert!(first(&ev, "playback_done").is_some());
}

#[test]
fn list_devices_prints_the_outputs_and_exits_0() {
    let h = home(NULL_DEFAULT);
    let o = cosy(h.path(), &["say", "--list-devices"]);
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().any(|l| l.starts_with("default (default)")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("null ")), "{out}");
    assert!(out.contains("Hz"), "{out}");
}

#[test]
fn no_audio_device_is_one_line_pointing_to_cosy_file() {
    let h = home(NO_DEVICE);
    let p = prompt();
    let o = cosy(h.path(), &say_args(p.to_str().unwrap(), &[]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_ne!(o.status.code(), Some(0));
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("cosy: no audio output device"), "{err}");
    assert!(lines[0].contains("cosy file"), "{err}");
    // An unknown device name is refused the same way, naming the ones there are.
    let o = cosy(h.path(), &say_args(p.to_str().unwrap(), &["--device", "no-such-speaker"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such-speaker") && err.contains("null"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Spawns `cosy say --no-buffering` (today's streaming path; Ctrl-C while buffering has its own
/// test) with `--min-tokens 600` (so the LLM is certainly still running), waits until
/// the event log holds `wait_for` (`""`: until the log file exists, i.e. the Ctrl-C handler is
/// installed and the model is about to load), then sends one SIGINT per entry of `gaps` (each
/// after sleeping that long). Returns the process output and the events.
fn interrupt(extra: &[&str], wait_for: &str, gaps: &[Duration]) -> (Output, Vec<(u64, String, Vec<String>)>) {
    let h = home(NULL_DEFAULT);
    let log = h.path().join("events.txt");
    let p = prompt();
    let mut opts = vec!["--no-buffering", "--min-tokens", "600", "--event-log", log.to_str().unwrap()];
    opts.extend_from_slice(extra);
    let args = say_args(p.to_str().unwrap(), &opts);
    let mut child = cosy_cmd(h.path(), &args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    wait_for_log(&mut child, &log, wait_for);
    for gap in gaps {
        std::thread::sleep(*gap);
        let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
        assert!(st.success());
    }
    let out = child.wait_with_output().expect("wait");
    let ev = events(&log);
    (out, ev)
}

/// Waits until the event log `log` of the running `child` holds `wait_for` (`""`: until it exists).
fn wait_for_log(child: &mut std::process::Child, log: &Path, wait_for: &str) {
    // The deadline only keeps a broken build from hanging the suite; nothing here measures speed.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(log);
        if text.is_ok_and(|t| t.contains(wait_for)) {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("cosy ended before {wait_for:?}: {status:?}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("hang guard: no {wait_for:?} in the event log");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Exit 130 and exactly the one line `cosy: stopped (Ctrl-C)` on stderr: never an ONNX Runtime
/// error from a run that was under way, never a crash, never silence.
fn stopped(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{what}: {:?} {err}", out.status);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines, vec!["cosy: stopped (Ctrl-C)"], "{what}: {err}");
}

/// Ctrl-C while the LLM is decoding: playback and synthesis stop, the process exits 130 with one
/// line, and the LLM loop reports that it was cancelled (it did not run to its end).
#[test]
fn ctrl_c_stops_playback_and_the_llm() {
    let (out, ev) = interrupt(&[], "chunk_pushed", &[Duration::ZERO]);
    stopped(&out, "after the first chunk");
    assert_eq!(ev.last().unwrap().1, "cancelled", "{ev:?}");
    assert!(first(&ev, "playback_done").is_none());
    let tokens = ev.iter().filter(|e| e.1 == "llm_token").count();
    assert!(tokens < 600, "the LLM ran on to {tokens} tokens after Ctrl-C");
    if let Some(done) = ev.iter().find(|e| e.1 == "llm_done") {
        assert_eq!(done.2[2], "cancelled", "{done:?}");
    }
}

/// Ctrl-C at other moments (while the model loads, on the first LLM token, without a player) and
/// twice in a row (the second press ends the process at once, while ONNX Runtime runs are under
/// way on other threads): always exit 130 with the one `stopped` line, never an ONNX Runtime
/// error such as `Softmax … GetElementType is not implemented` or a crash.
#[test]
fn ctrl_c_at_any_moment_and_twice_is_only_stopped() {
    let ms = Duration::from_millis;
    let cases: Vec<(&str, Vec<&str>, &str, Vec<Duration>)> = vec![
        ("while the model loads", vec![], "", vec![ms(0)]),
        ("on the first LLM token", vec![], "llm_token", vec![ms(0)]),
        ("without a player (--device none)", vec!["--device", "none"], "llm_token", vec![ms(0)]),
        ("twice at once, while the model loads", vec![], "", vec![ms(0), ms(0)]),
        ("twice at once, during decoding", vec![], "llm_token", vec![ms(0), ms(0)]),
        ("twice, 150 ms apart, after the first chunk", vec![], "chunk_pushed", vec![ms(0), ms(150)]),
        ("twice without a player", vec!["--device", "none"], "chunk_ready", vec![ms(0), ms(20)]),
    ];
    for (what, extra, wait_for, gaps) in cases {
        let (out, ev) = interrupt(&extra, wait_for, &gaps);
        stopped(&out, what);
        assert!(first(&ev, "playback_done").is_none(), "{what}: {ev:?}");
    }
}

/// Three sentences (the text frontend splits sentences only past ~80 tokens).
const SENTENCES: &str = "The old lighthouse keeper walked along the narrow path every single evening, carrying a lantern, a notebook and a small loaf of bread for the gulls that waited for him on the rocks, and he wrote down the colour of the sky and the strength of the wind. \
The fishermen who came back late in the autumn storms said that his light was the last thing they saw before the harbour, a steady yellow eye above the black water that never blinked, never faltered and never once went out in forty years of service. \
When he finally retired, the village gathered on the pier with music and lanterns of their own, and the children sang the old songs about the sea while the new electric lamp turned above them for the very first time.";

/// `cosy say` of [`SENTENCES`] with the test hook that slows synthesis to 3 × real time (the
/// hook sleeps, so the audio arrives at most at a third of real time on any machine), each
/// sentence 30 tokens long, with `extra` arguments; its output and events.
fn say_slowly(text: &str, extra: &[&str]) -> (Output, Vec<(u64, String, Vec<String>)>) {
    let h = home(NULL_DEFAULT);
    let log = h.path().join("events.txt");
    let p = prompt();
    let mut args = vec!["--set", "debug.test_hooks=true", "say", "--prompt-wav", p.to_str().unwrap(), "--prompt-text", TRANSCRIPT];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--slow-to-rtf", "3", "--min-tokens", "30", "--event-log", log.to_str().unwrap(), "--", text]);
    let o = cosy(h.path(), &args);
    ok(&o);
    (o, events(&log))
}

/// Where sentence K's audio ends (its `sentence_audio_done` line): (seq, end sample).
fn sentence_ends(ev: &[(u64, String, Vec<String>)]) -> Vec<(u64, u64)> {
    ev.iter().filter(|e| e.1 == "sentence_audio_done").map(|e| (e.0, e.2[1].parse().unwrap())).collect()
}

/// With synthesis at a third of real time, `say` buffers each whole sentence before it plays it:
/// the device plays nothing before the first sentence is whole, each sentence is released as
/// soon as its audio is all in (before the next sentence's first chunk exists), and the player
/// never runs dry inside released audio: zero underrun frames. (The null device pulls as fast as
/// it can, the worst case for underruns.) It says once on stderr that it waits.
#[test]
fn say_buffers_whole_sentences_when_synthesis_is_slower_than_real_time() {
    let (o, ev) = say_slowly(SENTENCES, &[]);
    let line = |e: &(u64, String, Vec<String>)| format!("{} {}", e.1, e.2.join(" "));
    let underruns = ev.iter().find(|e| e.1 == "underrun_frames").expect("underrun_frames logged");
    assert_eq!(underruns.2, vec!["0"], "{ev:?}");
    let ends = sentence_ends(&ev);
    assert_eq!(ends.len(), 3, "three sentences: {ev:?}");
    // (seq of chunk_ready, the sample the chunk starts at)
    let mut chunk_starts = Vec::new();
    let mut start = 0u64;
    for e in ev.iter().filter(|e| e.1 == "chunk_ready") {
        chunk_starts.push((e.0, start));
        start += e.2[1].parse::<u64>().unwrap();
    }
    // The first decision, on the first chunk: hold, the rate measured at most 1/3.
    let chunk1 = first(&ev, "chunk_ready").unwrap();
    let decision = ev.iter().find(|e| e.0 > chunk1 && e.1.starts_with("buffer_")).expect("a decision");
    assert_eq!((decision.1.as_str(), decision.2[0].as_str(), decision.2[1].as_str()), ("buffer_hold", "0", "slow"), "{}", line(decision));
    let rate: f64 = decision.2[2].parse().unwrap();
    assert!(rate <= 0.34, "the hook slows to 1/3 of real time: {rate}");
    // Each sentence is released at its end, before the next chunk is made (the synthesis thread
    // waits for the decision), and nothing plays before the first release.
    for (i, &(seq, end)) in ends.iter().enumerate() {
        let release = ev
            .iter()
            .find(|e| e.0 > seq && (e.1 == "buffer_hold" && e.2[0] == end.to_string() || e.1 == "buffer_open"))
            .unwrap_or_else(|| panic!("sentence {i} (to {end}) never released: {ev:?}"));
        // The next sentence's first chunk: the one that starts at this end (a sentence's last
        // chunk may be logged after its `sentence_audio_done`).
        let next_chunk = chunk_starts.iter().find(|&&(_, start)| start == end).map_or(u64::MAX, |c| c.0);
        assert!(release.0 < next_chunk, "sentence {i} released only after the next chunk: {ev:?}");
        if i == 0 {
            let device = first(&ev, "device_first_samples").expect("played");
            assert!(device > release.0, "the device played before the first sentence was whole: {ev:?}");
        }
    }
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one notice: {err}");
    assert!(lines[0].starts_with("cosy: synthesis runs at") && lines[0].contains("--no-buffering"), "{err}");
}

/// The same slow synthesis with `--no-buffering` plays each chunk as it comes (today's
/// behaviour): the first chunk plays before the second exists, and the player, run dry between
/// chunks, counts the underrun. With buffering and `-q`, it waits without a notice.
#[test]
fn no_buffering_plays_at_once_and_counts_the_underruns_and_q_silences_the_notice() {
    let (o, ev) = say_slowly(TEXT, &["--no-buffering"]);
    assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(first(&ev, "buffer_hold").is_none() && first(&ev, "buffer_open").is_none(), "{ev:?}");
    let device = first(&ev, "device_first_samples").expect("played");
    let chunk2 = ev.iter().filter(|e| e.1 == "chunk_ready").nth(1).expect("two chunks").0;
    assert!(device < chunk2, "{ev:?}");
    let underruns: u64 = ev.iter().find(|e| e.1 == "underrun_frames").expect("logged").2[0].parse().unwrap();
    assert!(underruns > 0, "the null device ran dry between chunks made at a third of real time: {ev:?}");

    let (o, ev) = say_slowly(TEXT, &["-q"]);
    assert!(o.stderr.is_empty(), "-q: no notice: {}", String::from_utf8_lossy(&o.stderr));
    assert!(ev.iter().any(|e| e.1 == "buffer_hold" && e.2[1] == "slow"), "it did wait: {ev:?}");
    assert_eq!(ev.iter().find(|e| e.1 == "underrun_frames").unwrap().2, vec!["0"], "{ev:?}");
}

/// Without the hook, the first decision follows the measured rate: when the audio arrives at
/// least as fast as it plays, the first chunk is released at once (before the second exists),
/// as without buffering; when this machine is slower than that (a debug build under load), the
/// hold says so with a rate below 1. `-q`: no notice either way.
#[test]
fn say_releases_the_first_chunk_at_once_when_synthesis_keeps_up() {
    let h = home(NULL_DEFAULT);
    let log = h.path().join("events.txt");
    let p = prompt();
    let o = cosy(h.path(), &[&["-q"][..], &say_args(p.to_str().unwrap(), &["--min-tokens", "100", "--event-log", log.to_str().unwrap()])].concat());
    ok(&o);
    assert!(o.stderr.is_empty(), "-q: no notice: {}", String::from_utf8_lossy(&o.stderr));
    let ev = events(&log);
    let chunk1 = first(&ev, "chunk_ready").unwrap();
    let pushed1 = first(&ev, "chunk_pushed").unwrap();
    let decision = ev.iter().find(|e| e.0 > chunk1 && e.1.starts_with("buffer_")).expect("a decision");
    assert!(decision.0 < pushed1, "decided on the first chunk: {ev:?}");
    let rate: f64 = decision.2.last().unwrap().parse().unwrap();
    if rate >= 1.0 {
        assert_eq!((decision.1.as_str(), decision.2[0].as_str()), ("buffer_open", "keeps_up"), "{ev:?}");
        let device = first(&ev, "device_first_samples").expect("played");
        let chunk2 = ev.iter().filter(|e| e.1 == "chunk_ready").nth(1).map_or(u64::MAX, |e| e.0);
        assert!(device < chunk2, "the first chunk waited for the second: {ev:?}");
    } else {
        assert_eq!((decision.1.as_str(), decision.2[1].as_str()), ("buffer_hold", "slow"), "rate {rate}: {ev:?}");
    }
}

/// Ctrl-C while playback is held for a slow synthesis (the synthesis thread may be waiting for a
/// sentence's last chunk to be pushed): exit 130, the notice and the one `stopped` line.
#[test]
fn ctrl_c_while_buffering_is_only_stopped() {
    let h = home(NULL_DEFAULT);
    let log = h.path().join("events.txt");
    let p = prompt();
    let args = [
        "--set", "debug.test_hooks=true", "say", "--prompt-wav", p.to_str().unwrap(), "--prompt-text", TRANSCRIPT,
        "--slow-to-rtf", "3", "--min-tokens", "30", "--event-log", log.to_str().unwrap(), "--", SENTENCES,
    ];
    let mut child = cosy_cmd(h.path(), &args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    wait_for_log(&mut child, &log, "buffer_hold");
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill").success());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.last(), Some(&"cosy: stopped (Ctrl-C)"), "{err}");
    assert!(lines.len() <= 2 && lines.iter().all(|l| l.starts_with("cosy: ")), "{err}");
    assert!(first(&events(&log), "playback_done").is_none());
}
