//! `cosy file`'s outputs in every format ([`FileFormat`]: wav16, wavf32, pcm, mp3, Ogg Opus,
//! flac), written chunk by chunk so a book never sits in memory, with chapter marks and tags in
//! the header ([`write_with_chapters`]) or one file per chapter and a playlist ([`write_split`]).
//!
//! Every file goes through [`cosy::output::OutputFile`] (`-o`'s rules: a temporary file renamed
//! over the final name once complete, links followed, devices and FIFOs written through): no
//! half-written output is ever at the final path. mp3 and flac rewrite their first bytes at the
//! end (LAME's Info frame with the exact length; STREAMINFO with the length and MD5), in the
//! temporary file before the rename.
//!
//! Chapter marks (see `super::tags` for the exact frames): mp3 ID3v2 `CHAP`/`CTOC`, flac and Ogg
//! Opus `CHAPTERnnn` Vorbis comments; times in milliseconds, rounded to the nearest. wav and pcm
//! have no place players read chapters from: they get none (use `--split chapters`).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use cosy::audio::{OutputFormat, WavStreamWriter};
use cosy::output::{explain_write_error, OutputFile};
use cosy::{Error, Result};

use super::tags::{self, ChapterMark, Tags};
use super::{FlacStream, Mp3, OggOpus};

/// The format of a file `cosy file` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// wav16, wavf32 or raw s16le pcm: the library's writers (`cosy::audio`).
    Plain(OutputFormat),
    Mp3,
    /// Opus in Ogg (`.opus`, `.ogg`).
    Opus,
    Flac,
}

/// The names `--format` takes, as messages list them.
pub const FORMAT_NAMES: &str = "wav16, wavf32, wav (= wav16), pcm, mp3, opus, flac";

impl FileFormat {
    /// A `--format` name.
    pub fn parse(name: &str) -> Result<FileFormat> {
        match name.trim().to_ascii_lowercase().as_str() {
            "wav" => Ok(FileFormat::Plain(OutputFormat::Wav16)),
            "mp3" => Ok(FileFormat::Mp3),
            "opus" => Ok(FileFormat::Opus),
            "flac" => Ok(FileFormat::Flac),
            other => other
                .parse::<OutputFormat>()
                .map(FileFormat::Plain)
                .map_err(|_| Error::invalid(format!("unknown audio format {name:?}: use one of {FORMAT_NAMES}"))),
        }
    }

    /// The format a file name's extension says (`.wav` is wav16), if it says one.
    pub fn by_extension(path: &Path) -> Option<FileFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "wav" => Some(FileFormat::Plain(OutputFormat::Wav16)),
            "pcm" | "raw" => Some(FileFormat::Plain(OutputFormat::Pcm16)),
            "mp3" => Some(FileFormat::Mp3),
            "opus" | "ogg" => Some(FileFormat::Opus),
            "flac" => Some(FileFormat::Flac),
            _ => None,
        }
    }

    /// The format of `cosy file`'s output: `--format` (`flag`) when given, else the extension of
    /// `-o`, else wav16. An extension that says another format than `--format` is refused
    /// (`.wav` takes wav16 and wavf32; `.raw` is pcm).
    pub fn choose(flag: Option<&str>, output: Option<&Path>) -> Result<FileFormat> {
        let by_name = output.and_then(FileFormat::by_extension);
        let Some(flag) = flag else {
            return Ok(by_name.unwrap_or(FileFormat::Plain(OutputFormat::Wav16)));
        };
        let asked = FileFormat::parse(flag)?;
        match (by_name, output) {
            (Some(named), Some(path)) if named.extension() != asked.extension() => Err(Error::invalid(format!(
                "-o {} is {} by its extension, but --format {flag} asks for {}: drop --format, or name the file {}",
                path.display(),
                named.kind(),
                asked.kind(),
                path.with_extension(asked.extension()).display()
            ))),
            _ => Ok(asked),
        }
    }

    /// The file extension.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Plain(f) => f.extension(),
            FileFormat::Mp3 => "mp3",
            FileFormat::Opus => "opus",
            FileFormat::Flac => "flac",
        }
    }

    /// The format in words, for messages.
    fn kind(self) -> &'static str {
        match self {
            FileFormat::Plain(OutputFormat::Pcm16) => "raw pcm",
            FileFormat::Plain(_) => "a wav",
            FileFormat::Mp3 => "an mp3",
            FileFormat::Opus => "an Ogg Opus",
            FileFormat::Flac => "a flac",
        }
    }

    /// Whether players find chapter marks in this format (wav and pcm have none).
    pub fn has_chapter_marks(self) -> bool {
        !matches!(self, FileFormat::Plain(_))
    }
}

