//! `cosy say` and `cosy file` through a running `cosy serve` on a local socket (docs/desktop.md, "A
//! warm model behind cosy say"): the same samples and the same bytes as without it, the local path
//! when no server runs, one clear line for a bad `COSY_SERVER`.
//!
//! The server is the tests' own (`serve::start_server`, the tiny model, a default voice "me"), on a
//! socket in a temporary folder; each `say` runs with HOME and XDG_RUNTIME_DIR of its own, so it
//! finds that server at the default socket path (`$XDG_RUNTIME_DIR/cosy/cosy.sock`), and no other.
//! What the device plays is captured by ALSA's `file` plugin (as tests/audio_capture.rs does).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{cosy_bin, fixture_model};
use crate::serve::{start_server, Server};

const TEXT: &str = "The old lighthouse blinked twice before the fog rolled in.";

/// A user's folder: HOME (its `.asoundrc` writes what the default device plays to
/// `capture.raw`) and XDG_RUNTIME_DIR (`run/`).
struct User {
    home: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        let home = tempfile::tempdir().unwrap();
        let capture = home.path().join("capture.raw");
        std::fs::write(
            home.path().join(".asoundrc"),
            format!("pcm.!default {{ type file; slave.pcm \"null\"; file \"{}\"; format \"raw\" }}\n", capture.display()),
        )
        .unwrap();
        User { home }
    }

    fn path(&self) -> &Path {
        self.home.path()
    }

    /// Where a server must listen for this user's `say` to find it by default.
    fn socket(&self) -> PathBuf {
        self.path().join("run/cosy/cosy.sock")
    }

    /// `cosy ARGS` as this user, on the server's voices folder (for the local path), no COSY_*
    /// from the caller.
    fn cosy(&self, server: &Server, args: &[&str]) -> Command {
        let mut cmd = Command::new(cosy_bin());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("COSY_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("HOME", self.path()).env("XDG_RUNTIME_DIR", self.path().join("run")).current_dir(self.path());
        cmd.env("COSY_GRAPH_CACHE", self.path().join("gc"));
        cmd.arg("--model").arg(fixture_model()).args(["--provider", "cpu", "--set"]);
        cmd.arg(format!("voices.dir={}", server.voices_dir().display()));
        cmd.args(args);
        cmd
    }

    /// What the device got, as samples, without the silence the player adds around the audio.
    fn played(&self) -> Vec<f32> {
        let bytes = std::fs::read(self.path().join("capture.raw")).expect("the capture");
        // The player takes f32 where the device offers it (ALSA's plug does).
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).filter(|&x| x != 0.0).collect()
    }
}

fn ok(out: Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {err}");
    err
}

/// A server of the tests' own on `user`'s default socket.
fn server_for(user: &User) -> Server {
    std::fs::create_dir_all(user.socket().parent().unwrap()).unwrap();
    std::fs::set_permissions(user.socket().parent().unwrap(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    start_server(&[&format!("server.socket={}", user.socket().display())])
}

/// The events of an event log, in order.
/// The chunks made and the sentence ends, each in the log's order (`chunk_ready N SAMPLES`,
/// `sentence_audio_done SENTENCE END`), as two lists. Not one interleaved list: on the local path
/// the player logs `chunk_ready` as it takes a chunk while the engine's worker reports the
/// sentence's end, so a sentence's last chunk and its end are logged by two threads in either
/// order (CI saw both); through a server both come from one ordered stream.
fn made(log: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(log).expect("event log");
    let mut lines: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' ').and_then(|(seq, rest)| Some((seq.parse().ok()?, rest.to_string()))))
        .filter(|(_, e)| e.starts_with("chunk_ready ") || e.starts_with("sentence_audio_done "))
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, e)| e).partition(|e| e.starts_with("chunk_ready "))
}

fn events(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).expect("event log");
    let mut lines: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' ').and_then(|(seq, rest)| Some((seq.parse().ok()?, rest.split(' ').next()?.to_string()))))
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, e)| e).collect()
}

