//! Audio out of the engine into Python: a whole-text request's stream ([`RequestStream`]) and a
//! text-in stream ([`TextStream`]). Each is read by one Python thread at a time; waits release
//! the GIL and look at Python's signals between slices of [`crate::POLL`] (Ctrl-C raises
//! `KeyboardInterrupt` and cancels the request). Closing a stream, or letting Python collect it,
//! cancels its request and frees its engine slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use cosy::app::drain::FnSink;
use cosy::engine::{CancelToken, Event, RequestHandle};
use cosy::request::Summary;
use cosy::Error;

use crate::errors::to_py;
use crate::{samples_bytes, summary_dict, POLL};

/// The lock of a stream's reading end: taken without waiting, since a second reader would wait
/// holding the GIL while the first needs it back.
fn reader<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Ok(g),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(PyRuntimeError::new_err("this stream is being read by another thread; read a stream from one thread")),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A whole-text request's audio, chunk by chunk.
#[pyclass(module = "cosy._cosy", frozen)]
pub(crate) struct RequestStream {
    handle: Mutex<Option<RequestHandle>>,
    cancel: CancelToken,
    summary: Mutex<Option<Summary>>,
}

impl RequestStream {
    pub(crate) fn new(handle: RequestHandle) -> RequestStream {
        RequestStream { cancel: handle.cancel_token(), handle: Mutex::new(Some(handle)), summary: Mutex::new(None) }
    }
}

/// What a wait on a request's handle gave.
enum Next {
    Audio(Vec<f32>),
    Finished,
}

impl RequestStream {
    /// The next event of the request, the GIL released while waiting; the summary is kept.
    fn next_audio(&self, py: Python<'_>, handle: &mut Option<RequestHandle>) -> PyResult<Next> {
        let Some(h) = handle.as_mut() else { return Ok(Next::Finished) };
        loop {
            match py.detach(|| h.next_event_timeout(POLL)) {
                Err(_timed_out) => {
                    if let Err(interrupted) = py.check_signals() {
                        // Dropping the handle cancels the request.
                        *handle = None;
                        return Err(interrupted);
                    }
                }
                Ok(Some(Event::Audio(samples))) => return Ok(Next::Audio(samples)),
                Ok(Some(Event::Done(summary))) => {
                    *lock(&self.summary) = Some(summary);
                    *handle = None;
                    return Ok(Next::Finished);
                }
                Ok(Some(Event::Failed(e))) => {
                    *handle = None;
                    return Err(to_py(e));
                }
                Ok(None) => {
                    *handle = None;
                    return Err(to_py(Error::Runtime("the request ended without a result".into())));
                }
            }
        }
    }
}

#[pymethods]
impl RequestStream {
    /// The next chunk's samples (f32 little-endian bytes); `None` once the request is done.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut handle = reader(&self.handle)?;
        match self.next_audio(py, &mut handle)? {
            Next::Audio(samples) => Ok(Some(samples_bytes(py, &samples))),
            Next::Finished => Ok(None),
        }
    }

    /// All the audio still to come, as one bytes object (the whole-text call).
    fn read_all<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut handle = reader(&self.handle)?;
        let mut all: Vec<f32> = Vec::new();
        while let Next::Audio(samples) = self.next_audio(py, &mut handle)? {
            all.extend_from_slice(&samples);
        }
        Ok(samples_bytes(py, &all))
    }

    /// Stops the request at its next token or chunk and frees its slot.
    fn close(&self) {
        self.cancel.cancel();
        if let Ok(mut handle) = self.handle.try_lock() {
            *handle = None;
        }
    }

    /// The request's summary once it is done, else `None`.
    fn summary<'py>(&self, py: Python<'py>, sample_rate: u32) -> PyResult<Option<Bound<'py, PyDict>>> {
        lock(&self.summary).as_ref().map(|s| summary_dict(py, s, sample_rate)).transpose()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What a text stream's thread sends its reader.
enum Out {
    Audio(Vec<f32>),
    Done(Summary),
    Failed(Error),
}

/// Audio a text stream's thread may have waiting for Python (the engine waits beyond this).
const WAITING: usize = 16;

