//! The one way cosy writes a file the user or a later run relies on (a voice, a cache file, a
//! marker, an output, a `--dump` array): into a temporary file in the same folder, synced, then
//! renamed over the final name (or hard-linked to it when an existing file must be kept), then the
//! folder synced. A crash or a full disk at any point leaves either the previous file or the new
//! one at the final name, never a part of one; the temporary file is removed on every error, and
//! one left by a process that was killed is ignored by readers (its name starts with a dot) and
//! removed by [`clean_temps`].
//!
//! Errors name the FINAL path (never the temporary file), say what failed in words (no space
//! left, quota, read-only, permission) and the fix: [`Error::Storage`], built by [`Dest::error`].
//!
//! Test hook: `COSY_TEST_KILL_AT=<step>` (`created`, `written`, `synced`, `renamed`; a model add
//! also `staged`; a writer that takes turns, `locking` just before it waits for its folder's lock),
//! or `<step>:<n>` for the n-th write to reach that step, makes the
//! process SIGKILL itself at that step of a write, so a crash test stops a write exactly between
//! two steps without timing; `COSY_TEST_PAUSE_AT` holds it there until the test lets it go
//! (tests/cli/disk.rs).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, StorageFault};

/// The environment variable of the crash-test hook (see the module's documentation).
pub const KILL_AT_ENV: &str = "COSY_TEST_KILL_AT";
/// The barrier test hook's variables (see [`test_hooks_at`]).
pub const PAUSE_AT_ENV: &str = "COSY_TEST_PAUSE_AT";
pub const PAUSE_DIR_ENV: &str = "COSY_TEST_PAUSE_DIR";

/// The part of a temporary file's name that marks it as one (after the leading dot and the final
/// name): `.<final name>.cosy-tmp.<pid>.<host>.<nanos>.<serial>`.
const TEMP_MARK: &str = ".cosy-tmp.";

/// The lock file of a folder whose writers take turns ([`Dest::locked`]).
pub const LOCK_FILE: &str = ".lock";

/// A file about to be written: where it goes, what it is (for messages: `voice "me"`, `the
/// optimised-graph cache file`), and the fix when its folder cannot be written.
#[derive(Debug, Clone)]
pub struct Dest {
    path: PathBuf,
    what: String,
    unwritable_fix: Option<String>,
}

impl Dest {
    pub fn new(path: impl Into<PathBuf>, what: impl Into<String>) -> Dest {
        Dest { path: path.into(), what: what.into(), unwritable_fix: None }
    }

    /// The fix to give when the folder is read-only or not ours (default: make the folder
    /// writable).
    pub fn unwritable_fix(mut self, fix: impl Into<String>) -> Dest {
        self.unwritable_fix = Some(fix.into());
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn folder(&self) -> &Path {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    }

    /// `e`, met while writing this file, as one line naming the final path and the fix.
    pub fn error(&self, e: io::Error) -> Error {
        let fault = StorageFault::of(&e);
        let reason = match fault {
            StorageFault::Full => "no space left on device".to_string(),
            StorageFault::Quota => "disk quota exceeded".to_string(),
            StorageFault::ReadOnly => "read-only file system".to_string(),
            StorageFault::Denied => "permission denied".to_string(),
            StorageFault::Other => e.to_string(),
        };
        let fix = match fault {
            StorageFault::Full => "the disk is full; free some space (or use another disk) and try again".to_string(),
            StorageFault::Quota => "your disk quota is used up; free some space (or raise the quota) and try again".to_string(),
            StorageFault::ReadOnly | StorageFault::Denied => self
                .unwritable_fix
                .clone()
                .unwrap_or_else(|| format!("make {} writable, or choose a folder you can write", self.folder().display())),
            StorageFault::Other => "check the disk and the folder, then try again".to_string(),
        };
        Error::Storage {
            path: self.path.clone(),
            fault,
            message: format!("{reason} writing {} ({}): {fix}", self.what, self.path.display()),
        }
    }

    /// Creates the folder the file goes in (and those above it).
    pub fn create_folder(&self) -> Result<()> {
        std::fs::create_dir_all(self.folder()).map_err(|e| self.error(e))
    }

    /// A fresh temporary name beside the file, for a write that is not one file (a model folder
    /// copied in, then renamed): [`clean_temps`] removes it if its writer dies.
    pub fn temp_path(&self) -> PathBuf {
        temp_path(&self.path)
    }

    /// Writes `bytes` as the file, replacing any previous version atomically.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        self.write_with(|f| f.write_all(bytes))
    }