#[test]
fn say_and_file_through_a_local_server_give_what_the_local_path_gives() {
    let user = User::new();
    let server = server_for(&user);
    let log = user.path().join("events");
    let log_arg = log.to_str().unwrap();

    // Through the server: found at the default socket, no model loaded here (no LLM events).
    let err = ok(user.cosy(&server, &["-v", "say", "--voice", "me", "--seed", "7", "--event-log", log_arg, TEXT]).output().unwrap(), "say");
    assert!(err.contains(&format!("using the cosy server at {}", user.socket().display())), "{err}");
    let ev = events(&log);
    assert!(!ev.iter().any(|e| e.starts_with("llm_")), "the model ran here: {ev:?}");
    assert!(ev.contains(&"device_first_samples".to_string()) && ev.last().map(String::as_str) == Some("playback_done"), "{ev:?}");
    let warm = user.played();
    assert!(!warm.is_empty());
    // The server's chunks and sentence ends reach the player as a synthesis here makes them (the
    // buffering rule measures chunks and buffers whole sentences on either path).
    let warm_made = made(&log);
    assert!(!warm_made.0.is_empty() && !warm_made.1.is_empty(), "the server told where sentences end: {warm_made:?}");

    // The same request with the model loaded here plays the same samples.
    std::fs::remove_file(user.path().join("capture.raw")).unwrap();
    ok(user.cosy(&server, &["say", "--local", "--voice", "me", "--seed", "7", "--event-log", log_arg, TEXT]).output().unwrap(), "say --local");
    assert!(events(&log).iter().any(|e| e == "llm_done"), "--local loads the model here");
    assert_eq!(warm_made, made(&log), "the same chunks and sentence ends either way");
    let cold = user.played();
    assert_eq!(warm.len(), cold.len(), "as many samples played");
    // Bit for bit on purpose: the same binary, model, request and seed on the same CPU, one
    // request at a time on each path (nothing batched), so the arithmetic is the same; the issue
    // asks for the same samples either way.
    assert!(warm == cold, "the same samples, bit for bit");

    // `cosy file`: the same bytes, as wav16, wavf32 and streamed pcm.
    for format in ["wav16", "wavf32"] {
        let through = user.path().join(format!("server-{format}.wav"));
        let here = user.path().join(format!("local-{format}.wav"));
        for (out, local) in [(&through, false), (&here, true)] {
            let mut args = vec!["file", "--voice", "me", "--seed", "7", "--format", format, "-o", out.to_str().unwrap()];
            if local {
                args.push("--local");
            }
            args.push(TEXT);
            ok(user.cosy(&server, &args).output().unwrap(), "file");
        }
        assert_eq!(std::fs::read(&through).unwrap(), std::fs::read(&here).unwrap(), "{format}: the same bytes");
    }
    let pcm = |local: bool| {
        let mut args = vec!["file", "--voice", "me", "--seed", "7", "--stream", "--format", "pcm"];
        if local {
            args.push("--local");
        }
        args.push(TEXT);
        let out = user.cosy(&server, &args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    assert_eq!(pcm(false), pcm(true), "streamed pcm on stdout: the same bytes");
    // A flag the server cannot honour: the model is loaded here, and a note says why.
    let dump = user.path().join("dump");
    let out = user.cosy(&server, &["file", "--voice", "me", "--dump", dump.to_str().unwrap(), "-o", "d.wav", TEXT]).output().unwrap();
    let err = ok(out, "file --dump");
    let note = format!("note: --dump is not served by a cosy server: loading the model here, not using the one at {}", user.socket().display());
    assert!(err.lines().any(|l| l == note), "{err}");
    assert!(dump.is_dir(), "the local path wrote the intermediates");
}

#[test]
fn without_a_server_say_loads_the_model_and_a_bad_cosy_server_is_one_line() {
    let user = User::new();
    // A server elsewhere (not on this user's socket): not found, so the model is loaded here.
    let server = start_server(&["server.socket=off"]);
    let log = user.path().join("events");
    ok(user.cosy(&server, &["say", "--voice", "me", "--event-log", log.to_str().unwrap(), TEXT]).output().unwrap(), "say");
    assert!(events(&log).iter().any(|e| e == "llm_done"), "no server: the local path");

    for (value, needle) in [
        ("ftp://example", "environment COSY_SERVER: say.server = \"ftp://example\": invalid value; allowed:"),
        ("relative.sock", "environment COSY_SERVER: say.server = \"relative.sock\": invalid value; allowed:"),
        ("/nowhere/cosy.sock", "say.server (COSY_SERVER) /nowhere/cosy.sock: no cosy server answers there"),
    ] {
        let out = user.cosy(&server, &["say", TEXT]).env("COSY_SERVER", value).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert_eq!(err.lines().count(), 1, "{value}: one line: {err}");
        assert!(err.starts_with("cosy: config: ") && err.contains(needle), "{value}: {err}");
    }
    // The TCP address works too, named by COSY_SERVER.
    let url = server.url("");
    let out = user.cosy(&server, &["-v", "file", "--voice", "me", "-o", "t.wav", TEXT]).env("COSY_SERVER", &url).output().unwrap();
    let err = ok(out, "file via http");
    assert!(err.contains(&format!("using the cosy server at {url}")), "{err}");
}

#[test]
fn a_server_with_an_api_key_takes_say_s_key_and_names_it_when_missing() {
    let user = User::new();
    std::fs::create_dir_all(user.socket().parent().unwrap()).unwrap();
    let server = start_server(&[&format!("server.socket={}", user.socket().display()), "server.api_key=sk-local"]);
    // The socket serves the same routes with the same rules: no key, one line naming the setting.
    let out = user.cosy(&server, &["say", "--device", "none", TEXT]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim(), format!("cosy: config: the cosy server at {} wants its API key: set server.api_key (COSY_API_KEY) to it, or use --local", user.socket().display()));
    // The command's own configuration holds the key (one config file serves both).
    ok(user.cosy(&server, &["file", "-o", "k.wav", TEXT]).env("COSY_API_KEY", "sk-local").output().unwrap(), "file with the key");
    // A refusal of the request itself is the server's message, as one line.
    let out = user.cosy(&server, &["file", "--voice", "nobody", "-o", "n.wav", TEXT]).env("COSY_API_KEY", "sk-local").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.lines().count() == 1 && err.contains("nobody"), "{err}");
}
