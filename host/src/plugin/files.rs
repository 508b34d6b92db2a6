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

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ccfleet::untrusted::Untrusted;

use super::held::{HeldFiles, Reread, may_hold, read_from_start};

pub use super::bindings::cc::fleet::files::FsStats;

/// The longest path a plugin may ask for, in bytes.
pub const MAX_PATH: usize = 4096;

/// The most names one `list` returns.
pub const MAX_LIST_ENTRIES: usize = 65_536;

/// Entries of `/proc` that expose kernel memory or its layout, or consume the kernel log.
const KERNEL_ENTRIES: [&str; 7] = [
    "kallsyms",
    "kcore",
    "kmsg",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
];

/// One component of a grant pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `**`: any number of components, including none.
    Deep,
    /// A name, possibly with `*` wildcards.
    Name(String),
}

/// A parsed `capabilities.read-files` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    parts: Vec<Part>,
}

impl Pattern {
    /// Parses a pattern: absolute, plain components, `**` only as a whole component.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let names = plain_components(text)
            .map_err(|why| format!("read-files entry {}: {why}", Untrusted(text)))?;
        let mut parts = Vec::with_capacity(names.len());
        for name in names {
            if name == "**" {
                parts.push(Part::Deep);
            } else if name.contains("**") {
                return Err(format!(
                    "read-files entry {}: `**` must be a whole path component",
                    Untrusted(text)
                ));
            } else {
                parts.push(Part::Name(name.to_owned()));
            }
        }
        // A pattern without wildcards that is refused anyway is a configuration mistake.
        if parts
            .iter()
            .all(|p| matches!(p, Part::Name(n) if !n.contains('*')))
        {
            let names: Vec<&str> = parts
                .iter()
                .map(|p| match p {
                    Part::Name(n) => n.as_str(),
                    Part::Deep => "**",
                })
                .collect();
            if let Some(why) = denied(&names, false) {
                return Err(format!("read-files entry {}: {why}", Untrusted(text)));
            }
        }
        Ok(Pattern { parts })
    }

    /// Whether the pattern matches the whole path.
    fn matches(&self, path: &[&str]) -> bool {
        match_parts(&self.parts, path, false)
    }

    /// Whether the pattern matches something strictly below the directory `path`.
    fn leads_below(&self, path: &[&str]) -> bool {
        match_parts(&self.parts, path, true)
    }
}

fn match_parts(parts: &[Part], path: &[&str], below: bool) -> bool {
    match (parts.split_first(), path.split_first()) {
        // The path is used up: a file matches if only `**` remain; a directory leads to
        // matches if anything remains.
        (None, None) => !below,
        (Some(_), None) => below || parts.iter().all(|p| *p == Part::Deep),
        (None, Some(_)) => false,
        (Some((Part::Deep, rest)), Some((_, tail))) => {
            match_parts(rest, path, below) || match_parts(parts, tail, below)
        }
        (Some((Part::Name(name), rest)), Some((head, tail))) => {
            glob(name, head) && match_parts(rest, tail, below)
        }
    }
}

/// `*` matches any run of characters within one name.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The components of an absolute, plain path; empty components (`//`, a trailing `/`) are
/// skipped.
fn plain_components(path: &str) -> Result<Vec<&str>, &'static str> {
    if path.len() > MAX_PATH {
        return Err("the path is too long");
    }
    if path.contains('\0') {
        return Err("the path contains NUL");
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err("the path must be absolute");
    };
    let mut names = Vec::new();
    for name in rest.split('/') {
        match name {
            "" => {}
            "." | ".." => return Err("`.` and `..` are not allowed in paths"),
            name => names.push(name),
        }
    }
    Ok(names)
}

/// Why a path (as components under the file root) is never readable, if it is not.
/// `via_proc_net` admits the per-process network view that `/proc/net` links to.
pub(crate) fn denied(path: &[&str], via_proc_net: bool) -> Option<&'static str> {
    match path {
        ["dev", ..] => Some("device files are never readable by plugins"),
        ["proc", entry, rest @ ..] => {
            let per_process = *entry == "self"
                || *entry == "thread-self"
                || (!entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()));
            if per_process {
                if via_proc_net && rest.first() == Some(&"net") {
                    None
                } else {
                    Some("the per-process entries of /proc are never readable by plugins")
                }
            } else if KERNEL_ENTRIES.contains(entry) {
                Some("kernel memory and log entries of /proc are never readable by plugins")
            } else {
                None
            }
        }
        _ => None,
    }
}

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

