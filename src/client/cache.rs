//! The configuration cache: the last configuration received from cc-backend, so a service can
//! start with it while cc-backend is unreachable.
//!
//! The configuration may hold secrets, so the file is written atomically (temporary file,
//! fsync, rename) with mode 0600 in a directory created with mode 0700. It never holds the
//! instance id. A cache written for another service type, scope, cluster or host is ignored.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::wire::{Scope, ServiceType};

/// Whom a cache file was written for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    #[serde(rename = "type")]
    pub service_type: ServiceType,
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    pub hostname: String,
}

/// A configuration read back from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub etag: String,
    pub revision: String,
    /// The configuration exactly as cc-backend sent it.
    pub config: String,
}

#[derive(Serialize)]
struct FileOut<'a> {
    identity: &'a Identity,
    etag: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    revision: &'a str,
    config: &'a RawValue,
}

#[derive(Deserialize)]
struct FileIn {
    identity: Identity,
    #[serde(default)]
    etag: String,
    #[serde(default)]
    revision: String,
    config: Option<Box<RawValue>>,
}

/// The cache file of one client.
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    path: PathBuf,
    identity: Identity,
}

impl Cache {
    pub(crate) fn new(path: PathBuf, identity: Identity) -> Cache {
        Cache { path, identity }
    }

    /// Reads the cache. A missing file is silent; an unreadable or malformed one is logged
    /// and ignored, as is one written for another identity.
    pub(crate) fn load(&self) -> Option<Entry> {
        let data = match fs::read(&self.path) {
            Ok(data) => data,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "fleet: cannot read the config cache, ignoring it");
                return None;
            }
        };
        let file: FileIn = match serde_json::from_slice(&data) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "fleet: malformed config cache, ignoring it");
                return None;
            }
        };
        if file.identity != self.identity {
            tracing::info!(
                path = %self.path.display(),
                "fleet: config cache was written for another service type, scope, cluster or host, ignoring it"
            );
            return None;
        }
        match file.config {
            Some(config) if config.get() != "null" => Some(Entry {
                etag: file.etag,
                revision: file.revision,
                config: config.get().to_owned(),
            }),
            _ => {
                tracing::warn!(path = %self.path.display(), "fleet: config cache holds no configuration, ignoring it");
                None
            }
        }
    }

    /// Replaces the cache atomically. `config` must be valid JSON.
    pub(crate) fn store(&self, etag: &str, revision: &str, config: &str) -> io::Result<()> {
        let config: &RawValue = serde_json::from_str(config).map_err(io::Error::other)?;
        let data = serde_json::to_vec(&FileOut {
            identity: &self.identity,
            etag,
            revision,
            config,
        })
        .map_err(io::Error::other)?;
        write_atomically(&self.path, &data)
    }

    /// Deletes the cache; a missing file is fine.
    pub(crate) fn remove(&self) -> io::Result<()> {
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

fn write_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let base = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "cache path names no file"))?;
    create_private_dir(dir)?;
    let mut tmp_name = base.to_owned();
    tmp_name.push(format!(".tmp{:016x}", rand::random::<u64>()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = open_private(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        // Make the rename itself durable; not every filesystem supports syncing a directory.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
}

#[cfg(unix)]
fn open_private(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    // The umask may have removed bits but never adds any; set the mode explicitly anyway.
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

#[cfg(not(unix))]
fn open_private(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            service_type: ServiceType::MetricCollector,
            scope: Scope::Cluster,
            cluster: "fritz".into(),
            hostname: "f0101".into(),
        }
    }

    #[test]
    fn round_trip_keeps_the_body_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("c.json"), identity());
        assert_eq!(cache.load(), None);
        let body = "{\"z\":1,\"a\":[1.0, 2e3],\"s\":\"<&>\"}";
        cache.store("\"7\"", "7", body).unwrap();
        assert_eq!(
            cache.load(),
            Some(Entry {
                etag: "\"7\"".into(),
                revision: "7".into(),
                config: body.into()
            })
        );
    }

    #[test]
    fn file_format_is_cc_libs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        Cache::new(path.clone(), identity())
            .store("\"1\"", "1", r#"{"interval":"5s"}"#)
            .unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            r#"{"identity":{"type":"ccmc","scope":"cluster","cluster":"fritz","hostname":"f0101"},"etag":"\"1\"","revision":"1","config":{"interval":"5s"}}"#
        );
    }

    #[cfg(unix)]
    #[test]
    fn modes_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state").join("fleet");
        let path = sub.join("c.json");
        let cache = Cache::new(path.clone(), identity());
        cache.store("", "", "{}").unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(sub.parent().unwrap()), 0o700);
        // Overwriting keeps the mode and leaves no temporary files behind.
        cache.store("\"2\"", "2", r#"{"a":2}"#).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read_dir(&sub).unwrap().count(), 1);
    }

    #[test]
    fn other_identities_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        Cache::new(path.clone(), identity())
            .store("\"1\"", "1", "{}")
            .unwrap();
        let variants = [
            Identity {
                service_type: ServiceType::MetricStore,
                ..identity()
            },
            Identity {
                scope: Scope::Infra,
                cluster: String::new(),
                ..identity()
            },
            Identity {
                cluster: "alex".into(),
                ..identity()
            },
            Identity {
                hostname: "f0102".into(),
                ..identity()
            },
        ];
        for other in variants {
            assert_eq!(Cache::new(path.clone(), other).load(), None);
        }
        assert!(Cache::new(path, identity()).load().is_some());
    }

    #[test]
    fn malformed_or_empty_caches_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let cache = Cache::new(path.clone(), identity());
        for content in [
            "",
            "{",
            "[]",
            r#"{"identity":{"type":"ccmc","scope":"cluster","cluster":"fritz","hostname":"f0101"},"etag":""}"#,
            r#"{"identity":{"type":"ccmc","scope":"cluster","cluster":"fritz","hostname":"f0101"},"etag":"","config":null}"#,
            r#"{"identity":{"type":"zzz","scope":"cluster","hostname":"f0101"},"config":{}}"#,
        ] {
            fs::write(&path, content).unwrap();
            assert_eq!(cache.load(), None, "{content}");
        }
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("c.json"), identity());
        cache.store("", "", "{}").unwrap();
        cache.remove().unwrap();
        cache.remove().unwrap();
        assert_eq!(cache.load(), None);
        assert!(!cache.path().exists());
    }
}
