//! One server per SQLite registry file: an advisory lock on a file beside the database.
//!
//! Two servers on one SQLite file each keep their own in-memory index of it, so they answer
//! differently (one answers 404 for an instance registered through the other) and overwrite
//! each other's writes. A server therefore holds an exclusive `flock` on `<db>.lock` while it
//! runs, and writes its process id and host name into that file. A second server on the
//! same file finds the lock taken and refuses to start, naming the file and the holder.
//!
//! The lock belongs to an open file, not to the file's existence: the kernel releases it
//! when the holder exits, however it exits (a SIGKILL or a crash included). A lock file left
//! behind by a killed server is therefore no obstacle; its stale content is overwritten by
//! the next holder. The file is never deleted: deleting it would let a server that opened
//! the old file and one that created a new file both hold "the" lock.
//!
//! The lock file is found through the database's canonical path, so two spellings of one
//! database (a relative path, a symbolic link) lock the same file.
//!
//! Taking the lock needs no free space: the file exists (it is never deleted) or is created
//! empty, and `flock` writes nothing. The holder's description is written as a best effort:
//! on a full disk it is not, the server starts all the same, and a second server finds the
//! holder's process id in the kernel's lock table (`/proc/locks`) instead, where it can see
//! it (the same host and process namespace).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::server::error::{RegistryError, RegistryErrorKind};
use crate::untrusted::Untrusted;

/// How long a server that finds the lock taken waits for the holder's process id to appear
/// in the file (the holder writes it right after taking the lock).
const HOLDER_WAIT: Duration = Duration::from_millis(500);

/// The exclusive lock on a SQLite registry file; released when dropped (or when the process
/// ends).
#[derive(Debug)]
pub struct DatabaseLock {
    file: File,
    path: PathBuf,
}

/// Who holds a lock, as its lock file or the kernel's lock table says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    pid: Option<u32>,
    host: Option<String>,
    /// The process id comes from the kernel's lock table: the holder could not write it.
    from_kernel: bool,
}

