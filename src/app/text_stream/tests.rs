//! The session on its own: events in, actions out, no engine, no clock (times are given).

use std::time::{Duration, Instant};

use super::session::{Action, Input, Report, SegmentEnd, SegmentStart, Segmenting, Session, Totals};
use crate::error::{Error, InputCode};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn start(index: usize, pieces: &[&str], text_complete: bool) -> SegmentStart {
    SegmentStart { index, pieces: pieces.iter().map(|p| p.to_string()).collect(), text_complete }
}

/// A short way to read actions in assertions.
#[derive(Debug, PartialEq)]
enum Seen {
    Start(SegmentStart),
    Feed(String),
    EndText,
    FirstAudio(usize, Duration),
    Audio(usize, usize),
    Done { index: usize, text: String, ended_early: bool, samples: usize, first_audio: Option<Duration> },
    Finished(Totals),
}

fn seen(actions: Vec<Action>) -> Vec<Seen> {
    actions
        .into_iter()
        .map(|a| match a {
            Action::Start(s) => Seen::Start(s),
            Action::Feed(p) => Seen::Feed(p),
            Action::EndText => Seen::EndText,
            Action::Report(Report::FirstAudio { segment, after }) => Seen::FirstAudio(segment, after),
            Action::Report(Report::Audio { segment, samples }) => Seen::Audio(segment, samples.len()),
            Action::Report(Report::SegmentDone(SegmentEnd { index, text, ended_early, samples, first_audio, .. })) => {
                Seen::Done { index, text, ended_early, samples, first_audio }
            }
            Action::Report(Report::Finished(t)) => Seen::Finished(t),
        })
        .collect()
}

struct Run {
    session: Session,
    t0: Instant,
}

impl Run {
    fn new(segmenting: Segmenting, limit: usize) -> (Run, Vec<Seen>) {
        let t0 = Instant::now();
        let mut session = Session::new(segmenting, limit);
        let first = seen(session.start(t0));
        (Run { session, t0 }, first)
    }

    /// `input` at `at_ms` after the start.
    fn at(&mut self, at_ms: u64, input: Input) -> Vec<Seen> {
        seen(self.session.handle(input, self.t0 + ms(at_ms)).expect("accepted"))
    }

    fn text(&mut self, at_ms: u64, piece: &str) -> Vec<Seen> {
        self.at(at_ms, Input::Text(piece.to_string()))
    }

    fn audio(&mut self, at_ms: u64, samples: usize) -> Vec<Seen> {
        self.at(at_ms, Input::Audio(vec![0.0; samples]))
    }
}

#[test]
fn text_in_feeds_one_segment_and_finishes() {
    let (mut run, first) = Run::new(Segmenting::TextIn, 100);
    assert_eq!(first, [Seen::Start(start(0, &[], false))], "the first segment starts before any text");
    assert_eq!(run.text(5, "Hello "), [Seen::Feed("Hello ".into())]);
    assert_eq!(run.text(6, ""), [], "an empty piece is no piece");
    assert_eq!(run.text(7, "world."), [Seen::Feed("world.".into())]);
    assert_eq!(run.audio(40, 100), [Seen::FirstAudio(0, ms(40)), Seen::Audio(0, 100)]);
    assert_eq!(run.audio(50, 50), [Seen::Audio(0, 50)], "the first audio is reported once");
    assert_eq!(run.session.speaking(), Some(0));
    assert_eq!(run.at(60, Input::End), [Seen::EndText]);
    assert!(run.session.input_done());
    assert_eq!(
        run.at(90, Input::Done { pieces_taken: Some(2) }),
        [
            Seen::Done { index: 0, text: "Hello world.".into(), ended_early: false, samples: 150, first_audio: Some(ms(40)) },
            Seen::Finished(Totals { segments: 1, samples: 150 }),
        ]
    );
    let after = run.session.handle(Input::Text("more".into()), run.t0 + ms(100));
    assert!(matches!(after, Err(Error::Runtime(_))), "a finished session takes no more events: {after:?}");
}

