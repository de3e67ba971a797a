//! `cosy file BOOK -o OUT`: a book or long document (EPUB, Markdown, plain text) said into one
//! audio file with chapter marks, or one file per chapter, resumably, with captions
//! (docs/long-form.md). This front end only joins the parts that decide: the book reader
//! (`cosy::frontend::book`), the resumable job (`cosy::app::longform`), the encoders with chapter
//! marks (`crate::encode::file`) and the captions (`cosy::captions`).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use cosy::app::longform::{Finished, Job, JobSpec, Progress};
use cosy::captions::{CaptionFormat, Timeline};
use cosy::config::Config;
use cosy::error::Error;
use cosy::frontend::book::{read_book, Book, BookLimits};

use super::{FileArgs, FileRequest};
use crate::encode::{write_split, write_with_chapters, ChapterMark, FileFormat, Tags};

/// The text the job's template request is built with (never said).
const TEMPLATE_TEXT: &str = "Book.";

/// Extensions that make a TEXT argument naming an existing file a book.
const BOOK_EXTENSIONS: [&str; 4] = ["epub", "md", "markdown", "txt"];

/// The book `cosy file` is asked to say, if any: `--book FILE`, or a TEXT that names an existing
/// file with a book's extension.
pub fn book_input(args: &FileArgs) -> Option<PathBuf> {
    if let Some(path) = &args.book {
        return Some(path.clone());
    }
    let text = args.text.as_deref().filter(|t| *t != "-" && !t.contains('\n'))?;
    let path = Path::new(text);
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    (BOOK_EXTENSIONS.contains(&extension.as_str()) && path.is_file()).then(|| path.to_path_buf())
}

/// A book read and its outputs checked, before the model is loaded.
pub struct BookPlan {
    book: Book,
    format: FileFormat,
    /// The audio file, or with `--split chapters` the folder of the chapters' files.
    output: PathBuf,
    split: bool,
    captions: Option<(PathBuf, CaptionFormat)>,
    job_dir: PathBuf,
    /// The job folder was derived, not given: removed once the book is written.
    job_derived: bool,
}

