//! The plugin directory (`fleet.plugin-dir`): WebAssembly components served to agents by
//! their SHA-256 at `GET /api/fleet/plugins/{sha256}`, behind the same authentication as
//! the rest of the fleet API.
//!
//! Every regular file directly in the directory is indexed by the SHA-256 of its content
//! (names do not matter; operators copy a new version in and name its hash in the config
//! tree). A request for a hash not in the index rescans the directory (at most once per
//! [`RESCAN_INTERVAL`]; only files whose size or modification time changed are hashed
//! again), and a file that changed since it was indexed is re-indexed before it is served,
//! so what is served always has the hash it is served under, or is not served at all.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use sha2::{Digest, Sha256};

/// The shortest time between two rescans caused by requests for unknown hashes.
pub const RESCAN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// What identifies a version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    path: PathBuf,
    stamp: Stamp,
    hash: String,
}

#[derive(Default)]
struct Index {
    by_hash: HashMap<String, Entry>,
    by_path: HashMap<PathBuf, Entry>,
    scanned: Option<Instant>,
}

/// A component found for a hash: its file and size, as indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub len: u64,
}

/// The indexed plugin directory.
pub struct PluginDir {
    root: PathBuf,
    index: Mutex<Index>,
}

/// Whether `s` is a SHA-256 as the API accepts it: 64 lowercase hexadecimal digits.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let mut out = String::with_capacity(64);
    for b in hasher.finalize() {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    Ok(out)
}

impl PluginDir {
    /// Indexes `root` (blocking: call it off the async runtime's workers).
    pub fn open(root: &Path) -> std::io::Result<PluginDir> {
        let dir = PluginDir {
            root: root.to_owned(),
            index: Mutex::new(Index::default()),
        };
        dir.rescan()?;
        Ok(dir)
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The number of distinct components indexed.
    pub fn len(&self) -> usize {
        self.lock().by_hash.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rescans the directory, hashing new and changed files (blocking).
    pub fn rescan(&self) -> std::io::Result<()> {
        let previous = self.lock().by_path.clone();
        let mut by_path = HashMap::new();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let path = entry.path();
            // Symlinks are followed: operators may link versions in.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let stamp = Stamp::of(&meta);
            let hash = match previous.get(&path) {
                Some(known) if known.stamp == stamp => known.hash.clone(),
                _ => match hash_file(&path) {
                    Ok(hash) => hash,
                    Err(error) => {
                        tracing::warn!(
                            "fleet: plugin-dir: cannot read {}: {error}",
                            path.display()
                        );
                        continue;
                    }
                },
            };
            by_path.insert(path.clone(), Entry { path, stamp, hash });
        }
        let mut by_hash = HashMap::new();
        for entry in by_path.values() {
            by_hash.insert(entry.hash.clone(), entry.clone());
        }
        let mut index = self.lock();
        index.by_hash = by_hash;
        index.by_path = by_path;
        index.scanned = Some(Instant::now());
        Ok(())
    }

    /// The file holding the component of `hash` (blocking: it may rescan). `None` when no
    /// file in the directory has that content.
    pub fn find(&self, hash: &str) -> Option<Found> {
        if !is_sha256(hash) {
            return None;
        }
        for attempt in 0..2 {
            let (known, may_rescan) = {
                let index = self.lock();
                (
                    index.by_hash.get(hash).cloned(),
                    index.scanned.is_none_or(|t| t.elapsed() >= RESCAN_INTERVAL),
                )
            };
            if let Some(entry) = known {
                let current = std::fs::metadata(&entry.path).map(|m| Stamp::of(&m));
                if current.as_ref().ok() == Some(&entry.stamp) {
                    return Some(Found {
                        path: entry.path,
                        len: entry.stamp.len,
                    });
                }
                // Changed since indexed: index it again, whatever the rate limit.
            } else if !may_rescan || attempt > 0 {
                return None;
            }
            if let Err(error) = self.rescan() {
                tracing::warn!(
                    "fleet: plugin-dir {}: cannot rescan: {error}",
                    self.root.display()
                );
                return None;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lowercase_64_hex_digits_are_a_hash() {
        let ok = "a".repeat(64);
        assert!(is_sha256(&ok));
        assert!(!is_sha256(&"A".repeat(64)));
        assert!(!is_sha256(&"a".repeat(63)));
        assert!(!is_sha256(&format!("{}g", "a".repeat(63))));
        assert!(!is_sha256("../../etc/passwd"));
    }

    #[test]
    fn files_are_found_by_content_and_a_changed_file_under_its_new_hash_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("v1.wasm"), b"version one").unwrap();
        let plugins = PluginDir::open(dir.path()).unwrap();
        let v1 = sha256_hex(b"version one");
        assert_eq!(plugins.find(&v1).unwrap().len, 11);
        // Rewritten in place with other content (and size): the old hash is gone.
        std::fs::write(dir.path().join("v1.wasm"), b"version two!").unwrap();
        assert_eq!(plugins.find(&v1), None);
        let v2 = sha256_hex(b"version two!");
        assert_eq!(
            plugins.find(&v2).map(|f| f.path),
            Some(dir.path().join("v1.wasm"))
        );
    }
}
