//! Text that arrives in pieces (the WebSocket; next the Wyoming server and the web page), spoken
//! as it comes through text-in streaming, without ever dropping text.
//!
//! The rule: the pieces go into one text-in streaming request (a *segment*). When its speech
//! ends before its text does (the model stopped early: an end token mid-text, or the length
//! bound), the pieces it never took, and every piece that comes after, are spoken as a new
//! segment: a new request with the same voice and options. A segment's text is what it took;
//! text with nothing speakable (spaces, punctuation) waits for more before a segment starts,
//! and at the end of the input it is not spoken. The front end reports each segment (its index,
//! the text it took, whether it ended early) its own way.
//!
//! What cannot be known: how much of the text a segment took it actually spoke when it ended
//! early (the model decides that); that text is reported as the segment's, not repeated.

use std::sync::Arc;

use crate::engine::{BistreamOptions, Engine, FeedProgress, RequestHandle, TextFeed};
use crate::error::{Error, InputCode, Result};
use crate::request::Request;

/// How much text one session of pieces may receive in all (`limits.max_text_chars`, counted in
/// characters as [`crate::request::check_text_length`] counts a whole text): the rule for every
/// front end that takes text in pieces (the WebSocket, Wyoming's streaming events), whether or
/// not the pieces go to a [`TextIn`].
pub struct TextBudget {
    received: usize,
    limit: usize,
}

impl TextBudget {
    pub fn new(limit: usize) -> TextBudget {
        TextBudget { received: 0, limit }
    }

    /// Counts `piece`; refuses it (`text_too_long`, param `text`) once the session's text is over
    /// the limit.
    pub fn take(&mut self, piece: &str) -> Result<()> {
        self.received = self.received.saturating_add(piece.chars().count());
        if self.received > self.limit {
            return Err(Error::input(
                InputCode::TextTooLong,
                Some("text"),
                format!(
                    "the streamed text is longer than limits.max_text_chars = {} characters; send the rest in a new session or stream",
                    self.limit
                ),
            ));
        }
        Ok(())
    }
}

/// One text-in streaming session: its segments, one at a time.
pub struct TextIn {
    engine: Arc<Engine>,
    /// The request every segment starts from ([`crate::app::speech::build_streaming_request`]).
    template: Request,
    options: BistreamOptions,
    current: Option<Segment>,
    /// Text received while no segment runs (after one ended early), for the next one.
    waiting: Vec<String>,
    input_done: bool,
    /// Segments started so far.
    started: usize,
}

struct Segment {
    index: usize,
    /// `None` once the input is done (the request's text is complete).
    feed: Option<TextFeed>,
    progress: FeedProgress,
    /// Every piece handed to this segment, in order (empty pieces are not pieces).
    pieces: Vec<String>,
}

/// How a segment ended, and what comes next ([`TextIn::segment_ended`]).
pub struct SegmentEnd {
    pub index: usize,
    /// The text the segment took.
    pub text: String,
    /// Its speech ended before its text: the text it did not take is in the next segment.
    pub ended_early: bool,
    pub next: Next,
}

/// What follows a segment.
pub enum Next {
    /// A new segment has started with the text the last one did not take.
    Segment(RequestHandle),
    /// The input goes on; the next piece with something to say starts a new segment.
    Waiting,
    /// The input is done and all of it was handed to segments: the session is over.
    Finished,
}

impl TextIn {
    /// Starts the first segment of `request` (a text-in streaming request, already checked).
    pub fn start(engine: Arc<Engine>, request: Request, options: BistreamOptions) -> Result<(TextIn, RequestHandle)> {
        let mut session = TextIn { engine, template: request, options, current: None, waiting: Vec::new(), input_done: false, started: 0 };
        let handle = session.open(Vec::new())?;
        Ok((session, handle))
    }

    /// The segment now speaking (its index), if one is.
    pub fn current(&self) -> Option<usize> {
        self.current.as_ref().map(|s| s.index)
    }

