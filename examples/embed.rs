//! Synthesis through the library alone, as a program that embeds cosy does: no command line
//! parser, no server, no playback (build it with `--no-default-features` to see that none of the
//! binary's crates is needed). It loads the configuration, resolves a voice from a recording and
//! its transcript, builds the request with every check the front ends apply, runs it on the engine
//! and writes a WAV.
//!
//!     cargo run --no-default-features --example embed -- MODEL_DIR PROMPT_WAV "PROMPT TEXT" "TEXT" OUT_WAV
//!
//! With the bundled tiny model (random weights: noise, not speech):
//!
//!     cargo run --no-default-features --example embed -- tests/fixtures/tiny \
//!         tests/fixtures/prompt_24k.wav "This recording is the voice prompt." "Hello there." /tmp/embed.wav

use std::path::PathBuf;

use cosy::app::speech::{build_request, SpeechOptions};
use cosy::app::voices::{Recording, VoiceChoice, Voices};
use cosy::audio::{write_audio_atomic, OutputFormat};
use cosy::config::{Config, LoadOptions};
use cosy::engine::Engine;

fn main() {
    if let Err(e) = run() {
        eprintln!("embed: {e}");
        std::process::exit(1);
    }
}

fn run() -> cosy::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, prompt_wav, prompt_text, text, out] = args.as_slice() else {
        return Err(cosy::Error::invalid("usage: embed MODEL_DIR PROMPT_WAV \"PROMPT TEXT\" \"TEXT\" OUT_WAV"));
    };
    // The same layered settings the binary reads (COSY_* variables, a config file if given),
    // with the model folder set the way a flag would set it.
    let mut options = LoadOptions::from_process_env();
    options.flags.push(("model.dir".into(), model.clone()));
    let config = Config::load(&options)?;
    let engine = Engine::load(&config)?;
    let voice = Voices::new(&config).resolve(
        VoiceChoice {
            name: None,
            recording: Some(Recording::File(PathBuf::from(prompt_wav))),
            transcript: Some(prompt_text.clone()),
            instruction: None,
        },
        None,
    )?;
    let mut speech = SpeechOptions::new(text.clone(), voice.voice, false);
    speech.seed = Some(1);
    let (samples, summary) = engine.submit(build_request(&config, speech)?)?.wait()?;
    write_audio_atomic(&PathBuf::from(out), &samples, engine.sample_rate(), OutputFormat::Wav16)?;
    println!("{out}: {} samples at {} Hz, {} speech tokens", samples.len(), engine.sample_rate(), summary.speech_tokens);
    Ok(())
}
