//! Tags and chapter marks in a file's header, the ways players read them:
//! * FLAC and Ogg Opus: Vorbis comments (`TITLE`, `ARTIST`, `ALBUM`, `TRACKNUMBER`) and the
//!   chapter convention `CHAPTER001=HH:MM:SS.mmm` / `CHAPTER001NAME=title` (the one ffmpeg,
//!   foobar2000 and most audiobook players read; numbers from 001, in order);
//! * mp3: an ID3v2.4 tag (`TIT2`, `TPE1`, `TALB`, `TRCK`) with a `CHAP` frame per chapter (start
//!   and end in milliseconds, its title as a `TIT2` sub-frame) and one top-level, ordered `CTOC`
//!   listing them (the ID3v2 Chapter Frame Addendum, what podcast players read).
//!
//! Written here by hand: the frames are a few bytes each, and no crate is needed for them.
//! Times are the sample counts rounded to the nearest millisecond (neither convention has
//! finer units).

use super::EncodeError;

/// A chapter: its title and the sample it starts at (in the whole audio).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapterMark {
    pub title: String,
    pub start_sample: u64,
}

impl ChapterMark {
    pub fn new(title: impl Into<String>, start_sample: u64) -> ChapterMark {
        ChapterMark { title: title.into(), start_sample }
    }
}

/// What a file says about itself (each tag left out when `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags {
    pub title: Option<String>,
    pub author: Option<String>,
    /// The book a chapter's own file belongs to (`--split chapters`).
    pub album: Option<String>,
    /// Its number and how many there are (`--split chapters`).
    pub track: Option<(u32, u32)>,
}

/// Chapters a Vorbis-comment file can name: the convention numbers them with three digits.
pub const MAX_VORBIS_CHAPTERS: usize = 999;
/// Chapters in the mp3's table of contents: `CTOC` counts its entries in one byte.
pub const MAX_ID3_CHAPTERS: usize = 255;

/// The body of a Vorbis comment block (FLAC's VORBIS_COMMENT; OpusTags after its magic): the
/// vendor, then each `KEY=value`, lengths little-endian.
pub fn vorbis_comment_body(vendor: &str, comments: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + vendor.len() + comments.iter().map(|c| c.len() + 4).sum::<usize>());
    out.extend((vendor.len() as u32).to_le_bytes());
    out.extend(vendor.as_bytes());
    out.extend((comments.len() as u32).to_le_bytes());
    for c in comments {
        out.extend((c.len() as u32).to_le_bytes());
        out.extend(c.as_bytes());
    }
    out
}

/// Milliseconds at sample `n`, to the nearest.
pub fn millis(n: u64, rate: u32) -> u64 {
    (n * 1000 + u64::from(rate) / 2) / u64::from(rate)
}

