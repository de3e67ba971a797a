//! Streamed text cut into settled sentences as it arrives: the one cut of every sentence
//! segmenting of streamed text (`app::text_stream`'s "sentences" and "text-in sentences", the
//! engine's `TextFeed` for a library caller that asks for normalised text-in streaming, and
//! `Engine::normalize_sentences`).

use crate::config::MarkdownSettings;
use crate::frontend::markdown::MarkdownStream;
use crate::frontend::text::{has_something_to_say, SentenceBuffer};

/// Text cut into settled spans as it arrives, read as Markdown first when it is (a construct split
/// across pieces reads as whole).
#[derive(Debug, Default)]
pub struct SentenceCutter {
    markdown: Option<Box<MarkdownStream>>,
    buffer: SentenceBuffer,
}

impl SentenceCutter {
    /// A cutter that reads the text as Markdown first with `markdown` (`None`: as written).
    pub fn new(markdown: Option<MarkdownSettings>) -> SentenceCutter {
        SentenceCutter { markdown: markdown.map(|m| Box::new(MarkdownStream::new(m))), buffer: SentenceBuffer::default() }
    }

    /// Whether it reads Markdown.
    pub fn reads_markdown(&self) -> bool {
        self.markdown.is_some()
    }

    /// `text` arrived: read, not cut yet.
    pub fn read(&mut self, text: &str) {
        match self.markdown.as_mut() {
            Some(stream) => self.buffer.push(&stream.push(text)),
            None => self.buffer.push(text),
        }
    }

    /// `text` arrived: the span it settled, if any. Text with nothing to say (only punctuation)
    /// is not a span: it joins the next.
    pub fn push(&mut self, text: &str) -> Option<String> {
        self.read(text);
        let span = self.buffer.take_settled()?;
        if has_something_to_say(&span) {
            return Some(span);
        }
        self.buffer.give_back(span);
        None
    }

    /// The input is done: the rest as the last span, unless it has nothing to say (only blanks
    /// or punctuation then go unsaid, as within the text they would join the next span).
    pub fn finish(&mut self) -> Option<String> {
        Some(self.rest()).filter(|rest| has_something_to_say(rest))
    }

    /// The input is done: all the rest, read (it may have nothing to say).
    pub fn rest(&mut self) -> String {
        if let Some(stream) = self.markdown.as_mut() {
            self.buffer.push(&stream.finish());
        }
        self.buffer.take_rest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_spans_come_out_as_they_settle_and_punctuation_joins_the_next() {
        let mut cut = SentenceCutter::new(None);
        assert_eq!(cut.push("I have 3 "), None);
        let first = cut.push("apples. And").expect("the first sentence settled");
        assert_eq!(first, "I have 3 apples.");
        assert_eq!(cut.push(" 12 more"), None);
        assert_eq!(cut.rest(), " And 12 more");
        // A span of only punctuation is not a span of its own: it opens the next one.
        let mut cut = SentenceCutter::new(None);
        let got: Vec<String> = ["… ", "! ", "Hello there. ", "Bye"].iter().filter_map(|p| cut.push(p)).collect();
        assert!(got.iter().all(|s| has_something_to_say(s)), "{got:?}");
        assert_eq!(got.concat() + &cut.rest(), "… ! Hello there. Bye", "no text lost or changed");
    }

    #[test]
    fn the_end_hands_over_the_rest_only_when_it_has_something_to_say() {
        let mut cut = SentenceCutter::new(None);
        assert_eq!(cut.push("Hello there. "), Some("Hello there.".to_string()));
        assert_eq!(cut.push("Bye"), None);
        assert_eq!(cut.finish().as_deref(), Some(" Bye"), "the last sentence needs no end mark");
        let mut cut = SentenceCutter::new(None);
        cut.read(" ?! \u{200b}");
        assert_eq!(cut.finish(), None, "only punctuation and blanks: nothing to say");
    }

    #[test]
    fn markdown_split_across_pieces_reads_as_whole() {
        let mut cut = SentenceCutter::new(Some(MarkdownSettings::default()));
        assert!(cut.reads_markdown());
        let mut out: Vec<String> = ["Some **bo", "ld** words. ", "Then [a li", "nk](http://x.y) here."].iter().filter_map(|p| cut.push(p)).collect();
        out.push(cut.rest());
        let all = out.concat();
        assert!(!all.contains('*') && !all.contains("]("), "marks dropped: {all:?}");
        assert!(all.contains("bold words") && all.contains("a link"), "{all:?}");
    }
}
