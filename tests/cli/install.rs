//! cosy installed as a program (scripts/install.sh into a prefix, and the relocatable tarball of
//! scripts/package.sh unpacked elsewhere), run as a new user would: a fresh HOME and XDG folders,
//! no COSY_* or ORT_* variables, from a folder that has nothing to do with cosy. It must find its
//! ONNX Runtime beside itself, say where every file lives, keep voices and caches in the user's
//! folders, serve, and leave the current folder holding only the files asked for.
//! Both reuse the test build's binary (no release build: keeps CI time small).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::fixture_prompt;

const TRANSCRIPT: &str = "This recording is the voice prompt.";

/// A new user's world: HOME and the XDG folders under one temporary folder, and an unrelated
/// working folder.
struct User {
    _root: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
}

impl User {
    fn new() -> User {
        let root = tempfile::tempdir().unwrap();
        let home = root.path().join("home");
        let work = root.path().join("elsewhere");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        // Playback is never used here; ALSA reads this if anything opens it.
        std::fs::write(home.join(".asoundrc"), "pcm.!default { type null }\n").unwrap();
        User { _root: root, home, work }
    }

    fn xdg(&self, what: &str) -> PathBuf {
        self.home.join(format!("xdg-{what}"))
    }

    /// `program ARGS` run in the working folder with only this user's environment.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        for (k, _) in std::env::vars() {
            if k.starts_with("COSY_") || k.starts_with("ORT_") || k.starts_with("XDG_") || k == "LD_LIBRARY_PATH" {
                cmd.env_remove(k);
            }
        }
        cmd.env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.xdg("config"))
            .env("XDG_DATA_HOME", self.xdg("data"))
            .env("XDG_CACHE_HOME", self.xdg("cache"))
            .env("XDG_RUNTIME_DIR", self.xdg("runtime"))
            .current_dir(&self.work)
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, program: &Path, args: &[&str]) -> String {
        let out = self.command(program).args(args).output().expect("run");
        ok(&out, &format!("{} {}", program.display(), args.join(" ")))
    }
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name)
}

/// The checks of the issue, on an installed or unpacked `prefix/bin/cosy`.
fn check_installed(user: &User, prefix: &Path) {
    let cosy = prefix.join("bin/cosy");
    let prefix = std::fs::canonicalize(prefix).unwrap();
    let data = user.xdg("data").join("cosy");
    let cache = user.xdg("cache").join("cosy");

    let report = user.run(&cosy, &["doctor"]);
    let lib = prefix.join("lib/cosy");
    assert!(report.contains(&format!("library: {}", lib.display())), "ONNX Runtime from lib/cosy beside the binary:\n{report}");
    assert!(report.contains("found by beside the executable"), "{report}");
    assert!(report.contains("config file: none found (looked for"), "{report}");
    assert!(report.contains(&user.xdg("config").join("cosy/config.toml").display().to_string()), "{report}");
    let model = prefix.join("share/cosy/models/tiny");
    assert!(report.contains(&format!("model folder: {} (the bundled tiny", model.display())), "{report}");
    assert!(report.contains("noise, not speech"), "doctor says the bundled model is noise:\n{report}");
    assert!(report.contains(&format!("voices folder: {}", data.join("voices").display())), "{report}");
    assert!(report.contains(&format!("TensorRT engine cache: {}", cache.join("engines").display())), "{report}");
    assert!(report.contains(&format!("optimised-graph cache (CPU sessions): {}", cache.join("engines/graphs").display())), "{report}");
    assert!(report.contains("no problems found"), "{report}");

    let prompt = fixture_prompt();
    user.run(&cosy, &["voice", "add", "me", "--wav", prompt.to_str().unwrap(), "--text", TRANSCRIPT, "--default"]);
    assert!(data.join("voices/me.safetensors").is_file(), "the voice is in the user's data folder");
    user.run(&cosy, &["file", "Hello from an installed cosy.", "-o", "hello.wav"]);
    let wav = hound::WavReader::open(user.work.join("hello.wav")).expect("a WAV");
    assert!(wav.len() > 0);
    assert!(cache.join("engines/graphs").is_dir(), "optimised graphs are cached in the user's cache folder");
    let listed = user.run(&cosy, &["model", "list"]);
    assert!(listed.contains("* tiny") && listed.contains("bundled"), "{listed}");

    serve_answers_ready(user, &cosy);

    let mut left: Vec<String> =
        std::fs::read_dir(&user.work).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["hello.wav"], "the working folder holds only the requested output");
}

