// Decoding a written audio file with ffmpeg, as a user's player would: shared by the CLI's tests
// (`crate::common::ffmpeg`) and the encoders' unit tests in src/encode/file.rs (which include this
// file: a unit test cannot import tests/common). No inner doc comment: `include!` takes items only.

/// ffmpeg's decoding of `path` to s16le mono at 24 kHz (a `.pcm` file read as that). Its stderr
/// at `-v error` must be empty: a warning is a failure.
pub fn decode_file(path: &std::path::Path) -> Vec<i16> {
    let mut cmd = std::process::Command::new("ffmpeg");
    cmd.args(["-v", "error", "-nostdin"]);
    if path.extension().is_some_and(|e| e == "pcm") {
        cmd.args(["-f", "s16le", "-ar", "24000", "-ac", "1"]);
    }
    let out = cmd
        .arg("-i")
        .arg(path)
        .args(["-f", "s16le", "-ac", "1", "-ar", "24000", "-"])
        .output()
        .unwrap_or_else(|e| panic!("ffmpeg cannot run ({e}): scripts/setup.sh installs it (apt-get install ffmpeg)"));
    assert!(out.status.success() && out.stderr.is_empty(), "ffmpeg {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect()
}