/// What the agent's secrets are on disk, looked up once per plugin call
/// ([`FileGrants::begin_call`]) rather than at every read: a collector reads tens of files
/// per call, and a `stat` of every secret file for each was a visible part of a small
/// collector's call.
#[derive(Debug, Default)]
struct SecretIds {
    /// Whether the lookup is of the current call.
    current: bool,
    /// Device and inode of every secret that exists.
    inodes: Vec<(u64, u64)>,
    /// The resolved paths of the secrets that are directories.
    dirs: Vec<PathBuf>,
    /// How often the secrets were looked up (for the tests).
    lookups: u64,
}

impl SecretIds {
    fn look_up(&mut self, secrets: &[PathBuf]) {
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

/// Directory descriptors (`O_PATH`) of the file root and of its top-level directories
/// (`proc`, `sys`, ...), opened on first use: every later read resolves beneath one of them
/// in a single `openat2` call. Only directories that opened are kept.
#[derive(Debug, Default)]
struct Trees {
    root: Option<Arc<OwnedFd>>,
    tops: Vec<(String, Arc<OwnedFd>)>,
    /// Paths (`top/...`, as asked for) that went through a symbolic link last time: they are
    /// opened following links straight away rather than first tried without. Only a hint
    /// for which way to try first; both ways are checked.
    linked: HashSet<String>,
    /// The devices of the top-level trees that are the kernel's own file systems (`proc`,
    /// `sysfs`): nobody can create a file there, so a file opened on one of them is never
    /// one of the agent's secrets. The trees' descriptors hold those file systems, so the
    /// numbers cannot pass to another file system while they are kept.
    kernel_devs: Vec<u64>,
}

/// The most paths [`Trees::linked`] remembers; it starts over when full.
const MAX_LINKED_HINTS: usize = 4096;

/// Cleared when the kernel turns out not to have `openat2` (before Linux 5.6).
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// How a resolution through `openat2` ended.
enum Beneath {
    /// Opened without following a link: the file and its path under the root, which is the
    /// path asked for (already checked).
    Plain(File, PathBuf),
    /// Opened following links: the file and the path it really is, still to be checked.
    Opened(File, PathBuf),
    /// The file does not exist (reported as is, as the host-side resolution would).
    Missing(std::io::Error),
    /// Not resolved this way (no `openat2`, a link leaving the tree, a top-level name that
    /// is a link, ...): the host-side resolution decides, and names the reason.
    Elsewhere,
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

/// The device of the directory `dir` when it is the root or any directory of a `proc` or
/// `sysfs` file system.
#[cfg(target_os = "linux")]
#[allow(clippy::unnecessary_cast)] // `f_type`'s type differs between architectures.
fn kernel_fs_dev(dir: &OwnedFd) -> Option<u64> {
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: the descriptor is open and `fs` is writable memory of the type fstatfs fills.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), fs.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstatfs succeeded, so it initialized the struct.
    let kind = unsafe { fs.assume_init() }.f_type as i64;
    if kind != PROC_SUPER_MAGIC && kind != SYSFS_MAGIC {
        return None;
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: as above, for fstat.
    if unsafe { libc::fstat(dir.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded.
    Some(unsafe { st.assume_init() }.st_dev)
}

/// `openat2(2)`: opens `path` relative to `dir` with `flags`, resolving under `resolve`.
#[cfg(target_os = "linux")]
fn openat2(
    dir: &OwnedFd,
    path: &CStr,
    flags: libc::c_int,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    // SAFETY: `open_how` is plain data; all-zero is its neutral value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: a valid directory descriptor, a valid C string, and `how` lives for the call
    // with its size passed along.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the call returned a new descriptor that nothing else owns (the cast cannot
    // truncate: descriptors are ints).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The names in an open directory, read from its descriptor (`.` and `..` left out).
fn dir_names(dir: &File) -> std::io::Result<Vec<OsString>> {
    // The stream takes a descriptor of its own, closed with it.
    // SAFETY: duplicating an open descriptor.
    let fd = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is an open directory descriptor that the stream takes over.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let error = std::io::Error::last_os_error();
        // SAFETY: the stream did not take the descriptor.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    let mut names = Vec::new();
    let result = loop {
        // readdir reports an error only through errno, and the end of the stream by NULL.
        // SAFETY: errno is this thread's; the stream is open.
        let entry = unsafe {
            *libc::__errno_location() = 0;
            libc::readdir(stream)
        };
        if entry.is_null() {
            let error = std::io::Error::last_os_error();
            break match error.raw_os_error() {
                Some(0) | None => Ok(()),
                Some(_) => Err(error),
            };
        }
        // SAFETY: a non-NULL entry holds a NUL-terminated name until the next readdir.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    };
    // SAFETY: the stream is open and closed once, with its descriptor.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
}

/// The `/proc/self/fd` entry of an open file: the file itself, whatever its path is now.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The normal components of a path as UTF-8 names; `None` when one is not UTF-8.
fn path_names(path: &Path) -> Option<Vec<&str>> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_str()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> Pattern {
        Pattern::parse(text).unwrap()
    }

    fn names(path: &str) -> Vec<&str> {
        plain_components(path).unwrap()
    }

    #[test]
    fn patterns_match_names_globs_and_any_depth() {
        let hwmon = pattern("/sys/class/hwmon/**");
        assert!(hwmon.matches(&names("/sys/class/hwmon/hwmon0/temp1_input")));
        assert!(hwmon.leads_below(&names("/sys/class/hwmon")));
        assert!(hwmon.leads_below(&names("/sys")));
        assert!(!hwmon.matches(&names("/sys/class/net/eth0")));
        let cpu = pattern("/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq");
        assert!(cpu.matches(&names(
            "/sys/devices/system/cpu/cpu12/cpufreq/scaling_cur_freq"
        )));
        assert!(!cpu.matches(&names("/sys/devices/system/cpu/online")));
        assert!(cpu.leads_below(&names("/sys/devices/system/cpu/cpu3")));
        let exact = pattern("/proc/loadavg");
        assert!(exact.matches(&names("//proc//loadavg/")));
        assert!(!exact.matches(&names("/proc")));
        assert!(exact.leads_below(&names("/proc")));
        assert!(!exact.leads_below(&names("/proc/loadavg")));
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxbyy") && glob("*", ""));
    }

    #[test]
    fn paths_with_dot_dot_or_relative_or_nul_are_refused() {
        for bad in [
            "proc/stat",
            "/proc/../etc/passwd",
            "/proc/./stat",
            "/proc/st\0at",
        ] {
            assert!(plain_components(bad).is_err(), "{bad:?}");
        }
        assert!(plain_components(&format!("/{}", "a".repeat(MAX_PATH))).is_err());
    }

    #[test]
    fn per_process_and_kernel_entries_are_denied_whatever_the_grant() {
        for path in [
            "/proc/self/environ",
            "/proc/thread-self/environ",
            "/proc/1/mem",
            "/proc/123/task/124/environ",
            "/proc/kcore",
            "/proc/kallsyms",
            "/dev/mem",
        ] {
            assert!(denied(&names(path), false).is_some(), "{path}");
        }
        for path in [
            "/proc/stat",
            "/proc/net/dev",
            "/sys/class/hwmon",
            "/proc/sys/kernel/hostname",
        ] {
            assert!(denied(&names(path), false).is_none(), "{path}");
        }
        // The network view is admitted only when asked for through /proc/net.
        assert!(denied(&names("/proc/77/net/dev"), true).is_none());
        assert!(denied(&names("/proc/77/environ"), true).is_some());
        assert!(denied(&names("/proc/77/net/dev"), false).is_some());
        // A grant naming a refused entry outright is a configuration error.
        let err = Pattern::parse("/proc/self/environ").unwrap_err();
        assert!(err.contains("per-process"), "{err}");
        assert!(Pattern::parse("/proc/a**").is_err());
    }

    #[test]
    fn secrets_are_refused_by_inode_through_links_and_below_a_secret_directory() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir_all(at("keys")).unwrap();
        std::fs::write(at("keys/inner.key"), "k").unwrap();
        std::fs::write(at("token"), "t").unwrap();
        std::fs::write(at("other"), "fine").unwrap();
        std::fs::hard_link(at("token"), at("innocent")).unwrap();
        std::os::unix::fs::symlink("keys", at("keys-link")).unwrap();
        // The secrets as the agent may be told them: a file, and a directory through a link.
        let secrets: Arc<[PathBuf]> = Arc::from(vec![at("token"), at("keys-link")]);
        let grants = FileGrants::new(&["/**".to_owned()], Some(root.path()), 1 << 20)
            .unwrap()
            .with_secrets(secrets);
        for path in ["/token", "/innocent", "/keys/inner.key"] {
            let err = grants.read(path).unwrap_err();
            assert!(err.contains("agent's own secrets"), "{path}: {err}");
        }
        assert_eq!(grants.read("/other").unwrap(), b"fine");
        // A replaced token file is caught by the next call: secrets are looked up once per
        // call.
        std::fs::remove_file(at("token")).unwrap();
        std::fs::rename(at("other"), at("token")).unwrap();
        grants.begin_call();
        assert!(grants.read("/innocent").is_ok());
        assert!(grants.read("/token").is_err());
    }

    #[test]
    fn files_of_proc_and_sys_need_no_secret_lookup_and_other_files_still_do() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        let granted = [
            "/proc/loadavg".to_owned(),
            "/sys/kernel/mm/transparent_hugepage/enabled".to_owned(),
            format!("{}/**", dir.path().display()),
        ];
        let grants = FileGrants::new(&granted, None, 1 << 20)
            .unwrap()
            .with_secrets(Arc::from(vec![token.clone()]));
        for _ in 0..3 {
            grants.begin_call();
            assert!(grants.read("/proc/loadavg").is_ok());
        }
        if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            grants.begin_call();
            assert!(
                grants
                    .read("/sys/kernel/mm/transparent_hugepage/enabled")
                    .is_ok()
            );
        }
        assert_eq!(grants.secret_lookups(), 0, "looked up for kernel files");
        // A file elsewhere is checked against the secrets as they are now.
        let other = dir.path().join("other");
        std::fs::write(&other, "fine").unwrap();
        grants.begin_call();
        assert!(grants.read(other.to_str().unwrap()).is_ok());
        assert_eq!(grants.secret_lookups(), 1);
        std::fs::hard_link(&token, dir.path().join("innocent")).unwrap();
        let err = grants
            .read(dir.path().join("innocent").to_str().unwrap())
            .unwrap_err();
        assert!(err.contains("agent's own secrets"), "{err}");
    }

    #[test]
    fn a_link_leaving_its_top_level_tree_is_refused_whichever_way_it_is_resolved() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir_all(at("sys/devices/hwmon0")).unwrap();
        std::fs::create_dir_all(at("sys/class/hwmon")).unwrap();
        std::fs::create_dir_all(at("etc")).unwrap();
        std::fs::write(at("sys/devices/hwmon0/temp1_input"), "41000\n").unwrap();
        std::fs::write(at("etc/shadow"), "x").unwrap();
        std::os::unix::fs::symlink("../../devices/hwmon0", at("sys/class/hwmon/hwmon0")).unwrap();
        std::os::unix::fs::symlink("../../../etc", at("sys/class/hwmon/hwmon1")).unwrap();
        let absolute = at("sys/devices/hwmon0");
        std::os::unix::fs::symlink(&absolute, at("sys/class/hwmon/hwmon2")).unwrap();
        let grants = FileGrants::new(&["/sys/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
        // A relative link within /sys is followed, for reading and for listing.
        let path = "/sys/class/hwmon/hwmon0/temp1_input";
        assert_eq!(grants.read(path).unwrap(), b"41000\n");
        assert_eq!(
            grants.list("/sys/class/hwmon/hwmon0").unwrap(),
            ["temp1_input"]
        );
        assert_eq!(
            grants.list("/sys/class/hwmon").unwrap(),
            ["hwmon0", "hwmon1", "hwmon2"]
        );
        // One out of /sys is not.
        let err = grants.read("/sys/class/hwmon/hwmon1/shadow").unwrap_err();
        assert!(err.contains("leads outside /sys"), "{err}");
        // An absolute link (which `openat2` beneath /sys refuses to follow) is resolved on
        // the host instead, and is served as it leads into /sys.
        let path = "/sys/class/hwmon/hwmon2/temp1_input";
        assert_eq!(grants.read(path).unwrap(), b"41000\n");
        // A missing file is reported as missing.
        let err = grants
            .read("/sys/class/hwmon/hwmon0/temp1_label")
            .unwrap_err();
        assert!(err.contains("No such file"), "{err}");
    }

    #[test]
    fn a_plain_path_that_turns_into_a_link_is_checked_where_it_leads_at_the_next_read() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir_all(at("sys/devices/hwmon0")).unwrap();
        std::fs::create_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
        std::fs::create_dir_all(at("etc")).unwrap();
        std::fs::write(at("sys/devices/hwmon0/temp1_input"), "41000\n").unwrap();
        std::fs::write(at("sys/class/hwmon/hwmon0/temp1_input"), "1\n").unwrap();
        std::fs::write(at("etc/temp1_input"), "outside").unwrap();
        let grants = FileGrants::new(&["/sys/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
        let path = "/sys/class/hwmon/hwmon0/temp1_input";
        // Read without a link on the way, twice (the second read takes the same way).
        assert_eq!(grants.read(path).unwrap(), b"1\n");
        assert_eq!(grants.read(path).unwrap(), b"1\n");
        // The directory becomes a link out of /sys: refused, not read the way it was.
        std::fs::remove_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
        std::os::unix::fs::symlink("../../../etc", at("sys/class/hwmon/hwmon0")).unwrap();
        let err = grants.read(path).unwrap_err();
        assert!(err.contains("leads outside /sys"), "{err}");
        // A link within /sys is followed; then the link is a directory again.
        std::fs::remove_file(at("sys/class/hwmon/hwmon0")).unwrap();
        std::os::unix::fs::symlink("../../devices/hwmon0", at("sys/class/hwmon/hwmon0")).unwrap();
        assert_eq!(grants.read(path).unwrap(), b"41000\n");
        std::fs::remove_file(at("sys/class/hwmon/hwmon0")).unwrap();
        std::fs::create_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
        std::fs::write(at("sys/class/hwmon/hwmon0/temp1_input"), "2\n").unwrap();
        assert_eq!(grants.read(path).unwrap(), b"2\n");
        // The file itself turning into a link to a secret of the agent is caught too.
        std::fs::write(at("sys/token"), "t").unwrap();
        let grants = grants.with_secrets(Arc::from(vec![at("sys/token")]));
        assert_eq!(grants.read(path).unwrap(), b"2\n");
        std::fs::remove_file(at("sys/class/hwmon/hwmon0/temp1_input")).unwrap();
        std::os::unix::fs::symlink("../../../token", at("sys/class/hwmon/hwmon0/temp1_input"))
            .unwrap();
        let err = grants.read(path).unwrap_err();
        assert!(err.contains("agent's own secrets"), "{err}");
        assert!(grants.read("/sys/token").is_err());
    }

    #[test]
    fn the_root_and_top_level_names_are_opened_beneath_the_root_and_links_there_checked() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir_all(at("scratch")).unwrap();
        std::fs::create_dir_all(at("real")).unwrap();
        std::fs::write(at("scratch/file"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", at("outside")).unwrap();
        std::os::unix::fs::symlink("real", at("inside")).unwrap();
        let grants = FileGrants::new(
            &[
                "/".to_owned(),
                "/scratch".to_owned(),
                "/outside".to_owned(),
                "/inside".to_owned(),
                "/missing".to_owned(),
            ],
            Some(root.path()),
            1 << 20,
        )
        .unwrap();
        let s = grants.statvfs("/").unwrap();
        assert!(s.block_size > 0 && s.blocks > 0, "{s:?}");
        assert_eq!(grants.statvfs("/scratch").unwrap().blocks, s.blocks);
        assert_eq!(
            grants.list("/").unwrap(),
            ["inside", "outside", "scratch"].map(String::from)
        );
        // A top-level link is resolved on the host: out of the root it is refused, and a
        // link beside a top-level name does not lead into another tree either.
        let err = grants.statvfs("/outside").unwrap_err();
        assert!(err.contains("outside the plugin's file root"), "{err}");
        let err = grants.statvfs("/inside").unwrap_err();
        assert!(err.contains("leads outside /inside"), "{err}");
        let err = grants.statvfs("/missing").unwrap_err();
        assert!(err.contains("No such file"), "{err}");
        // A top-level name that was a directory and turned into a link is checked again.
        std::fs::remove_dir_all(at("scratch")).unwrap();
        std::os::unix::fs::symlink("/etc", at("scratch")).unwrap();
        let err = grants.statvfs("/scratch").unwrap_err();
        assert!(err.contains("outside the plugin's file root"), "{err}");
    }

    #[test]
    fn a_fixture_root_serves_its_files_and_nothing_beside_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/net")).unwrap();
        std::fs::write(root.path().join("proc/stat"), "cpu 1 2 3\n").unwrap();
        std::fs::write(root.path().join("proc/net/dev"), "eth0\n").unwrap();
        std::fs::write(root.path().join("secret"), "s3cret").unwrap();
        std::os::unix::fs::symlink("../secret", root.path().join("proc/leak")).unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", root.path().join("proc/env")).unwrap();
        let grants = FileGrants::new(&["/proc/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
        assert_eq!(grants.read("/proc/stat").unwrap(), b"cpu 1 2 3\n");
        assert_eq!(grants.read("/proc/net/dev").unwrap(), b"eth0\n");
        let err = grants.read("/proc/leak").unwrap_err();
        assert!(err.contains("leads outside /proc"), "{err}");
        let err = grants.read("/proc/env").unwrap_err();
        assert!(err.contains("outside the plugin's file root"), "{err}");
        let err = grants.read("/secret").unwrap_err();
        assert!(err.contains("not granted"), "{err}");
        assert_eq!(
            grants.list("/proc").unwrap(),
            ["env", "leak", "net", "stat"]
        );
        assert_eq!(grants.list("/").unwrap(), ["proc"]);
        assert!(grants.list("/proc/stat").is_err());
        let small = FileGrants::new(&["/proc/stat".to_owned()], Some(root.path()), 4).unwrap();
        let err = small.read("/proc/stat").unwrap_err();
        assert!(
            err.contains("larger than this plugin's limit of 4 bytes"),
            "{err}"
        );
        assert_eq!(small.list("/proc").unwrap(), ["stat"]);
    }

    fn held(grants: &FileGrants) -> (usize, u64) {
        let held = grants.held.lock().unwrap();
        (held.held(), held.reused())
    }

    #[test]
    fn a_kernel_file_read_every_round_is_opened_once_and_still_read_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "one").unwrap();
        let granted = [
            "/proc/uptime".to_owned(),
            format!("{}/*", dir.path().display()),
        ];
        let grants = FileGrants::new(&granted, None, 1 << 20).unwrap();
        let first = grants.read("/proc/uptime").unwrap();
        assert_eq!(held(&grants), (1, 0));
        // The uptime counts hundredths of a second: a later read sees a later time.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = grants.read("/proc/uptime").unwrap();
        assert_eq!(
            held(&grants),
            (1, 1),
            "the second read opened the file again"
        );
        let seconds = |b: &[u8]| -> f64 {
            let text = std::str::from_utf8(b).unwrap();
            text.split_whitespace().next().unwrap().parse().unwrap()
        };
        assert!(
            seconds(&second) > seconds(&first),
            "a held file gave old content: {:?} then {:?}",
            String::from_utf8_lossy(&first),
            String::from_utf8_lossy(&second)
        );
        // A file elsewhere is opened at every read, and so sees a replaced file.
        let path = plain.to_str().unwrap();
        assert_eq!(grants.read(path).unwrap(), b"one");
        std::fs::remove_file(&plain).unwrap();
        std::fs::write(&plain, "two").unwrap();
        assert_eq!(grants.read(path).unwrap(), b"two");
        assert_eq!(held(&grants), (1, 1));
        // A held file still answers to the size limit.
        let small = FileGrants::new(&granted, None, 2).unwrap();
        small.read("/proc/uptime").unwrap_err();
        let err = small.read("/proc/uptime").unwrap_err();
        assert!(err.contains("larger than this plugin's limit"), "{err}");
    }

    #[test]
    fn a_held_file_that_fails_is_dropped_and_the_path_opened_again() {
        let grants = FileGrants::new(&["/proc/uptime".to_owned()], None, 1 << 20).unwrap();
        grants.read("/proc/uptime").unwrap();
        assert_eq!(held(&grants), (1, 0));
        // A descriptor whose read fails, as one of a device that went away does (ENODEV);
        // a directory's fails with EISDIR.
        let dir = tempfile::tempdir().unwrap();
        grants
            .held
            .lock()
            .unwrap()
            .replace("/proc/uptime", File::open(dir.path()).unwrap());
        let again = grants.read("/proc/uptime").unwrap();
        assert!(again.first().is_some_and(u8::is_ascii_digit), "{again:?}");
        assert_eq!(held(&grants), (1, 0), "the failed read counted as served");
        grants.read("/proc/uptime").unwrap();
        assert_eq!(held(&grants), (1, 1), "the file opened again is not held");
    }
}
