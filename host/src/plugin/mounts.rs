//! The mount-info grant (`capabilities.mount-info`): the mount table and the per-mount
//! statistics, without the agent's own process.
//!
//! Collectors need two things the per-process part of `/proc` holds: the mount table
//! (`diskstat`, as `/proc/self/mounts`) and the NFS per-mount statistics (`nfsiostat`, as
//! `/proc/self/mountstats`). [`super::files`] refuses every per-process entry whatever the
//! grant, because `/proc/self` is the agent: its memory, environment, descriptors and
//! command line. This grant opens exactly three files and nothing beside them:
//!
//! - the plugin names one of [`SERVED`] (`/proc/self/mounts`, `/proc/self/mountinfo`,
//!   `/proc/self/mountstats`) by its exact text; anything else, including other spellings
//!   (`/proc/self//mounts`, `/proc/<pid>/mounts`, `/proc/thread-self/...`), is refused by
//!   the ordinary rules. No byte of the plugin's path reaches the file system: the host
//!   picks the file from a fixed table, so no pattern, link or `..` can lead anywhere else;
//! - the three files describe the mount namespace the agent runs in (any process in it
//!   reads the same table), not the agent: which file systems are mounted where, with which
//!   options, and, for NFS, the client's operation and byte counters. The kernel leaves
//!   passwords out of mount options. Nothing else of `/proc/self` is reachable;
//! - `statvfs` is additionally allowed on the mount points the table lists at that moment
//!   (the sizes a `df` shows), still subject to every other refusal of [`super::files`]:
//!   a mount point under `/proc`, `/sys` or `/dev` stays refused, and opening a directory
//!   for `fstatvfs` reads nothing from it;
//! - with `files-root` (fixtures) the three files are `<root>/proc/self/<name>`, which must
//!   resolve to a regular file under the root.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use ccfleet::untrusted::Untrusted;

/// The paths served, as a plugin asks for them.
pub const SERVED: [&str; 3] = [
    "/proc/self/mounts",
    "/proc/self/mountinfo",
    "/proc/self/mountstats",
];

/// The grant of one plugin.
#[derive(Debug, Clone)]
pub struct MountInfo {
    /// The file root (canonical): `/`, or a directory of fixtures.
    root: PathBuf,
    max_bytes: usize,
}

impl MountInfo {
    /// The grant under `root` (canonical), returning at most `max_bytes` per file.
    pub fn new(root: PathBuf, max_bytes: usize) -> MountInfo {
        MountInfo { root, max_bytes }
    }

    /// The served file a path names, if it names one.
    pub fn served(path: &str) -> Option<&'static str> {
        SERVED
            .iter()
            .find(|s| **s == path)
            .and_then(|s| s.rsplit('/').next())
    }

    /// Reads the served file `name` (one of [`SERVED`]'s last components).
    pub fn read(&self, path: &str, name: &'static str) -> Result<Vec<u8>, String> {
        let fail = |why: &dyn std::fmt::Display| format!("{}: {why}", Untrusted(path));
        let host = if self.root == std::path::Path::new("/") {
            // The agent's own view of its mount namespace: a fixed path, opened without
            // following a link at its last component (`/proc/self` itself is the kernel's).
            PathBuf::from("/proc/self").join(name)
        } else {
            let host = self.root.join("proc/self").join(name);
            let real = std::fs::canonicalize(&host).map_err(|e| fail(&e))?;
            if !real.starts_with(&self.root) {
                return Err(fail(&"leads outside the plugin's file root"));
            }
            real
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&host)
            .map_err(|e| fail(&e))?;
        let meta = file.metadata().map_err(|e| fail(&e))?;
        if !meta.is_file() {
            return Err(fail(&"is not a regular file"));
        }
        read_capped(file, self.max_bytes).map_err(|e| match e {
            Capped::Io(e) => fail(&e),
            Capped::TooLarge => fail(&format!(
                "is larger than this plugin's limit of {} bytes",
                self.max_bytes
            )),
        })
    }

    /// Whether `path` is a mount point of the table now (read from `mountinfo`, whose mount
    /// points are the fifth field, octal-escaped).
    pub fn is_mount_point(&self, path: &str) -> bool {
        let Ok(table) = self.read(SERVED[1], "mountinfo") else {
            return false;
        };
        let table = String::from_utf8_lossy(&table);
        table
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .any(|field| unescape(field) == path)
    }
}

enum Capped {
    Io(std::io::Error),
    TooLarge,
}

fn read_capped(file: File, max_bytes: usize) -> Result<Vec<u8>, Capped> {
    let mut bytes = Vec::with_capacity(4096);
    file.take(max_bytes.saturating_add(1) as u64)
        .read_to_end(&mut bytes)
        .map_err(Capped::Io)?;
    if bytes.len() > max_bytes {
        return Err(Capped::TooLarge);
    }
    Ok(bytes)
}

/// Undoes the kernel's octal escapes in a mount table field (`\040` is a space); shared by
/// the mount-info grant and the WASI directory checks, which read the same tables. An
/// escape above `\377` (the kernel writes none) is kept as it stands.
pub(crate) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = (u32::from(bytes[i + 1] - b'0') << 6)
                | (u32::from(bytes[i + 2] - b'0') << 3)
                | u32::from(bytes[i + 3] - b'0');
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_three_exact_paths_are_served() {
        assert_eq!(
            MountInfo::served("/proc/self/mountstats"),
            Some("mountstats")
        );
        assert_eq!(MountInfo::served("/proc/self/mounts"), Some("mounts"));
        for other in [
            "/proc/self/environ",
            "/proc/self//mounts",
            "/proc/1/mounts",
            "/proc/thread-self/mounts",
            "/proc/self/mounts/",
            "/proc/mounts",
        ] {
            assert_eq!(MountInfo::served(other), None, "{other}");
        }
    }

    #[test]
    fn mount_points_are_read_from_mountinfo_with_escapes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/self")).unwrap();
        std::fs::write(
            root.path().join("proc/self/mountinfo"),
            "22 1 252:1 / / rw - ext4 /dev/vda1 rw\n23 22 0:5 / /my\\040data rw - xfs /dev/vdb rw\n",
        )
        .unwrap();
        let grant = MountInfo::new(std::fs::canonicalize(root.path()).unwrap(), 1 << 20);
        assert!(grant.is_mount_point("/"));
        assert!(grant.is_mount_point("/my data"));
        assert!(!grant.is_mount_point("/home"));
        let small = MountInfo::new(std::fs::canonicalize(root.path()).unwrap(), 10);
        assert!(
            small
                .read("/proc/self/mountinfo", "mountinfo")
                .unwrap_err()
                .contains("limit of 10 bytes")
        );
    }
}
