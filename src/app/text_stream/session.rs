//! The rules of one text stream, without I/O: events in ([`Input`]), what to do out
//! ([`Action`]). [`super::TextStream`] does the engine's part; a front end does the rest.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::config::MarkdownSettings;
use crate::frontend::ssml::InputFormat;
use crate::frontend::sentences::SentenceCutter;
use crate::request::{check_speakable, check_streamed_length};

/// How a session's text becomes segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmenting {
    /// Text-in streaming: every piece goes into the segment speaking as it arrives; the first
    /// segment starts at once (its prompt is read while the text comes).
    TextIn,
    /// Each settled sentence ([`SentenceCutter`]) is a whole-text segment; segments speak one
    /// after another.
    Sentences,
    /// Text-in streaming of settled sentences (its normalising option): the pieces are read as
    /// Markdown and cut into settled spans here, and each span goes into the segment speaking as
    /// one piece. So a segment that ends early has taken whole spans only, and what it did not
    /// take starts the next segment (the engine's own regrouping would hold text it had taken).
    TextInSentences,
}

/// What happens to a session (its front end's message, or its engine's event).
#[derive(Debug)]
pub enum Input {
    /// A piece of text.
    Text(String),
    /// The input is done: no more text.
    End,
    /// Audio of the segment speaking, in order.
    Audio(Vec<f32>),
    /// The segment speaking has ended; `pieces_taken`: how many of its pieces its request took
    /// (text-in streaming, `FeedProgress::taken`), `None` = all of them (a whole-text request).
    Done { pieces_taken: Option<usize> },
    /// The segment speaking failed: the session ends with that error.
    Failed(Error),
    /// The front end stops (its client went away): what speaks is to be dropped.
    Cancel,
}

/// What to do.
#[derive(Debug)]
pub enum Action {
    /// Submit a segment: a request for these pieces; when `text_complete` is false more pieces
    /// follow ([`Action::Feed`]) until [`Action::EndText`].
    Start(SegmentStart),
    /// Hand this piece to the segment speaking (text-in streaming).
    Feed(String),
    /// The segment speaking has all its text.
    EndText,
    /// Something the front end tells its client.
    Report(Report),
}

/// What a front end tells its client (its own way).
#[derive(Debug)]
pub enum Report {
    /// A segment's first audio, `after` its start.
    FirstAudio { segment: usize, after: Duration },
    /// Audio to send.
    Audio { segment: usize, samples: Vec<f32> },
    /// A segment has ended.
    SegmentDone(SegmentEnd),
    /// The session is over: all its text was spoken.
    Finished(Totals),
}

/// A segment to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentStart {
    pub index: usize,
    /// Its text so far (text-in: what waited for it; sentences: its one sentence).
    pub pieces: Vec<String>,
    /// No piece follows: the request's text is complete.
    pub text_complete: bool,
}

impl SegmentStart {
    /// The segment's text so far.
    pub fn text(&self) -> String {
        self.pieces.concat()
    }
}

/// How a segment ended.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentEnd {
    pub index: usize,
    /// The text it took.
    pub text: String,
    /// Its speech ended before its text: what it did not take is in the next segment.
    pub ended_early: bool,
    /// Its audio's length.
    pub samples: usize,
    /// When it started (for its timing).
    pub started: Instant,
    /// Its first audio, after its start (`None`: it made none).
    pub first_audio: Option<Duration>,
}

/// A finished session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Segments started.
    pub segments: usize,
    /// All the audio's length.
    pub samples: usize,
}

/// Text not yet in a segment, by segmenting.
#[derive(Debug)]
enum Pending {
    /// Pieces no segment took yet (after one ended early): all of them are the next segment's;
    /// `cutter`: the pieces are settled spans cut from the text as it arrives
    /// ([`Segmenting::TextInSentences`]).
    TextIn { waiting: Vec<String>, cutter: Option<SentenceCutter> },
    /// Text not settled yet (`cutter`, which reads the Markdown before it cuts: a construct split
    /// across pieces reads as whole), and settled sentences waiting for their turn.
    Sentences { cutter: SentenceCutter, settled: VecDeque<String> },
}

/// Whether a sentence-segmented stream is SSML, which is read whole (an element may span
/// sentences and pieces): held until the input is done, then one segment.
#[derive(Debug)]
enum SsmlHold {
    /// Not known yet (the text so far could still start `<speak>`): the text so far.
    Undecided(String),
    /// SSML: all the text so far.
    Whole(String),
    /// Text: read sentence by sentence.
    Text,
}

