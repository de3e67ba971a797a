//! A text stream read from a reader (standard input) as it arrives, spoken into a sink: the
//! reader on a thread of its own, each segment's events on another, the [`TextStream`] on the
//! caller's thread (which also pushes the audio, so a slow sink paces the stream).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use super::{Report, Step, TextStream};
use crate::app::drain::AudioSink;
use crate::engine::{CancelToken, Event, RequestHandle};
use crate::error::{Error, Result};
use crate::request::{SentenceSpan, Summary};

/// What the reader reports as it reads (a log's lines), from its own thread.
pub trait ReadNotes: Send + Sync {
    /// The `number`th piece (from 1) was read.
    fn piece(&self, _number: usize, _piece: &str) {}
    /// The input has ended (no error).
    fn end(&self) {}
}

/// What wakes the stream's thread.
enum Wake {
    Piece(String),
    End,
    ReadFailed(Error),
    Engine(Event),
}

/// Events the stream's thread may have waiting (the reader and the segment wait beyond this).
const WAITING: usize = 64;

/// Speaks the text of `reader` (named `what` in messages) as it arrives through `stream`: each
/// read is a piece ([`crate::frontend::text::read_pieces`]: UTF-8 checked, a byte-order mark
/// dropped); each segment's audio goes to `sink` in order. Returns the segments' summaries added
/// up; an error of the input, the stream, a segment or the sink ends it (the segment speaking is
/// cancelled).
pub fn speak_read(
    stream: TextStream,
    reader: impl std::io::Read + Send + 'static,
    what: &str,
    notes: Option<Arc<dyn ReadNotes>>,
    sink: &mut dyn AudioSink,
) -> Result<Summary> {
    let what = what.to_string();
    let source = move |on_piece: &mut dyn FnMut(String) -> Result<()>| crate::frontend::text::read_pieces(reader, &what, on_piece).map(|_| ());
    speak_from(stream, source, notes, sink)
}

/// [`speak_read`] over text already in pieces (a program's own text, as its language model
/// writes it: the Python package's `text_stream`): each item is one piece as given (an empty one
/// is none); the iterator may block while text is coming, and an `Err` item ends the stream
/// with that error.
pub fn speak_pieces(
    stream: TextStream,
    pieces: impl Iterator<Item = Result<String>> + Send + 'static,
    sink: &mut dyn AudioSink,
) -> Result<Summary> {
    let source = move |on_piece: &mut dyn FnMut(String) -> Result<()>| {
        for piece in pieces {
            let piece = piece?;
            if !piece.is_empty() {
                on_piece(piece)?;
            }
        }
        Ok(())
    };
    speak_from(stream, source, None, sink)
}

/// What hands a text stream its pieces, on the reader's thread: each piece to `on_piece`, then
/// `Ok` at the end of the input.
type Source = dyn FnOnce(&mut dyn FnMut(String) -> Result<()>) -> Result<()> + Send;

fn speak_from(
    mut stream: TextStream,
    source: impl FnOnce(&mut dyn FnMut(String) -> Result<()>) -> Result<()> + Send + 'static,
    notes: Option<Arc<dyn ReadNotes>>,
    sink: &mut dyn AudioSink,
) -> Result<Summary> {
    let (wake, woken) = sync_channel::<Wake>(WAITING);
    let mut following = Following(None);
    let steps = stream.start(Instant::now())?;
    if let Some(summary) = act(steps, &wake, &mut following, sink, &Summary::default())? {
        return Ok(summary);
    }
    let reader = start_reader(Box::new(source), notes, wake.clone())?;
    let summary = run(&mut stream, &woken, &wake, &mut following, sink)?;
    // The reader has ended: the stream is finished only after the end of its input.
    let _ = reader.join();
    Ok(summary)
}