    /// [`Self::write`], the contents written by `fill` (which may write in pieces).
    pub fn write_with(&self, fill: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
        self.write_temp(|f, _| fill(f), |temp| std::fs::rename(temp, &self.path).map(|()| true))?;
        Ok(())
    }

    /// [`Self::write`] for a writer that takes a path, not a file (it must write that path in
    /// place: truncate and fill it, as `File::create` does).
    pub fn write_to_path(&self, fill: impl FnOnce(&Path) -> io::Result<()>) -> Result<()> {
        self.write_temp(|_, temp| fill(temp), |temp| std::fs::rename(temp, &self.path).map(|()| true))?;
        Ok(())
    }

    /// Holds an exclusive lock on the folder's lock file `.lock` (created if needed) while `f`
    /// runs: two processes sharing the folder never write one of its files at the same time.
    pub fn locked<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.create_folder()?;
        let lock_path = self.folder().join(LOCK_FILE);
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(|e| self.error(e))?;
        test_hooks_at("locking");
        lock.lock().map_err(|e| self.error(e))?;
        let out = f();
        let _ = lock.unlock();
        out
    }

    /// An exclusive hold on the folder's lock file `.lock` (the one [`Self::locked`] takes),
    /// kept until the returned [`FolderLock`] is dropped; `None` at once when another process (or
    /// another hold in this one) has it. For work that owns a folder for a long time and must not
    /// share it (a long-form job's folder), rather than wait.
    pub fn try_hold(&self) -> Result<Option<FolderLock>> {
        self.create_folder()?;
        let lock_path = self.folder().join(LOCK_FILE);
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(|e| self.error(e))?;
        match lock.try_lock() {
            Ok(()) => Ok(Some(FolderLock(lock))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(self.error(e)),
        }
    }

    /// Writes `bytes` as the file unless a file of that name exists: `Ok(false)` then (the
    /// existing file untouched). Two processes writing the same new name at once cannot both
    /// succeed: the temporary file is hard-linked to the final name, which fails if it exists.
    pub fn write_new(&self, bytes: &[u8]) -> Result<bool> {
        self.write_temp(
            |f, _| f.write_all(bytes),
            |temp| match std::fs::hard_link(temp, &self.path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                // A file system without hard links: an exclusive create of the final name, filled
                // and synced; removed again if that fails.
                Err(_) => {
                    let mut f = match OpenOptions::new().write(true).create_new(true).open(&self.path) {
                        Ok(f) => f,
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
                        Err(e) => return Err(e),
                    };
                    let written = f.write_all(bytes).and_then(|()| f.sync_all());
                    if written.is_err() {
                        let _ = std::fs::remove_file(&self.path);
                    }
                    written.map(|()| true)
                }
            },
        )
    }

    /// The steps every write shares: a fresh temporary file beside the final one, filled, synced,
    /// `publish`ed (renamed or linked), the folder synced; the temporary file removed whatever
    /// happens.
    fn write_temp(&self, fill: impl FnOnce(&mut File, &Path) -> io::Result<()>, publish: impl FnOnce(&Path) -> io::Result<bool>) -> Result<bool> {
        self.create_folder()?;
        let temp = temp_path(&self.path);
        let mut file = OpenOptions::new().write(true).create_new(true).open(&temp).map_err(|e| self.error(e))?;
        test_hooks_at("created");
        let result = (|| {
            fill(&mut file, &temp)?;
            test_hooks_at("written");
            file.sync_all()?;
            drop(file);
            test_hooks_at("synced");
            let published = publish(&temp)?;
            test_hooks_at("renamed");
            sync_folder(self.folder())?;
            Ok(published)
        })();
        // After a rename it is gone already; after a link (or an error) this removes it.
        let _ = std::fs::remove_file(&temp);
        result.map_err(|e| self.error(e))
    }
}

