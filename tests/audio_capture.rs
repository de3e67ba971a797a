//! What the device receives equals what was pushed: ALSA's `file` plugin (configured through
//! `$HOME/.asoundrc` before ALSA starts in this process, this file being its own test binary) writes
//! every frame handed to the default PCM to a raw file, on top of the null device.

// Playback is a module of the binary, not the library (an embedding program plays audio its own
// way); it imports only the library, so this test compiles it in.
#[allow(dead_code)]
#[path = "../src/playback.rs"]
mod playback;

use playback::{Flow, Player, PlayerOptions, MODEL_SAMPLE_RATE};

#[test]
fn captured_device_bytes_are_the_pushed_samples_then_silence() {
    let home = tempfile::tempdir().unwrap();
    let capture = home.path().join("capture.raw");
    std::fs::write(
        home.path().join(".asoundrc"),
        format!(
            "pcm.!default {{ type file; slave.pcm \"null\"; file \"{}\"; format \"raw\" }}\n",
            capture.display()
        ),
    )
    .unwrap();
    // SAFETY: the only test in this process, and it has not started ALSA or other threads yet.
    unsafe { std::env::set_var("HOME", home.path()) };

    // Never exactly zero, so the silence the device inserts (before the first push, whenever the
    // unpaced null device outruns the producer, and after the end) can be told apart from audio.
    let audio: Vec<f32> = (0..MODEL_SAMPLE_RATE as usize / 2)
        .map(|i| 0.4 + 0.3 * (2.0 * std::f32::consts::PI * 330.0 * i as f32 / MODEL_SAMPLE_RATE as f32).sin())
        .collect();
    let mut player = Player::open_with(&PlayerOptions {
        buffer_seconds: 0.1,
        ..PlayerOptions::default()
    })
    .unwrap();
    let config = player.config().clone();
    let events = player.events();
    for chunk in audio.chunks(1000) {
        assert_eq!(player.push(chunk).unwrap(), Flow::Continue);
    }
    player.finish().unwrap();
    assert_eq!(events.frames_played(), audio.len() as u64);

    let bytes = std::fs::read(&capture).unwrap();
    assert_eq!(
        (config.device_rate, config.channels),
        (MODEL_SAMPLE_RATE, 1),
        "{config:?}"
    );
    // Decode the device's sample format back to f32.
    let captured: Vec<f32> = match config.sample_format.as_str() {
        "f32" => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        "i16" => bytes
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32767.0)
            .collect(),
        other => panic!("unexpected device format {other}"),
    };
    // The device got the pushed audio plus silence; at most the last callback's buffer (silence,
    // filled while finish() was stopping the stream) may not have been handed over.
    assert!(captured.len() as u64 <= events.frames_played() + events.silence_frames());
    let audible: Vec<f32> = captured.iter().copied().filter(|&x| x != 0.0).collect();
    assert_eq!(audible.len(), audio.len());
    let tolerance = if config.sample_format == "f32" {
        0.0 // f32 samples are copied to the device unchanged
    } else {
        1.0 / 32767.0
    };
    for (i, (&got, &want)) in audible.iter().zip(&audio).enumerate() {
        assert!(
            (got - want).abs() <= tolerance,
            "sample {i}: captured {got}, pushed {want}"
        );
    }
    // After the last audio sample the device only got silence (the drain tail).
    let last_audible = captured.iter().rposition(|&x| x != 0.0).unwrap();
    assert!((captured.len() - 1 - last_audible) as u64 >= MODEL_SAMPLE_RATE as u64 / 20);
}