/// `cosy serve` on a free loopback port answers `GET /ready` with 200, then stops on SIGTERM.
fn serve_answers_ready(user: &User, cosy: &Path) {
    let mut child = user
        .command(cosy)
        .args(["--set", "server.warmup=false", "serve", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cosy serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("cosy serve: listening on http://127.0.0.1:") {
                let _ = tx.send(rest.trim().parse::<u16>().ok());
            }
        }
    });
    let port = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Some(p)) => p,
        _ => {
            let _ = child.kill();
            panic!("cosy serve did not say where it listens");
        }
    };
    let mut status = String::new();
    // A hang guard, not a speed bound: the tiny model loads in well under a second.
    for _ in 0..1200 {
        status = get(port, "/ready").unwrap_or_default();
        if status.starts_with("HTTP/1.1 200") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(status.starts_with("HTTP/1.1 200"), "/ready: {status}");
}

/// The status line of `GET path` (reads time out: a hung server fails the test).
fn get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply.lines().next().unwrap_or("").to_string())
}

#[test]
fn installed_into_a_prefix_it_runs_from_any_folder() {
    let user = User::new();
    let prefix = user.home.join("prefix");
    let out = user.command(&script("install.sh")).args(["--bin", env!("CARGO_BIN_EXE_cosy")]).arg(&prefix).output().unwrap();
    let said = ok(&out, "install.sh");
    assert!(said.contains("uninstall"), "{said}");
    for f in ["bin/cosy", "lib/cosy/libonnxruntime.so", "share/man/man1/cosy.1", "share/bash-completion/completions/cosy", "share/systemd/user/cosy.service", "share/cosy/models/tiny/manifest.json"] {
        assert!(prefix.join(f).exists(), "{f} installed");
    }
    let unit = std::fs::read_to_string(prefix.join("share/systemd/user/cosy.service")).unwrap();
    assert!(unit.contains(&format!("ExecStart={}/bin/cosy serve", std::fs::canonicalize(&prefix).unwrap().display())), "{unit}");
    assert!(unit.contains("Environment=COSY_IDLE_UNLOAD_S=300"), "the user service gives memory back when idle: {unit}");
    assert!(std::fs::read_to_string(prefix.join("share/man/man1/cosy.1")).unwrap().contains(".TH cosy"), "a man page");

    check_installed(&user, &prefix);

    // Uninstalling removes exactly the listed files; the user's voices stay.
    let out = user.command(&script("install.sh")).arg("--uninstall").arg(&prefix).output().unwrap();
    ok(&out, "install.sh --uninstall");
    let mut left: Vec<PathBuf> = Vec::new();
    let mut stack = vec![prefix.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { stack.push(p) } else { left.push(p) }
        }
    }
    assert!(left.is_empty(), "files left after uninstalling: {left:?}");
    assert!(user.xdg("data").join("cosy/voices/me.safetensors").is_file(), "the user's voices are not the install's");
}

#[test]
fn the_tarball_unpacked_anywhere_runs_from_any_folder() {
    let user = User::new();
    let dist = user.home.join("dist");
    let out = user
        .command(&script("package.sh"))
        .args(["--bin", env!("CARGO_BIN_EXE_cosy")])
        .env("COSY_DIST", &dist)
        .output()
        .unwrap();
    let tarball = PathBuf::from(ok(&out, "package.sh").trim());
    let name = tarball.file_name().unwrap().to_string_lossy().trim_end_matches(".tar.gz").to_string();
    assert!(name.starts_with("cosy-") && name.ends_with("-x86_64-linux"), "{name}");
    let unpacked = user.home.join("somewhere/else");
    std::fs::create_dir_all(&unpacked).unwrap();
    let out = Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(&unpacked).output().unwrap();
    ok(&out, "tar -x");
    std::fs::remove_file(&tarball).unwrap();
    let root = unpacked.join(&name);
    assert!(root.join("install.sh").is_file() && root.join("README").is_file());
    assert!(!root.join("share/systemd").exists(), "no unit in the tarball (its ExecStart needs the final path)");
    check_installed(&user, &root);
}
