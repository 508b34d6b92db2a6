//! Read-only host files for collector plugins: the host side of `cc:fleet/files`.
//!
//! A plugin names what it may read in `capabilities.read-files`: exact paths or patterns in
//! which `*` matches within one name and a whole `**` component matches any depth
//! (`/sys/class/hwmon/**`). The host resolves every request itself, so no grant can reach
//! the agent's own process:
//!
//! - a path must be absolute and plain: no `.` or `..` components, no NUL, at most
//!   [`MAX_PATH`] bytes;
//! - the per-process entries of `/proc` (`/proc/self`, `/proc/thread-self`, `/proc/<pid>`
//!   for every process and every thread), the kernel's memory and log files in `/proc` and
//!   all of `/dev` are refused whatever the grant (`denied`);
//! - symbolic links are resolved on the host and the result checked again: it must stay
//!   under the file root, in the same top-level tree as the path asked for (`/sys` stays in
//!   `/sys`), and must not be refused. The one per-process place reachable is the network
//!   view behind `/proc/net` (`/proc/<pid>/net/...`), and only through `/proc/net`;
//! - the file is opened without blocking and checked to be a regular file (or a directory,
//!   for listing). Where the kernel has `openat2(2)` the path is resolved and opened in one
//!   call beneath a cached descriptor of its top-level directory (`RESOLVE_BENEATH`: no link
//!   leaves the tree; `RESOLVE_NO_MAGICLINKS`: no `/proc/<pid>/fd`-style jumps), and the
//!   opened descriptor's own path is checked as above before a byte is read (opening a file
//!   of `/proc` or `/sys` has no effect by itself). A path is first opened that way without
//!   following any link (`RESOLVE_NO_SYMLINKS`): then it is the very path asked for, checked
//!   already, and is not read back; only a path that meets a link is opened again following
//!   it, and remembered so the next round does that at once. The root and its top-level
//!   names are opened afresh beneath the root's descriptor, never through a link. Where the
//!   kernel has no `openat2`, or for anything that call refuses, the path is resolved on
//!   the host first, opened without following links,
//!   and the descriptor checked to be that very file (a link swapped in between is caught);
//! - the files the agent keeps its own secrets in (token file, NATS credentials, its
//!   configuration, the compile cache's key: [`crate::RuntimeOptions::secret_files`]) are
//!   refused whatever the grant, matched by resolved path and by inode (a hard link is
//!   caught), and so is everything below a secret directory;
//! - at most `limits.max-file-bytes` bytes are returned;
//! - a file of `/proc` or `/sys` stays open after its first read and is read again from its
//!   start at the next ([`super::held`]): the checks above run at every read all the same,
//!   only the open is spared.
//!
//! `capabilities.files-root` (default `/`) puts the whole view under another directory, for
//! fixtures: the plugin still asks for `/proc/stat` and gets `<root>/proc/stat`.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ccfleet::untrusted::Untrusted;

use super::held::{HeldFiles, Reread, may_hold, read_from_start};

pub use super::bindings::cc::fleet::files::FsStats;

/// The longest path a plugin may ask for, in bytes.
pub const MAX_PATH: usize = 4096;

/// The most names one `list` returns.
pub const MAX_LIST_ENTRIES: usize = 65_536;

mod beneath;
mod pattern;
mod secret_ids;
#[cfg(test)]
mod tests;

use beneath::{
    Beneath, MAX_LINKED_HINTS, OPENAT2, Trees, dir_names, fd_path, kernel_fs_dev, openat2,
    path_names,
};
use pattern::plain_components;
use secret_ids::SecretIds;

pub use pattern::Pattern;
pub(crate) use pattern::{denied, glob};

/// The files one plugin may read.
#[derive(Debug, Clone)]
pub struct FileGrants {
    patterns: Vec<Pattern>,
    root: PathBuf,
    max_bytes: usize,
    secrets: Arc<[PathBuf]>,
    secret_ids: Arc<Mutex<SecretIds>>,
    trees: Arc<Mutex<Trees>>,
    /// `capabilities.mount-info`: see [`super::mounts`].
    mounts: Option<super::mounts::MountInfo>,
    /// Kernel files kept open from read to read: see [`super::held`].
    held: Arc<Mutex<HeldFiles>>,
}

/// What an opened path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    /// A file or a directory named by a grant (for `statvfs`).
    Either,
}

