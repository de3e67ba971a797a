//! Text that arrives in pieces (the WebSocket, Wyoming's `synthesize-chunk`s, `cosy say -`,
//! `cosy file - --bistream`), spoken as it comes, segment by segment, without ever dropping text.
//!
//! * [`Session`]: every rule of a text stream (budget, segmentation, segment lifecycle, early
//!   end, first audio and timing), sans I/O: events in, actions out; tested on its own.
//! * [`TextStream`]: a session with its engine: it submits the segments and hands them their
//!   text, and gives the front end only what it tells its client ([`Step`]).
//! * [`speak_read`]: a whole stream from a reader (standard input), on threads, into an
//!   [`AudioSink`]: the command line's `say -` and `file - --bistream`; [`speak_pieces`], the
//!   same from pieces a program hands over (the Python package's `text_stream`).
//!
//! A front end translates: its messages into [`TextStream`] calls, the [`Step`]s into its own
//! events (WebSocket JSON, Wyoming events, a player). It decides nothing about the text.
//!
//! The text layer (Markdown, pauses, a lexicon) plugs in once, in [`Session::handle`]'s text
//! path (see the comment there), so that every front end gets it.

mod read;
mod session;

use std::sync::Arc;
use std::time::Instant;

use crate::app::speech::{build_request, SpeechOptions};
use crate::config::Config;
use crate::engine::{BistreamOptions, Engine, FeedProgress, RequestHandle, TextFeed};
use crate::error::{Error, Result};
use crate::frontend::ssml::InputFormat;
use crate::request::{Request, SynthesisObserver};

pub use read::{speak_pieces, speak_read, ReadNotes};
pub use session::{Action, Input, Report, SegmentEnd, SegmentStart, Segmenting, Session, Totals};

#[cfg(test)]
mod tests;

/// What a front end does next.
pub enum Step {
    /// A segment's request was submitted: follow its handle; its audio goes back in through
    /// [`TextStream::audio`], its end through [`TextStream::done`].
    Follow(SegmentStart, RequestHandle),
    /// Tell the client.
    Report(Report),
}

/// How a segment becomes a request.
enum Requests {
    /// Text-in streaming: `template` ([`crate::app::speech::build_streaming_request`]) per
    /// segment, its text through a [`TextFeed`].
    TextIn { template: Request, options: BistreamOptions },
    /// A whole-text request of each sentence ([`build_request`], every check).
    Sentences { config: Box<Config>, speech: SpeechOptions },
}

/// A [`Session`] and its engine: the segments' requests, submitted and fed here.
pub struct TextStream {
    session: Session,
    engine: Arc<Engine>,
    requests: Requests,
    observer: Option<Arc<dyn SynthesisObserver + Send>>,
    /// The text of the segment speaking, while more may come.
    feed: Option<TextFeed>,
    /// How many pieces the segment speaking took.
    progress: Option<FeedProgress>,
}

impl TextStream {
    /// Text-in streaming: each segment a request from `template` (a text-in streaming request,
    /// already checked), observed by `observer`. With `options.normalize_sentences` the session
    /// reads the Markdown and cuts the settled sentences ([`Segmenting::TextInSentences`]), and
    /// the engine normalises each as it takes it (`BistreamOptions::settled_pieces`): no text is
    /// held in the engine where an early end would lose it.
    pub fn text_in(
        engine: Arc<Engine>,
        config: &Config,
        template: Request,
        mut options: BistreamOptions,
        observer: Option<Arc<dyn SynthesisObserver + Send>>,
    ) -> TextStream {
        let session = if options.normalize_sentences {
            options.settled_pieces = true;
            let markdown = template.normalization.markdown(config.text.markdown, template.text_frontend);
            Session::new(Segmenting::TextInSentences, config.limits.max_text_chars).with_markdown(markdown)
        } else {
            Session::new(Segmenting::TextIn, config.limits.max_text_chars)
        };
        TextStream { session, engine, requests: Requests::TextIn { template, options }, observer, feed: None, progress: None }
    }

    /// Sentence by sentence: each segment a whole-text request of `speech` with its sentence.
    /// Markdown is read by the session, over the whole stream (a construct split across pieces
    /// or sentences reads as whole), so the sentences' requests do not read it again.
    pub fn sentences(engine: Arc<Engine>, config: &Config, mut speech: SpeechOptions) -> TextStream {
        let markdown = speech.normalization.markdown(config.text.markdown, speech.text_frontend);
        if markdown.is_some() {
            speech.normalization.markdown = Some(false);
        }
        // SSML is held and read whole; without the text frontend the text is as written.
        let format = if speech.text_frontend { speech.input_format } else { InputFormat::Text };
        let session = Session::new(Segmenting::Sentences, config.limits.max_text_chars).with_markdown(markdown).with_input_format(format);
        let requests = Requests::Sentences { config: Box::new(config.clone()), speech };
        TextStream { session, engine, requests, observer: None, feed: None, progress: None }
    }