/// `HH:MM:SS.mmm` of a millisecond count (hours grow past 99 if they must).
pub fn clock(ms: u64) -> String {
    format!("{:02}:{:02}:{:02}.{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

/// A value on one line: a comment's value ends at its length, but a reader that shows it on one
/// line (and the M3U8 playlist) must not break.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_string()
}

/// The Vorbis comments of a file: its tags, then its chapters.
/// (At most [`MAX_VORBIS_CHAPTERS`]: `file::check_marks` refuses more.)
pub fn vorbis_comments(tags: &Tags, marks: &[ChapterMark], rate: u32) -> Result<Vec<String>, EncodeError> {
    let mut out = Vec::new();
    let mut tag = |key: &str, value: &Option<String>| {
        if let Some(v) = value.as_deref().map(one_line).filter(|v| !v.is_empty()) {
            out.push(format!("{key}={v}"));
        }
    };
    tag("TITLE", &tags.title);
    tag("ARTIST", &tags.author);
    tag("ALBUM", &tags.album);
    tag("TRACKNUMBER", &tags.track.map(|(n, _)| n.to_string()));
    tag("TRACKTOTAL", &tags.track.map(|(_, of)| of.to_string()));
    for (i, m) in marks.iter().enumerate() {
        out.push(format!("CHAPTER{:03}={}", i + 1, clock(millis(m.start_sample, rate))));
        out.push(format!("CHAPTER{:03}NAME={}", i + 1, one_line(&m.title)));
    }
    Ok(out)
}

/// An ID3v2.4 size: 28 bits, 7 a byte ("syncsafe").
fn syncsafe(n: usize) -> Result<[u8; 4], EncodeError> {
    if n >= 1 << 28 {
        return Err(EncodeError::new("mp3: the ID3 tag is over 256 MiB"));
    }
    Ok([(n >> 21) as u8 & 0x7f, (n >> 14) as u8 & 0x7f, (n >> 7) as u8 & 0x7f, n as u8 & 0x7f])
}

fn frame(id: &[u8; 4], body: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(10 + body.len());
    out.extend(id);
    out.extend(syncsafe(body.len())?);
    out.extend([0, 0]); // flags
    out.extend(body);
    Ok(out)
}

/// A text frame in UTF-8 (encoding 3, ID3v2.4 only).
fn text_frame(id: &[u8; 4], text: &str) -> Result<Vec<u8>, EncodeError> {
    let mut body = vec![3u8];
    body.extend(one_line(text).as_bytes());
    frame(id, &body)
}

/// The ID3v2.4 tag of an mp3 (empty when there is nothing to say). `total` is the audio's length
/// in samples: the last chapter ends there. (At most [`MAX_ID3_CHAPTERS`] marks:
/// `file::check_marks` refuses more.)
pub fn id3v2(tags: &Tags, marks: &[ChapterMark], rate: u32, total: u64) -> Result<Vec<u8>, EncodeError> {
    let mut frames = Vec::new();
    for (id, value) in [(b"TIT2", &tags.title), (b"TPE1", &tags.author), (b"TALB", &tags.album)] {
        if let Some(v) = value.as_deref().filter(|v| !one_line(v).is_empty()) {
            frames.extend(text_frame(id, v)?);
        }
    }
    if let Some((n, of)) = tags.track {
        frames.extend(text_frame(b"TRCK", &format!("{n}/{of}"))?);
    }
    if !marks.is_empty() {
        let ids: Vec<String> = (1..=marks.len()).map(|i| format!("ch{i}")).collect();
        let mut toc = b"toc\0".to_vec();
        toc.push(0b11); // top-level, ordered
        toc.push(u8::try_from(marks.len()).map_err(|_| EncodeError::new(format!("mp3: {} chapters in one CTOC", marks.len())))?);
        for id in &ids {
            toc.extend(id.as_bytes());
            toc.push(0);
        }
        frames.extend(frame(b"CTOC", &toc)?);
        for (i, m) in marks.iter().enumerate() {
            let end = marks.get(i + 1).map_or(total, |next| next.start_sample);
            let mut chap = ids[i].as_bytes().to_vec();
            chap.push(0);
            let ms = |n: u64| u32::try_from(millis(n, rate)).unwrap_or(u32::MAX);
            chap.extend(ms(m.start_sample).to_be_bytes());
            chap.extend(ms(end).to_be_bytes());
            chap.extend(u32::MAX.to_be_bytes()); // byte offsets: not given
            chap.extend(u32::MAX.to_be_bytes());
            chap.extend(text_frame(b"TIT2", &m.title)?);
            frames.extend(frame(b"CHAP", &chap)?);
        }
    }
    if frames.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = b"ID3".to_vec();
    out.extend([4, 0, 0]); // version 2.4.0, no flags
    out.extend(syncsafe(frames.len())?);
    out.extend(frames);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_and_rounding() {
        assert_eq!(clock(0), "00:00:00.000");
        assert_eq!(clock(3_723_004), "01:02:03.004");
        // 12 samples at 24 kHz are 0.5 ms: to the nearest, up.
        assert_eq!(millis(12, 24_000), 1);
        assert_eq!(millis(11, 24_000), 0);
        assert_eq!(millis(24_000 * 61, 24_000), 61_000);
    }

    #[test]
    fn vorbis_comments_name_tags_and_chapters() {
        let tags = Tags { title: Some("A Book".into()), author: Some("Someone\nElse".into()), ..Tags::default() };
        let marks = [ChapterMark::new("One", 0), ChapterMark::new("Two", 36_000)];
        let c = vorbis_comments(&tags, &marks, 24_000).unwrap();
        assert_eq!(
            c,
            ["TITLE=A Book", "ARTIST=Someone Else", "CHAPTER001=00:00:00.000", "CHAPTER001NAME=One", "CHAPTER002=00:00:01.500", "CHAPTER002NAME=Two"]
        );
    }

    #[test]
    fn no_tags_no_id3() {
        assert!(id3v2(&Tags::default(), &[], 24_000, 100).unwrap().is_empty());
        let tag = id3v2(&Tags { title: Some("t".into()), ..Tags::default() }, &[], 24_000, 100).unwrap();
        assert_eq!(&tag[..5], b"ID3\x04\x00");
        assert_eq!(tag.len(), 10 + 10 + 2);
    }
}
