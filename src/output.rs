//! Output files: everything cosy writes where the user said (`-o`, `--json`, `--trace`, `--dump`,
//! saved voices) goes through here, so the rules are the same everywhere.
//!
//! * [`check_file`] refuses an output path before any work is done: a path ending in `/`, a
//!   folder, a missing folder, a parent that is a file, a file name over the 255-byte limit, a
//!   folder that is not writable, a block device or a socket. Messages name the user's path.
//! * [`OutputFile`] stages the output and puts it in place only when it is complete, by kind of
//!   target (symbolic links are followed, the link itself is never replaced):
//!   - a regular file, or nothing yet: written to `.<name>.partial-<pid>` in the real file's
//!     folder, fsynced and renamed onto it (so a reader never sees half a file, and an error
//!     leaves an older file as it was);
//!   - a character device or a FIFO (`/dev/null`, a named pipe, `/dev/stdout` on a pipe): written
//!     through, once the whole output is ready (it is staged in an unlinked temporary file), so
//!     the device node or FIFO is never replaced by a regular file. A FIFO with no reader is an
//!     error, not a hang.
//!
//! [`write_bytes`] is the one-shot form; `crate::audio::wav` encodes audio on top of [`OutputFile`].

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The longest file name (one path component) Linux file systems take, in bytes.
pub const NAME_MAX: usize = 255;
/// How many symbolic links are followed before giving up (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

/// Where the bytes of an output go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A regular file or nothing yet: a temporary sibling of `real` (symbolic links followed) is
    /// renamed onto it.
    Replace { real: PathBuf },
    /// A character device or a FIFO: opened and written through.
    Through { fifo: bool },
}

/// What is wrong with an output path: the words for a message (without the path) and an io kind.
#[derive(Debug)]
struct Problem {
    kind: io::ErrorKind,
    msg: String,
}

fn problem(kind: io::ErrorKind, msg: impl Into<String>) -> Problem {
    Problem { kind, msg: msg.into() }
}

fn shown(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        ".".into()
    } else {
        p.display().to_string()
    }
}

fn parent_of(p: &Path) -> &Path {
    p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Follows `path` while it is a symbolic link (also a dangling one) and returns the last path,
/// which is not a link (or does not exist).
fn follow_links(path: &Path) -> std::result::Result<PathBuf, Problem> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p)
                    .map_err(|e| problem(e.kind(), format!("cannot read the symbolic link {} ({e})", shown(&p))))?;
                p = if to.is_absolute() { to } else { parent_of(&p).join(to) };
            }
            _ => return Ok(p),
        }
    }
    Err(problem(io::ErrorKind::InvalidInput, "is a loop of symbolic links; point it at a file"))
}

/// Why the folder `dir` (that should hold a new file) cannot: missing, or a file on the way.
fn folder_problem(dir: &Path) -> Problem {
    // The deepest ancestor that exists tells which: a file there, or a folder not made yet.
    let mut a = dir;
    loop {
        match fs::metadata(a) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return problem(
                    io::ErrorKind::NotADirectory,
                    format!("{} is a file, not a folder; choose another output path", shown(a)),
                )
            }
            Err(_) => match a.parent() {
                Some(p) if !p.as_os_str().is_empty() => a = p,
                _ => break,
            },
        }
    }
    problem(
        io::ErrorKind::NotFound,
        format!("the folder {} does not exist; create it or choose another output path", shown(dir)),
    )
}

fn name_too_long(name: &std::ffi::OsStr) -> Option<Problem> {
    let n = name.as_bytes().len();
    (n > NAME_MAX).then(|| {
        problem(
            io::ErrorKind::InvalidFilename,
            format!("the file name is {n} bytes, over the {NAME_MAX}-byte limit of file names; use a shorter name"),
        )
    })
}