impl SsmlHold {
    /// `piece` arrived: the text to read sentence by sentence now (none while held).
    fn push(&mut self, piece: &str) -> Option<String> {
        match self {
            SsmlHold::Text => Some(piece.to_string()),
            SsmlHold::Whole(all) => {
                all.push_str(piece);
                None
            }
            SsmlHold::Undecided(so_far) => {
                so_far.push_str(piece);
                match InputFormat::Auto.decided(so_far)? {
                    true => *self = SsmlHold::Whole(std::mem::take(so_far)),
                    false => {
                        let text = std::mem::take(so_far);
                        *self = SsmlHold::Text;
                        return Some(text);
                    }
                }
                None
            }
        }
    }
}

/// The segment speaking.
#[derive(Debug)]
struct Speaking {
    index: usize,
    /// Every piece handed to it, in order.
    pieces: Vec<String>,
    /// More pieces may come (text-in streaming, input not done).
    text_open: bool,
    started: Instant,
    first_audio: Option<Duration>,
    samples: usize,
}

/// One text stream (a WebSocket session, a Wyoming `synthesize-start` … `synthesize-stop`, `cosy
/// say -`): its rules, in one place.
///
/// * The budget: at most `limits.max_text_chars` characters over the whole session, whatever
///   the segments ([`check_streamed_length`]).
/// * Segmentation: text-in pieces, or settled sentences ([`Segmenting`]). Text with nothing to
///   say (spaces, punctuation) waits for more before a segment starts; at the end of the input
///   it is not spoken (but a session that says nothing at all is an error).
/// * The segment lifecycle: one segment speaks at a time; a segment starts when text for it is
///   there and none speaks; the session is finished when the input is done and nothing is left.
/// * Early end (text-in): when a segment's speech ends before its text (an end token mid-text, the
///   length bound), the pieces it did not take, and every piece after, start the next segment:
///   no text is dropped. What cannot be known: how much of the text a segment took it spoke;
///   that text is reported as the segment's, not repeated.
/// * First audio and timing: each segment's start, first audio and length.
///
/// Time comes in with each event (`at`), so the session reads no clock.
#[derive(Debug)]
pub struct Session {
    pending: Pending,
    /// Whether the text is SSML, held whole (sentence segmenting only).
    ssml: SsmlHold,
    received: usize,
    limit: usize,
    input_done: bool,
    /// Finished, failed or cancelled: it takes no more events.
    over: bool,
    speaking: Option<Speaking>,
    /// Segments started.
    started: usize,
    samples: usize,
}

impl Session {
    /// A session of `segmenting`, at most `max_text_chars` characters of text in all.
    pub fn new(segmenting: Segmenting, max_text_chars: usize) -> Session {
        let pending = match segmenting {
            Segmenting::TextIn => Pending::TextIn { waiting: Vec::new(), cutter: None },
            Segmenting::TextInSentences => Pending::TextIn { waiting: Vec::new(), cutter: Some(SentenceCutter::default()) },
            Segmenting::Sentences => Pending::Sentences { cutter: SentenceCutter::default(), settled: VecDeque::new() },
        };
        let ssml = SsmlHold::Undecided(String::new());
        Session { pending, ssml, received: 0, limit: max_text_chars, input_done: false, over: false, speaking: None, started: 0, samples: 0 }
    }

    /// Sentences are read as Markdown first (`frontend::markdown`); their segments' requests
    /// must then not read it again. Text-in pieces ([`Segmenting::TextIn`]) are given as written.
    pub fn with_markdown(mut self, settings: Option<MarkdownSettings>) -> Session {
        match &mut self.pending {
            Pending::Sentences { cutter, .. } | Pending::TextIn { cutter: Some(cutter), .. } => *cutter = SentenceCutter::new(settings),
            Pending::TextIn { cutter: None, .. } => {}
        }
        self
    }

    /// Whether sentences are SSML (`format`; auto: the stream starts with `<speak>`): an SSML
    /// stream is held until the input is done and then spoken whole, one segment.
    pub fn with_input_format(mut self, format: InputFormat) -> Session {
        if matches!(self.pending, Pending::Sentences { .. }) {
            self.ssml = match format {
                InputFormat::Auto => SsmlHold::Undecided(String::new()),
                InputFormat::Ssml => SsmlHold::Whole(String::new()),
                InputFormat::Text => SsmlHold::Text,
            };
        }
        self
    }

