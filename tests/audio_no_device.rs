//! A machine without a usable sound output: `Player::open(None, …)` must fail with one line that
//! says so and points to `cosy file`. The default PCM is made unusable for this process (its own
//! test binary) by an `.asoundrc` naming a sound card that does not exist, so the result is the same
//! on machines that do have a sound card.

// Playback is a module of the binary, not the library (an embedding program plays audio its own
// way); it imports only the library, so this test compiles it in.
#[allow(dead_code)]
#[path = "../src/playback.rs"]
mod playback;

use playback::{list_devices, Player, MODEL_SAMPLE_RATE};

fn without_sound_output() {
    static HOME: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".asoundrc"),
            "pcm.!default { type hw; card 99; device 0 }\n",
        )
        .unwrap();
        // SAFETY: called first by every test; the OnceLock serialises the only write to HOME.
        unsafe { std::env::set_var("HOME", home.path()) };
        home
    });
}

#[test]
fn opening_the_default_output_without_a_device_says_to_use_cosy_file() {
    without_sound_output();
    let msg = Player::open(None, MODEL_SAMPLE_RATE)
        .err()
        .expect("there is no usable default output")
        .to_string();
    assert!(msg.starts_with("no audio output device was found"), "{msg}");
    assert!(msg.contains("cosy file"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

#[test]
fn listing_still_works_and_marks_the_default_as_unusable() {
    without_sound_output();
    let devices = list_devices().unwrap();
    let default = devices
        .iter()
        .find(|d| d.is_default)
        .expect("the default output is listed");
    assert!(default.error.is_some(), "{default:?}");
    assert!(default.channels.is_empty() && default.sample_rates.is_empty());
}
