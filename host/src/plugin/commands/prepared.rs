//! A grant checked at start-up: its executable opened and checked, its user resolved;
//! and the same checks for `--check-config`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::grant::{RunGrant, validate_name};
use super::identity::{Identity, effective_uid, lookup_user, own_groups};

/// The device and inode of a file, which name it as long as it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    pub(super) dev: u64,
    pub(super) ino: u64,
}

pub(super) fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: `stat` is plain data fstat fills in; `fd` is an open descriptor of ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Opens `path` (following links) as an `O_PATH` descriptor: it names the file without
/// granting any access to it, and is closed on exec.
pub(super) fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `cpath` is a valid C string; the result is checked before it is owned.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why the file behind `st` may not be run as `as_uid` (with `groups`), if it may not.
pub(super) fn unrunnable(
    st: &libc::stat,
    as_uid: libc::uid_t,
    groups: &[libc::gid_t],
) -> Option<String> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Some("it is not a regular file".to_owned());
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o002 != 0 {
        return Some(format!(
            "it is writable by every user (mode {mode:04o}): anyone could change what runs"
        ));
    }
    let executable = if as_uid == 0 {
        mode & 0o111 != 0
    } else if st.st_uid == as_uid {
        mode & 0o100 != 0
    } else if groups.contains(&st.st_gid) {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    };
    if !executable {
        return Some(format!(
            "it is not executable by uid {as_uid} (mode {mode:04o}, owner {}:{})",
            st.st_uid, st.st_gid
        ));
    }
    None
}

/// A grant checked at start-up: its executable open, its user resolved.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) grant: RunGrant,
    /// The executable, kept open so its inode cannot be reused by another file.
    pub(super) exe: OwnedFd,
    pub(super) id: FileId,
    /// `None` runs as the agent's own user.
    pub(super) switch_to: Option<Identity>,
    /// The user the checks were made for.
    pub(super) runs_as: libc::uid_t,
    pub(super) groups: Vec<libc::gid_t>,
}

impl Prepared {
    pub(super) fn open(grant: &RunGrant) -> Result<Prepared, String> {
        grant.validate()?;
        let identity = grant.user.as_deref().map(lookup_user).transpose()?;
        let exe = open_path(&grant.path)
            .map_err(|e| format!("cannot open {}: {e}", grant.path.display()))?;
        let st = fstat(exe.as_raw_fd())
            .map_err(|e| format!("cannot examine {}: {e}", grant.path.display()))?;
        let own_uid = effective_uid();
        // Running as oneself needs no switch, whatever the grant names.
        let switch_to = identity.filter(|who| who.uid != own_uid);
        let (runs_as, groups) = match &switch_to {
            Some(who) => (who.uid, who.groups.clone()),
            None => (own_uid, own_groups()),
        };
        if let Some(why) = unrunnable(&st, runs_as, &groups) {
            return Err(format!("{}: {why}", grant.path.display()));
        }
        Ok(Prepared {
            grant: grant.clone(),
            exe,
            id: FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            switch_to,
            runs_as,
            groups,
        })
    }

    /// Checks that the path still leads to the file opened at start-up, and that the file
    /// may still be run.
    pub(super) fn recheck(&self) -> Result<(), String> {
        let path = self.grant.path.display();
        let now = open_path(&self.grant.path)
            .and_then(|fd| fstat(fd.as_raw_fd()))
            .map_err(|e| format!("cannot open {path}: {e}"))?;
        if (FileId {
            dev: now.st_dev,
            ino: now.st_ino,
        }) != self.id
        {
            return Err(format!(
                "{path} is no longer the file checked when the plugin started (it was replaced \
                 or a link on the way now points elsewhere); restart the agent to grant the \
                 new file"
            ));
        }
        // The same inode may have been made writable or non-executable since.
        let st = fstat(self.exe.as_raw_fd()).map_err(|e| format!("cannot examine {path}: {e}"))?;
        if let Some(why) = unrunnable(&st, self.runs_as, &self.groups) {
            return Err(format!("{path}: {why}"));
        }
        Ok(())
    }
}

/// What `--check-config` learns about one grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantCheck {
    /// The grant's name.
    pub name: String,
    /// Why it cannot be run, if it cannot.
    pub error: Option<String>,
    /// What is allowed but will probably fail (switching users without being root).
    pub warning: Option<String>,
}

/// Checks every grant as start-up does (file, mode, user), without running anything.
pub fn check(grants: &BTreeMap<String, RunGrant>) -> Vec<GrantCheck> {
    grants
        .iter()
        .map(|(name, grant)| {
            let mut check = GrantCheck {
                name: name.clone(),
                error: None,
                warning: None,
            };
            if let Err(why) = validate_name(name) {
                check.error = Some(why);
                return check;
            }
            match Prepared::open(grant) {
                Ok(prepared) => {
                    if let Some(who) = &prepared.switch_to
                        && effective_uid() != 0
                    {
                        check.warning = Some(format!(
                            "runs as user {} but the agent does not run as root: the switch \
                             will be refused unless it has CAP_SETUID and CAP_SETGID",
                            who.name
                        ));
                    }
                }
                Err(why) => check.error = Some(why),
            }
            check
        })
        .collect()
}