/// A text-in stream: text goes in with `write`, audio comes out, on a thread of its own that
/// runs the library's text-stream session ([`cosy::app::text_stream::speak_pieces`]).
#[pyclass(module = "cosy._cosy", frozen)]
pub(crate) struct TextStream {
    pieces: Mutex<Option<Sender<String>>>,
    out: Mutex<Option<Receiver<Out>>>,
    stopped: Arc<AtomicBool>,
    summary: Mutex<Option<Summary>>,
}

impl TextStream {
    /// Starts `stream` on its thread.
    pub(crate) fn start(stream: cosy::app::text_stream::TextStream) -> cosy::Result<TextStream> {
        let (piece_tx, piece_rx) = crossbeam_channel::unbounded::<String>();
        let (out_tx, out_rx) = crossbeam_channel::bounded::<Out>(WAITING);
        let stopped = Arc::new(AtomicBool::new(false));
        let stop_pieces = stopped.clone();
        // The pieces as they are written; a close ends them, a cancel fails them (so that a
        // stream waiting for text notices).
        let pieces = std::iter::from_fn(move || loop {
            match piece_rx.recv_timeout(POLL) {
                Ok(piece) => return Some(Ok(piece)),
                Err(RecvTimeoutError::Timeout) if stop_pieces.load(Ordering::Relaxed) => return Some(Err(Error::Cancelled)),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        });
        let stop_sink = stopped.clone();
        std::thread::Builder::new()
            .name("py-text-stream".into())
            .spawn(move || {
                let mut sink = FnSink(|chunk: &[f32]| {
                    if stop_sink.load(Ordering::Relaxed) {
                        return Err(Error::Cancelled);
                    }
                    out_tx.send(Out::Audio(chunk.to_vec())).map_err(|_| Error::Cancelled)
                });
                let result = cosy::app::text_stream::speak_pieces(stream, pieces, &mut sink);
                let _ = out_tx.send(match result {
                    Ok(summary) => Out::Done(summary),
                    Err(e) => Out::Failed(e),
                });
            })
            .map_err(|e| Error::Runtime(format!("cannot start a text stream's thread: {e}")))?;
        Ok(TextStream { pieces: Mutex::new(Some(piece_tx)), out: Mutex::new(Some(out_rx)), stopped, summary: Mutex::new(None) })
    }
}

#[pymethods]
impl TextStream {
    /// Hands the next piece of text over (never blocks).
    fn write(&self, text: String) -> PyResult<()> {
        let pieces = lock(&self.pieces);
        let Some(tx) = pieces.as_ref() else {
            return Err(to_py(Error::invalid("the text stream is closed: write before close()")));
        };
        // Its thread has ended (an error, read from the audio side): the piece is not spoken.
        tx.send(text).map_err(|_| to_py(Error::invalid("the text stream has ended; read its audio for the reason")))
    }

    /// The text is complete: the rest is spoken and the audio ends.
    fn close(&self) {
        lock(&self.pieces).take();
    }

    /// Stops the stream and frees the engine's slot.
    fn cancel(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        lock(&self.pieces).take();
        if let Ok(mut out) = self.out.try_lock() {
            *out = None;
        }
    }

    /// The next chunk's samples (f32 little-endian bytes); `None` once the stream is done.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut out = reader(&self.out)?;
        let Some(rx) = out.as_ref() else { return Ok(None) };
        loop {
            match py.detach(|| rx.recv_timeout(POLL)) {
                Ok(Out::Audio(samples)) => return Ok(Some(samples_bytes(py, &samples))),
                Ok(Out::Done(summary)) => {
                    *lock(&self.summary) = Some(summary);
                    *out = None;
                    return Ok(None);
                }
                Ok(Out::Failed(e)) => {
                    *out = None;
                    return Err(to_py(e));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    *out = None;
                    return Err(to_py(Error::Runtime("the text stream ended without a result".into())));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(interrupted) = py.check_signals() {
                        self.stopped.store(true, Ordering::Relaxed);
                        lock(&self.pieces).take();
                        *out = None;
                        return Err(interrupted);
                    }
                }
            }
        }
    }

    /// The stream's summary once it is done, else `None`.
    fn summary<'py>(&self, py: Python<'py>, sample_rate: u32) -> PyResult<Option<Bound<'py, PyDict>>> {
        lock(&self.summary).as_ref().map(|s| summary_dict(py, s, sample_rate)).transpose()
    }
}

impl Drop for TextStream {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}
