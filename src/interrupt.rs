//! Ctrl-C for the whole process (`cosy say`): the first press asks the work to stop (the
//! callbacks registered with [`on_interrupt`] run, [`requested`] turns true, and the command ends
//! with [`Error::Cancelled`], said as [`STOPPED`], exit status 130); a second press ends the
//! process at once with that same line.
//!
//! The second press leaves through `_exit`, not `exit`: `exit` runs the C++ static destructors of
//! ONNX Runtime while another thread may still be inside a run, and that run then fails with
//! errors that have nothing to do with the user's input (e.g. `Softmax … GetElementType is not
//! implemented`, `MLDataType for: tensor(float) is not currently registered`) or crashes.
//! [`print_final_line`] makes sure the process says exactly one last line either way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use cosy::error::{Error, Result};

use crate::playback::CancelHandle;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
type Callback = Box<dyn Fn() + Send>;
static CALLBACKS: Mutex<Vec<Callback>> = Mutex::new(Vec::new());
static FINAL_LINE: Mutex<bool> = Mutex::new(false);

/// How the command line says [`Error::Cancelled`] once Ctrl-C was pressed (the library's own
/// words do not know what stopped the work).
pub const STOPPED: &str = "stopped (Ctrl-C)";

/// Installs the process's Ctrl-C handler (once; later calls return the first call's result).
pub fn install() -> Result<()> {
    INSTALLED
        .get_or_init(|| ctrlc::set_handler(on_ctrl_c).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::invalid(format!("cannot install the Ctrl-C handler: {e}")))
}

fn on_ctrl_c() {
    if REQUESTED.swap(true, Ordering::SeqCst) {
        print_final_line(&format!("cosy: {STOPPED}"));
        // SAFETY: `_exit` ends the process without running any Rust or C code; nothing is unsound
        // about calling it from any thread.
        unsafe { libc::_exit(130) }
    }
    let callbacks = CALLBACKS.lock().unwrap_or_else(|e| e.into_inner());
    for f in callbacks.iter() {
        f();
    }
}

/// Runs `f` on the first Ctrl-C (at once if it was already pressed). `f` must be quick and must
/// not call [`on_interrupt`].
pub fn on_interrupt(f: impl Fn() + Send + 'static) {
    let mut callbacks = CALLBACKS.lock().unwrap_or_else(|e| e.into_inner());
    if REQUESTED.load(Ordering::SeqCst) {
        f();
    }
    callbacks.push(Box::new(f));
}

/// Whether Ctrl-C was pressed (since the handler was installed).
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Prints the process's last line to stderr, once: of this call and a second Ctrl-C, whichever
/// comes first prints, and the other prints nothing.
pub fn print_final_line(line: &str) {
    let mut printed = FINAL_LINE.lock().unwrap_or_else(|e| e.into_inner());
    if !*printed {
        eprintln!("{line}");
        *printed = true;
    }
}

/// Makes Ctrl-C cancel playback; a second Ctrl-C exits at once with status 130 (the process's one
/// handler, above). May be called for several players.
pub fn cancel_on_ctrl_c(handle: CancelHandle) -> Result<()> {
    install()?;
    on_interrupt(move || handle.cancel());
    Ok(())
}
