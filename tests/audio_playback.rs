//! Live playback on a headless machine, through ALSA's `null` device.
//!
//! ALSA reads its configuration once per process, at first use, from `$HOME/.asoundrc`. This file is
//! its own test binary (= its own process) and every test calls [`headless`] before touching cpal,
//! which points HOME at a temporary folder whose `.asoundrc` makes the default PCM the null device.
//! The null device is not paced (it pulls samples as fast as it can), so nothing here waits on wall
//! time: the assertions are about counts and the order of events.

use std::sync::OnceLock;
use std::thread;

// Playback is a module of the binary, not the library (an embedding program plays audio its own
// way); it imports only the library, so this test compiles it in.
#[allow(dead_code)]
#[path = "../src/playback.rs"]
mod playback;

use playback::{list_devices, Flow, Player, PlayerOptions, MODEL_SAMPLE_RATE};

fn headless() {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    HOME.get_or_init(|| {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join(".asoundrc"), "pcm.!default { type null }\n").unwrap();
        // SAFETY: every test calls this before any other work; the OnceLock makes the others wait
        // until the variable is set, so no thread reads the environment concurrently.
        unsafe { std::env::set_var("HOME", home.path()) };
        home
    });
}

fn sine(n: usize, freq: f32) -> Vec<f32> {
    let rate = MODEL_SAMPLE_RATE as f32;
    (0..n)
        .map(|i| 0.5 * (2.0 * std::f32::consts::PI * freq * i as f32 / rate).sin())
        .collect()
}

#[test]
fn list_devices_shows_the_default_and_null_outputs() {
    headless();
    let devices = list_devices().unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let default = devices
        .iter()
        .find(|d| d.is_default)
        .unwrap_or_else(|| panic!("no default in {names:?}"));
    assert_eq!(default.name, "default");
    assert_eq!(default.error, None);
    assert!(default.supports_rate(MODEL_SAMPLE_RATE), "{default:?}");
    assert!(
        default.channels.contains(&1) && default.channels.contains(&2),
        "{default:?}"
    );
    let null = devices
        .iter()
        .find(|d| d.name == "null")
        .unwrap_or_else(|| panic!("no null in {names:?}"));
    assert!(!null.is_default);
    assert!(null.supports_rate(MODEL_SAMPLE_RATE));
    assert_eq!(devices.iter().filter(|d| d.is_default).count(), 1);
}

#[test]
fn unknown_device_name_is_refused_with_the_available_names() {
    headless();
    let err = Player::open(Some("no-such-speaker"), MODEL_SAMPLE_RATE)
        .err()
        .expect("opening must fail");
    let msg = err.to_string();
    assert!(msg.contains("\"no-such-speaker\" not found"), "{msg}");
    assert!(msg.contains("null") && msg.contains("default"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

#[test]
fn device_can_be_chosen_by_name_and_runs_at_the_model_rate_in_mono() {
    headless();
    for name in ["null", "alsa:null"] {
        let player = Player::open(Some(name), MODEL_SAMPLE_RATE).unwrap();
        let config = player.config().clone();
        assert_eq!(config.device, "null");
        assert_eq!(
            (config.input_rate, config.device_rate, config.channels),
            (MODEL_SAMPLE_RATE, MODEL_SAMPLE_RATE, 1)
        );
        assert_eq!(config.sample_format, "f32");
        player.finish().unwrap();
    }
}

#[test]
fn first_audio_reaches_the_device_before_the_producer_finishes_and_finish_drains_everything() {
    headless();
    // A 0.25 s queue and 1 s of audio in 0.1 s chunks: the producer can only get its last chunk in
    // after the device has pulled earlier ones.
    let mut player = Player::open_with(&PlayerOptions {
        buffer_seconds: 0.25,
        ..PlayerOptions::default()
    })
    .unwrap();
    assert_eq!(player.config().device, "default");
    let events = player.events();
    let audio = sine(MODEL_SAMPLE_RATE as usize, 440.0);
    let chunks: Vec<Vec<f32>> = audio.chunks(2400).map(<[f32]>::to_vec).collect();
    let producer = thread::spawn(move || {
        let events = player.events();
        let mut before_last_push = None;
        for (i, chunk) in chunks.iter().enumerate() {
            if i + 1 == chunks.len() {
                before_last_push = Some(events.next_seq());
            }
            assert_eq!(player.push(chunk).unwrap(), Flow::Continue);
        }
        let before_finish = events.next_seq();
        player.finish().unwrap();
        (before_last_push.unwrap(), before_finish)
    });
    let (before_last_push, before_finish) = producer.join().unwrap();
    let first = events.first_samples_seq().expect("the device never pulled any audio");
    assert!(
        first < before_last_push,
        "first audio at seq {first}, last chunk pushed at {before_last_push}"
    );
    assert!(first < before_finish);
    assert!(events.first_samples_at().is_some());
    // finish() returned only after every pushed frame was pulled, plus a tail of silence.
    assert_eq!(events.frames_queued(), audio.len() as u64);
    assert_eq!(events.frames_played(), audio.len() as u64);
    assert!(events.silence_frames() >= MODEL_SAMPLE_RATE as u64 / 20);
    assert!(events.callbacks() >= 2);
}

#[test]
fn chunks_larger_than_the_queue_are_split_and_all_played() {
    headless();
    let mut player = Player::open_with(&PlayerOptions {
        buffer_seconds: 0.05,
        ..PlayerOptions::default()
    })
    .unwrap();
    let events = player.events();
    let audio = sine(3 * MODEL_SAMPLE_RATE as usize, 220.0); // 60 queue-fulls in a single push
    assert_eq!(player.push(&audio).unwrap(), Flow::Continue);
    player.finish().unwrap();
    assert_eq!(events.frames_played(), audio.len() as u64);
}

#[test]
fn cancel_stops_playback_and_the_producer_promptly() {
    headless();
    let mut player = Player::open_with(&PlayerOptions {
        buffer_seconds: 0.1,
        ..PlayerOptions::default()
    })
    .unwrap();
    let events = player.events();
    let cancel = player.cancel_handle();
    let chunk = sine(2400, 440.0);
    let total_chunks = 1000; // 100 s of audio: far more than the test could ever play
    let mut pushed = 0;
    for _ in 0..total_chunks {
        if player.push(&chunk).unwrap() == Flow::Cancelled {
            break;
        }
        pushed += 1;
        // Cancel (as Ctrl-C would) once the device has started pulling audio.
        if events.first_samples_seq().is_some() && !cancel.is_cancelled() {
            cancel.cancel();
        }
    }
    assert!(cancel.is_cancelled() && player.is_cancelled());
    assert!(pushed < total_chunks, "push never reported the cancellation");
    assert_eq!(player.push(&chunk).unwrap(), Flow::Cancelled);
    let played_at_cancel = events.frames_played();
    player.finish().unwrap();
    assert!(played_at_cancel < (total_chunks * chunk.len()) as u64);
    assert_eq!(
        events.frames_played(),
        played_at_cancel,
        "audio kept playing after cancel"
    );
}

#[test]
fn zero_sample_rate_is_refused() {
    headless();
    let msg = Player::open(None, 0).err().expect("must fail").to_string();
    assert!(msg.contains("sample rate"), "{msg}");
}
