//! The user a command runs as, from the user database, and the agent's own.

use std::ffi::{CStr, CString};

/// The user a command runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) name: String,
    pub(super) uid: libc::uid_t,
    pub(super) gid: libc::gid_t,
    pub(super) groups: Vec<libc::gid_t>,
}

/// Looks a user up in the user database, with its supplementary groups.
pub(super) fn lookup_user(name: &str) -> Result<Identity, String> {
    let cname = CString::new(name).map_err(|_| "the user name contains NUL".to_owned())?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `passwd` is plain data that getpwnam_r fills in; `buf` outlives the call
        // and its length is passed; `found` is written by the call.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(format!(
                "cannot look up user {name}: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        if found.is_null() {
            return Err(format!("unknown user {name}"));
        }
        let groups = group_list(&cname, pwd.pw_gid)?;
        return Ok(Identity {
            name: name.to_owned(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            groups,
        });
    }
}

/// The groups of a user: its primary group and every group listing it.
pub(super) fn group_list(name: &CStr, gid: libc::gid_t) -> Result<Vec<libc::gid_t>, String> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut count = groups.len() as libc::c_int;
        // SAFETY: `groups` holds `count` elements and getgrouplist writes at most that many,
        // setting `count` to the number needed.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return Ok(groups);
        }
        if count as usize <= groups.len() {
            // The list did not fit, yet the call asks for no more room: give up rather
            // than loop.
            if groups.len() >= 65_536 {
                return Err("the user has too many groups".to_owned());
            }
            groups.resize(groups.len() * 2, 0);
        } else {
            groups.resize(count as usize, 0);
        }
    }
}

/// The agent's effective user.
pub(super) fn effective_uid() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The agent's own groups: its effective group and its supplementary ones.
pub(super) fn own_groups() -> Vec<libc::gid_t> {
    // SAFETY: getegid has no preconditions; getgroups with 0 only counts.
    let mut groups = vec![unsafe { libc::getegid() }];
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if count > 0 {
        let mut more: Vec<libc::gid_t> = vec![0; count as usize];
        // SAFETY: `more` holds `count` elements.
        let got = unsafe { libc::getgroups(count, more.as_mut_ptr()) };
        if got > 0 {
            more.truncate(got as usize);
            groups.extend(more);
        }
    }
    groups
}