impl DatabaseLock {
    /// Takes the lock of the SQLite database `db` without waiting. Blocking (file I/O).
    ///
    /// Fails with a [`RegistryErrorKind::Unavailable`] error naming the database, the lock
    /// file and the process holding it when another server (in this process or another)
    /// holds it, and when the lock file cannot be created.
    pub fn acquire(db: &Path) -> Result<DatabaseLock, RegistryError> {
        let path = lock_path(db)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| {
                RegistryError::with_source(
                    RegistryErrorKind::Unavailable,
                    format!("cannot open the lock file {}: {e}", path.display()),
                    e,
                )
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = read_holder(&file);
                return Err(RegistryError::new(
                    RegistryErrorKind::Unavailable,
                    format!(
                        "the database {} is in use by another fleet server ({}; lock file {}): \
                         one server per SQLite file. Stop that server, or give this one its own \
                         db, or let several servers share a \"registry\": {{\"type\": \"jetstream-kv\"}}",
                        db.display(),
                        holder.describe(),
                        path.display()
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(RegistryError::with_source(
                    RegistryErrorKind::Unavailable,
                    format!("cannot lock {}: {e}", path.display()),
                    e,
                ));
            }
        }
        let mut lock = DatabaseLock { file, path };
        if let Err(e) = lock.write_holder() {
            // The lock is held without it; an outage for want of 30 bytes would be worse
            // than a second server that names the holder less precisely.
            let _ = lock.file.set_len(0);
            tracing::warn!(
                "fleet registry: cannot write this server's process id into the lock file {} \
                 ({e}); the lock is held all the same",
                lock.path.display()
            );
        }
        Ok(lock)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_holder(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        let mut text = format!("pid {}\n", std::process::id());
        if let Some(host) = host_name() {
            text.push_str(&format!("host {host}\n"));
        }
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()
    }
}

impl Drop for DatabaseLock {
    fn drop(&mut self) {
        // Emptied while still held, so the file never names a server that is gone; the
        // lock itself goes with the file handle.
        let _ = self.file.set_len(0);
    }
}

/// `<db>.lock` beside the database's canonical path (of its directory while it does not
/// exist yet).
fn lock_path(db: &Path) -> Result<PathBuf, RegistryError> {
    let unavailable = |what: &Path, e: std::io::Error| {
        RegistryError::with_source(
            RegistryErrorKind::Unavailable,
            format!("cannot resolve the database path {}: {e}", what.display()),
            e,
        )
    };
    let canonical = match std::fs::canonicalize(db) {
        Ok(path) => path,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(name) = db.file_name() else {
                return Err(RegistryError::new(
                    RegistryErrorKind::Unavailable,
                    format!("the database path {} names no file", db.display()),
                ));
            };
            let parent = match db.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            std::fs::canonicalize(parent)
                .map_err(|e| unavailable(parent, e))?
                .join(name)
        }
        Err(e) => return Err(unavailable(db, e)),
    };
    let mut name = canonical.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    Ok(canonical.with_file_name(name))
}

/// What the lock file says about its holder; waits briefly for a holder that has just
/// taken the lock and not written yet. A file that names no process after that (its holder
/// could not write it, for want of space) leaves the kernel's lock table to name it.
fn read_holder(file: &File) -> Holder {
    let deadline = std::time::Instant::now() + HOLDER_WAIT;
    loop {
        let holder = parse_holder(&read_all(file));
        if holder.pid.is_some() {
            return holder;
        }
        if std::time::Instant::now() >= deadline {
            let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
            return match file_id(file).and_then(|id| kernel_holder(&locks, id)) {
                Some(pid) => Holder {
                    pid: Some(pid),
                    host: None,
                    from_kernel: true,
                },
                None => holder,
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The device (major, minor) and inode of an open file, as `/proc/locks` writes them.
fn file_id(file: &File) -> Option<(u64, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    // The kernel's encoding of a device number in `st_dev` (glibc's `major`/`minor`).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    Some((major, minor, meta.ino()))
}

/// The process holding a `flock` on the file `(major, minor, inode)` in the kernel's lock
/// table (the text of `/proc/locks`), where the table shows it: lines such as
/// `1: FLOCK  ADVISORY  WRITE 4711 08:02:1234 0 EOF` (device numbers in hex), and waiters
/// as `1: -> FLOCK ...`, which are skipped. A process outside this process namespace shows
/// as 0 or -1 and is not named.
fn kernel_holder(locks: &str, (major, minor, inode): (u64, u64, u64)) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, "FLOCK", _, _, pid, id, ..] = fields.as_slice() else {
            return None;
        };
        let mut parts = id.split(':');
        let (Some(ma), Some(mi), Some(ino), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let same = u64::from_str_radix(ma, 16).ok()? == major
            && u64::from_str_radix(mi, 16).ok()? == minor
            && ino.parse::<u64>().ok()? == inode;
        same.then(|| pid.parse::<u32>().ok().filter(|&pid| pid > 0))
            .flatten()
    })
}

fn read_all(mut file: &File) -> String {
    let mut text = String::new();
    if file.seek(SeekFrom::Start(0)).is_ok() {
        // At most a small file: anything else is not ours.
        let _ = file.take(4096).read_to_string(&mut text);
    }
    text
}

fn parse_holder(text: &str) -> Holder {
    let mut holder = Holder {
        pid: None,
        host: None,
        from_kernel: false,
    };
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("pid", pid)) => holder.pid = pid.trim().parse().ok(),
            Some(("host", host)) if !host.trim().is_empty() => {
                holder.host = Some(host.trim().to_owned());
            }
            _ => {}
        }
    }
    holder
}

