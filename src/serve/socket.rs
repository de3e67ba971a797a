//! The local socket (`server.socket`): the same routes as the TCP address, on a Unix socket of the
//! user's own, so `cosy say` and `cosy file` on this machine find a warm model without a port
//! (docs/desktop.md, "A warm model behind cosy say").
//!
//! The socket file is the only thing here that outlives a process: a file left by a server that
//! died is replaced, one a live server listens on is never taken (an error naming it, or with the
//! per-user default a warning and TCP only, so a second `cosy serve` on other ports still starts),
//! and the file this server made is removed when it stops. The default folder is made mode 0700
//! and must be the user's own: whoever can reach the socket can use the API as this user.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::settings::SocketSetting;

/// The socket file this server listens on; removed on drop while it is still the one it made.
pub struct SocketFile {
    pub path: PathBuf,
    /// (device, inode) of the socket file made by `bind`: a later server's file is never removed.
    made: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.made) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Listens on the socket `setting` names, or on none (`off`; `auto` when it cannot, with a
/// warning). Called inside the server's runtime (tokio's listener registers with it).
pub fn bind(setting: &SocketSetting) -> Result<Option<(UnixListener, SocketFile)>, cosy::Error> {
    let (path, auto) = match setting {
        SocketSetting::Off => return Ok(None),
        SocketSetting::Auto => (cosy::paths::local_socket(), true),
        SocketSetting::Path(path) => (path.clone(), false),
    };
    match bind_at(&path, auto) {
        Ok(bound) => Ok(Some(bound)),
        Err(why) if auto => {
            tracing::warn!("no local socket ({why}); cosy say will not find this server (server.socket)");
            Ok(None)
        }
        Err(why) => Err(cosy::Error::Config(format!("server.socket: {why}"))),
    }
}

fn bind_at(path: &Path, private_folder: bool) -> Result<(UnixListener, SocketFile), String> {
    let shown = path.display();
    if private_folder {
        if let Some(folder) = path.parent() {
            make_private_folder(folder)?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(format!("{shown} exists and is not a socket; not replaced (remove it, or set another path)"))
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(format!("another cosy serve listens on {shown}; stop it, or set another path (or \"off\")")),
            // Nobody listens: a file left by a server that died.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(|e| format!("{shown}: a socket left by a stopped server cannot be removed ({e})"))?;
                tracing::info!("replaced the socket a stopped server left at {shown}");
            }
            Err(e) => return Err(format!("{shown}: cannot tell whether a server listens there ({e})")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{shown}: {e}")),
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("{shown}: cannot listen there ({e})"))?;
    // Only this user: the folder may be shared (a path the user chose).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| format!("{shown}: {e}"))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    Ok((listener, SocketFile { path: path.to_path_buf(), made: (meta.dev(), meta.ino()) }))
}

/// The socket's default folder: made mode 0700 when missing; refused unless it is a real folder
/// of this user's that no one else may enter (under /tmp anyone could have made it first).
fn make_private_folder(folder: &Path) -> Result<(), String> {
    let shown = folder.display();
    if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(folder) {
        return Err(format!("{shown}: cannot create the folder ({e})"));
    }
    let meta = std::fs::symlink_metadata(folder).map_err(|e| format!("{shown}: {e}"))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!("{shown} is not a folder of this user's with mode 0700; not used"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_is_named_and_the_file_goes_with_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cosy.sock");
        let setting = SocketSetting::Path(path.clone());
        // A socket nobody listens on any more: a server that died.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let (listener, file) = bind(&setting).unwrap().expect("a socket");
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second server on the same path is refused, naming it.
        let e = bind(&setting).err().expect("a live socket is not taken").to_string();
        assert!(e.contains("another cosy serve listens on") && e.contains(&path.display().to_string()), "{e}");
        drop(listener);
        drop(file);
        assert!(!path.exists(), "the server's socket file is removed when it stops");
        // A file that is not a socket is never replaced.
        std::fs::write(&path, "x").unwrap();
        let e = bind(&setting).err().expect("not a socket").to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert!(bind(&SocketSetting::Off).unwrap().is_none());
    }

    #[test]
    fn the_default_folder_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("cosy");
        make_private_folder(&folder).unwrap();
        assert_eq!(std::fs::metadata(&folder).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = make_private_folder(&folder).unwrap_err();
        assert!(e.contains("mode 0700"), "{e}");
    }
}