/// What writing to `path` would do, or why it cannot (see the module docs).
fn resolve(path: &Path) -> std::result::Result<Target, Problem> {
    let raw = path.as_os_str().as_bytes();
    if raw.is_empty() {
        return Err(problem(io::ErrorKind::InvalidInput, "the path is empty; give a file name"));
    }
    if raw.ends_with(b"/") {
        return Err(problem(
            io::ErrorKind::IsADirectory,
            "the path ends with '/', so it names a folder; give a file name (without the trailing '/')",
        ));
    }
    if raw.ends_with(b"/.") || raw.ends_with(b"/..") || raw == b"." || raw == b".." {
        return Err(problem(io::ErrorKind::IsADirectory, "names a folder, not a file; give a file name"));
    }
    let Some(name) = path.file_name() else {
        return Err(problem(io::ErrorKind::IsADirectory, "names a folder, not a file; give a file name"));
    };
    if let Some(p) = name_too_long(name) {
        return Err(p);
    }
    match fs::metadata(path) {
        Ok(m) => {
            let t = m.file_type();
            if t.is_dir() {
                Err(problem(io::ErrorKind::IsADirectory, "is a folder; give a file name (e.g. inside it)"))
            } else if t.is_file() {
                let real = fs::canonicalize(path).map_err(|e| problem(e.kind(), format!("cannot be resolved ({e})")))?;
                Ok(Target::Replace { real })
            } else if t.is_char_device() {
                Ok(Target::Through { fifo: false })
            } else if t.is_fifo() {
                Ok(Target::Through { fifo: true })
            } else if t.is_block_device() {
                Err(problem(
                    io::ErrorKind::InvalidInput,
                    "is a block device (a disk); cosy writes to files, FIFOs and character devices only",
                ))
            } else {
                Err(problem(
                    io::ErrorKind::InvalidInput,
                    "is a socket; cosy writes to files, FIFOs and character devices only",
                ))
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            Err(problem(io::ErrorKind::InvalidInput, "is a loop of symbolic links; point it at a file"))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory => {
            // Nothing there yet (or a dangling link): the file is made where the link points.
            let real = follow_links(path)?;
            let real_name = real.file_name().ok_or_else(|| {
                problem(io::ErrorKind::IsADirectory, format!("points to {}, which is not a file name", shown(&real)))
            })?;
            if let Some(p) = name_too_long(real_name) {
                return Err(p);
            }
            let dir = parent_of(&real);
            match fs::metadata(dir) {
                Ok(m) if m.is_dir() => Ok(Target::Replace { real }),
                _ => Err(folder_problem(dir)),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(problem(
            e.kind(),
            format!("cannot be reached (a folder on the way is not readable: {e}); choose another output path"),
        )),
        Err(e) => Err(problem(e.kind(), format!("cannot be inspected ({e}); choose another output path"))),
    }
}

/// `.<name>.partial-<pid>` beside `real`, the name shortened so it stays a valid file name.
fn temp_path(real: &Path) -> PathBuf {
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let suffix = format!(".partial-{}", std::process::id());
    let room = NAME_MAX - 1 - suffix.len();
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    real.with_file_name(format!(".{}{suffix}", &name[..cut]))
}

/// Can a new file be made in `dir`? (A file is made and removed: the only reliable test.)
fn probe_folder(dir: &Path) -> std::result::Result<(), Problem> {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut attempt = 0;
    let result = loop {
        let probe = dir.join(format!(".cosy-write-probe-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        match OpenOptions::new().write(true).create_new(true).open(&probe) {
            Ok(_) => {
                fs::remove_file(&probe).ok();
                break Ok(());
            }
            // A stale probe of an earlier process with this id: try the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => break Err(e),
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem) => Err(problem(
            e.kind(),
            format!("the folder {} is not writable; choose another output path or fix its permissions", shown(dir)),
        )),
        Err(e) => Err(problem(e.kind(), format!("cannot write in the folder {} ({e})", shown(dir)))),
    }
}

fn writable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Refuses an output file path before any work (see the module docs). `label` says where the
/// path came from (e.g. `-o`, `--json`); the message is `LABEL PATH: what is wrong; the fix`.
pub fn check_file(label: &str, path: &Path) -> Result<()> {
    let fail = |p: Problem| Error::invalid(format!("{label} {}: {}", shown(path), p.msg));
    match resolve(path).map_err(fail)? {
        Target::Replace { real } => probe_folder(parent_of(&real)).map_err(fail),
        Target::Through { fifo } => {
            if writable(path) {
                Ok(())
            } else {
                let what = if fifo { "FIFO" } else { "device" };
                Err(fail(problem(io::ErrorKind::PermissionDenied, format!("this {what} is not writable for you"))))
            }
        }
    }
}

/// Refuses an output folder (`--dump`, `-o` with `--input`) before any work; with `create`, a
/// missing folder is made (with its parents).
pub fn check_folder(label: &str, dir: &Path, create: bool) -> Result<()> {
    let fail = |msg: String| Error::invalid(format!("{label} {}: {msg}", shown(dir)));
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail("is a file, not a folder; give a folder".into())),
        Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
            fs::create_dir_all(dir).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory | io::ErrorKind::NotFound => {
                    fail(folder_problem(dir).msg)
                }
                _ => fail(format!("cannot create it ({e})")),
            })?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory => {
            let p = folder_problem(dir);
            return Err(fail(if p.kind == io::ErrorKind::NotFound {
                "the folder does not exist; create it or choose another one".into()
            } else {
                p.msg
            }));
        }
        Err(e) => return Err(fail(format!("cannot be inspected ({e})"))),
    }
    probe_folder(dir).map_err(|p| fail(p.msg))
}

/// The file `path` really names: the folder (canonical) and the name, links followed. Two
/// spellings of one output (`p.json`, `./p.json`, `dir/../p.json`, a link to it) give the same.
fn identity(path: &Path) -> (PathBuf, OsString) {
    let real = fs::canonicalize(path).ok().or_else(|| follow_links(path).ok()).unwrap_or_else(|| path.to_path_buf());
    let dir = parent_of(&real);
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    (dir, real.file_name().map(OsString::from).unwrap_or_default())
}

/// Whether two output paths name the same file (through different spellings and links too).
pub fn same_file(a: &Path, b: &Path) -> bool {
    identity(a) == identity(b)
}

/// Refuses an output that would write over one of the command's inputs (`inputs`: each input's
/// flag and path, e.g. `--input lines.txt`, `--prompt-wav me.wav`): an output never replaces what
/// the command reads, whatever spelling or link names it.
pub fn check_not_an_input(label: &str, out: &Path, inputs: &[(&str, &Path)]) -> Result<()> {
    for (flag, input) in inputs {
        if input.as_os_str() != "-" && input.exists() && same_file(out, input) {
            return Err(Error::invalid(format!(
                "{label} {}: is the file given as {flag} ({}); an output never replaces an input: choose another output name{}",
                shown(out),
                shown(input),
                if label == "--name-template" { " (another template, or -o FOLDER)" } else { "" }
            )));
        }
    }
    Ok(())
}

/// Rewrites an io error so that its message also says what the user can do about it. The kind
/// is kept, so callers can still match on it. Names the user's path, never a temporary one.
pub fn explain_write_error(e: io::Error, path: &Path) -> Error {
    // A full disk is worded as every other write words it.
    if crate::error::StorageFault::of(&e).is_full() {
        return crate::fsx::Dest::new(path, "the output").error(e);
    }
    let fix = match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => format!(
            "the folder {} is not writable: choose another output path or fix its permissions",
            shown(parent_of(path))
        ),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => folder_problem(parent_of(path)).msg,
        io::ErrorKind::IsADirectory => "the output path is a folder: give a file name".to_string(),
        io::ErrorKind::BrokenPipe => "the program reading it closed it".to_string(),
        _ => "nothing was written; check the output path".to_string(),
    };
    Error::io(path, io::Error::new(e.kind(), format!("{e}; {fix}")))
}