/// Writes `samples` whole as `path` in `format` (no marks, no tags). wav and pcm are the bytes
/// `cosy::audio::write_audio_atomic` writes; an mp3 is the server's whole response.
pub fn write_audio(path: &Path, samples: &[f32], rate: u32, format: FileFormat) -> Result<()> {
    match format {
        FileFormat::Plain(f) => cosy::audio::write_audio_atomic(path, samples, rate, f),
        _ => write_with_chapters(path, format, rate, &[], &Tags::default(), samples.len() as u64, [Ok::<_, Error>(samples)]),
    }
}

/// Writes one file with chapter marks and tags (see the module's documentation), from `chunks`
/// (the audio in order, any sizes: it is never held whole). `total_samples`, the length of the
/// audio, is known beforehand: marks go in the header, and the last chapter ends there; chunks
/// that add up to another length are an error (and nothing is written). Marks must be in order
/// and within the audio; wav and pcm ignore them and the tags.
pub fn write_with_chapters<C: AsRef<[f32]>>(
    dest: &Path,
    format: FileFormat,
    rate: u32,
    marks: &[ChapterMark],
    tags: &Tags,
    total_samples: u64,
    chunks: impl IntoIterator<Item = Result<C>>,
) -> Result<()> {
    check_marks(format, marks, total_samples)?;
    let mut file = ChapterFile::create(dest, format, rate, marks, tags, total_samples)?;
    for chunk in chunks {
        file.push(chunk?.as_ref())?;
    }
    file.finish()
}