/// The stream's loop: each wake through the stream, its steps done, until it is finished.
fn run(
    stream: &mut TextStream,
    woken: &Receiver<Wake>,
    wake: &SyncSender<Wake>,
    following: &mut Following,
    sink: &mut dyn AudioSink,
) -> Result<Summary> {
    let mut summary = Summary::default();
    loop {
        // `wake` is held here, so the channel stays open.
        let Ok(event) = woken.recv() else { return Err(Error::Runtime("the text stream lost its events".into())) };
        let now = Instant::now();
        let steps = match event {
            Wake::Piece(piece) => stream.text(piece, now)?,
            Wake::End => stream.end(now)?,
            Wake::ReadFailed(e) => return Err(e),
            Wake::Engine(Event::Audio(samples)) => stream.audio(samples, now)?,
            Wake::Engine(Event::Done(done)) => {
                add(&mut summary, &done);
                following.0 = None;
                stream.done(now)?
            }
            Wake::Engine(Event::Failed(e)) => return Err(stream.failed(e)),
        };
        if let Some(summary) = act(steps, wake, following, sink, &summary)? {
            return Ok(summary);
        }
    }
}

/// Does `steps`: follows a started segment, pushes audio; the summary once the stream is finished.
fn act(steps: Vec<Step>, wake: &SyncSender<Wake>, following: &mut Following, sink: &mut dyn AudioSink, summary: &Summary) -> Result<Option<Summary>> {
    for step in steps {
        match step {
            Step::Follow(_, handle) => following.0 = Some(follow(handle, wake.clone())?),
            Step::Report(Report::Audio { samples, .. }) => sink.audio(&samples)?,
            Step::Report(Report::Finished(_)) => return Ok(Some(summary.clone())),
            Step::Report(Report::FirstAudio { .. } | Report::SegmentDone(_)) => {}
        }
    }
    Ok(None)
}

/// The segment followed; dropped (the stream ended, by an error too), it is cancelled.
struct Following(Option<CancelToken>);

impl Drop for Following {
    fn drop(&mut self) {
        if let Some(token) = self.0.take() {
            token.cancel();
        }
    }
}

/// A segment's events, forwarded to the stream's thread from a thread of their own.
fn follow(mut handle: RequestHandle, wake: SyncSender<Wake>) -> Result<CancelToken> {
    let token = handle.cancel_token();
    std::thread::Builder::new()
        .name("segment-events".into())
        .spawn(move || loop {
            let event = handle.next_event().unwrap_or_else(|| Event::Failed(Error::Runtime("the request ended without a result".into())));
            let last = !matches!(event, Event::Audio(_));
            // The stream has ended (an error): dropping the handle cancels the request.
            if wake.send(Wake::Engine(event)).is_err() || last {
                break;
            }
        })
        .map_err(|e| Error::Runtime(format!("cannot start a segment's event thread: {e}")))?;
    Ok(token)
}

/// The reader's thread: each piece from `source`, then the end of the input or its error.
fn start_reader(source: Box<Source>, notes: Option<Arc<dyn ReadNotes>>, wake: SyncSender<Wake>) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("text-reader".into())
        .spawn(move || {
            let mut pieces = 0usize;
            let read = source(&mut |piece: String| {
                pieces += 1;
                if let Some(notes) = &notes {
                    notes.piece(pieces, &piece);
                }
                // The stream has ended (an error): stop reading.
                wake.send(Wake::Piece(piece)).map_err(|_| Error::Cancelled)
            });
            let last = match read {
                Ok(()) => {
                    if let Some(notes) = &notes {
                        notes.end();
                    }
                    Wake::End
                }
                Err(e) => Wake::ReadFailed(e),
            };
            let _ = wake.send(last);
        })
        .map_err(|e| Error::Runtime(format!("cannot start the text reader: {e}")))
}

/// A segment's summary added to the stream's.
fn add(total: &mut Summary, segment: &Summary) {
    let offset = total.samples;
    total.spans.extend(segment.spans.iter().map(|s| SentenceSpan { start: s.start + offset, ..s.clone() }));
    total.samples += segment.samples;
    total.sentences += segment.sentences;
    total.chunks += segment.chunks;
    total.speech_tokens += segment.speech_tokens;
    total.text_tokens += segment.text_tokens;
}
