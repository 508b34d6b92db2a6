//! The on-disk cache of compiled components.
//!
//! A cache entry is native code that the host maps and runs, so nothing but this host may
//! ever have written it:
//!
//! - the directory is private (created `0700`; an existing one must belong to this user and
//!   is narrowed to `0700`; a symbolic link is not accepted), entries are `0600`;
//! - entries are written to a temporary file with an unpredictable name, created exclusively
//!   (so a planted link is never followed), and renamed into place, which replaces whatever
//!   was planted at the entry's name instead of writing through it;
//! - every entry ends with an HMAC-SHA256 of its contents under a key kept outside the
//!   directory (`<dir>.key`, `0600`, created with the cache), and is opened without following
//!   links and verified before it is deserialized. A missing or wrong tag, a foreign owner or
//!   loose permissions discard the entry and the component is compiled again.
//!
//! The verified entry is then mapped from the file, through the very descriptor it was
//! verified through (`/proc/self/fd/N`, not its name again), rather than copied into
//! anonymous memory: its pages are the page cache's (shared, and the kernel can drop and
//! reread them under memory pressure), only the pages that are touched become resident, and
//! loading holds no second copy of the entry (it was read whole into the heap and copied).
//! The kernel maps a file 64 KiB around each fault, so a collector's calls still bring in
//! most of its code (about 0.55 MiB each). What a mapping gives up against a copy is
//! protection from a writer changing the file in place while it is mapped; that writer would
//! need the agent's own rights, which also read the key and so forge any tag. The cache
//! itself never changes an entry in place: it writes a new file and renames it.
//!
//! Entries are keyed by the SHA-256 of the component bytes and a hash of the engine's
//! compatibility settings, so a changed component or an incompatible engine simply misses.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Bytes of the tag at the end of every entry.
const TAG_LEN: usize = 32;

/// Bytes of the cache key.
const KEY_LEN: usize = 32;

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
    /// The directory and its key; `None` when caching is off or the directory is unusable.
    store: Option<(PathBuf, [u8; KEY_LEN])>,
    engine_key: String,
}

impl ComponentCache {
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        // DefaultHasher is only stable within one build of the host, which is exactly the
        // validity of a cache entry anyway (the key also changes with wasmtime's version).
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let store = dir.and_then(|dir| match open_private(&dir) {
            Ok(key) => Some((dir, key)),
            Err(error) => {
                tracing::warn!(path = %dir.display(), %error, "compile cache disabled");
                None
            }
        });
        ComponentCache {
            store,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    /// Compiles `bytes` or loads the cached compilation. Returns whether the cache was hit.
    pub fn load(
        &self,
        engine: &Engine,
        hash: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, bool)> {
        if let Some((dir, key)) = &self.store {
            let path = dir.join(format!("{hash}-{}.cwasm", self.engine_key));
            match self.open_verified(&path, key, hash) {
                Ok(Some(file)) => {
                    // SAFETY: the file's contents carry a valid tag under the key only this
                    // host holds, so they are the unmodified output of `Component::serialize`
                    // in `store`, by an engine with the same compatibility hash (part of the
                    // name), followed by the tag (the ELF image ignores what follows its
                    // sections). The path names the verified file itself, whatever its
                    // directory entry has become since; the cache never changes or truncates
                    // an entry in place (module documentation).
                    match unsafe { Component::deserialize_file(engine, fd_path(&file)) } {
                        Ok(component) => return Ok((component, true)),
                        Err(error) => discard(&path, &error),
                    }
                }
                Ok(None) => {}
                Err(error) => discard(&path, &error),
            }
            let component = Component::from_binary(engine, bytes)?;
            if let Err(error) = self.store(&component, dir, &path, key, hash) {
                tracing::warn!(path = %path.display(), %error, "cannot write the compile cache");
            }
            return Ok((component, false));
        }
        Ok((Component::from_binary(engine, bytes)?, false))
    }

    /// The entry, open, if it exists and its tag verifies; `Ok(None)` when there is none.
    /// The contents are read through a small buffer to check the tag, never held whole.
    fn open_verified(
        &self,
        path: &Path,
        key: &[u8; KEY_LEN],
        hash: &str,
    ) -> std::io::Result<Option<File>> {
        let mut file = match open_nofollow(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        check_private(&meta, false)?;
        let code_len = meta
            .len()
            .checked_sub(TAG_LEN as u64)
            .ok_or_else(|| std::io::Error::other("the entry is truncated"))?;
        let mut mac = Hmac::new(key);
        mac.update(self.engine_key.as_bytes());
        mac.update(b"/");
        mac.update(hash.as_bytes());
        mac.update(b"/");
        let mut buf = vec![0u8; 64 << 10];
        let mut left = code_len;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            file.read_exact(&mut buf[..want])?;
            mac.update(&buf[..want]);
            left -= want as u64;
        }
        let mut tag = [0u8; TAG_LEN];
        file.read_exact(&mut tag)?;
        let expected = mac.finish();
        // Constant time: the comparison must not tell a forger how much of a tag was right.
        let diff = tag
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(std::io::Error::other(
                "the entry's tag does not verify (not written by this host, or changed)",
            ));
        }
        Ok(Some(file))
    }