impl FileGrants {
    /// Grants `patterns` under `root` (canonicalized here; `/` when `None`), returning at
    /// most `max_bytes` per file.
    pub fn new(
        patterns: &[String],
        root: Option<&Path>,
        max_bytes: usize,
    ) -> Result<FileGrants, String> {
        let patterns = patterns
            .iter()
            .map(|p| Pattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let root = root.unwrap_or(Path::new("/"));
        let root = std::fs::canonicalize(root)
            .map_err(|e| format!("files-root {}: {e}", root.display()))?;
        let names = path_names(&root)
            .ok_or_else(|| format!("files-root {} is not UTF-8", root.display()))?;
        if matches!(names.first(), Some(&("proc" | "sys" | "dev"))) {
            return Err(format!(
                "files-root {} lies in /proc, /sys or /dev; give a directory of fixtures",
                root.display()
            ));
        }
        Ok(FileGrants {
            patterns,
            root,
            max_bytes,
            secrets: Arc::from(Vec::new()),
            secret_ids: Arc::default(),
            trees: Arc::default(),
            mounts: None,
            held: Arc::default(),
        })
    }

    /// Adds the mount-info grant ([`super::mounts`]).
    pub fn with_mount_info(mut self) -> FileGrants {
        self.mounts = Some(super::mounts::MountInfo::new(
            self.root.clone(),
            self.max_bytes,
        ));
        self
    }

    /// Refuses `secrets` (host paths, files or directories) whatever the grant.
    pub fn with_secrets(mut self, secrets: Arc<[PathBuf]>) -> FileGrants {
        self.secrets = secrets;
        self
    }

    /// Starts a plugin call: the secrets are looked up again at the call's first read, since
    /// a token file may be replaced between calls (and may not exist yet when the agent
    /// starts).
    pub fn begin_call(&self) {
        if !self.secrets.is_empty() {
            self.secret_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .current = false;
        }
    }

    /// Whether the opened file (resolved to `real`) is one of the agent's secrets: the same
    /// path, below a secret directory, or the same inode, as the secrets were at the call's
    /// first read ([`FileGrants::begin_call`]).
    ///
    /// A secret that is a file is caught by its inode alone (the same path is the same
    /// inode); only a secret directory needs its resolved path, to catch what lies below it.
    /// A secret that does not exist cannot be the opened file; its path as given is still
    /// compared.
    fn is_secret(&self, real: &Path, opened: &std::fs::Metadata) -> bool {
        if self.secrets.is_empty() {
            return false;
        }
        if self.secrets.iter().any(|secret| real.starts_with(secret)) {
            return true;
        }
        // Most reads are of `/proc` and `/sys`: no secret to look up for them.
        if self.on_kernel_fs(opened) {
            return false;
        }
        let mut ids = self.secret_ids.lock().unwrap_or_else(|e| e.into_inner());
        if !ids.current {
            ids.look_up(&self.secrets);
        }
        ids.inodes.contains(&(opened.dev(), opened.ino()))
            || ids.dirs.iter().any(|dir| real.starts_with(dir))
    }

    /// Whether the opened file is on the `proc` or `sysfs` file system of a top-level tree.
    fn on_kernel_fs(&self, opened: &std::fs::Metadata) -> bool {
        let trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        trees.kernel_devs.contains(&opened.dev())
    }

    /// How often the secrets were looked up so far.
    #[cfg(test)]
    fn secret_lookups(&self) -> u64 {
        self.secret_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lookups
    }

    /// Nothing granted.
    pub fn none() -> FileGrants {
        FileGrants {
            patterns: Vec::new(),
            root: PathBuf::from("/"),
            max_bytes: 0,
            secrets: Arc::from(Vec::new()),
            secret_ids: Arc::default(),
            trees: Arc::default(),
            mounts: None,
            held: Arc::default(),
        }
    }

    /// Reads a whole granted file. The error is the message the plugin sees.
    pub fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        if let Some(mounts) = &self.mounts
            && let Some(name) = super::mounts::MountInfo::served(path)
        {
            return mounts.read(path, name);
        }
        let names = self.check(path, Kind::File)?;
        // The limit and one more byte, to tell a file of exactly the limit from a larger one.
        let limit = self.max_bytes.saturating_add(1);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = match held.reread(path, limit) {
            Reread::Read(bytes) => bytes,
            Reread::Open => {
                let (file, meta, real) = self.open(path, &names, Kind::File)?;
                // /proc files report no size and /sys files a page: a page to start with.
                let hint = usize::try_from(meta.len()).unwrap_or(usize::MAX);
                let bytes = read_from_start(&file, hint, limit)
                    .map_err(|e| format!("{}: {e}", Untrusted(path)))?;
                if self.on_kernel_fs(&meta)
                    && real
                        .strip_prefix(&self.root)
                        .ok()
                        .and_then(path_names)
                        .is_some_and(|names| may_hold(&names))
                {
                    held.hold(path, file, bytes.len());
                }
                bytes
            }
        };
        drop(held);
        if bytes.len() > self.max_bytes {
            return Err(format!(
                "{} is larger than this plugin's limit of {} bytes",
                Untrusted(path),
                self.max_bytes
            ));
        }
        Ok(bytes)
    }