    /// Segments started so far.
    pub fn segments(&self) -> usize {
        self.started
    }

    /// Whether the input is done.
    pub fn input_done(&self) -> bool {
        self.input_done
    }

    /// A new piece of text: into the segment that is speaking, or kept for the next one. Returns
    /// the handle of a segment this piece started (after one ended early).
    pub fn push(&mut self, piece: String) -> Result<Option<RequestHandle>> {
        if piece.is_empty() {
            return Ok(None);
        }
        if let Some(segment) = self.current.as_mut() {
            if let Some(feed) = segment.feed.as_mut() {
                match feed.send(piece.clone()) {
                    Ok(()) => {}
                    // The request ended already (its last event is on the way): the piece was not
                    // taken, so it goes to the next segment (`segment_ended`).
                    Err(crate::Error::Runtime(_)) => {}
                    Err(e) => return Err(e),
                }
                segment.pieces.push(piece);
                return Ok(None);
            }
        }
        self.waiting.push(piece);
        self.start_waiting()
    }

    /// The input is done: the speaking segment's text is complete. Returns the handle of a
    /// segment started for text that was waiting.
    pub fn finish(&mut self) -> Result<Option<RequestHandle>> {
        self.input_done = true;
        if let Some(segment) = self.current.as_mut() {
            if let Some(feed) = segment.feed.take() {
                feed.finish();
            }
            return Ok(None);
        }
        self.start_waiting()
    }

    /// The speaking segment's request has ended (its `Done` event): which text it took, and the
    /// next segment when text is left.
    pub fn segment_ended(&mut self) -> Result<SegmentEnd> {
        let Some(mut segment) = self.current.take() else {
            return Err(crate::Error::Runtime("text-in streaming: no segment was speaking".into()));
        };
        let taken = segment.progress.taken().min(segment.pieces.len());
        let rest = segment.pieces.split_off(taken);
        let ended_early = segment.feed.is_some() || !rest.is_empty();
        drop(segment.feed.take());
        let mut waiting = rest;
        waiting.append(&mut self.waiting);
        self.waiting = waiting;
        let next = match self.start_waiting()? {
            Some(handle) => Next::Segment(handle),
            None if self.input_done => Next::Finished,
            None => Next::Waiting,
        };
        if ended_early {
            tracing::info!(
                "text-in streaming: the speech of segment {} ended before its text{}",
                segment.index,
                if matches!(next, Next::Segment(_)) { "; the rest is a new segment" } else { "" }
            );
        }
        Ok(SegmentEnd { index: segment.index, text: segment.pieces.concat(), ended_early, next })
    }

    /// Starts a segment for the waiting text when it has something to say (and the input, when
    /// done, ends it at once). Text with nothing to say waits (and is dropped at the end).
    fn start_waiting(&mut self) -> Result<Option<RequestHandle>> {
        if self.current.is_some() || self.waiting.is_empty() {
            return Ok(None);
        }
        if crate::request::check_speakable(&self.waiting.concat()).is_err() {
            if self.input_done {
                self.waiting.clear();
            }
            return Ok(None);
        }
        let pieces = std::mem::take(&mut self.waiting);
        let handle = self.open(pieces)?;
        if self.input_done {
            if let Some(feed) = self.current.as_mut().and_then(|s| s.feed.take()) {
                feed.finish();
            }
        }
        Ok(Some(handle))
    }

    /// A new segment's request, fed `pieces` at once.
    fn open(&mut self, pieces: Vec<String>) -> Result<RequestHandle> {
        let (mut feed, handle) = self.engine.submit_bistream(self.template.clone(), self.options, None)?;
        for piece in &pieces {
            feed.send(piece.clone())?;
        }
        let progress = feed.progress();
        self.current = Some(Segment { index: self.started, feed: Some(feed), progress, pieces });
        self.started += 1;
        Ok(handle)
    }
}