    fn store(
        &self,
        component: &Component,
        dir: &Path,
        path: &Path,
        key: &[u8; KEY_LEN],
        hash: &str,
    ) -> std::io::Result<()> {
        let code = component
            .serialize()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let tag = self.tag(key, hash, &code);
        // A random name, created exclusively with mode 0600; the rename replaces anything
        // planted at the entry's name rather than following it.
        let mut tmp = tempfile::Builder::new()
            .prefix(".entry-")
            .suffix(".tmp")
            .permissions(std::fs::Permissions::from_mode(0o600))
            .tempfile_in(dir)?;
        tmp.write_all(&code)?;
        tmp.write_all(&tag)?;
        tmp.as_file().sync_data()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }

    fn tag(&self, key: &[u8; KEY_LEN], hash: &str, code: &[u8]) -> [u8; TAG_LEN] {
        hmac_sha256(
            key,
            &[
                self.engine_key.as_bytes(),
                b"/",
                hash.as_bytes(),
                b"/",
                code,
            ],
        )
    }
}

fn discard(path: &Path, error: &dyn std::fmt::Display) {
    tracing::warn!(path = %path.display(), %error, "discarding a compile-cache entry");
    let _ = std::fs::remove_file(path);
}

/// HMAC (RFC 2104) over SHA-256 of the concatenated `parts`.
fn hmac_sha256(key: &[u8; KEY_LEN], parts: &[&[u8]]) -> [u8; TAG_LEN] {
    let mut mac = Hmac::new(key);
    for part in parts {
        mac.update(part);
    }
    mac.finish()
}

/// HMAC (RFC 2104) over SHA-256, fed piece by piece.
struct Hmac {
    inner: Sha256,
    outer_pad: [u8; 64],
}

impl Hmac {
    fn new(key: &[u8; KEY_LEN]) -> Hmac {
        let mut inner_pad = [0x36u8; 64];
        let mut outer_pad = [0x5cu8; 64];
        for (i, byte) in key.iter().enumerate() {
            inner_pad[i] ^= byte;
            outer_pad[i] ^= byte;
        }
        let mut inner = Sha256::new();
        inner.update(inner_pad);
        Hmac { inner, outer_pad }
    }

    fn update(&mut self, part: &[u8]) {
        self.inner.update(part);
    }

    fn finish(self) -> [u8; TAG_LEN] {
        let mut outer = Sha256::new();
        outer.update(self.outer_pad);
        outer.update(self.inner.finalize());
        outer.finalize().into()
    }
}

/// The path that opens `file` itself, whatever has become of the name it was opened by.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

fn open_nofollow(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses anything not owned by this user or readable or writable by others.
fn check_private(meta: &std::fs::Metadata, dir: bool) -> std::io::Result<()> {
    let what = if dir { "directory" } else { "file" };
    if meta.uid() != effective_uid() {
        return Err(std::io::Error::other(format!(
            "the {what} belongs to user {}, not to this user",
            meta.uid()
        )));
    }
    if (dir && !meta.is_dir()) || (!dir && !meta.is_file()) {
        return Err(std::io::Error::other(format!("not a plain {what}")));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "the {what} is accessible to other users (mode {:o})",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

/// Creates (or checks and narrows) the private cache directory and returns its key.
fn open_private(dir: &Path) -> std::io::Result<[u8; KEY_LEN]> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Err(std::io::Error::other(
            "the cache directory is a symbolic link",
        ));
    }
    if meta.uid() != effective_uid() {
        return Err(std::io::Error::other(format!(
            "the cache directory belongs to user {}, not to this user",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    check_private(&std::fs::symlink_metadata(dir)?, true)?;
    let mut key_path = dir.as_os_str().to_owned();
    key_path.push(".key");
    read_or_create_key(Path::new(&key_path))
}

fn read_or_create_key(path: &Path) -> std::io::Result<[u8; KEY_LEN]> {
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    match created {
        Ok(mut file) => {
            let mut key = [0u8; KEY_LEN];
            File::open("/dev/urandom")?.read_exact(&mut key)?;
            file.write_all(&key)?;
            file.sync_all()?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut file = open_nofollow(path)?;
            check_private(&file.metadata()?, false)
                .map_err(|e| std::io::Error::other(format!("key file {}: {e}", path.display())))?;
            let mut key = [0u8; KEY_LEN];
            file.read_exact(&mut key)?;
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2_shape() {
        // RFC 4231 test case 2 uses a 4-byte key; zero-padding it to 32 bytes is the same
        // HMAC key, since keys shorter than the block are zero-padded anyway.
        let mut key = [0u8; KEY_LEN];
        key[..4].copy_from_slice(b"Jefe");
        let tag = hmac_sha256(&key, &[b"what do ya want ", b"for nothing?"]);
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