/// Writes one file per chapter into `dir` (made if missing), `NN - Title.ext` (numbered from 01,
/// the title made safe for file systems), each tagged with its title, the book's title as the
/// album, the author and its track number; then the playlist `<stem>.m3u8` (titles and
/// durations), written last: it exists only once every chapter's file does. The arguments are
/// [`write_with_chapters`]'s (the audio is cut at the marks); audio before the first mark belongs
/// to the first chapter; no marks: one file titled by the book. Returns the chapter files' paths.
#[allow(clippy::too_many_arguments)]
pub fn write_split<C: AsRef<[f32]>>(
    dir: &Path,
    stem: &str,
    format: FileFormat,
    rate: u32,
    marks: &[ChapterMark],
    tags: &Tags,
    total_samples: u64,
    chunks: impl IntoIterator<Item = Result<C>>,
) -> Result<Vec<PathBuf>> {
    // Each file has no marks: only the order and the length matter.
    check_marks(FileFormat::Plain(OutputFormat::Pcm16), marks, total_samples)?;
    cosy::fsx::create_folder(dir, "the chapters' folder")?;
    let book_title = tags.title.clone().unwrap_or_else(|| stem.to_string());
    let whole = [ChapterMark::new(book_title.clone(), 0)];
    let marks = if marks.is_empty() { &whole[..] } else { marks };
    let count = marks.len();
    // Chapter i: [starts[i], starts[i + 1]); the first from 0, the last to the end.
    let mut starts: Vec<u64> = marks.iter().map(|m| m.start_sample).collect();
    starts[0] = 0;
    starts.push(total_samples);
    let width = count.to_string().len().max(2);
    let names: Vec<String> = marks
        .iter()
        .enumerate()
        .map(|(i, m)| format!("{:0width$} - {}.{}", i + 1, safe_name(&m.title, i + 1), format.extension()))
        .collect();
    let open = |i: usize| {
        let chapter_tags = Tags {
            title: Some(marks[i].title.clone()),
            author: tags.author.clone(),
            album: Some(book_title.clone()),
            track: Some((i as u32 + 1, count as u32)),
        };
        ChapterFile::create(&dir.join(&names[i]), format, rate, &[], &chapter_tags, starts[i + 1] - starts[i])
    };
    let mut index = 0;
    let mut current = open(0)?;
    let mut position = 0u64;
    for chunk in chunks {
        let chunk = chunk?;
        let mut rest = chunk.as_ref();
        while !rest.is_empty() {
            // Close every chapter that ends here (empty ones too).
            while index + 1 < count && position >= starts[index + 1] {
                current.finish()?;
                index += 1;
                current = open(index)?;
            }
            let room = if index + 1 < count { (starts[index + 1] - position) as usize } else { rest.len() };
            let (now, later) = rest.split_at(room.min(rest.len()));
            current.push(now)?;
            position += now.len() as u64;
            rest = later;
        }
    }
    while index + 1 < count {
        current.finish()?;
        index += 1;
        current = open(index)?;
    }
    current.finish()?;
    let mut playlist = String::from("#EXTM3U\n");
    if let Some(title) = &tags.title {
        playlist.push_str(&format!("#PLAYLIST:{}\n", title.replace(['\n', '\r'], " ")));
    }
    for (i, (m, name)) in marks.iter().zip(&names).enumerate() {
        let seconds = ((starts[i + 1] - starts[i]) as f64 / f64::from(rate)).round() as u64;
        playlist.push_str(&format!("#EXTINF:{seconds},{}\n{name}\n", m.title.replace(['\n', '\r'], " ")));
    }
    cosy::fsx::Dest::new(dir.join(format!("{stem}.m3u8")), "the playlist").write(playlist.as_bytes())?;
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// A chapter's title as a file name: no path separators, no characters Windows or FAT refuse, no
/// control characters, no leading or trailing dots or spaces, at most 120 bytes (the number and
/// extension fit in the 255-byte limit); `Chapter N` when nothing is left.
pub fn safe_name(title: &str, number: usize) -> String {
    let cleaned: String = title
        .chars()
        .map(|c| if c.is_control() || matches!(c, '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|') { ' ' } else { c })
        .collect();
    let mut name = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut cut = name.len().min(120);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    let name = name.trim_matches(|c: char| c == '.' || c.is_whitespace());
    if name.is_empty() {
        format!("Chapter {number}")
    } else {
        name.to_string()
    }
}

/// Marks in order, within the audio (the caller's promise; not the user's doing), and no more
/// than the format can list (the book's: refused as input, with what to do instead).
fn check_marks(format: FileFormat, marks: &[ChapterMark], total: u64) -> Result<()> {
    let most = match format {
        FileFormat::Mp3 => tags::MAX_ID3_CHAPTERS,
        FileFormat::Opus | FileFormat::Flac => tags::MAX_VORBIS_CHAPTERS,
        FileFormat::Plain(_) => usize::MAX,
    };
    if marks.len() > most {
        let why = if format == FileFormat::Mp3 { "an mp3's table of contents (ID3 CTOC) lists" } else { "the CHAPTERnnn comments of flac and Ogg Opus number" };
        return Err(Error::invalid(format!(
            "{} chapters: {why} at most {most}; write one file per chapter (--split chapters){}",
            marks.len(),
            if format == FileFormat::Mp3 { ", or flac or opus" } else { "" }
        )));
    }
    for pair in marks.windows(2) {
        if pair[1].start_sample < pair[0].start_sample {
            return Err(Error::Runtime(format!(
                "chapter marks out of order: {:?} at sample {} after {:?} at {}",
                pair[1].title, pair[1].start_sample, pair[0].title, pair[0].start_sample
            )));
        }
    }
    if let Some(m) = marks.last().filter(|m| m.start_sample > total) {
        return Err(Error::Runtime(format!("chapter {:?} starts at sample {}, after the audio's end ({total})", m.title, m.start_sample)));
    }
    Ok(())
}

/// One output file being written chunk by chunk.
struct ChapterFile {
    inner: Writer,
    path: PathBuf,
    expected: u64,
    written: u64,
}

enum Writer {
    Plain(WavStreamWriter),
    Encoded { out: OutputFile, file: BufWriter<File>, encoder: FileEncoder },
}

enum FileEncoder {
    /// Bytes of the ID3 tag before LAME's Info frame.
    Mp3 { lame: Box<Mp3>, info_at: u64 },
    Opus(Box<OggOpus>),
    Flac(Box<FlacStream>),
}

impl ChapterFile {
    fn create(path: &Path, format: FileFormat, rate: u32, marks: &[ChapterMark], tags: &Tags, expected: u64) -> Result<ChapterFile> {
        let inner = match format {
            FileFormat::Plain(f) => Writer::Plain(WavStreamWriter::create(path, rate, f)?),
            _ => {
                let (head, encoder) = match format {
                    FileFormat::Mp3 => {
                        let id3 = tags::id3v2(tags, marks, rate, expected)?;
                        (id3.clone(), FileEncoder::Mp3 { lame: Box::new(Mp3::new(rate, true)?), info_at: id3.len() as u64 })
                    }
                    FileFormat::Opus => {
                        let comments = tags::vorbis_comments(tags, marks, rate)?;
                        let serial = stream_serial(&comments, expected);
                        (Vec::new(), FileEncoder::Opus(Box::new(OggOpus::new(rate, Some(serial), comments)?)))
                    }
                    _ => (Vec::new(), FileEncoder::Flac(Box::new(FlacStream::new(rate, Some(tags::vorbis_comments(tags, marks, rate)?))?))),
                };
                let (out, handle) = OutputFile::create(path)?;
                let mut file = BufWriter::new(handle);
                file.write_all(&head).map_err(|e| explain_write_error(e, path))?;
                Writer::Encoded { out, file, encoder }
            }
        };
        Ok(ChapterFile { inner, path: path.to_path_buf(), expected, written: 0 })
    }

    fn push(&mut self, samples: &[f32]) -> Result<()> {
        self.written += samples.len() as u64;
        match &mut self.inner {
            Writer::Plain(w) => w.append(samples),
            Writer::Encoded { file, encoder, .. } => {
                let bytes = match encoder {
                    FileEncoder::Mp3 { lame, .. } => lame.push(samples)?,
                    FileEncoder::Opus(o) => o.push(samples)?,
                    FileEncoder::Flac(f) => f.push(samples)?,
                };
                file.write_all(&bytes).map_err(|e| explain_write_error(e, &self.path))
            }
        }
    }

    /// The end of the stream, the header rewritten where the format wants it, and the rename.
    fn finish(self) -> Result<()> {
        if self.written != self.expected {
            return Err(Error::Runtime(format!(
                "{}: the audio has {} samples, {} were announced for its header; nothing was written",
                self.path.display(),
                self.written,
                self.expected
            )));
        }
        let path = self.path;
        match self.inner {
            Writer::Plain(w) => w.finish(),
            Writer::Encoded { out, mut file, mut encoder } => {
                let io = |e| explain_write_error(e, &path);
                let (tail, rewrite) = match &mut encoder {
                    FileEncoder::Mp3 { lame, info_at } => {
                        let tail = lame.finish()?;
                        let mut tag = Vec::with_capacity(lame.lame.lame_tag_size());
                        lame.lame.lame_tag_encode_to_vec(&mut tag);
                        (tail, Some((*info_at, tag)))
                    }
                    FileEncoder::Opus(o) => (o.finish()?, None),
                    FileEncoder::Flac(f) => {
                        let tail = f.finish()?;
                        (tail, Some((0, f.final_header()?)))
                    }
                };
                file.write_all(&tail).map_err(io)?;
                if let Some((at, bytes)) = rewrite.filter(|(_, b)| !b.is_empty()) {
                    file.seek(SeekFrom::Start(at)).map_err(io)?;
                    file.write_all(&bytes).map_err(io)?;
                }
                file.flush().map_err(io)?;
                drop(file);
                out.commit()
            }
        }
    }
}

/// An Ogg stream number from what the file holds: the same audio and tags give the same bytes.
fn stream_serial(comments: &[String], samples: u64) -> u32 {
    // FNV-1a: any fixed mixing would do.
    let mut h: u32 = 0x811c_9dc5;
    for b in comments.iter().flat_map(|c| c.bytes()).chain(samples.to_le_bytes()) {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    //! Synthetic audio (no model) written in every format and read back by ffmpeg and ffprobe, as
    //! a user's player would (tests/serve/formats.rs decodes the server's the same way).
    use super::*;
    use std::process::Command;

    const RATE: u32 = 24_000;

    /// A tone with some noise: not silence, so a codec has work to do.
    fn audio(n: usize) -> Vec<f32> {
        let mut state = 7u64;
        (0..n)
            .map(|i| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let noise = ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
                ((i as f32) * 0.05).sin() * 0.4 + noise * 0.1
            })
            .collect()
    }

    mod ffmpeg {
        include!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/ffmpeg.rs"));
    }
    use ffmpeg::decode_file as decode;

    fn probe(path: &Path) -> serde_json::Value {
        let out = Command::new("ffprobe")
            .args(["-v", "error", "-show_chapters", "-show_format", "-show_streams", "-of", "json"])
            .arg(path)
            .output()
            .expect("ffprobe runs");
        assert!(out.status.success(), "ffprobe {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("ffprobe's json")
    }

    /// A tag as ffprobe shows it: on the file (mp3, flac) or on its stream (Ogg), in either case.
    fn probed_tag(info: &serde_json::Value, key: &str) -> Option<String> {
        [&info["format"]["tags"], &info["streams"][0]["tags"]]
            .into_iter()
            .find_map(|t| t[key].as_str().or_else(|| t[key.to_uppercase()].as_str()))
            .map(str::to_string)
    }

    fn formats() -> [FileFormat; 6] {
        [
            FileFormat::Plain(OutputFormat::Wav16),
            FileFormat::Plain(OutputFormat::WavF32),
            FileFormat::Plain(OutputFormat::Pcm16),
            FileFormat::Mp3,
            FileFormat::Opus,
            FileFormat::Flac,
        ]
    }

    #[test]
    fn every_format_decodes_to_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(RATE as usize * 3 + 1234);
        for format in formats() {
            let path = dir.path().join(format!("out-{format:?}.{}", format.extension()).replace(['(', ')'], ""));
            write_audio(&path, &samples, RATE, format).unwrap();
            let n = decode(&path).len();
            eprintln!("{format:?}: {n} samples decoded of {}", samples.len());
            // wav, pcm and flac exactly; mp3 too (LAME's Info frame gives the encoder delay and
            // the padding, which ffmpeg trims); Ogg Opus to ffmpeg's 48 → 24 kHz resampling,
            // which keeps the length to a sample or two.
            let slack = if format == FileFormat::Opus { 2 } else { 0 };
            assert!(n.abs_diff(samples.len()) <= slack, "{format:?}: {n} samples decoded of {}", samples.len());
        }
        // Nothing but the outputs: no temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), formats().len());
    }

    #[test]
    fn an_untagged_mp3_is_the_servers_whole_mp3() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(40_000);
        let path = dir.path().join("x.mp3");
        write_audio(&path, &samples, RATE, FileFormat::Mp3).unwrap();
        let whole = super::super::AudioFormat::Mp3.encode_whole(&samples, RATE).unwrap();
        assert!(std::fs::read(&path).unwrap() == whole);
    }

    #[test]
    fn lossless_formats_keep_the_int16_samples() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(50_000);
        let want: Vec<i16> = samples.iter().map(|&x| cosy::audio::f32_to_i16(x)).collect();
        for format in [FileFormat::Plain(OutputFormat::Wav16), FileFormat::Plain(OutputFormat::Pcm16), FileFormat::Flac] {
            let path = dir.path().join(format!("x.{}", format.extension()));
            write_audio(&path, &samples, RATE, format).unwrap();
            assert!(decode(&path) == want, "{format:?}");
        }
    }

    fn marks() -> Vec<ChapterMark> {
        vec![
            ChapterMark::new("Chapter One: Beginnings", 0),
            ChapterMark::new("Chapter Two / The \"Middle\"", 36_001),
            ChapterMark::new("Épilogue", 60_012),
        ]
    }

    fn book_tags() -> Tags {
        Tags { title: Some("A Test Book".into()), author: Some("A. N. Author".into()), ..Tags::default() }
    }

    /// The chunks of `samples` in uneven sizes, as a producer hands them over.
    fn chunks(samples: &[f32]) -> impl Iterator<Item = Result<&[f32]>> {
        samples.chunks(7_001).map(Ok)
    }

    #[test]
    fn chapters_show_in_ffprobe_with_titles_times_and_tags() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(84_000);
        let marks = marks();
        for format in [FileFormat::Mp3, FileFormat::Opus, FileFormat::Flac] {
            let path = dir.path().join(format!("book.{}", format.extension()));
            write_with_chapters(&path, format, RATE, &marks, &book_tags(), samples.len() as u64, chunks(&samples)).unwrap();
            let info = probe(&path);
            let chapters = info["chapters"].as_array().unwrap_or_else(|| panic!("{format:?}: no chapters: {info}"));
            assert_eq!(chapters.len(), marks.len(), "{format:?}: {info}");
            for (c, m) in chapters.iter().zip(&marks) {
                assert_eq!(c["tags"]["title"], m.title.as_str(), "{format:?}: {c}");
                // Milliseconds, rounded to the nearest (both conventions count in them).
                let start: f64 = c["start_time"].as_str().unwrap().parse().unwrap();
                let want = tags::millis(m.start_sample, RATE) as f64 / 1000.0;
                assert!((start - want).abs() < 1e-6, "{format:?}: {} starts at {start}, want {want}", m.title);
            }
            // The last chapter ends with the audio: the Vorbis convention has no end times, so
            // ffprobe ends it at the file's duration, which for Ogg Opus it counts with the
            // pre-skip (312 samples at 48 kHz: 6.5 ms more, though the decoded audio has not).
            let end: f64 = chapters[2]["end_time"].as_str().unwrap().parse().unwrap();
            let pre_skip = if format == FileFormat::Opus { 0.0065 } else { 0.0 };
            assert!((end - 3.5 - pre_skip).abs() < 0.001, "{format:?}: the last chapter ends at {end}: {}", info["format"]);
            let tag = |k: &str| probed_tag(&info, k);
            assert_eq!(tag("title").as_deref(), Some("A Test Book"), "{format:?}: {info}");
            assert_eq!(tag("artist").as_deref(), Some("A. N. Author"), "{format:?}: {info}");
            // The marks change nothing in the audio's length.
            let n = decode(&path).len();
            assert!(n.abs_diff(samples.len()) <= 2, "{format:?}: {n} samples");
        }
    }

    #[test]
    fn the_most_chapters_each_format_holds() {
        let dir = tempfile::tempdir().unwrap();
        for (format, most) in [(FileFormat::Mp3, tags::MAX_ID3_CHAPTERS), (FileFormat::Opus, tags::MAX_VORBIS_CHAPTERS), (FileFormat::Flac, tags::MAX_VORBIS_CHAPTERS)] {
            // A chapter every 480 samples (20 ms), titles long enough for the Opus tags to span
            // several Ogg pages.
            let marks: Vec<ChapterMark> = (0..=most).map(|i| ChapterMark::new(format!("Chapter {i} of a rather long book title"), i as u64 * 480)).collect();
            let samples = audio(marks.len() * 480);
            let path = dir.path().join(format!("many.{}", format.extension()));
            let err = write_with_chapters(&path, format, RATE, &marks, &Tags::default(), samples.len() as u64, chunks(&samples)).unwrap_err();
            assert!(err.to_string().contains(&format!("at most {most}")), "{err}");
            write_with_chapters(&path, format, RATE, &marks[..most], &Tags::default(), samples.len() as u64, chunks(&samples)).unwrap();
            let info = probe(&path);
            let chapters = info["chapters"].as_array().unwrap();
            assert_eq!(chapters.len(), most, "{format:?}");
            assert_eq!(chapters[most - 1]["tags"]["title"], marks[most - 1].title.as_str(), "{format:?}");
        }
    }

    #[test]
    fn the_same_audio_gives_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(30_000);
        for format in formats() {
            let write = |name: &str| {
                let path = dir.path().join(format!("{name}.{}", format.extension()));
                write_with_chapters(&path, format, RATE, &marks()[..1], &book_tags(), samples.len() as u64, chunks(&samples)).unwrap();
                std::fs::read(path).unwrap()
            };
            assert!(write("a") == write("b"), "{format:?}");
        }
    }

    #[test]
    fn a_wrong_length_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(10_000);
        for format in formats() {
            let path = dir.path().join(format!("short.{}", format.extension()));
            let err = write_with_chapters(&path, format, RATE, &[], &Tags::default(), 12_000, chunks(&samples)).unwrap_err();
            assert!(err.to_string().contains("12000 were announced"), "{err}");
            let failing = [Ok(&samples[..5000]), Err(Error::Cancelled)];
            assert!(write_with_chapters(&path, format, RATE, &[], &Tags::default(), 10_000, failing).is_err());
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{format:?}: nothing at all, no temporary file");
        }
        let backwards = [ChapterMark::new("b", 10), ChapterMark::new("a", 5)];
        assert!(write_with_chapters(&dir.path().join("x.flac"), FileFormat::Flac, RATE, &backwards, &Tags::default(), 10_000, chunks(&samples)).is_err());
    }

    #[test]
    fn split_files_add_up_to_the_single_file() {
        let dir = tempfile::tempdir().unwrap();
        let samples = audio(84_000);
        let marks = marks();
        for format in [FileFormat::Plain(OutputFormat::Pcm16), FileFormat::Plain(OutputFormat::Wav16), FileFormat::Flac, FileFormat::Mp3, FileFormat::Opus] {
            let single = dir.path().join(format!("book.{}", format.extension()));
            write_with_chapters(&single, format, RATE, &marks, &book_tags(), samples.len() as u64, chunks(&samples)).unwrap();
            let folder = dir.path().join(format!("split-{}", format.extension()));
            let files = write_split(&folder, "book", format, RATE, &marks, &book_tags(), samples.len() as u64, chunks(&samples)).unwrap();
            let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
            let ext = format.extension();
            assert_eq!(names, [format!("01 - Chapter One Beginnings.{ext}"), format!("02 - Chapter Two The Middle.{ext}"), format!("03 - Épilogue.{ext}")]);
            let playlist = std::fs::read_to_string(folder.join("book.m3u8")).unwrap();
            assert_eq!(
                playlist,
                format!("#EXTM3U\n#PLAYLIST:A Test Book\n#EXTINF:2,Chapter One: Beginnings\n{}\n#EXTINF:1,Chapter Two / The \"Middle\"\n{}\n#EXTINF:1,Épilogue\n{}\n", names[0], names[1], names[2])
            );
            let whole = decode(&single);
            let parts: Vec<Vec<i16>> = files.iter().map(|p| decode(p)).collect();
            if matches!(format, FileFormat::Mp3 | FileFormat::Opus) {
                // Lossy: each part decodes to its chapter's length (Opus: to a sample or two, the
                // 48 → 24 kHz resampling).
                let bounds = [0, 36_001, 60_012, 84_000];
                for (i, p) in parts.iter().enumerate() {
                    let want = bounds[i + 1] - bounds[i];
                    assert!(p.len().abs_diff(want) <= 2, "{format:?} part {i}: {} samples, want {want}", p.len());
                }
            } else {
                assert!(parts.concat() == whole, "{format:?}: the parts, end to end, are the single file");
            }
            if format == FileFormat::Flac {
                let info = probe(&files[1]);
                assert_eq!(probed_tag(&info, "title").as_deref(), Some("Chapter Two / The \"Middle\""), "{info}");
                assert_eq!(probed_tag(&info, "album").as_deref(), Some("A Test Book"), "{info}");
                assert_eq!(probed_tag(&info, "track").as_deref(), Some("2"), "{info}");
            }
        }
    }

    #[test]
    fn format_by_flag_or_extension() {
        let choose = |flag: Option<&str>, out: Option<&str>| FileFormat::choose(flag, out.map(Path::new));
        assert_eq!(choose(None, None).unwrap(), FileFormat::Plain(OutputFormat::Wav16));
        assert_eq!(choose(None, Some("a.MP3")).unwrap(), FileFormat::Mp3);
        assert_eq!(choose(None, Some("a.ogg")).unwrap(), FileFormat::Opus);
        assert_eq!(choose(None, Some("a.raw")).unwrap(), FileFormat::Plain(OutputFormat::Pcm16));
        assert_eq!(choose(None, Some("a.bin")).unwrap(), FileFormat::Plain(OutputFormat::Wav16));
        assert_eq!(choose(Some("flac"), Some("a.bin")).unwrap(), FileFormat::Flac);
        assert_eq!(choose(Some("wavf32"), Some("a.wav")).unwrap(), FileFormat::Plain(OutputFormat::WavF32));
        assert_eq!(choose(Some("wav"), None).unwrap(), FileFormat::Plain(OutputFormat::Wav16));
        assert_eq!(choose(Some("pcm"), Some("a.raw")).unwrap(), FileFormat::Plain(OutputFormat::Pcm16));
        let err = choose(Some("flac"), Some("book.mp3")).unwrap_err().to_string();
        assert_eq!(err, "-o book.mp3 is an mp3 by its extension, but --format flac asks for a flac: drop --format, or name the file book.flac");
        assert!(choose(Some("aac"), None).unwrap_err().to_string().contains(FORMAT_NAMES));
    }

    #[test]
    fn safe_names() {
        assert_eq!(safe_name("a/b\\c: d?*", 1), "a b c d");
        assert_eq!(safe_name("  ..hidden.. ", 1), "hidden");
        assert_eq!(safe_name("///", 4), "Chapter 4");
        assert_eq!(safe_name("line\nbreak", 1), "line break");
        let long = safe_name(&"é".repeat(100), 1);
        assert!(long.len() <= 120 && long.chars().all(|c| c == 'é'));
    }
}