/// A folder's lock held ([`Dest::try_hold`]); dropping it lets the lock go (so does the end of
/// the process, however it ends: the kernel releases the lock with the file).
#[derive(Debug)]
pub struct FolderLock(#[allow(dead_code)] File);

/// Swaps two names atomically (`renameat2` with `RENAME_EXCHANGE`): a folder replaced this way is
/// never absent, not even for a moment. File systems without it: the old one removed, then the
/// rename (a crash between the two leaves neither at `to`; the new one stays at `from`).
pub fn exchange(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(a), Ok(b)) = (std::ffi::CString::new(from.as_os_str().as_bytes()), std::ffi::CString::new(to.as_os_str().as_bytes())) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: both are valid NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
        return Err(e);
    }
    let meta = to.symlink_metadata()?;
    if meta.is_dir() { std::fs::remove_dir_all(to)? } else { std::fs::remove_file(to)? }
    std::fs::rename(from, to)
}

/// Syncs a folder, so that a rename or a new name in it survives a power cut. File systems that
/// cannot sync a folder (some network and FUSE ones) say `EINVAL`: taken as done.
pub fn sync_folder(dir: &Path) -> io::Result<()> {
    match File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// A temporary name beside `path`, unique across the processes that share the folder: in
/// containers every replica's process id is 1, so the time and the host name are part of it.
fn temp_path(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}{TEMP_MARK}{}.{}.{nanos:x}.{serial}", std::process::id(), host_name()))
}

/// This machine's name, cut to letters, digits and `-` (it goes into file names).
fn host_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(32).collect()
}

/// Whether `name` is a temporary file of [`Dest`]'s writes (readers skip these).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARK)
}

/// Creates the folder `dir` is (and those above it); errors as [`Dest::error`] words them, about
/// `what` (`the --dump folder`).
pub fn create_folder(dir: &Path, what: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Dest::new(dir, what).error(e))
}

/// Removes the temporary files (and folders) in `dir` left by writers that died (a crash, a SIGKILL): those of
/// this host whose process no longer runs. Another host's (a shared network folder) are left
/// alone: they are ignored by readers all the same. Returns how many were removed.
pub fn clean_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let host = host_name();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((_, rest)) = name.split_once(TEMP_MARK) else { continue };
        if !name.starts_with('.') {
            continue;
        }
        let mut parts = rest.split('.');
        let (Some(pid), Some(their_host)) = (parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next()) else { continue };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if their_host == host && !alive {
            let path = entry.path();
            let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            removed += usize::from(gone.is_ok());
        }
    }
    removed
}

/// Whether the kill hook `spec` (`STEP`, or `STEP:N` for the N-th time this process reaches that
/// step, from 1) fires at `step` now; counts the step's occurrences.
fn kill_here(spec: &str, step: &str) -> bool {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    let (at, nth) = match spec.split_once(':') {
        Some((at, n)) => (at, n.parse::<usize>().unwrap_or(1).max(1)),
        None => (spec, 1),
    };
    at == step && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == nth
}

