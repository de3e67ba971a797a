//! speech-dispatcher speaking through cosy (docs/desktop.md): Debian's real daemon, started by
//! the test as the user's would be (its HOME, XDG folders and runtime folder in a temporary
//! folder), with the module `cosy speech-dispatcher install` wrote. `spd-say -o cosy` reaches
//! the test's ALSA file sink; `spd-say -C` stops a `cosy say` that would otherwise never end (the
//! test hook holds it after its first chunk), so the stop is what ends it, not the text.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{fixture_model, fixture_prompt, missing};

const TRANSCRIPT: &str = "This recording is the voice prompt.";

/// A user's folder with speech-dispatcher set up for cosy, and the daemon once started.
struct Desktop {
    home: tempfile::TempDir,
    daemon: Option<Child>,
}

impl Drop for Desktop {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

impl Desktop {
    /// A HOME whose sound goes to `out.raw` (ALSA's file plugin), with voice `anna` saved and the
    /// module installed; `None` when speech-dispatcher is not installed (a failure under CI).
    fn new() -> Option<Desktop> {
        if !Path::new("/usr/bin/speech-dispatcher").exists() || !Path::new("/usr/bin/spd-say").exists() {
            missing("speech-dispatcher is not installed (scripts/setup.sh installs it: apt install speech-dispatcher)");
            return None;
        }
        let home = tempfile::tempdir().expect("temp dir");
        let h = home.path();
        std::fs::create_dir_all(h.join("run")).expect("runtime dir");
        std::fs::set_permissions(h.join("run"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
        std::fs::write(
            h.join(".asoundrc"),
            format!("pcm.!default {{ type file; slave.pcm \"null\"; file \"{}\"; format \"raw\" }}\n", h.join("out.raw").display()),
        )
        .expect("asoundrc");
        let desktop = Desktop { home, daemon: None };
        desktop.ok(desktop.cosy().args(["voice", "add", "anna", "--wav"]).arg(fixture_prompt()).args(["--text", TRANSCRIPT]));
        desktop.ok(desktop.cosy().args(["speech-dispatcher", "install"]));
        // The test's own daemon settings: its modules' audio on ALSA's null device (cosy plays
        // itself, through the user's default output: the file sink).
        std::fs::write(desktop.path().join(".config/speech-dispatcher/speechd.conf"), "AudioOutputMethod \"alsa\"\nAudioALSADevice \"null\"\n").expect("speechd.conf");
        Some(desktop)
    }

    fn path(&self) -> &Path {
        self.home.path()
    }

    /// The user's environment: no COSY_* from the caller, the fixture model on the CPU.
    fn env(&self, cmd: &mut Command) {
        for (k, _) in std::env::vars() {
            if k.starts_with("COSY_") || k.starts_with("XDG_") || k == "SPEECHD_ADDRESS" {
                cmd.env_remove(k);
            }
        }
        let h = self.path();
        cmd.env("HOME", h)
            .env("XDG_RUNTIME_DIR", h.join("run"))
            .env("COSY_MODEL", fixture_model())
            .env("COSY_PROVIDERS", "cpu")
            .env("COSY_GRAPH_CACHE", h.join("gc"))
            .current_dir(h);
    }

    fn cosy(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosy"));
        self.env(&mut cmd);
        cmd
    }

    fn spd_say(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("spd-say");
        self.env(&mut cmd);
        cmd.args(args).stdin(Stdio::null());
        cmd
    }

    fn ok(&self, cmd: &mut Command) -> String {
        let out = cmd.output().expect("run");
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts the daemon and waits for its socket.
    fn start(&mut self) {
        let mut cmd = Command::new("speech-dispatcher");
        self.env(&mut cmd);
        let log = std::fs::File::create(self.path().join("speechd.out")).expect("log");
        cmd.args(["-s", "-t", "0", "-l", "4"]).stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log);
        self.daemon = Some(cmd.spawn().expect("start speech-dispatcher"));
        let socket = self.path().join("run/speech-dispatcher/speechd.sock");
        wait_for("speech-dispatcher's socket", || socket.exists(), self);
    }

    /// Runs `cmd` to its end (a guard against a hang, not a timing assertion).
    fn run(&self, mut cmd: Command) {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
        wait_for("the command to end", || child.try_wait().ok().flatten().is_some(), self);
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Non-zero bytes the sound output received.
    fn sound_bytes(&self) -> usize {
        std::fs::read(self.path().join("out.raw")).map(|b| b.iter().filter(|&&x| x != 0).count()).unwrap_or(0)
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.path().join("speechd.out")).unwrap_or_default()
    }
}

/// Waits until `done` (at most 300 s: a guard against a hang); the daemon's log on failure.
fn wait_for(what: &str, mut done: impl FnMut() -> bool, desktop: &Desktop) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(300), "{what}: not within 300 s; speech-dispatcher's log:\n{}", desktop.daemon_log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline).contains(marker).then_some(pid)
    })
    .collect()
}

#[test]
fn spd_say_speaks_through_cosy_and_lists_its_voices() {
    let Some(mut desktop) = Desktop::new() else { return };
    let conf = std::fs::read_to_string(desktop.path().join(".config/speech-dispatcher/modules/cosy.conf")).expect("module conf");
    assert!(conf.contains("DefaultVoice \"anna\""), "{conf}");
    let link: PathBuf = desktop.path().join(".local/libexec/speech-dispatcher-modules/sd_cosy");
    assert!(std::fs::read_link(&link).expect("sd_cosy link").ends_with("sd_generic"));
    desktop.start();
    let modules = desktop.ok(&mut desktop.spd_say(&["-O"]));
    assert!(modules.lines().any(|l| l.trim() == "cosy"), "module cosy not loaded: {modules}\n{}", desktop.daemon_log());
    let voices = desktop.ok(&mut desktop.spd_say(&["-o", "cosy", "-L"]));
    assert!(voices.lines().any(|l| l.split_whitespace().next() == Some("anna")), "{voices}");
    assert_eq!(desktop.sound_bytes(), 0);
    desktop.run(desktop.spd_say(&["-o", "cosy", "-w", "Hello from the screen reader."]));
    assert!(desktop.sound_bytes() > 1000, "no audio reached the sound output; log:\n{}", desktop.daemon_log());
}

#[test]
fn spd_say_cancel_stops_cosy() {
    let Some(mut desktop) = Desktop::new() else { return };
    // The module's command, with the test hook: after its first chunk, `cosy say` waits until
    // it is stopped, so only speech-dispatcher's cancel can end it.
    let conf_path = desktop.path().join(".config/speech-dispatcher/modules/cosy.conf");
    let events = desktop.path().join("say-events.log");
    let conf = std::fs::read_to_string(&conf_path).expect("module conf");
    let held = conf.replace(
        " say -q ",
        &format!(" say -q --set debug.test_hooks=true --hold-after-first-audio --event-log {} ", events.display()),
    );
    assert_ne!(held, conf);
    std::fs::write(&conf_path, held).expect("module conf");
    desktop.start();
    desktop.run(desktop.spd_say(&["-o", "cosy", "A sentence that is held after its first chunk until it is stopped."]));
    let marker = events.display().to_string();
    wait_for("cosy say's first chunk", || std::fs::read_to_string(&events).is_ok_and(|l| l.contains("chunk_ready")), &desktop);
    assert!(!processes_with(&marker).is_empty(), "cosy say is running");
    desktop.run(desktop.spd_say(&["-C"]));
    wait_for("cosy say to be stopped", || processes_with(&marker).is_empty(), &desktop);
}