    /// Every segment's request observed by `observer` (sentences; text-in streaming takes it
    /// when made).
    pub fn observed(mut self, observer: Option<Arc<dyn SynthesisObserver + Send>>) -> TextStream {
        self.observer = observer;
        self
    }

    /// The stream begins (text-in streaming submits its first segment now).
    pub fn start(&mut self, at: Instant) -> Result<Vec<Step>> {
        let actions = self.session.start(at);
        self.run(actions)
    }

    /// A piece of text arrived.
    pub fn text(&mut self, piece: String, at: Instant) -> Result<Vec<Step>> {
        self.handle(Input::Text(piece), at)
    }

    /// The input is done.
    pub fn end(&mut self, at: Instant) -> Result<Vec<Step>> {
        self.handle(Input::End, at)
    }

    /// Audio of the segment speaking.
    pub fn audio(&mut self, samples: Vec<f32>, at: Instant) -> Result<Vec<Step>> {
        self.handle(Input::Audio(samples), at)
    }

    /// The segment speaking has ended (its request's `Done`).
    pub fn done(&mut self, at: Instant) -> Result<Vec<Step>> {
        let pieces_taken = self.progress.take().map(|p| p.taken());
        drop(self.feed.take());
        self.handle(Input::Done { pieces_taken }, at)
    }

    /// The segment speaking failed: the stream ends with `error`, returned.
    pub fn failed(&mut self, error: Error) -> Error {
        self.feed = None;
        match self.session.handle(Input::Failed(error), Instant::now()) {
            Err(e) => e,
            Ok(_) => Error::Runtime("a failed segment did not end its text stream".into()),
        }
    }

    /// The front end stops: no more text goes to the engine (dropping the handle it follows
    /// cancels the request).
    pub fn cancel(&mut self) {
        self.feed = None;
        let _ = self.session.handle(Input::Cancel, Instant::now());
    }

    /// The segment speaking, if one is.
    pub fn speaking(&self) -> Option<usize> {
        self.session.speaking()
    }

    /// Whether the input is done.
    pub fn input_done(&self) -> bool {
        self.session.input_done()
    }

    /// Segments started so far.
    pub fn segments(&self) -> usize {
        self.session.segments()
    }

    fn handle(&mut self, input: Input, at: Instant) -> Result<Vec<Step>> {
        let actions = self.session.handle(input, at)?;
        self.run(actions)
    }

    /// Does the engine's part of `actions`; the rest is the front end's.
    fn run(&mut self, actions: Vec<Action>) -> Result<Vec<Step>> {
        let mut steps = Vec::new();
        for action in actions {
            match action {
                Action::Start(start) => {
                    let handle = self.submit(&start)?;
                    steps.push(Step::Follow(start, handle));
                }
                Action::Feed(piece) => {
                    if let Some(feed) = self.feed.as_mut() {
                        match feed.send(piece) {
                            // The request ended already (its last event is on the way): the
                            // piece was not taken, so it goes to the next segment.
                            Ok(()) | Err(Error::Runtime(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Action::EndText => {
                    if let Some(feed) = self.feed.take() {
                        feed.finish();
                    }
                }
                Action::Report(report) => steps.push(Step::Report(report)),
            }
        }
        Ok(steps)
    }

    /// A segment's request, submitted (text-in: fed its pieces so far).
    fn submit(&mut self, start: &SegmentStart) -> Result<RequestHandle> {
        match &self.requests {
            Requests::TextIn { template, options } => {
                let (mut feed, handle) = self.engine.submit_bistream(template.clone(), *options, self.observer.clone())?;
                for piece in &start.pieces {
                    feed.send(piece.clone())?;
                }
                self.progress = Some(feed.progress());
                self.feed = if start.text_complete {
                    feed.finish();
                    None
                } else {
                    Some(feed)
                };
                Ok(handle)
            }
            Requests::Sentences { config, speech } => {
                // The held SSML is read as SSML; a sentence of text is text, whatever it starts with.
                let input_format = if self.session.reads_ssml() { InputFormat::Ssml } else { InputFormat::Text };
                let options = SpeechOptions { text: start.text(), input_format, ..speech.clone() };
                let request = build_request(config, options)?;
                self.engine.submit_observed(request, self.observer.clone())
            }
        }
    }
}