#[test]
fn the_budget_counts_the_whole_session() {
    let (mut run, _) = Run::new(Segmenting::TextIn, 10);
    assert_eq!(run.text(1, "abcd "), [Seen::Feed("abcd ".into())]);
    // The segment ends early, before its second piece: that piece is spoken again in the next
    // segment, but the budget counts what the client sent, once.
    assert_eq!(run.text(2, "éfgh"), [Seen::Feed("éfgh".into())]);
    let next = run.at(3, Input::Done { pieces_taken: Some(1) });
    assert_eq!(next[1], Seen::Start(start(1, &["éfgh"], false)));
    assert_eq!(run.text(4, "i"), [Seen::Feed("i".into())], "10 characters in all: within the limit");
    let over = run.session.handle(Input::Text("j".into()), run.t0 + ms(5)).expect_err("11 characters");
    match &over {
        Error::Input { code, param, message } => {
            assert_eq!(*code, InputCode::TextTooLong);
            assert_eq!(*param, Some("text"));
            assert_eq!(
                message,
                "the streamed text is longer than limits.max_text_chars = 10 characters; send the rest in a new session or stream"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(run.session.handle(Input::End, run.t0 + ms(6)).is_err(), "the session ended with its error");
}

#[test]
fn an_early_end_starts_the_next_segment_with_what_it_did_not_take() {
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    for piece in ["One ", "two ", "three "] {
        run.text(1, piece);
    }
    run.audio(20, 10);
    // The speech ended after the first piece: the other two, and what follows, are segment 1.
    assert_eq!(
        run.at(30, Input::Done { pieces_taken: Some(1) }),
        [
            Seen::Done { index: 0, text: "One ".into(), ended_early: true, samples: 10, first_audio: Some(ms(20)) },
            Seen::Start(start(1, &["two ", "three "], false)),
        ]
    );
    assert_eq!(run.text(31, "four."), [Seen::Feed("four.".into())]);
    assert_eq!(run.audio(45, 5), [Seen::FirstAudio(1, ms(15)), Seen::Audio(1, 5)], "segment 1's first audio, after its own start");
    assert_eq!(run.at(50, Input::End), [Seen::EndText]);
    assert_eq!(
        run.at(60, Input::Done { pieces_taken: Some(3) }),
        [
            Seen::Done { index: 1, text: "two three four.".into(), ended_early: false, samples: 5, first_audio: Some(ms(15)) },
            Seen::Finished(Totals { segments: 2, samples: 15 }),
        ]
    );
}

#[test]
fn an_early_end_with_all_text_taken_waits_for_more() {
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    run.text(1, "Hello.");
    // Its text was all taken, but the input is open: it ended before its text.
    let ended = run.at(10, Input::Done { pieces_taken: Some(1) });
    assert_eq!(ended, [Seen::Done { index: 0, text: "Hello.".into(), ended_early: true, samples: 0, first_audio: None }]);
    assert_eq!(run.session.speaking(), None);
    assert_eq!(run.text(11, " ... "), [], "nothing to say yet: it waits");
    assert_eq!(run.text(12, "Again"), [Seen::Start(start(1, &[" ... ", "Again"], false))]);
    assert_eq!(run.at(13, Input::End), [Seen::EndText]);
    // Nothing speaks and nothing to say waits at the end: finished, the punctuation unsaid.
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    run.text(1, "Hi.");
    run.at(2, Input::Done { pieces_taken: Some(1) });
    assert_eq!(run.text(3, " !"), []);
    assert_eq!(run.at(4, Input::End), [Seen::Finished(Totals { segments: 1, samples: 0 })]);
}

#[test]
fn an_early_end_after_the_input_ends_starts_a_complete_segment() {
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    run.text(1, "a ");
    run.text(2, "b ");
    run.at(3, Input::End);
    let next = run.at(4, Input::Done { pieces_taken: Some(1) });
    assert_eq!(next[1], Seen::Start(start(1, &["b "], true)), "no text follows: its text is complete");
    assert_eq!(next.len(), 2);
    let last = run.at(5, Input::Done { pieces_taken: Some(1) });
    assert_eq!(last[1], Seen::Finished(Totals { segments: 2, samples: 0 }));
}

#[test]
fn sentences_are_segments_one_after_another() {
    let (mut run, first) = Run::new(Segmenting::Sentences, 1000);
    assert_eq!(first, [], "nothing starts before a sentence");
    assert_eq!(run.text(1, "Hello world, "), []);
    assert_eq!(run.text(2, "First sentence here. Second"), [Seen::Start(start(0, &["Hello world, First sentence here."], true))]);
    assert_eq!(run.text(3, " one. Third"), [], "settled while the first speaks: it waits its turn");
    run.audio(30, 8);
    assert_eq!(run.at(40, Input::End), []);
    assert_eq!(
        run.at(50, Input::Done { pieces_taken: None }),
        [
            Seen::Done { index: 0, text: "Hello world, First sentence here.".into(), ended_early: false, samples: 8, first_audio: Some(ms(28)) },
            Seen::Start(start(1, &[" Second one."], true)),
        ]
    );
    let second = run.at(60, Input::Done { pieces_taken: None });
    assert_eq!(second[1], Seen::Start(start(2, &[" Third"], true)), "the rest at the end of the input");
    let third = run.at(70, Input::Done { pieces_taken: None });
    assert_eq!(third[1], Seen::Finished(Totals { segments: 3, samples: 8 }));
}

#[test]
fn sentences_with_nothing_to_say_wait_or_are_refused() {
    // Punctuation alone joins the next sentence.
    let (mut run, _) = Run::new(Segmenting::Sentences, 1000);
    assert_eq!(run.text(1, "... "), []);
    assert_eq!(run.text(2, "Yes. "), [Seen::Start(start(0, &["... Yes."], true))]);
    // A session with nothing at all to say is an error, with the text rule's message.
    let (mut run, _) = Run::new(Segmenting::Sentences, 1000);
    run.text(1, "  ");
    let empty = run.session.handle(Input::End, run.t0 + ms(2)).expect_err("nothing to say");
    assert!(empty.to_string().contains("the text is empty"), "{empty}");
    // After something was said, an unspeakable rest is simply not spoken.
    let (mut run, _) = Run::new(Segmenting::Sentences, 1000);
    run.text(1, "Fine. ");
    run.text(2, "?!");
    assert_eq!(run.at(3, Input::End), []);
    let done = run.at(4, Input::Done { pieces_taken: None });
    assert_eq!(done[1], Seen::Finished(Totals { segments: 1, samples: 0 }));
}

#[test]
fn events_out_of_place_fail_and_cancel_ends_the_session() {
    let (mut run, _) = Run::new(Segmenting::Sentences, 1000);
    let stray = run.session.handle(Input::Audio(vec![0.0]), run.t0);
    assert!(matches!(stray, Err(Error::Runtime(_))), "audio with no segment speaking: {stray:?}");
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    let failed = run.session.handle(Input::Failed(Error::invalid("broken")), run.t0).expect_err("the segment's error");
    assert_eq!(failed.to_string(), Error::invalid("broken").to_string());
    let (mut run, _) = Run::new(Segmenting::TextIn, 1000);
    assert_eq!(run.at(1, Input::Cancel), []);
    assert_eq!(run.session.speaking(), None);
    assert!(run.session.handle(Input::Text("late".into()), run.t0 + ms(2)).is_err(), "cancelled: over");
}

/// Sentences read as Markdown over the whole session: the segments of a reply sent in pieces
/// (a `**` split across two, a code fence open over several) say what the whole reply says, and
/// each segment is its own sentence.
#[test]
fn sentences_read_markdown_across_pieces() {
    let reply = "## Steps\n\nRun **cargo\u{20}build** first. Then see https://docs.rs/ort.\n\n```sh\ncargo run\n```\n\n- one\n- two 🎉\n";
    let whole = crate::frontend::markdown::to_speech(reply, crate::config::MarkdownSettings::ON);
    for cuts in [vec![], vec![3, 20, 26, 60, 70, 75, 90], (1..reply.len()).filter(|i| reply.is_char_boundary(*i)).collect()] {
        let t0 = Instant::now();
        let mut session = Session::new(Segmenting::Sentences, 10_000).with_markdown(Some(crate::config::MarkdownSettings::ON));
        let mut said = Vec::new();
        let mut from = 0;
        let mut inputs: Vec<Input> = cuts.iter().chain([&reply.len()]).map(|&c| {
            let piece = reply[from..c].to_string();
            from = c;
            Input::Text(piece)
        }).collect();
        inputs.push(Input::End);
        let mut queue: std::collections::VecDeque<Input> = inputs.into();
        while let Some(input) = queue.pop_front() {
            for action in session.handle(input, t0).expect("accepted") {
                if let Action::Start(start) = action {
                    said.push(start.text());
                    queue.push_front(Input::Done { pieces_taken: None });
                }
            }
        }
        assert_eq!(said.concat().trim_end(), whole.trim_end(), "cut at {cuts:?}: {said:?}");
        if cuts.len() > 10 {
            assert!(said.len() >= 4, "the sentences, the code and the items are segments: {said:?}");
        }
    }
    assert_eq!(whole, "Steps.\n\nRun cargo build first. Then see docs dot rs slash ort.\n\nsh code block.\n\none.\ntwo");
}

/// The segments a sentence-segmented session of `format` (Markdown read) makes of `pieces`.
fn segments_of(format: crate::frontend::ssml::InputFormat, pieces: &[&str]) -> (Vec<String>, bool) {
    let t0 = Instant::now();
    let mut session =
        Session::new(Segmenting::Sentences, 10_000).with_markdown(Some(crate::config::MarkdownSettings::ON)).with_input_format(format);
    let mut said = Vec::new();
    let mut queue: std::collections::VecDeque<Input> = pieces.iter().map(|p| Input::Text(p.to_string())).chain([Input::End]).collect();
    let mut ssml = false;
    while let Some(input) = queue.pop_front() {
        for action in session.handle(input, t0).expect("accepted") {
            if let Action::Start(start) = action {
                said.push(start.text());
                ssml |= session.reads_ssml();
                queue.push_front(Input::Done { pieces_taken: None });
            }
        }
    }
    (said, ssml)
}

/// SSML in a stream (issue 32): a stream that starts with `<speak>` (or is said to be SSML) is
/// held until its end and is then one segment, its text whole (an element may span pieces and
/// sentences), not read as Markdown; a stream that does not is read sentence by sentence, as before.
#[test]
fn sentences_hold_ssml_until_the_end() {
    use crate::frontend::ssml::InputFormat;
    let pieces = [" <spe", "ak>One. <break time=\"1s\"/> Two", " <sub alias=\"x\">**y**", "</sub>.</speak>"];
    assert_eq!(segments_of(InputFormat::Auto, &pieces), (vec![pieces.concat()], true));
    let bare = ["One. <break/> Tw", "o."];
    assert_eq!(segments_of(InputFormat::Ssml, &bare), (vec![bare.concat()], true));
    // Text: sentence by sentence, Markdown read, whatever it starts with.
    let (said, ssml) = segments_of(InputFormat::Auto, &["**One**. Two", " three."]);
    assert!(!ssml, "{said:?}");
    assert_eq!(said.concat(), "One. Two three.");
    let (said, ssml) = segments_of(InputFormat::Text, &["<speak>One. Two.</speak>"]);
    assert!(!ssml, "{said:?}");
    // Too short to tell: text.
    assert_eq!(segments_of(InputFormat::Auto, &["<spe"]), (vec!["<spe".to_string()], false));
}

/// Text-in streaming's normalising option: the session cuts settled sentences and each goes in as
/// one piece. A segment whose speech ends early has taken whole sentences only; the sentences it
/// did not take and the text still unsettled are the next segment's, so nothing is lost and
/// nothing said twice (issue 32: the engine's own regrouping held taken text and dropped it).
#[test]
fn text_in_sentences_feed_settled_sentences_and_an_early_end_loses_none() {
    let (mut run, first) = Run::new(Segmenting::TextInSentences, 1000);
    assert_eq!(first, [Seen::Start(start(0, &[], false))], "the first segment starts before any text");
    assert_eq!(run.text(1, "One two"), [], "nothing settled yet");
    assert_eq!(run.text(2, ". Three"), [Seen::Feed("One two.".into())], "a sentence end settles once the next sentence begins");
    assert_eq!(run.text(3, " four. Fi"), [Seen::Feed(" Three four.".into())]);
    assert_eq!(run.text(4, "ve six. Se"), [Seen::Feed(" Five six.".into())]);
    // The speech ended after the first sentence: the others, and the unsettled "Se…", are
    // segment 1's.
    let next = run.at(5, Input::Done { pieces_taken: Some(1) });
    assert_eq!(
        next,
        [
            Seen::Done { index: 0, text: "One two.".into(), ended_early: true, samples: 0, first_audio: None },
            Seen::Start(start(1, &[" Three four.", " Five six."], false)),
        ]
    );
    assert_eq!(run.text(6, "ven"), []);
    assert_eq!(run.at(7, Input::End), [Seen::Feed(" Seven".into()), Seen::EndText], "the rest at the end, then the text is complete");
    let last = run.at(8, Input::Done { pieces_taken: Some(3) });
    assert_eq!(last[0], Seen::Done { index: 1, text: " Three four. Five six. Seven".into(), ended_early: false, samples: 0, first_audio: None });
    assert_eq!(last[1], Seen::Finished(Totals { segments: 2, samples: 0 }));

    // Markdown is read before the cut, across pieces (the engine then reads none).
    let t0 = Instant::now();
    let mut session = Session::new(Segmenting::TextInSentences, 1000).with_markdown(Some(crate::config::MarkdownSettings::ON));
    assert_eq!(seen(session.start(t0)), [Seen::Start(start(0, &[], false))]);
    let mut fed = Vec::new();
    for input in ["Run **cargo", " build** now.\n\nThen ", "stop.\n\nMore", " text"].map(|p| Input::Text(p.into())).into_iter().chain([Input::End]) {
        for action in session.handle(input, t0).expect("accepted") {
            if let Action::Feed(piece) = action {
                fed.push(piece);
            }
        }
    }
    assert_eq!(fed.concat(), crate::frontend::markdown::to_speech("Run **cargo build** now.\n\nThen stop.\n\nMore text", crate::config::MarkdownSettings::ON));
}
