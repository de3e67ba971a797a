//! Pause tags (docs/text.md): `[pause:0.5s]`, `[pause:500ms]` in a text give exact silence there.
//!
//! Grammar: `[pause:` (any case), a decimal number (`2`, `0.5`, `.5`), the unit `s` or `ms`,
//! `]`, no blanks inside. CosyVoice3's own bracketed tags (`[breath]`, `[AA1]`, `[ni3]`) never
//! hold a `:`, so a pause tag cannot be one of them. Text starting `[pause:` that is not a
//! whole tag is an error naming its place, not text to say.

use crate::error::{Error, Result};

/// The longest pause one tag may ask for, in seconds.
pub const MAX_PAUSE_S: f64 = 10.0;

/// A text cut at its pause tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text between tags, as written.
    Text(&'a str),
    /// Exact silence: this many samples.
    Pause { samples: usize },
}

const OPEN: &str = "[pause:";
/// How far a tag's `]` may be from its `[`: a longer "tag" is a mistake, not a pause.
const LONGEST_TAG: usize = 32;

/// `text` cut at its pause tags, each tag as `round(seconds × sample_rate)` samples. A text
/// without tags is one piece.
pub fn split(text: &str, sample_rate: u32) -> Result<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let mut rest_start = 0;
    let mut search = 0;
    while let Some(found) = find_open(&text[search..]) {
        let at = search + found;
        let position = text[..at].chars().count() + 1;
        let tail = &text[at..];
        let close = tail.char_indices().take(LONGEST_TAG).find(|(_, c)| *c == ']' || c.is_whitespace());
        let tag = match close {
            Some((end, ']')) => &tail[..=end],
            _ => {
                let shown: String = tail.chars().take(LONGEST_TAG).take_while(|c| !c.is_whitespace()).collect();
                return Err(bad_tag(position, &shown));
            }
        };
        let samples = pause_samples(&tag[OPEN.len()..tag.len() - 1], sample_rate)
            .map_err(|why| match why {
                Why::Malformed => bad_tag(position, tag),
                Why::TooLong => Error::invalid(format!(
                    "pause tag {tag} at character {position} is longer than the longest pause, {MAX_PAUSE_S} s"
                )),
            })?;
        if at > rest_start {
            pieces.push(Piece::Text(&text[rest_start..at]));
        }
        pieces.push(Piece::Pause { samples });
        rest_start = at + tag.len();
        search = rest_start;
    }
    if rest_start < text.len() || pieces.is_empty() {
        pieces.push(Piece::Text(&text[rest_start..]));
    }
    Ok(pieces)
}

/// Whether `length` (`0.5s`, `500ms`) is a pause a tag may ask for (SSML's `<break time>`).
pub fn is_pause_length(length: &str) -> bool {
    pause_samples(length, 1).is_ok()
}

/// Byte offset of the next `[pause:` in any case.
fn find_open(text: &str) -> Option<usize> {
    text.char_indices()
        .filter(|(_, c)| *c == '[')
        .map(|(i, _)| i)
        .find(|&i| text.get(i..i + OPEN.len()).is_some_and(|s| s.eq_ignore_ascii_case(OPEN)))
}

fn bad_tag(position: usize, tag: &str) -> Error {
    Error::invalid(format!(
        "pause tag {tag:?} at character {position} is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]"
    ))
}

enum Why {
    Malformed,
    TooLong,
}

/// Samples of a tag's length (`0.5s`, `500ms`).
fn pause_samples(length: &str, sample_rate: u32) -> std::result::Result<usize, Why> {
    let lower = length.to_ascii_lowercase();
    let (number, scale) = match lower.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (lower.strip_suffix('s').ok_or(Why::Malformed)?, 1.0),
    };
    let well_formed = !number.is_empty()
        && number.chars().all(|c| c.is_ascii_digit() || c == '.')
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    if !well_formed {
        return Err(Why::Malformed);
    }
    let seconds = number.parse::<f64>().map_err(|_| Why::Malformed)? * scale;
    if seconds > MAX_PAUSE_S {
        return Err(Why::TooLong);
    }
    Ok((seconds * f64::from(sample_rate)).round() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_become_exact_sample_counts() {
        assert_eq!(
            split("Hello. [pause:0.5s] World [PAUSE:250ms][pause:2s]", 24_000).unwrap(),
            vec![
                Piece::Text("Hello. "),
                Piece::Pause { samples: 12_000 },
                Piece::Text(" World "),
                Piece::Pause { samples: 6_000 },
                Piece::Pause { samples: 48_000 },
            ]
        );
        assert_eq!(split("[pause:.1s]x", 24_000).unwrap(), vec![Piece::Pause { samples: 2_400 }, Piece::Text("x")]);
        assert_eq!(split("[pause:10s]", 22_050).unwrap(), vec![Piece::Pause { samples: 220_500 }]);
    }

    #[test]
    fn text_without_tags_is_one_piece_and_markup_is_text() {
        assert_eq!(split("[breath] a [AA1] [ni3] [pause] b", 24_000).unwrap(), vec![Piece::Text("[breath] a [AA1] [ni3] [pause] b")]);
        assert_eq!(split("", 24_000).unwrap(), vec![Piece::Text("")]);
    }

    /// Streamed sentences are read as Markdown before their tags are cut: the reading keeps a tag whole.
    #[test]
    fn markdown_keeps_tags() {
        let read = crate::frontend::markdown::to_speech("**Wait** [pause:0.5s] now [PAUSE:250ms].", crate::config::MarkdownSettings::ON);
        assert_eq!(read, "Wait [pause:0.5s] now [PAUSE:250ms].");
    }

    #[test]
    fn bad_tags_name_their_place() {
        let err = |t: &str| split(t, 24_000).expect_err("refused").to_string();
        assert_eq!(err("ab [pause:1x] c"), "pause tag \"[pause:1x]\" at character 4 is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]");
        assert_eq!(err("好 [pause:] c"), "pause tag \"[pause:]\" at character 3 is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]");
        assert_eq!(err("[pause:1 s]"), "pause tag \"[pause:1\" at character 1 is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]");
        assert_eq!(err("x [pause:1.2.3s]"), "pause tag \"[pause:1.2.3s]\" at character 3 is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]");
        assert_eq!(err("x [pause:-1s]"), "pause tag \"[pause:-1s]\" at character 3 is not a pause: write the seconds or milliseconds, as [pause:0.5s] or [pause:500ms]");
        assert_eq!(err("x [pause:11s]"), "pause tag [pause:11s] at character 3 is longer than the longest pause, 10 s");
        assert_eq!(err("x [pause:10001ms]"), "pause tag [pause:10001ms] at character 3 is longer than the longest pause, 10 s");
    }
}
