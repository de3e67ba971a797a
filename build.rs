//! Compiles the one C function cosy needs: a quiet ALSA error handler (src/audio/c/alsa_quiet.c).
//! ALSA's headers come from libasound2-dev, which cpal's ALSA backend needs anyway.

fn main() {
    println!("cargo:rerun-if-changed=src/audio/c/alsa_quiet.c");
    // Only the command-line front end plays audio (feature `cli`, which brings cpal).
    let cli = std::env::var_os("CARGO_FEATURE_CLI").is_some();
    if cli && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        cc::Build::new().file("src/audio/c/alsa_quiet.c").compile("cosy_alsa_quiet");
        println!("cargo:rustc-link-lib=asound");
    }
}
