//! The agent's secret files as device and inode numbers, looked up once per plugin call.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// What the agent's secrets are on disk, looked up once per plugin call
/// ([`FileGrants::begin_call`]) rather than at every read: a collector reads tens of files
/// per call, and a `stat` of every secret file for each was a visible part of a small
/// collector's call.
#[derive(Debug, Default)]
pub(super) struct SecretIds {
    /// Whether the lookup is of the current call.
    pub(super) current: bool,
    /// Device and inode of every secret that exists.
    pub(super) inodes: Vec<(u64, u64)>,
    /// The resolved paths of the secrets that are directories.
    pub(super) dirs: Vec<PathBuf>,
    /// How often the secrets were looked up (for the tests).
    pub(super) lookups: u64,
}

impl SecretIds {
    pub(super) fn look_up(&mut self, secrets: &[PathBuf]) {
        self.inodes.clear();
        self.dirs.clear();
        for secret in secrets {
            if let Ok(meta) = std::fs::metadata(secret) {
                self.inodes.push((meta.dev(), meta.ino()));
                if meta.is_dir()
                    && let Ok(resolved) = std::fs::canonicalize(secret)
                {
                    self.dirs.push(resolved);
                }
            }
        }
        self.current = true;
        self.lookups += 1;
    }
}
