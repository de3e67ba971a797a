//! Running a request's handle into a sink: the one loop every front end that consumes audio on a
//! thread uses (a file, stdout, a player, a profile run).

use crate::engine::{Event, RequestHandle};
use crate::error::{Error, Result};
use crate::request::Summary;

/// Where a request's audio goes, chunk by chunk (24 kHz mono f32, in order). An error stops the
/// request (its handle is dropped, which cancels it).
pub trait AudioSink {
    fn audio(&mut self, samples: &[f32]) -> Result<()>;
}

/// Collects the audio in memory.
impl AudioSink for Vec<f32> {
    fn audio(&mut self, samples: &[f32]) -> Result<()> {
        self.extend_from_slice(samples);
        Ok(())
    }
}

/// A closure as a sink.
pub struct FnSink<F>(pub F);

impl<F: FnMut(&[f32]) -> Result<()>> AudioSink for FnSink<F> {
    fn audio(&mut self, samples: &[f32]) -> Result<()> {
        (self.0)(samples)
    }
}

/// Hands every chunk of `handle` to `sink` until the request ends; its summary, or its error
/// (or the sink's).
pub fn drain(mut handle: RequestHandle, sink: &mut dyn AudioSink) -> Result<Summary> {
    loop {
        match handle.next_event() {
            Some(Event::Audio(chunk)) => sink.audio(&chunk)?,
            Some(Event::Done(summary)) => return Ok(summary),
            Some(Event::Failed(e)) => return Err(e),
            None => return Err(Error::Runtime("the request ended without a result".into())),
        }
    }
}
