//! `cosy`: the binary, every front end over the library. Parsing and error reporting here; the
//! commands in the modules below (the binary's own: the library cannot import them), the work in
//! the library (`cosy::…`).

mod cli;
mod client;
mod doctor;
mod encode;
mod engines;
mod interrupt;
mod playback;
mod say;
mod serve;
mod speechd;

use cli::{exit_code, one_line, run, Cli};
use tracing_subscriber::EnvFilter;

fn main() {
    // clap prints usage errors itself and exits with 2.
    let cli = Cli::parse_args();
    // Checked as strictly as every COSY_* variable (Config::load checks it too).
    let log_env = std::env::var_os(cosy::config::LOG_ENV).map(|v| v.to_string_lossy().into_owned());
    if let Some(f) = &log_env {
        if let Err(e) = cosy::config::check_log_filter(f) {
            let err = anyhow::Error::from(e);
            eprintln!("cosy: {}", one_line(&err));
            std::process::exit(exit_code(&err));
        }
    }
    let filter = log_env
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| {
            EnvFilter::new(format!("cosy={},ort={}", cli.log_filter(), ort_level(cli.log_filter())))
                // Everything else (ort internals at info) only when asked for.
                .add_directive("warn".parse().unwrap_or_default())
                // The audio decoder logs its own errors (e.g. "probe reached EOF"); cosy reports
                // them as one clear line, so they would only be said twice.
                .add_directive("symphonia=off".parse().unwrap_or_default())
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never in a server's log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .init();
    if let Err(err) = run(cli) {
        // Once: a second Ctrl-C that ends the process meanwhile prints the same line itself.
        interrupt::print_final_line(&format!("cosy: {}", one_line(&err)));
        std::process::exit(exit_code(&err));
    }
}

/// ONNX Runtime's own log one step quieter than ours: its warnings (e.g. constants it cannot fold
/// on CPU in fp16 graphs) are about its optimiser, not about the user's run; `-v` shows them. Its
/// errors are off by default too: every failed ORT call also comes back as an error that cosy
/// reports as its one `cosy: …` line, so the log line (ANSI-coloured, with ORT's node names) would
/// only say it twice; `-v` shows it.
fn ort_level(cosy_level: &str) -> &'static str {
    match cosy_level {
        "trace" => "debug",
        "debug" => "info",
        "info" => "warn",
        _ => "off",
    }
}