    /// Whether the segments are SSML (held whole), not text.
    pub fn reads_ssml(&self) -> bool {
        matches!(self.pending, Pending::Sentences { .. }) && matches!(self.ssml, SsmlHold::Whole(_))
    }

    /// The session begins: text-in streaming starts its first segment now, with no text yet.
    pub fn start(&mut self, at: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if matches!(self.pending, Pending::TextIn { .. }) && self.started == 0 && !self.over {
            self.open(Vec::new(), at, &mut actions);
        }
        actions
    }

    /// What `input` (at `at`) means: what to do, in order; an error ends the session (the
    /// budget, a session with nothing to say, a failed segment).
    pub fn handle(&mut self, input: Input, at: Instant) -> Result<Vec<Action>> {
        if self.over {
            return Err(Error::Runtime("the text stream is over; it takes no more events".into()));
        }
        let mut actions = Vec::new();
        let result = match input {
            Input::Text(piece) => self.text(piece, at, &mut actions),
            Input::End => self.end(at, &mut actions),
            Input::Audio(samples) => self.audio(samples, at, &mut actions),
            Input::Done { pieces_taken } => self.done(pieces_taken, at, &mut actions),
            Input::Failed(e) => Err(e),
            Input::Cancel => {
                self.speaking = None;
                self.over = true;
                Ok(())
            }
        };
        if result.is_err() {
            self.over = true;
        }
        result.map(|()| actions)
    }

    /// The segment speaking, if one is.
    pub fn speaking(&self) -> Option<usize> {
        self.speaking.as_ref().map(|s| s.index)
    }

    /// Whether the input is done.
    pub fn input_done(&self) -> bool {
        self.input_done
    }

    /// Segments started so far.
    pub fn segments(&self) -> usize {
        self.started
    }

    fn text(&mut self, piece: String, at: Instant, actions: &mut Vec<Action>) -> Result<()> {
        if self.input_done {
            return Err(Error::Runtime("text after the end of the input".into()));
        }
        self.received = self.received.saturating_add(piece.chars().count());
        check_streamed_length(self.received, self.limit)?;
        // The seam of the text layer (Markdown now; pauses, a lexicon later): a piece counted
        // against the budget becomes what is segmented below (`Pending::Sentences`' reader).
        if piece.is_empty() {
            return Ok(());
        }
        match &mut self.pending {
            Pending::TextIn { waiting, cutter } => {
                let piece = match cutter {
                    None => piece,
                    Some(cutter) => match cutter.push(&piece) {
                        Some(span) => span,
                        None => return Ok(()),
                    },
                };
                match self.speaking.as_mut().filter(|s| s.text_open) {
                    Some(speaking) => {
                        speaking.pieces.push(piece.clone());
                        actions.push(Action::Feed(piece));
                        return Ok(());
                    }
                    None => waiting.push(piece),
                }
            }
            Pending::Sentences { cutter, settled } => {
                let Some(piece) = self.ssml.push(&piece) else { return Ok(()) };
                settled.extend(cutter.push(&piece));
            }
        }
        self.start_next(at, actions);
        Ok(())
    }

    fn end(&mut self, at: Instant, actions: &mut Vec<Action>) -> Result<()> {
        if self.input_done {
            return Err(Error::Runtime("the input ended twice".into()));
        }
        self.input_done = true;
        match &mut self.pending {
            Pending::TextIn { waiting, cutter } => {
                // The text the cutter still held: the last piece, if it has something to say.
                if let Some(rest) = cutter.as_mut().and_then(SentenceCutter::finish) {
                    match self.speaking.as_mut().filter(|s| s.text_open) {
                        Some(speaking) => {
                            speaking.pieces.push(rest.clone());
                            actions.push(Action::Feed(rest));
                        }
                        None => waiting.push(rest),
                    }
                }
                if let Some(speaking) = self.speaking.as_mut() {
                    if std::mem::take(&mut speaking.text_open) {
                        actions.push(Action::EndText);
                    }
                    return Ok(());
                }
            }
            Pending::Sentences { cutter, settled } => {
                let ssml = &mut self.ssml;
                let rest = match ssml {
                    SsmlHold::Whole(all) => std::mem::take(all),
                    _ => {
                        // A stream too short to tell (`<spe`) is text.
                        if let SsmlHold::Undecided(so_far) = std::mem::replace(ssml, SsmlHold::Text) {
                            cutter.read(&so_far);
                        }
                        cutter.rest()
                    }
                };
                match check_speakable(&rest) {
                    Ok(()) => settled.push_back(rest),
                    // Nothing at all to say in the whole session.
                    Err(e) if self.started == 0 && settled.is_empty() => return Err(e),
                    Err(_) => {}
                }
            }
        }
        self.start_next(at, actions);
        self.finish_when_done(actions);
        Ok(())
    }

