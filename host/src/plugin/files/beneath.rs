//! Resolving a path beneath a directory descriptor: the cached descriptors of the file
//! root and its top-level trees, `openat2(2)`, and reading a directory from its descriptor.

use std::collections::HashSet;
use std::ffi::{CStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Directory descriptors (`O_PATH`) of the file root and of its top-level directories
/// (`proc`, `sys`, ...), opened on first use: every later read resolves beneath one of them
/// in a single `openat2` call. Only directories that opened are kept.
#[derive(Debug, Default)]
pub(super) struct Trees {
    pub(super) root: Option<Arc<OwnedFd>>,
    pub(super) tops: Vec<(String, Arc<OwnedFd>)>,
    /// Paths (`top/...`, as asked for) that went through a symbolic link last time: they are
    /// opened following links straight away rather than first tried without. Only a hint
    /// for which way to try first; both ways are checked.
    pub(super) linked: HashSet<String>,
    /// The devices of the top-level trees that are the kernel's own file systems (`proc`,
    /// `sysfs`): nobody can create a file there, so a file opened on one of them is never
    /// one of the agent's secrets. The trees' descriptors hold those file systems, so the
    /// numbers cannot pass to another file system while they are kept.
    pub(super) kernel_devs: Vec<u64>,
}

/// The most paths [`Trees::linked`] remembers; it starts over when full.
pub(super) const MAX_LINKED_HINTS: usize = 4096;

/// Cleared when the kernel turns out not to have `openat2` (before Linux 5.6).
pub(super) static OPENAT2: AtomicBool = AtomicBool::new(true);

/// How a resolution through `openat2` ended.
pub(super) enum Beneath {
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

/// The device of the directory `dir` when it is the root or any directory of a `proc` or
/// `sysfs` file system.
#[cfg(target_os = "linux")]
#[allow(clippy::unnecessary_cast)] // `f_type`'s type differs between architectures.
pub(super) fn kernel_fs_dev(dir: &OwnedFd) -> Option<u64> {
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
pub(super) fn openat2(
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
pub(super) fn dir_names(dir: &File) -> std::io::Result<Vec<OsString>> {
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
pub(super) fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The normal components of a path as UTF-8 names; `None` when one is not UTF-8.
pub(super) fn path_names(path: &Path) -> Option<Vec<&str>> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_str()),
            _ => None,
        })
        .collect()
}
