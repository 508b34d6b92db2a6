//! Kernel files a plugin reads every round, kept open from one read to the next.
//!
//! A collector reads the same few files of `/proc` and `/sys` at every collect. Opening one
//! is most of what reading it costs the kernel (a path walk, a file and a `seq_file` set up
//! and torn down again), and on a node that was a tenth of the agent's CPU. A file of those
//! two file systems is generated anew whenever it is read from offset 0 (`seq_file` restarts
//! its walk, a sysfs attribute calls its `show` again), so a descriptor read with `pread` at
//! offset 0 gives what a fresh `open` would.
//!
//! Only what [`FileGrants`](super::files::FileGrants) opened and checked is held, and every
//! read is still checked against the grants first: holding a file skips the open, never a
//! check. A held file whose kernel object went away (a device unplugged, a CPU taken
//! offline) fails its read (`ENODEV`): it is dropped and the path opened again, which then
//! finds the new object or reports the file missing.
//!
//! Not held, since the path could come to name another object while the descriptor keeps
//! reading the old one: anything below a class of devices the kernel renames while running
//! ([`RENAMED_CLASSES`]: network interfaces, InfiniBand and wireless devices). Every other
//! kernel object behind a `/sys` path (CPUs, NUMA nodes, hwmon chips, block devices) keeps
//! its name until it goes away, and `/proc`'s files are never renamed.
//!
//! Held descriptors count against the process's open-file limit: all plugins together hold
//! at most [`budget`] of them, and a file beyond that is opened at every read as before.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Names in a `/sys` path below which objects can be renamed at run time (`dev_change_name`,
/// `ib_device_rename`, `cfg80211_dev_rename`): a file there is opened at every read.
pub const RENAMED_CLASSES: [&str; 4] = ["net", "infiniband", "ieee80211", "ieee802154"];

/// The most kernel files one plugin holds open.
pub const MAX_HELD_PER_PLUGIN: usize = 1024;

/// How many files all plugins hold open now.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// How many files all plugins together may hold open: a quarter of the soft open-file limit
/// (256 of the usual 1024), at most 4096, so that held files never crowd out the sockets,
/// components and files the agent itself opens.
pub fn budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            1024
        };
        (soft / 4).min(4096)
    })
}

/// Whether a kernel file at `real` (its names below the file root, as resolved) may be held
/// open: see the module documentation.
pub fn may_hold(real: &[&str]) -> bool {
    match real {
        ["proc", ..] => true,
        ["sys", rest @ ..] => !rest.iter().any(|name| RENAMED_CLASSES.contains(name)),
        _ => false,
    }
}

/// One held file, counted in [`HELD`] while it lives.
#[derive(Debug)]
struct Held {
    file: File,
    /// The size of the last read, so the next one starts with a buffer that fits.
    last_len: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The kernel files one plugin holds open, by the path it asked for.
#[derive(Debug, Default)]
pub struct HeldFiles {
    files: HashMap<String, Held>,
    /// Reads served by a held file (for the tests).
    reused: u64,
}

/// What reading a held file gave.
pub enum Reread {
    /// The file's whole content now, or its first `limit` bytes and one more when it is
    /// larger (the caller refuses it then).
    Read(Vec<u8>),
    /// The path is not held, or its held file failed and was dropped: open it again.
    Open,
}

impl HeldFiles {
    /// Reads the file held for `path` from its start, at most `limit` bytes.
    pub fn reread(&mut self, path: &str, limit: usize) -> Reread {
        let Some(held) = self.files.get_mut(path) else {
            return Reread::Open;
        };
        match read_from_start(&held.file, held.last_len, limit) {
            Ok(bytes) => {
                held.last_len = bytes.len();
                self.reused += 1;
                Reread::Read(bytes)
            }
            Err(_) => {
                // Gone (ENODEV, ESRCH) or not readable at an offset after all (ESPIPE):
                // a fresh open says what the path is now.
                self.files.remove(path);
                Reread::Open
            }
        }
    }

    /// Keeps `file`, just read whole (`len` bytes), for the next read of `path`, if the
    /// budgets allow.
    pub fn hold(&mut self, path: &str, file: File, len: usize) {
        if self.files.len() >= MAX_HELD_PER_PLUGIN {
            return;
        }
        let budget = budget();
        if HELD
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < budget).then_some(held + 1)
            })
            .is_err()
        {
            return;
        }
        self.files.insert(
            path.to_owned(),
            Held {
                file,
                last_len: len,
            },
        );
    }

    /// How many reads a held file served so far.
    #[cfg(test)]
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// How many files this plugin holds.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.files.len()
    }

    /// Replaces the file held for `path` (for the tests of a held file that fails).
    #[cfg(test)]
    pub fn replace(&mut self, path: &str, file: File) {
        if let Some(held) = self.files.get_mut(path) {
            held.file = file;
        }
    }
}

/// Reads `file` from offset 0 to its end with `pread`, at most `limit` bytes (the caller's
/// limit and one more), starting with room for `hint` bytes and one more: the usual read
/// then takes one call for the content and one for the end.
pub fn read_from_start(file: &File, hint: usize, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; hint.max(4096).saturating_add(1).min(limit)];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            if len >= limit {
                break;
            }
            bytes.resize(len.saturating_mul(2).min(limit), 0);
        }
        match file.read_at(&mut bytes[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_classes_that_are_renamed_at_run_time_are_opened_at_every_read() {
        assert!(may_hold(&["proc", "stat"]));
        // /proc/net leads to the agent's own /proc/<pid>/net: never renamed.
        assert!(may_hold(&["proc", "1234", "net", "dev"]));
        assert!(may_hold(&[
            "sys",
            "devices",
            "system",
            "cpu",
            "cpu3",
            "cpufreq",
            "scaling_cur_freq"
        ]));
        assert!(may_hold(&[
            "sys",
            "class",
            "hwmon",
            "hwmon0",
            "temp1_input"
        ]));
        assert!(!may_hold(&[
            "sys",
            "class",
            "net",
            "eth0",
            "statistics",
            "rx_bytes"
        ]));
        assert!(!may_hold(&[
            "sys",
            "devices",
            "pci0000:00",
            "0000:00:03.0",
            "net",
            "eth0",
            "mtu"
        ]));
        assert!(!may_hold(&[
            "sys",
            "class",
            "infiniband",
            "mlx5_0",
            "ports",
            "1",
            "state"
        ]));
        assert!(!may_hold(&["tmp", "stat"]));
    }

    #[test]
    fn a_file_read_from_its_start_is_read_whole_and_capped_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let content: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        // Whatever the hint, the whole file, twice over (the offset is not moved).
        for hint in [0, 10, 9_999, 10_000, 50_000] {
            assert_eq!(read_from_start(&file, hint, 20_001).unwrap(), content);
        }
        // A limit below the size gives exactly the limit: the caller sees it is larger.
        assert_eq!(read_from_start(&file, 0, 5_001).unwrap(), &content[..5_001]);
        assert_eq!(read_from_start(&file, 0, 1).unwrap(), &content[..1]);
    }
}