    fn audio(&mut self, samples: Vec<f32>, at: Instant, actions: &mut Vec<Action>) -> Result<()> {
        let Some(speaking) = self.speaking.as_mut() else {
            return Err(Error::Runtime("audio while no segment speaks".into()));
        };
        if speaking.first_audio.is_none() {
            let after = at.saturating_duration_since(speaking.started);
            speaking.first_audio = Some(after);
            actions.push(Action::Report(Report::FirstAudio { segment: speaking.index, after }));
        }
        speaking.samples += samples.len();
        self.samples += samples.len();
        actions.push(Action::Report(Report::Audio { segment: speaking.index, samples }));
        Ok(())
    }

    fn done(&mut self, pieces_taken: Option<usize>, at: Instant, actions: &mut Vec<Action>) -> Result<()> {
        let Some(mut segment) = self.speaking.take() else {
            return Err(Error::Runtime("a segment ended while none was speaking".into()));
        };
        let taken = pieces_taken.unwrap_or(segment.pieces.len()).min(segment.pieces.len());
        let mut rest = segment.pieces.split_off(taken);
        let ended_early = segment.text_open || !rest.is_empty();
        if let Pending::TextIn { waiting, .. } = &mut self.pending {
            rest.append(waiting);
            *waiting = rest;
        }
        actions.push(Action::Report(Report::SegmentDone(SegmentEnd {
            index: segment.index,
            text: segment.pieces.concat(),
            ended_early,
            samples: segment.samples,
            started: segment.started,
            first_audio: segment.first_audio,
        })));
        self.start_next(at, actions);
        if ended_early {
            tracing::info!(
                "text-in streaming: the speech of segment {} ended before its text{}",
                segment.index,
                if self.speaking.is_some() { "; the rest is a new segment" } else { "" }
            );
        }
        self.finish_when_done(actions);
        Ok(())
    }

    /// Starts the next segment when none speaks and text for one is there. Text-in: all the
    /// waiting pieces, once they have something to say (at the end of the input, waiting text
    /// with nothing to say is dropped).
    fn start_next(&mut self, at: Instant, actions: &mut Vec<Action>) {
        if self.speaking.is_some() {
            return;
        }
        let pieces = match &mut self.pending {
            Pending::TextIn { waiting, .. } => {
                if waiting.is_empty() {
                    return;
                }
                if check_speakable(&waiting.concat()).is_err() {
                    if self.input_done {
                        waiting.clear();
                    }
                    return;
                }
                std::mem::take(waiting)
            }
            Pending::Sentences { settled, .. } => match settled.pop_front() {
                Some(sentence) => vec![sentence],
                None => return,
            },
        };
        self.open(pieces, at, actions);
    }

    fn open(&mut self, pieces: Vec<String>, at: Instant, actions: &mut Vec<Action>) {
        let text_open = matches!(self.pending, Pending::TextIn { .. }) && !self.input_done;
        let index = self.started;
        self.started += 1;
        self.speaking = Some(Speaking { index, pieces: pieces.clone(), text_open, started: at, first_audio: None, samples: 0 });
        actions.push(Action::Start(SegmentStart { index, pieces, text_complete: !text_open }));
    }

    /// The session is finished once the input is done, nothing speaks and nothing waits.
    fn finish_when_done(&mut self, actions: &mut Vec<Action>) {
        let nothing_waits = match &self.pending {
            Pending::TextIn { waiting, .. } => waiting.is_empty(),
            Pending::Sentences { settled, .. } => settled.is_empty(),
        };
        if self.input_done && self.speaking.is_none() && nothing_waits {
            self.over = true;
            actions.push(Action::Report(Report::Finished(Totals { segments: self.started, samples: self.samples })));
        }
    }
}