impl Holder {
    /// "held by process 1234 (ccfleet) on node01", with what is known of it.
    fn describe(&self) -> String {
        let Some(pid) = self.pid else {
            return "held by a process that did not write its id into the lock file (its disk \
                    may be full) and that this host's lock table does not show (it runs on \
                    another host or in another container)"
                .to_owned();
        };
        let mut text = format!("held by process {pid}");
        let here = host_name();
        let local = self.host.is_none() || self.host == here;
        if local && let Some(name) = process_name(pid) {
            text.push_str(&format!(" ({})", Untrusted(&name).capped(64)));
        }
        if let Some(host) = &self.host {
            // The file may have been written by anyone who can write the directory.
            text.push_str(&format!(" on {}", Untrusted(host).capped(255)));
        }
        if self.from_kernel {
            text.push_str(
                ", as the kernel's lock table says: it could not write the lock file (its disk \
                 may be full)",
            );
        }
        text
    }
}

/// This machine's host name, where the system tells it.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The command name of a local process, where the system tells it.
fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_in_the_same_process_is_refused_naming_file_and_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fleet.db");
        let first = DatabaseLock::acquire(&db).unwrap();
        assert_eq!(first.path().file_name().unwrap(), "fleet.db.lock");
        let error = DatabaseLock::acquire(&db).unwrap_err();
        assert_eq!(error.kind(), RegistryErrorKind::Unavailable);
        let text = error.to_string();
        assert!(text.contains(&db.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("process {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("fleet.db.lock"), "{text}");
        drop(first);
        DatabaseLock::acquire(&db).expect("free again once the holder is gone");
    }

    #[test]
    fn another_spelling_of_the_same_database_is_the_same_lock() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fleet.db");
        std::fs::write(&db, b"").unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let _held = DatabaseLock::acquire(&db).unwrap();
        assert!(DatabaseLock::acquire(&link).is_err());
        let dotted = dir.path().join(".").join("fleet.db");
        assert!(DatabaseLock::acquire(&dotted).is_err());
    }

    #[test]
    fn a_stale_lock_file_without_a_holder_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fleet.db");
        std::fs::write(dir.path().join("fleet.db.lock"), "pid 999999\nhost gone\n").unwrap();
        let lock = DatabaseLock::acquire(&db).unwrap();
        let text = std::fs::read_to_string(lock.path()).unwrap();
        assert!(
            text.starts_with(&format!("pid {}\n", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn a_holder_that_could_not_write_the_lock_file_is_named_from_the_kernels_lock_table() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fleet.db");
        let held = DatabaseLock::acquire(&db).unwrap();
        // What a holder on a full disk leaves: an empty lock file.
        std::fs::write(held.path(), b"").unwrap();
        let text = DatabaseLock::acquire(&db).unwrap_err().to_string();
        assert!(
            text.contains(&format!("process {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("kernel's lock table"), "{text}");
    }

    #[test]
    fn the_kernels_lock_table_is_read_by_device_and_inode() {
        let table = "1: FLOCK  ADVISORY  WRITE 77 00:2e:99 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 78 00:2e:1234 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 79 08:02:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE -1 08:02:555 0 EOF\n\
                     4: FLOCK  ADVISORY  WRITE 4711 fd:1a:1234 0 EOF\n";
        assert_eq!(kernel_holder(table, (0xfd, 0x1a, 1234)), Some(4711));
        assert_eq!(kernel_holder(table, (0, 0x2e, 99)), Some(77));
        // A waiter, a POSIX lock, a process of another namespace, an unknown file.
        assert_eq!(kernel_holder(table, (0, 0x2e, 1234)), None);
        assert_eq!(kernel_holder(table, (8, 2, 1234)), None);
        assert_eq!(kernel_holder(table, (8, 2, 555)), None);
        assert_eq!(kernel_holder(table, (1, 1, 1)), None);
        assert_eq!(kernel_holder("garbage\n1: FLOCK\n", (1, 1, 1)), None);
    }

    #[test]
    fn holder_text_is_parsed_and_hostile_content_is_escaped() {
        let holder = parse_holder("pid 42\nhost evil\u{1b}[2J\n");
        assert_eq!(holder.pid, Some(42));
        let shown = holder.describe();
        assert!(shown.contains("process 42"), "{shown}");
        assert!(!shown.contains('\u{1b}'), "{shown}");
        assert_eq!(parse_holder("").pid, None);
        assert!(
            parse_holder("garbage")
                .describe()
                .contains("did not write its id")
        );
    }
}
