//! The library's errors as Python exceptions: the same one-line message the `cosy` binary prints
//! (`str(e)`), and the typed parts as attributes: `kind` (the error's variant), `code` (an input
//! error's code, the HTTP API's error code) and `param` (the parameter it is about, as the HTTP API
//! names it).

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(cosy, CosyError, PyException, "Any error of the cosy engine (`kind`, `code`, `param` say which).");
pyo3::create_exception!(cosy, InputError, CosyError, "Bad input: text, voice, recording or options (`code`, `param`).");
pyo3::create_exception!(cosy, ConfigError, CosyError, "A configuration key or value is invalid.");
pyo3::create_exception!(cosy, ModelError, CosyError, "The model folder or the ONNX Runtime library cannot be used.");
pyo3::create_exception!(cosy, BusyError, CosyError, "Every slot and queue place of the engine is taken (engine.max_in_flight, engine.max_queue).");
pyo3::create_exception!(cosy, CancelledError, CosyError, "The request was stopped before it finished.");

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CosyError", py.get_type::<CosyError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    Ok(())
}

/// The variant's name, as `kind` gives it.
fn kind_of(e: &cosy::Error) -> &'static str {
    match e {
        cosy::Error::Config(_) => "config",
        cosy::Error::Model { .. } => "model",
        cosy::Error::Library(_) => "library",
        cosy::Error::Runtime(_) => "runtime",
        cosy::Error::Provider { .. } => "provider",
        cosy::Error::Input { .. } => "input",
        cosy::Error::Io { .. } => "io",
        cosy::Error::Storage { .. } => "storage",
        cosy::Error::Ort(_) => "onnxruntime",
        cosy::Error::Busy(_) => "busy",
        cosy::Error::Cancelled => "cancelled",
    }
}

/// `e` as the matching exception, its message as the binary prints it.
pub(crate) fn to_py(e: cosy::Error) -> PyErr {
    let message = e.to_string();
    let (code, param) = match &e {
        cosy::Error::Input { code, param, .. } => (Some(code.as_str()), *param),
        _ => (None, None),
    };
    let kind = kind_of(&e);
    let err = match &e {
        cosy::Error::Input { .. } => InputError::new_err(message),
        cosy::Error::Config(_) => ConfigError::new_err(message),
        cosy::Error::Model { .. } | cosy::Error::Library(_) | cosy::Error::Provider { .. } => ModelError::new_err(message),
        cosy::Error::Busy(_) => BusyError::new_err(message),
        cosy::Error::Cancelled => CancelledError::new_err(message),
        _ => CosyError::new_err(message),
    };
    Python::attach(|py| {
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance does not fail.
        let _ = value.setattr("kind", kind);
        let _ = value.setattr("code", code);
        let _ = value.setattr("param", param);
    });
    err
}
