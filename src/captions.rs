//! Captions: when each sentence is said, from sample counts (SRT, WebVTT and a JSON form).
//!
//! A caption's times come from the audio itself, not from a clock: a sentence starts where the
//! samples before it end (every earlier sentence, chapter gap and pause counted) and ends after
//! its own samples. SRT and WebVTT can only say milliseconds, so a time is the sample position
//! rounded to the nearest millisecond (at 24 kHz a millisecond is 24 samples); the JSON form
//! keeps the exact sample positions beside the seconds. Word-level timing is not given: cosy has
//! no measured word alignment (docs/long-form.md, "Captions", says what it would take).

use serde::Serialize;

/// One sentence's caption: its text and where its samples lie in the whole audio.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cue {
    /// The first sample of the sentence's audio (0 = the first sample of the file).
    pub start_sample: u64,
    /// One past the sentence's last sample.
    pub end_sample: u64,
    /// What is said, one line (line breaks become blanks).
    pub text: String,
}

/// A chapter's start, for the JSON form and WebVTT's chapter notes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChapterStart {
    pub title: String,
    pub start_sample: u64,
}

/// The caption formats cosy writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptionFormat {
    Srt,
    Vtt,
    Json,
}

impl CaptionFormat {
    /// The names [`Self::parse`] takes, for messages.
    pub const ALLOWED: &'static str = "\"srt\", \"vtt\" or \"json\"";

    /// A format by its name (`srt`, `vtt`, `json`; any case, blanks around ignored).
    pub fn parse(name: &str) -> Option<CaptionFormat> {
        match name.trim().to_ascii_lowercase().as_str() {
            "srt" => Some(CaptionFormat::Srt),
            "vtt" | "webvtt" => Some(CaptionFormat::Vtt),
            "json" => Some(CaptionFormat::Json),
            _ => None,
        }
    }

    /// The format a caption file's extension names (`.srt`, `.vtt`, `.webvtt`, `.json`), if any.
    pub fn from_path(path: &std::path::Path) -> Option<CaptionFormat> {
        CaptionFormat::parse(path.extension()?.to_str()?)
    }
}