/// The test hooks at `step` of a write: SIGKILL this process when `COSY_TEST_KILL_AT` names the
/// step (a crash test); when `COSY_TEST_PAUSE_AT` names it, create `paused.<pid>` in the folder
/// `COSY_TEST_PAUSE_DIR` and wait there until a file `go` appears (a barrier that lines two
/// processes up at the same step).
pub(crate) fn test_hooks_at(step: &str) {
    if let (Some(at), Some(dir)) = (std::env::var_os(PAUSE_AT_ENV), std::env::var_os(PAUSE_DIR_ENV)) {
        if at == step {
            let dir = PathBuf::from(dir);
            let _ = std::fs::write(dir.join(format!("paused.{}", std::process::id())), step);
            while !dir.join("go").exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
    if std::env::var(KILL_AT_ENV).is_ok_and(|v| kill_here(&v, step)) {
        // SAFETY: raise has no preconditions; SIGKILL ends the process here, as a crash would.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_whole_and_leaves_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let dest = Dest::new(d.path().join("sub/a.bin"), "test file");
        dest.write(b"one").unwrap();
        dest.write(b"two").unwrap();
        assert_eq!(std::fs::read(dest.path()).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(d.path().join("sub")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["a.bin"]);
    }

    #[test]
    fn write_new_keeps_an_existing_file() {
        let d = tempfile::tempdir().unwrap();
        let dest = Dest::new(d.path().join("a.bin"), "test file");
        assert!(dest.write_new(b"one").unwrap());
        assert!(!dest.write_new(b"two").unwrap());
        assert_eq!(std::fs::read(dest.path()).unwrap(), b"one");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_fill_leaves_the_previous_version_and_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let dest = Dest::new(d.path().join("a.bin"), "voice \"me\"");
        dest.write(b"old").unwrap();
        let e = dest
            .write_with(|f| {
                f.write_all(b"half")?;
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            })
            .unwrap_err();
        let text = e.to_string();
        let want = format!("no space left on device writing voice \"me\" ({}): the disk is full; free some space", dest.path().display());
        assert!(text.starts_with(&want), "{text}");
        assert!(matches!(e, Error::Storage { fault: StorageFault::Full, .. }));
        assert_eq!(std::fs::read(dest.path()).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn each_fault_has_its_words() {
        let dest = Dest::new("/x/y.bin", "the thing").unwritable_fix("fix it");
        for (errno, words) in [
            (libc::EDQUOT, "disk quota exceeded writing the thing (/x/y.bin): your disk quota is used up"),
            (libc::EROFS, "read-only file system writing the thing (/x/y.bin): fix it"),
            (libc::EACCES, "permission denied writing the thing (/x/y.bin): fix it"),
        ] {
            let text = dest.error(io::Error::from_raw_os_error(errno)).to_string();
            assert!(text.starts_with(words), "{text}");
        }
    }

    /// The child of [`two_processes_take_turns_under_the_folder_lock`] (run by it, skipped
    /// otherwise): takes the folder lock, logs its entry, waits at the barrier, logs its exit.
    #[test]
    #[ignore = "a child process of two_processes_take_turns_under_the_folder_lock"]
    fn locked_child() {
        let Some(dir) = std::env::var_os("FSX_LOCK_CHILD_DIR").map(PathBuf::from) else { return };
        let me = std::process::id();
        let log = |what: &str| {
            let mut f = OpenOptions::new().append(true).create(true).open(dir.join("log")).unwrap();
            writeln!(f, "{what}").unwrap();
        };
        std::fs::write(dir.join(format!("trying.{me}")), b"").unwrap();
        Dest::new(dir.join("cache/file"), "a test file")
            .locked(|| {
                log("enter");
                std::fs::write(dir.join(format!("inside.{me}")), b"").unwrap();
                while !dir.join("go").exists() {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                log("leave");
                Ok(())
            })
            .unwrap();
    }

    /// Two processes writing into one folder take turns: the second waits while the first holds
    /// the lock (held at a barrier), so entries and exits never interleave.
    #[test]
    fn two_processes_take_turns_under_the_folder_lock() {
        let d = tempfile::tempdir().unwrap();
        let child = || {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["fsx::tests::locked_child", "--exact", "--ignored", "--quiet"])
                .env("FSX_LOCK_CHILD_DIR", d.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let count = |prefix: &str| std::fs::read_dir(d.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).count();
        let mut first = child();
        while count("inside.") < 1 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut second = child();
        while count("trying.") < 2 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The second is at the lock (or about to be); the first still holds it. (Both are let go
        // before anything is asserted: a failure leaves no child waiting.)
        let inside = count("inside.");
        std::fs::write(d.path().join("go"), b"").unwrap();
        assert_eq!(inside, 1, "the second entered while the first held the lock");
        assert!(first.wait().unwrap().success() && second.wait().unwrap().success());
        let log = std::fs::read_to_string(d.path().join("log")).unwrap();
        assert_eq!(log, "enter\nleave\nenter\nleave\n");
        assert!(d.path().join("cache/.lock").is_file());
    }

    #[test]
    fn temporary_files_of_dead_writers_are_removed_others_kept() {
        let d = tempfile::tempdir().unwrap();
        let host = host_name();
        // A process id that cannot run (past pid_max), one that does (ours), another host's.
        let dead = d.path().join(format!(".v.safetensors{TEMP_MARK}99999999.{host}.1.0"));
        let live = d.path().join(format!(".v.safetensors{TEMP_MARK}{}.{host}.1.0", std::process::id()));
        let other = d.path().join(format!(".v.safetensors{TEMP_MARK}99999999.elsewhere.1.0"));
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        assert!(is_temp_name(&dead.file_name().unwrap().to_string_lossy()));
        assert_eq!(clean_temps(d.path()), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
    }
}
