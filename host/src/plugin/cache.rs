//! The on-disk cache of compiled components.
//!
//! Entries are keyed by the SHA-256 of the component bytes and a hash of the engine's
//! compatibility settings, so a changed component or an incompatible engine simply misses.
//! Only files this host wrote into its own directory are ever deserialized: wasmtime
//! validates precompiled code only lightly, so foreign `.cwasm` files are never trusted.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Hex SHA-256 of `bytes`.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

pub(crate) struct ComponentCache {
    dir: Option<PathBuf>,
    engine_key: String,
}

impl ComponentCache {
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        // DefaultHasher is only stable within one build of the host, which is exactly the
        // validity of a cache entry anyway (the key also changes with wasmtime's version).
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ComponentCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn entry(&self, hash: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{hash}-{}.cwasm", self.engine_key)))
    }

    /// Compiles `bytes` or loads the cached compilation. Returns whether the cache was hit.
    pub fn load(
        &self,
        engine: &Engine,
        hash: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, bool)> {
        let entry = self.entry(hash);
        if let Some(path) = &entry
            && path.is_file()
        {
            // SAFETY: the file lives in the host's own cache directory and was written by
            // `store` below from `Component::serialize` of an engine with the same
            // compatibility hash (part of the file name).
            match unsafe { Component::deserialize_file(engine, path) } {
                Ok(component) => return Ok((component, true)),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "discarding an unusable compile-cache entry");
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let component = Component::from_binary(engine, bytes)?;
        if let Some(path) = &entry
            && let Err(error) = store(&component, path)
        {
            tracing::warn!(path = %path.display(), %error, "cannot write the compile cache");
        }
        Ok((component, false))
    }
}

fn store(component: &Component, path: &Path) -> std::io::Result<()> {
    let bytes = component
        .serialize()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // Write then rename, so a concurrent reader never maps a half-written entry.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