enum Dest {
    Replace { real: PathBuf, temp: PathBuf },
    Through { fifo: bool, staging: File },
}

/// An output being written: bytes go to a staging file (the handle [`OutputFile::create`]
/// returns) and reach the target at [`OutputFile::commit`]; dropped without commit, nothing
/// reaches it and the staging file is removed.
pub struct OutputFile {
    /// The user's path (what messages name).
    path: PathBuf,
    dest: Dest,
    /// A second handle on the staging file, for fsync / copying while the first is wrapped.
    handle: File,
    committed: bool,
}

/// An unlinked temporary file (it disappears with its last handle).
fn anonymous_file() -> io::Result<File> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir();
    let p = dir.join(format!(".cosy-staging-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&p)?;
    fs::remove_file(&p)?;
    Ok(f)
}

impl OutputFile {
    /// Starts an output at `path`; returns it with the handle to write the bytes to.
    pub fn create(path: &Path) -> Result<(OutputFile, File)> {
        let target = resolve(path).map_err(|p| Error::io(path, io::Error::new(p.kind, p.msg)))?;
        let (dest, file) = match target {
            Target::Replace { real } => {
                let temp = temp_path(&real);
                let file = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&temp)
                    .map_err(|e| explain_write_error(e, path))?;
                // A file replaced keeps its permissions (best effort).
                if let Ok(m) = fs::metadata(&real) {
                    let _ = file.set_permissions(m.permissions());
                }
                (Dest::Replace { real, temp }, file)
            }
            Target::Through { fifo } => {
                let staging = anonymous_file().map_err(|e| {
                    Error::io(
                        path,
                        io::Error::new(
                            e.kind(),
                            format!(
                                "cannot make a temporary file in {} to hold the output until it is complete ({e}); set TMPDIR to a writable folder",
                                std::env::temp_dir().display()
                            ),
                        ),
                    )
                })?;
                let file = staging.try_clone().map_err(|e| explain_write_error(e, path))?;
                (Dest::Through { fifo, staging }, file)
            }
        };
        let handle = file.try_clone().map_err(|e| explain_write_error(e, path))?;
        Ok((OutputFile { path: path.to_path_buf(), dest, handle, committed: false }, file))
    }

    /// The user's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the complete output in place: fsync and rename (regular files), or a copy into the
    /// device or FIFO.
    pub fn commit(mut self) -> Result<()> {
        let path = self.path.clone();
        match &mut self.dest {
            Dest::Replace { real, temp } => {
                self.handle.sync_all().map_err(|e| explain_write_error(e, &path))?;
                fs::rename(&*temp, &*real).map_err(|e| explain_write_error(e, &path))?;
                self.committed = true;
                // The rename itself is durable once the folder is synced (best effort: the output
                // is in place already).
                let _ = crate::fsx::sync_folder(parent_of(real));
            }
            Dest::Through { fifo, staging } => {
                staging.flush().map_err(|e| explain_write_error(e, &path))?;
                staging.seek(SeekFrom::Start(0)).map_err(|e| explain_write_error(e, &path))?;
                let mut out = open_through(&path, *fifo)?;
                io::copy(staging, &mut out).map_err(|e| explain_write_error(e, &path))?;
                out.flush().map_err(|e| explain_write_error(e, &path))?;
                self.committed = true;
            }
        }
        Ok(())
    }
}

/// Opens a device or FIFO for writing. A FIFO is opened without blocking (so a FIFO nobody reads
/// is an error at once, not a hang), then switched back to blocking writes.
fn open_through(path: &Path, fifo: bool) -> Result<File> {
    if !fifo {
        return OpenOptions::new().write(true).open(path).map_err(|e| explain_write_error(e, path));
    }
    let f = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENXIO) {
            Error::io(
                path,
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    "no program is reading this FIFO; start the reader first, then cosy",
                ),
            )
        } else {
            explain_write_error(e, path)
        }
    })?;
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `f` for the duration of both calls.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(explain_write_error(io::Error::last_os_error(), path));
    }
    Ok(f)
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let (false, Dest::Replace { temp, .. }) = (self.committed, &self.dest) {
            let _ = fs::remove_file(temp);
        }
    }
}

/// Writes `bytes` to `path` (see the module docs: complete or not at all, links followed,
/// devices and FIFOs written through).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let (out, mut file) = OutputFile::create(path)?;
    file.write_all(bytes).map_err(|e| explain_write_error(e, path))?;
    drop(file);
    out.commit()
}