/// Builds cues as audio is laid end to end: `push_sentence` for a sentence's samples,
/// `push_silence` for samples that carry no caption (a pause, a chapter gap).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    position: u64,
    cues: Vec<Cue>,
    chapters: Vec<ChapterStart>,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// The cues of one request's sentences, as its summary gives them (each sentence's text and
    /// where its samples lie), in audio of `total` samples.
    pub fn from_spans(spans: &[crate::request::SentenceSpan], total: u64) -> Timeline {
        let mut timeline = Timeline::new();
        for span in spans {
            timeline.push_silence((span.start as u64).saturating_sub(timeline.position));
            timeline.push_sentence(&span.text, span.samples as u64);
        }
        timeline.push_silence(total.saturating_sub(timeline.position));
        timeline
    }

    /// A sentence of `samples` samples saying `text` follows. An empty text (a pause item) is
    /// silence, not a caption.
    pub fn push_sentence(&mut self, text: &str, samples: u64) {
        let text = one_line(text);
        if text.is_empty() || samples == 0 {
            self.position += samples;
            return;
        }
        self.cues.push(Cue { start_sample: self.position, end_sample: self.position + samples, text });
        self.position += samples;
    }

    /// `samples` samples with nothing said.
    pub fn push_silence(&mut self, samples: u64) {
        self.position += samples;
    }

    /// A chapter starts here.
    pub fn start_chapter(&mut self, title: &str) {
        self.chapters.push(ChapterStart { title: one_line(title), start_sample: self.position });
    }

    /// Samples laid so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn cues(&self) -> &[Cue] {
        &self.cues
    }

    pub fn chapters(&self) -> &[ChapterStart] {
        &self.chapters
    }

    /// The captions in `format` for audio at `sample_rate`.
    pub fn render(&self, format: CaptionFormat, sample_rate: u32) -> String {
        match format {
            CaptionFormat::Srt => self.srt(sample_rate),
            CaptionFormat::Vtt => self.vtt(sample_rate),
            CaptionFormat::Json => self.json(sample_rate),
        }
    }

    /// SubRip: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each.
    pub fn srt(&self, sample_rate: u32) -> String {
        let mut out = String::new();
        for (i, cue) in self.cues.iter().enumerate() {
            let (start, end) = cue_millis(cue, sample_rate);
            out.push_str(&format!("{}\n{} --> {}\n{}\n\n", i + 1, clock(start, ','), clock(end, ','), cue.text));
        }
        out
    }

    /// WebVTT: the `WEBVTT` header, a NOTE at each chapter start, cues `HH:MM:SS.mmm --> …`.
    pub fn vtt(&self, sample_rate: u32) -> String {
        let mut out = String::from("WEBVTT\n\n");
        let mut chapters = self.chapters.iter().peekable();
        for (i, cue) in self.cues.iter().enumerate() {
            while let Some(chapter) = chapters.next_if(|c| c.start_sample <= cue.start_sample) {
                // A NOTE may not hold "-->" (WebVTT): a title with it is written without.
                out.push_str(&format!("NOTE chapter: {}\n\n", chapter.title.replace("-->", "->")));
            }
            let (start, end) = cue_millis(cue, sample_rate);
            out.push_str(&format!("{}\n{} --> {}\n{}\n\n", i + 1, clock(start, '.'), clock(end, '.'), vtt_text(&cue.text)));
        }
        out
    }

    /// JSON: exact sample positions and seconds, the chapters, the sample rate.
    pub fn json(&self, sample_rate: u32) -> String {
        let seconds = |s: u64| s as f64 / f64::from(sample_rate);
        let cues: Vec<serde_json::Value> = self
            .cues
            .iter()
            .map(|c| {
                serde_json::json!({
                    "start": seconds(c.start_sample), "end": seconds(c.end_sample),
                    "start_sample": c.start_sample, "end_sample": c.end_sample, "text": c.text,
                })
            })
            .collect();
        let chapters: Vec<serde_json::Value> = self
            .chapters
            .iter()
            .map(|c| serde_json::json!({ "title": c.title, "start": seconds(c.start_sample), "start_sample": c.start_sample }))
            .collect();
        let doc = serde_json::json!({
            "sample_rate": sample_rate, "samples": self.position, "chapters": chapters, "sentences": cues,
        });
        let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// A cue's start and end in whole milliseconds, nearest; an end never before its start.
fn cue_millis(cue: &Cue, sample_rate: u32) -> (u64, u64) {
    let ms = |s: u64| (s * 1000 + u64::from(sample_rate) / 2) / u64::from(sample_rate.max(1));
    let start = ms(cue.start_sample);
    (start, ms(cue.end_sample).max(start))
}

/// `HH:MM:SS<sep>mmm` (hours grow past 99 for very long books; both formats allow it).
fn clock(ms: u64, sep: char) -> String {
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    format!("{:02}:{:02}:{:02}{sep}{:03}", h, rest / 60_000, (rest % 60_000) / 1000, rest % 1000)
}

/// One line of caption text: line breaks and runs of blanks become one blank.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// WebVTT cue text: `&`, `<` and `>` are escaped (they start entities and tags there).
fn vtt_text(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline() -> Timeline {
        let mut t = Timeline::new();
        t.start_chapter("One");
        t.push_sentence("Hello there.", 24_000);
        t.push_silence(12_000);
        t.push_sentence("A <b> & \n second  line.", 36_013);
        t.start_chapter("Two --> three");
        t.push_sentence("", 500);
        t.push_sentence("Last.", 11);
        t
    }

    #[test]
    fn cues_lie_where_the_samples_do() {
        let t = timeline();
        let cues = t.cues();
        assert_eq!(cues.len(), 3);
        assert_eq!((cues[0].start_sample, cues[0].end_sample), (0, 24_000));
        assert_eq!((cues[1].start_sample, cues[1].end_sample), (36_000, 72_013));
        assert_eq!(cues[1].text, "A <b> & second line.");
        assert_eq!((cues[2].start_sample, cues[2].end_sample), (72_513, 72_524));
        assert_eq!(t.chapters()[1].start_sample, 72_013);
        assert_eq!(t.position(), 72_524);
    }

    #[test]
    fn srt_and_vtt_round_to_the_nearest_millisecond() {
        let t = timeline();
        let srt = t.srt(24_000);
        assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:01,000\nHello there.\n\n2\n00:00:01,500 --> 00:00:03,001\n"), "{srt}");
        // 72_513 samples = 3021.375 ms → 3021; 72_524 = 3021.83 → 3022.
        assert!(srt.ends_with("3\n00:00:03,021 --> 00:00:03,022\nLast.\n\n"), "{srt}");
        let vtt = t.vtt(24_000);
        assert!(vtt.starts_with("WEBVTT\n\nNOTE chapter: One\n\n1\n00:00:00.000 --> 00:00:01.000\n"), "{vtt}");
        assert!(vtt.contains("A &lt;b&gt; &amp; second line."), "{vtt}");
        assert!(vtt.contains("NOTE chapter: Two -> three\n\n3\n"), "{vtt}");
    }

    #[test]
    fn json_keeps_exact_samples() {
        let v: serde_json::Value = serde_json::from_str(&timeline().json(24_000)).unwrap();
        assert_eq!(v["sentences"][1]["start_sample"], 36_000);
        assert_eq!(v["sentences"][1]["end_sample"], 72_013);
        assert_eq!(v["chapters"][1]["title"], "Two --> three");
        assert_eq!(v["samples"], 72_524);
    }

    #[test]
    fn hours_are_counted_past_a_day() {
        assert_eq!(clock(100 * 3_600_000 + 61_001, ','), "100:01:01,001");
    }
}