    /// `statvfs(3)` of the file system holding a granted file or directory (named by a grant
    /// itself, as for [`FileGrants::read`]), e.g. a mount point.
    pub fn statvfs(&self, path: &str) -> Result<FsStats, String> {
        let names = self.check(path, Kind::Either)?;
        let (file, _, _) = self.open(path, &names, Kind::Either)?;
        let mut stats = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: the descriptor is open for the call and `stats` is writable memory of the
        // type fstatvfs fills.
        let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), stats.as_mut_ptr()) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            return Err(format!("{}: {error}", Untrusted(path)));
        }
        // SAFETY: fstatvfs succeeded, so it initialized the struct.
        let stats = unsafe { stats.assume_init() };
        // The counts are in units of the fragment size; some file systems report 0 there.
        // (The casts are no-ops on 64-bit targets; the fields are narrower on 32-bit ones.)
        let block_size = if stats.f_frsize != 0 {
            stats.f_frsize
        } else {
            stats.f_bsize
        };
        #[allow(clippy::unnecessary_cast)]
        let result = FsStats {
            block_size: block_size as u64,
            blocks: stats.f_blocks as u64,
            blocks_free: stats.f_bfree as u64,
            blocks_available: stats.f_bavail as u64,
            files: stats.f_files as u64,
            files_free: stats.f_ffree as u64,
        };
        Ok(result)
    }

    /// The names in a directory that are granted or lead to granted files, sorted.
    pub fn list(&self, path: &str) -> Result<Vec<String>, String> {
        let names = self.check(path, Kind::Dir)?;
        let (dir, _, _) = self.open(path, &names, Kind::Dir)?;
        let entries = dir_names(&dir).map_err(|e| format!("{}: {e}", Untrusted(path)))?;
        let mut out = Vec::new();
        for entry in entries {
            let Ok(name) = entry.into_string() else {
                continue;
            };
            let mut child = names.clone();
            child.push(&name);
            let visible = denied(&child, false).is_none()
                && self
                    .patterns
                    .iter()
                    .any(|p| p.matches(&child) || p.leads_below(&child));
            drop(child);
            if visible {
                if out.len() == MAX_LIST_ENTRIES {
                    return Err(format!(
                        "{} holds more than {MAX_LIST_ENTRIES} entries",
                        Untrusted(path)
                    ));
                }
                out.push(name);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Checks the path as asked for: plain, not refused, granted.
    fn check<'p>(&self, path: &'p str, kind: Kind) -> Result<Vec<&'p str>, String> {
        let names = plain_components(path).map_err(|why| format!("{}: {why}", Untrusted(path)))?;
        if let Some(why) = denied(&names, false) {
            return Err(format!("{}: {why}", Untrusted(path)));
        }
        let granted = self.patterns.iter().any(|p| match kind {
            Kind::File | Kind::Either => p.matches(&names),
            Kind::Dir => p.leads_below(&names),
        }) || (kind == Kind::Either
            && self.mounts.as_ref().is_some_and(|m| m.is_mount_point(path)));
        if !granted {
            return Err(format!(
                "{} is not granted to this plugin (capabilities.read-files)",
                Untrusted(path)
            ));
        }
        Ok(names)
    }

    /// Opens the path under the root where it really leads, once that is checked: the file,
    /// what it is and the host path it really is.
    fn open(
        &self,
        path: &str,
        names: &[&str],
        kind: Kind,
    ) -> Result<(File, std::fs::Metadata, PathBuf), String> {
        let fail = |why: &dyn std::fmt::Display| format!("{}: {why}", Untrusted(path));
        let (file, real) = match self.open_beneath(names, kind) {
            // No link on the way: the file is where the names say, and they were checked.
            Beneath::Plain(file, real) => (file, real),
            Beneath::Opened(file, real) => {
                // Checked before anything is read; dropping the file closes it.
                self.check_real(names, &real).map_err(|why| fail(&why))?;
                (file, real)
            }
            Beneath::Missing(e) => return Err(fail(&e)),
            Beneath::Elsewhere => self.open_resolved(names, kind).map_err(|why| fail(&why))?,
        };
        let meta = file.metadata().map_err(|e| fail(&e))?;
        if self.is_secret(&real, &meta) {
            return Err(fail(
                &"holds the agent's own secrets and is never readable by plugins",
            ));
        }
        match kind {
            Kind::File if !meta.is_file() => Err(fail(&"is not a regular file")),
            Kind::Dir if !meta.is_dir() => Err(fail(&"is not a directory")),
            Kind::Either if !meta.is_dir() && !meta.is_file() => {
                Err(fail(&"is neither a regular file nor a directory"))
            }
            _ => Ok((file, meta, real)),
        }
    }

    /// Checks where a path asked for as `names` really leads (`real`, a host path): under
    /// the root, in the same top-level tree, not refused.
    fn check_real(&self, names: &[&str], real: &Path) -> Result<(), String> {
        let inside = real
            .strip_prefix(&self.root)
            .map_err(|_| "leads outside the plugin's file root".to_owned())?;
        let real_names =
            path_names(inside).ok_or_else(|| "leads to a name that is not UTF-8".to_owned())?;
        if real_names.first() != names.first() {
            return Err(format!(
                "leads outside /{}",
                names.first().copied().unwrap_or_default()
            ));
        }
        let via_proc_net = names.starts_with(&["proc", "net"]);
        if let Some(why) = denied(&real_names, via_proc_net) {
            return Err(why.to_owned());
        }
        if self.root != Path::new("/")
            && let Some(why) = path_names(real).and_then(|all| denied(&all, false))
        {
            return Err(why.to_owned());
        }
        Ok(())
    }

    /// Resolves and opens the path in one `openat2` call beneath its top-level directory
    /// (the root and top-level names: see [`FileGrants::open_top`]).
    ///
    /// A path without symbolic links (most of `/proc` and `/sys/devices`) is opened with
    /// `RESOLVE_NO_SYMLINKS`: the kernel then walked exactly the names asked for, so the file
    /// is where the path says and the descriptor's path need not be read back (a `readlink`
    /// of `/proc/self/fd/N`, the dearest part of a read). Where a link is met (`ELOOP`), the
    /// path is opened again following links beneath the tree, and the descriptor's real path
    /// is read back and checked; the path is remembered, so the next round opens it that way
    /// at once.
    #[cfg(target_os = "linux")]
    fn open_beneath(&self, names: &[&str], kind: Kind) -> Beneath {
        if !OPENAT2.load(Ordering::Relaxed) {
            return Beneath::Elsewhere;
        }
        let mut flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
        if kind == Kind::Dir {
            flags |= libc::O_DIRECTORY;
        }
        let [top, rest @ ..] = names else {
            return self.open_top(names, flags);
        };
        if rest.is_empty() {
            return self.open_top(names, flags);
        }
        let Some(tree) = self.tree(top) else {
            return Beneath::Elsewhere;
        };
        // The names are plain (no NUL, no `.` or `..`): checked before.
        let path = names.join("/");
        let Ok(rest) = CString::new(&path[top.len() + 1..]) else {
            return Beneath::Elsewhere;
        };
        if !self.linked(&path) {
            let no_links = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
            match openat2(&tree, &rest, flags, no_links) {
                Ok(fd) => {
                    let mut real = self.root.clone();
                    real.extend(names);
                    return Beneath::Plain(File::from(fd), real);
                }
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => self.remember_linked(path),
                // Missing before any link was met: missing whichever way it is resolved.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Beneath::Missing(e),
                Err(e) => {
                    if e.raw_os_error() == Some(libc::ENOSYS) {
                        OPENAT2.store(false, Ordering::Relaxed);
                    }
                    return Beneath::Elsewhere;
                }
            }
        }
        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        let file = match openat2(&tree, &rest, flags, resolve) {
            Ok(fd) => File::from(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Beneath::Missing(e),
            Err(e) => {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    OPENAT2.store(false, Ordering::Relaxed);
                }
                return Beneath::Elsewhere;
            }
        };
        // Where the descriptor really is, whatever links the kernel followed.
        match std::fs::read_link(fd_path(&file)) {
            Ok(real) => Beneath::Opened(file, real),
            Err(_) => Beneath::Elsewhere,
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn open_beneath(&self, _names: &[&str], _kind: Kind) -> Beneath {
        Beneath::Elsewhere
    }

    /// The directory descriptor of the file root, opened now if it is not yet.
    #[cfg(target_os = "linux")]
    fn root_dir(&self, trees: &mut Trees) -> Option<Arc<OwnedFd>> {
        if let Some(root) = &trees.root {
            return Some(root.clone());
        }
        let path_only = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let path = CString::new(self.root.as_os_str().as_bytes()).ok()?;
        // SAFETY: a valid C string; the descriptor returned is owned below.
        let fd = unsafe { libc::open(path.as_ptr(), path_only) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let root = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        trees.root = Some(root.clone());
        Some(root)
    }

    /// Opens the file root itself (`names` empty) or one of its top-level names, beneath the
    /// root's descriptor and without following a link: a fresh open, so a file system
    /// mounted there since is the one seen (`statvfs` of a mount point). A top-level link
    /// takes the host-side way, which names where it leads.
    #[cfg(target_os = "linux")]
    fn open_top(&self, names: &[&str], flags: libc::c_int) -> Beneath {
        let root = {
            let mut trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
            self.root_dir(&mut trees)
        };
        let Some(root) = root else {
            return Beneath::Elsewhere;
        };
        let Ok(name) = CString::new(names.first().copied().unwrap_or(".")) else {
            return Beneath::Elsewhere;
        };
        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        match openat2(&root, &name, flags, resolve) {
            Ok(fd) => {
                let mut real = self.root.clone();
                real.extend(names);
                Beneath::Plain(File::from(fd), real)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Beneath::Missing(e),
            Err(e) => {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    OPENAT2.store(false, Ordering::Relaxed);
                }
                Beneath::Elsewhere
            }
        }
    }

    /// Whether `path` (`top/...` as asked for) was last reached through a link.
    #[cfg(target_os = "linux")]
    fn linked(&self, path: &str) -> bool {
        let trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        !trees.linked.is_empty() && trees.linked.contains(path)
    }

    /// Remembers that `path` is reached through a link.
    #[cfg(target_os = "linux")]
    fn remember_linked(&self, path: String) {
        let mut trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        if trees.linked.len() >= MAX_LINKED_HINTS {
            trees.linked.clear();
        }
        trees.linked.insert(path);
    }

    /// The directory descriptor of the top-level name `top` under the root, opened now if it
    /// is not yet. A top-level name that is a link or not a directory has none.
    #[cfg(target_os = "linux")]
    fn tree(&self, top: &str) -> Option<Arc<OwnedFd>> {
        let mut trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, fd)) = trees.tops.iter().find(|(name, _)| name == top) {
            return Some(fd.clone());
        }
        let path_only = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let root = self.root_dir(&mut trees)?;
        let name = CString::new(top).ok()?;
        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        let fd = match openat2(&root, &name, path_only, resolve) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    OPENAT2.store(false, Ordering::Relaxed);
                }
                return None;
            }
        };
        if let Some(dev) = kernel_fs_dev(&fd)
            && !trees.kernel_devs.contains(&dev)
        {
            trees.kernel_devs.push(dev);
        }
        trees.tops.push((top.to_owned(), fd.clone()));
        Some(fd)
    }

    /// Resolves the path on the host, checks where it leads, opens that without following
    /// links and checks the descriptor is that very file.
    fn open_resolved(&self, names: &[&str], kind: Kind) -> Result<(File, PathBuf), String> {
        let mut host = self.root.clone();
        host.extend(names);
        let real = std::fs::canonicalize(&host).map_err(|e| e.to_string())?;
        self.check_real(names, &real)?;
        // Not following a link, not blocking on a FIFO or device in a fixture directory.
        let mut flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        if kind == Kind::Dir {
            flags |= libc::O_DIRECTORY;
        }
        let mut options = std::fs::OpenOptions::new();
        options.read(true).custom_flags(flags);
        let file = options.open(&real).map_err(|e| e.to_string())?;
        // A link swapped into the path after it was resolved would have opened something
        // else: the descriptor must be the file that was checked.
        match std::fs::read_link(fd_path(&file)) {
            Ok(opened) if opened == real => Ok((file, real)),
            Ok(_) => Err("changed while it was opened".to_owned()),
            Err(e) => Err(format!("cannot verify the opened file: {e}")),
        }
    }
}