impl BookPlan {
    /// Reads the book and checks every output it will write (one line each, nothing made yet).
    pub fn prepare(args: &FileArgs, path: &Path, format: FileFormat) -> Result<BookPlan, Error> {
        if args.output.as_deref().is_some_and(|o| o.as_os_str() == "-") {
            return Err(Error::invalid("a book is written to a file, not to standard output: give -o FILE (or a folder with --split chapters)"));
        }
        let book = read_book(path, &BookLimits::default())?;
        for warning in &book.warnings {
            eprintln!("note: {warning}");
        }
        let split = args.split.is_some();
        if !split && !format.has_chapter_marks() {
            eprintln!("note: a {} file has no chapter marks; use .mp3, .opus or .flac for them, or --split chapters", format.extension());
        }
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "book".into());
        let output = match &args.output {
            Some(o) => o.clone(),
            None if split => PathBuf::from(&stem),
            None => PathBuf::from(format!("{stem}.{}", format.extension())),
        };
        let inputs = [("the book", path)];
        if split {
            cosy::output::check_folder("-o", &output, true)?;
        } else {
            cosy::output::check_file("-o", &output)?;
            cosy::output::check_not_an_input("-o", &output, &inputs)?;
        }
        let captions = match &args.captions {
            None => None,
            Some(file) => {
                let Some(kind) = CaptionFormat::from_path(file) else {
                    return Err(Error::invalid(format!(
                        "--captions {}: name the format by the extension: .srt, .vtt or .json",
                        file.display()
                    )));
                };
                cosy::output::check_file("--captions", file)?;
                cosy::output::check_not_an_input("--captions", file, &inputs)?;
                Some((file.clone(), kind))
            }
        };
        let (job_dir, job_derived) = match &args.job {
            Some(dir) => (dir.clone(), false),
            None => {
                let mut name = output.file_name().map(|n| n.to_os_string()).unwrap_or_default();
                name.push(".cosy-job");
                (output.with_file_name(name), true)
            }
        };
        cosy::output::check_folder("--job", &job_dir, true)?;
        Ok(BookPlan { book, format, output, split, captions, job_dir, job_derived })
    }

    /// Says the book into its job folder (continuing a job stopped before), then writes the
    /// audio, its chapter marks and the captions.
    pub fn run(self, config: &Config, engine: &cosy::engine::Engine, args: &FileArgs, request: &FileRequest<'_>) -> anyhow::Result<()> {
        // The job's template request: the voice and options every sentence is said with. Its text
        // is not used (each sentence is its own request), but the request rules want one: a
        // plain word, so that nothing in a chapter title (only symbols, SSML) can refuse it.
        let mut template = request(TEMPLATE_TEXT.to_string())?;
        template.text.clear();
        let spec = JobSpec {
            chapters: self.book.chapters.iter().map(|c| (c.title.clone(), c.text.clone())).collect(),
            request: template,
            seed: args.seed.unwrap_or(config.sampling.seed),
            // The text settings change what is said: a job made with others is not resumed.
            settings: vec![("the [text] settings".to_string(), format!("{:?}", config.text))],
            // One at a time by default: the only way a resumed job is exact to the bit (sentences
            // batched together differ in the last bits by who shares the batch).
            in_flight: usize::from(args.in_flight),
        };
        let mut job = Job::open(&self.job_dir, spec, engine)?;
        let (done, total) = job.sentences();
        if job.resumed() {
            eprintln!("resuming {}: {done} of {total} sentences already said", self.job_dir.display());
        }
        let mut meter = Meter::new();
        let finished = match job.run(engine, |p| meter.show(p)) {
            Ok(finished) => finished,
            Err(Error::Cancelled) => {
                meter.end();
                anyhow::bail!(
                    "{}; what is said is kept in {}: run the same command again to continue",
                    crate::interrupt::STOPPED,
                    self.job_dir.display()
                );
            }
            Err(e) => {
                meter.end();
                return Err(e.into());
            }
        };
        meter.end();
        drop(job);
        self.write(&finished)?;
        if self.job_derived {
            // The book is written: what the job kept is no longer needed.
            let _ = std::fs::remove_dir_all(&self.job_dir);
        }
        Ok(())
    }

    /// The audio (one file with marks, or one per chapter) and the captions, from the finished
    /// sentences on disk: read one at a time, so a book of any length takes the memory of one.
    fn write(&self, finished: &Finished) -> anyhow::Result<()> {
        let rate = finished.sample_rate;
        let mut marks = Vec::new();
        let mut timeline = Timeline::new();
        for chapter in &finished.chapters {
            marks.push(ChapterMark::new(chapter.title.clone(), timeline.position()));
            timeline.start_chapter(&chapter.title);
            for part in &chapter.parts {
                match part {
                    cosy::app::longform::Part::Sentence { text, samples, .. } => timeline.push_sentence(text, *samples as u64),
                    cosy::app::longform::Part::Pause { samples } => timeline.push_silence(*samples as u64),
                }
            }
        }
        let total = timeline.position();
        let tags = Tags { title: self.book.title.clone(), author: self.book.author.clone(), ..Tags::default() };
        let chunks = finished.chapters.iter().flat_map(|c| &c.parts).map(|part| part.samples());
        if self.split {
            let stem = self.book.title.clone().unwrap_or_else(|| "book".into());
            let stem = crate::encode::file::safe_name(&stem, 0);
            let files = write_split(&self.output, &stem, self.format, rate, &marks, &tags, total, chunks)?;
            eprintln!("wrote {} chapter files and {stem}.m3u8 into {}", files.len(), self.output.display());
        } else {
            write_with_chapters(&self.output, self.format, rate, &marks, &tags, total, chunks)?;
            eprintln!(
                "wrote {} ({} chapters, {})",
                self.output.display(),
                marks.len(),
                clock(total as f64 / f64::from(rate))
            );
        }
        if let Some((path, kind)) = &self.captions {
            let text = timeline.render(*kind, rate);
            cosy::fsx::Dest::new(path, "the captions").write(text.as_bytes())?;
        }
        Ok(())
    }
}

/// The run's progress on standard error: rewritten in place on a terminal, a line per finished
/// chapter otherwise (a log stays short).
struct Meter {
    terminal: bool,
    chapters_done: usize,
    shown: bool,
}

impl Meter {
    fn new() -> Meter {
        use std::io::IsTerminal as _;
        Meter { terminal: std::io::stderr().is_terminal(), chapters_done: 0, shown: false }
    }

    fn show(&mut self, p: &Progress) -> ControlFlow<()> {
        if crate::interrupt::requested() {
            return ControlFlow::Break(());
        }
        let eta = p.eta.map(|d| format!(", about {} left", clock(d.as_secs_f64()))).unwrap_or_default();
        let line = format!(
            "chapter {}/{}, sentence {}/{}, {} of audio{eta}",
            (p.chapters_done + 1).min(p.chapters_total),
            p.chapters_total,
            p.sentences_done,
            p.sentences_total,
            clock(p.audio_seconds)
        );
        if self.terminal {
            eprint!("\r\x1b[2K{line}");
            self.shown = true;
        } else if p.chapters_done != self.chapters_done || p.sentences_done == p.sentences_total {
            eprintln!("{line}");
        }
        self.chapters_done = p.chapters_done;
        ControlFlow::Continue(())
    }

    fn end(&mut self) {
        if self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}

/// `H:MM:SS` (or `M:SS`) for progress lines.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s / 3600 {
        0 => format!("{}:{:02}", s / 60, s % 60),
        h => format!("{h}:{:02}:{:02}", s / 60 % 60, s % 60),
    }
}
