//! Granted commands: the host side of `cc:fleet/commands`.
//!
//! A plugin may run exactly the commands its `capabilities.run` names, each by the name of
//! its entry, and nothing else:
//!
//! ```json
//! {"ipmi-sensors": {"path": "/usr/sbin/ipmi-sensors", "args": ["--comma-separated-output"],
//!                   "user": "ccfleet", "timeout": "5s", "max-output-bytes": 1048576}}
//! ```
//!
//! The plugin passes only the name: it cannot add arguments, environment or input. The host
//! runs the grant
//!
//! - without a shell, as the absolute `path` with the fixed `args`;
//! - with a cleared environment holding only `PATH=/usr/bin:/bin` and `LC_ALL=C`, standard
//!   input from `/dev/null`, `/` as working directory, as `user` when one is given (its
//!   primary and supplementary groups from the user database; switching needs an agent
//!   running as root), and with `max-processes` as the processes' `RLIMIT_NPROC` when given;
//! - as the leader of a process group of its own: at the `timeout` (default 5 s), when its
//!   output passes `max-output-bytes` (default 1 MiB, standard output and error together),
//!   and when the command exits, the whole group is killed with `SIGKILL`, so nothing it
//!   started outlives the run (a process that leaves the group, with `setsid`, is outside
//!   the host's reach);
//! - only if the file is still the one checked when the plugin started: the executable is
//!   opened then (following links), checked to be a regular file executable by the user
//!   and not writable by every user, and its descriptor kept. Each run opens the path again
//!   and refuses to run unless it leads to the same file (device and inode, which the kept
//!   descriptor stops from being reused); the run then executes the kept descriptor itself
//!   (`/proc/self/fd/N`), so the file checked is the file run. A replaced executable (a
//!   package upgrade, a link pointed elsewhere) is refused until the plugin is loaded
//!   again (the agent restarts, or a new version of its component arrives). The process'
//!   short name (`comm`) is therefore the descriptor's number; its `argv[0]` is the path.
//!
//! A grant that cannot be used at start-up (a missing file, an unknown user) does not stop
//! the plugin: each run of it returns the start-up error, and `--check-config` reports it.
//! Every run is counted per plugin ([`CommandStats`]), by how it ended.
//!
//! The runner waits on the process' pipes, its exit (`SIGCHLD`) and its deadline
//! asynchronously: a running command occupies no runtime worker. Its process group is
//! killed before the leader is reaped, so the group id cannot belong to anyone else yet;
//! dropping the run's future (a cancelled call) kills the group too.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccfleet::duration::serde_go;
use ccfleet::untrusted::Untrusted;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// How long a command may run unless its grant says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How many bytes of output (standard output and error together) a command may write
/// unless its grant says otherwise.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// The `PATH` a command runs with.
pub const PATH: &str = "/usr/bin:/bin";

/// The longest name of a grant, in bytes.
pub const MAX_NAME: usize = 64;

/// How long the host waits for a killed process to be reaped before leaving that to the
/// runtime's background reaper (a process stuck in the kernel cannot die at once).
const REAP_GRACE: Duration = Duration::from_millis(500);

/// How much of a pipe is read at a time.
const READ_CHUNK: usize = 64 << 10;

/// One entry of `capabilities.run`: a command the plugin may run by the entry's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunGrant {
    /// The executable, an absolute path; a link is followed once, when the plugin starts.
    pub path: PathBuf,
    /// The fixed arguments (without the program name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The user to run as (a name of the user database); the agent's own user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// How long the command may run before its process group is killed.
    #[serde(default = "default_timeout", with = "serde_go")]
#[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub timeout: Duration,
    /// The most bytes of standard output and error together; more is an error.
    #[serde(default = "default_max_output")]
    pub max_output_bytes: u64,
    /// `RLIMIT_NPROC` of the command's processes: the most processes (and threads) its user
    /// may have before a fork fails. It counts all of that user's processes, so it is meant
    /// for a dedicated `user`; the kernel does not apply it to root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_processes: Option<u64>,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT
}

impl RunGrant {
    /// A grant of `path` with no arguments and the default limits.
    pub fn new(path: impl Into<PathBuf>) -> RunGrant {
        RunGrant {
            path: path.into(),
            args: Vec::new(),
            user: None,
            timeout: DEFAULT_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT,
            max_processes: None,
        }
    }

    /// Checks the grant without touching the file system.
    pub fn validate(&self) -> Result<(), String> {
        if !self.path.is_absolute() {
            return Err(format!(
                "path {} must be an absolute path (commands are never looked up in PATH)",
                self.path.display()
            ));
        }
        if self.path.as_os_str().as_bytes().contains(&0) {
            return Err("path contains NUL".to_owned());
        }
        if self.args.iter().any(|a| a.contains('\0')) {
            return Err("an argument contains NUL".to_owned());
        }
        if let Some(user) = &self.user
            && (user.is_empty() || user.contains('\0'))
        {
            return Err("user must be a user name".to_owned());
        }
        if self.timeout.is_zero() {
            return Err("timeout must be positive".to_owned());
        }
        if self.max_output_bytes == 0 {
            return Err("max-output-bytes must be positive".to_owned());
        }
        if self.max_processes == Some(0) {
            return Err("max-processes must be positive".to_owned());
        }
        Ok(())
    }
}

/// Checks the names and entries of a `capabilities.run` object without touching the file
/// system.
pub fn validate(grants: &BTreeMap<String, RunGrant>) -> Result<(), String> {
    for (name, grant) in grants {
        validate_name(name)?;
        grant
            .validate()
            .map_err(|why| format!("capabilities.run.{name}: {why}"))?;
    }
    Ok(())
}

/// A grant's name: what plugins ask for and what logs show, so a short plain word.
fn validate_name(name: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(plain) {
        return Err(format!(
            "capabilities.run entry {}: a name has 1 to {MAX_NAME} letters, digits, `-`, `_` \
             or `.`",
            Untrusted(name).capped(MAX_NAME + 16)
        ));
    }
    Ok(())
}

/// What a finished command produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// The exit status; `None` when a signal ended the process.
    pub status: Option<i32>,
    /// Everything it wrote to standard output.
    pub stdout: Vec<u8>,
    /// Everything it wrote to standard error.
    pub stderr: Vec<u8>,
}

/// How a run request ended, as counted in [`CommandStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    /// The command exited with status 0.
    Ok,
    /// It exited with another status or was ended by a signal; its output is returned.
    ExitNonzero,
    /// It ran past its timeout and was killed.
    Timeout,
    /// It wrote more than its output cap and was killed.
    OutputCap,
    /// It could not be run: unusable since start-up, replaced, or the start failed.
    Failed,
    /// The plugin asked for a name it was not granted.
    Refused,
}

impl RunResult {
    /// Every result, in the order of [`CommandSnapshot::runs`].
    pub const ALL: [RunResult; 6] = [
        RunResult::Ok,
        RunResult::ExitNonzero,
        RunResult::Timeout,
        RunResult::OutputCap,
        RunResult::Failed,
        RunResult::Refused,
    ];

    /// The result's label in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RunResult::Ok => "ok",
            RunResult::ExitNonzero => "exit_nonzero",
            RunResult::Timeout => "timeout",
            RunResult::OutputCap => "output_cap",
            RunResult::Failed => "failed",
            RunResult::Refused => "refused",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why a run returned no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    /// How the run ended.
    pub result: RunResult,
    /// What happened, naming the grant; what the plugin receives.
    pub message: String,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RunError {}

impl RunError {
    fn new(result: RunResult, message: String) -> RunError {
        RunError { result, message }
    }
}

/// A plugin's command counters, which outlive its instances.
#[derive(Debug, Default)]
pub struct CommandStats {
    runs: [AtomicU64; RunResult::ALL.len()],
    nanos: AtomicU64,
}

/// A copy of a plugin's command counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CommandSnapshot {
    /// Run requests per result of [`RunResult::ALL`], in that order.
    pub runs: Vec<u64>,
    /// Time spent running commands, in seconds.
    pub seconds: f64,
}

impl CommandSnapshot {
    /// The requests that ended with `result`.
    pub fn count(&self, result: RunResult) -> u64 {
        self.runs.get(result.index()).copied().unwrap_or(0)
    }
}

impl CommandStats {
    /// Counts one run request.
    pub fn record(&self, result: RunResult, took: Duration) {
        self.runs[result.index()].fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The counters now.
    pub fn snapshot(&self) -> CommandSnapshot {
        CommandSnapshot {
            runs: self
                .runs
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The user a command runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    name: String,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

/// Looks a user up in the user database, with its supplementary groups.
fn lookup_user(name: &str) -> Result<Identity, String> {
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
fn group_list(name: &CStr, gid: libc::gid_t) -> Result<Vec<libc::gid_t>, String> {
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
fn effective_uid() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The device and inode of a file, which name it as long as it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: `stat` is plain data fstat fills in; `fd` is an open descriptor of ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Opens `path` (following links) as an `O_PATH` descriptor: it names the file without
/// granting any access to it, and is closed on exec.
fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
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
fn unrunnable(st: &libc::stat, as_uid: libc::uid_t, groups: &[libc::gid_t]) -> Option<String> {
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
struct Prepared {
    grant: RunGrant,
    /// The executable, kept open so its inode cannot be reused by another file.
    exe: OwnedFd,
    id: FileId,
    /// `None` runs as the agent's own user.
    switch_to: Option<Identity>,
    /// The user the checks were made for.
    runs_as: libc::uid_t,
    groups: Vec<libc::gid_t>,
}

impl Prepared {
    fn open(grant: &RunGrant) -> Result<Prepared, String> {
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
    fn recheck(&self) -> Result<(), String> {
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

/// The agent's own groups: its effective group and its supplementary ones.
fn own_groups() -> Vec<libc::gid_t> {
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

/// The commands one plugin may run, checked and opened when the plugin starts; shared by
/// all its instances.
#[derive(Debug)]
pub struct CommandGrants {
    grants: BTreeMap<String, Result<Prepared, String>>,
    stats: std::sync::Arc<CommandStats>,
}

impl CommandGrants {
    /// No commands; the refused runs are counted in `stats`.
    pub fn none(stats: std::sync::Arc<CommandStats>) -> CommandGrants {
        CommandGrants {
            grants: BTreeMap::new(),
            stats,
        }
    }

    /// Checks and opens every grant now. A grant that fails its checks stays known by name
    /// and each run of it returns the reason; [`CommandGrants::unusable`] lists them.
    pub fn open(
        grants: &BTreeMap<String, RunGrant>,
        stats: std::sync::Arc<CommandStats>,
    ) -> CommandGrants {
        CommandGrants {
            grants: grants
                .iter()
                .map(|(name, grant)| (name.clone(), Prepared::open(grant)))
                .collect(),
            stats,
        }
    }

    /// Whether no command is granted.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The grants that could not be opened, with the reason.
    pub fn unusable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.grants
            .iter()
            .filter_map(|(name, g)| g.as_ref().err().map(|why| (name.as_str(), why.as_str())))
    }

    /// The counters of this plugin's runs.
    pub fn stats(&self) -> &CommandStats {
        &self.stats
    }

    /// The time one call of the plugin may spend in commands: each granted command once,
    /// at its full timeout.
    pub fn call_budget(&self) -> Duration {
        self.grants
            .values()
            .filter_map(|g| g.as_ref().ok())
            .map(|p| p.grant.timeout)
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    /// Runs the command granted as `name` and returns its output; counts the run.
    pub async fn run(&self, name: &str) -> Result<CommandOutput, RunError> {
        self.run_within(name, None).await
    }

    /// [`CommandGrants::run`] ended at `limit` at the latest (what the plugin's call has
    /// left of its command time) when that comes before the grant's own timeout.
    pub async fn run_within(
        &self,
        name: &str,
        limit: Option<Duration>,
    ) -> Result<CommandOutput, RunError> {
        let begun = Instant::now();
        let result = self.run_uncounted(name, limit).await;
        let kind = match &result {
            Ok(out) if out.status == Some(0) => RunResult::Ok,
            Ok(_) => RunResult::ExitNonzero,
            Err(e) => e.result,
        };
        self.stats.record(kind, begun.elapsed());
        result
    }

    async fn run_uncounted(
        &self,
        name: &str,
        limit: Option<Duration>,
    ) -> Result<CommandOutput, RunError> {
        let prepared = match self.grants.get(name) {
            None => {
                return Err(RunError::new(
                    RunResult::Refused,
                    format!(
                        "command {} is not granted to this plugin (capabilities.run)",
                        Untrusted(name).capped(MAX_NAME + 16)
                    ),
                ));
            }
            Some(Err(why)) => {
                return Err(RunError::new(
                    RunResult::Failed,
                    format!("command {name} cannot be run: {why}"),
                ));
            }
            Some(Ok(prepared)) => prepared,
        };
        if limit.is_some_and(|left| left.is_zero()) {
            return Err(RunError::new(
                RunResult::Timeout,
                format!(
                    "command {name} was not started: this call has used all its time for \
                     commands (one run of each granted command at its timeout)"
                ),
            ));
        }
        prepared
            .recheck()
            .map_err(|why| RunError::new(RunResult::Failed, format!("command {name}: {why}")))?;
        execute(name, prepared, limit).await
    }
}

/// A store's view of its plugin's commands: the grants, shared by the plugin's instances,
/// and what the current call has left of its command time.
///
/// Time in a command is not charged to the call's CPU deadline (`limits.call-timeout`): a
/// collector waiting five seconds for `ipmitool` is not running. It is bounded instead by
/// [`CommandGrants::call_budget`] per call, so a call still ends, at the latest after its
/// call timeout plus that budget.
#[derive(Debug)]
pub(crate) struct StoreCommands {
    grants: std::sync::Arc<CommandGrants>,
    left: Duration,
}

impl StoreCommands {
    pub fn new(grants: std::sync::Arc<CommandGrants>) -> StoreCommands {
        let left = grants.call_budget();
        StoreCommands { grants, left }
    }

    /// A call into the plugin begins: its command time is full again.
    pub fn new_call(&mut self) {
        self.left = self.grants.call_budget();
    }

    /// The grants and the command time the call has left.
    pub fn begin(&self) -> (std::sync::Arc<CommandGrants>, Duration) {
        (self.grants.clone(), self.left)
    }

    /// Charges `took` to the call's command time.
    pub fn spent(&mut self, took: Duration) {
        self.left = self.left.saturating_sub(took);
    }
}

/// The settings the child applies to itself between fork and exec, prepared beforehand:
/// nothing there may allocate.
struct ChildSetup {
    exe: RawFd,
    max_processes: Option<u64>,
    switch: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
}

impl ChildSetup {
    /// Runs in the child after `fork`: only async-signal-safe calls.
    fn apply(&self) -> std::io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY (all calls): plain system calls on values prepared before the fork.
        unsafe {
            // The executable is run through its descriptor, which must survive the exec
            // (a script's interpreter opens it by that name).
            check(libc::fcntl(self.exe, libc::F_SETFD, 0))?;
            if let Some((uid, gid, groups)) = &self.switch {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(libc::setgid(*gid))?;
                check(libc::setuid(*uid))?;
            }
            if let Some(n) = self.max_processes {
                let limit = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                check(libc::setrlimit(libc::RLIMIT_NPROC, &limit))?;
            }
        }
        Ok(())
    }
}

/// A started command's process group: killed when dropped unless the run finished.
struct Group {
    child: Child,
    pgid: libc::pid_t,
    /// The leader has been reaped: the group id may belong to someone else now.
    reaped: bool,
}

impl Group {
    fn kill(&self) {
        if !self.reaped {
            // SAFETY: plain system call; the unreaped leader keeps the group id ours.
            unsafe { libc::killpg(self.pgid, libc::SIGKILL) };
        }
    }

    /// Whether the leader has exited, without reaping it.
    fn leader_exited(&self) -> bool {
        // SAFETY: `info` is plain data waitid fills in; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pgid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // An error means there is no such child left to wait for: it is gone.
        rc != 0 || unsafe { info.si_pid() } != 0
    }

    /// Kills the group and reaps the leader, waiting a little at most.
    async fn kill_and_reap(&mut self) {
        self.kill();
        if tokio::time::timeout(REAP_GRACE, self.child.wait())
            .await
            .is_ok()
        {
            self.reaped = true;
        }
        // Otherwise the runtime reaps the leader once it dies (the child is dropped).
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One open pipe of the command and what has been read from it.
struct Pipe<R> {
    reader: Option<R>,
    data: Vec<u8>,
    chunk: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Pipe<R> {
    fn new(reader: Option<R>) -> Pipe<R> {
        Pipe {
            reader,
            data: Vec::new(),
            chunk: Vec::new(),
        }
    }

    /// Reads one chunk; `Ok(0)` at the end. Never resolves once the pipe is closed.
    async fn read(&mut self) -> std::io::Result<usize> {
        match &mut self.reader {
            Some(reader) => {
                self.chunk.resize(READ_CHUNK, 0);
                reader.read(&mut self.chunk).await
            }
            None => std::future::pending().await,
        }
    }

    /// Keeps what the last read got (`n` bytes), or closes the pipe at its end.
    fn keep(&mut self, n: usize) {
        if n == 0 {
            self.reader = None;
        } else {
            self.data.extend_from_slice(&self.chunk[..n]);
        }
    }
}

/// Starts the command and collects its output under its timeout and cap.
async fn execute(
    name: &str,
    prepared: &Prepared,
    limit: Option<Duration>,
) -> Result<CommandOutput, RunError> {
    let grant = &prepared.grant;
    let (timeout, whose) = match limit {
        Some(left) if left < grant.timeout => (left, "the time its call had left for commands"),
        _ => (grant.timeout, "its timeout"),
    };
    let failed = |why: String| RunError::new(RunResult::Failed, format!("command {name}: {why}"));
    // Registered before the start, so the leader's exit cannot go unnoticed.
    let mut exits = signal(SignalKind::child())
        .map_err(|e| failed(format!("cannot watch for the command's exit: {e}")))?;
    let exe = prepared.exe.as_raw_fd();
    let setup = ChildSetup {
        exe,
        max_processes: grant.max_processes,
        switch: prepared
            .switch_to
            .as_ref()
            .map(|who| (who.uid, who.gid, who.groups.clone())),
    };
    let mut command = Command::new(format!("/proc/self/fd/{exe}"));
    command
        .arg0(grant.path.as_os_str())
        .args(grant.args.iter().map(OsStr::new))
        .env_clear()
        .env("PATH", PATH)
        .env("LC_ALL", "C")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: `apply` makes only async-signal-safe system calls on data prepared here.
    unsafe {
        command.pre_exec(move || setup.apply());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut child = command.spawn().map_err(|e| {
        let hint = match (e.raw_os_error(), &prepared.switch_to) {
            (Some(libc::EPERM), Some(who)) => format!(
                " (switching to user {} needs an agent running as root)",
                who.name
            ),
            (Some(libc::EAGAIN), _) if grant.max_processes.is_some() => {
                " (its user has reached max-processes)".to_owned()
            }
            (Some(libc::EACCES), _) => " (is it on a file system mounted noexec?)".to_owned(),
            _ => String::new(),
        };
        failed(format!("cannot start {}: {e}{hint}", grant.path.display()))
    })?;
    let Some(pid) = child.id() else {
        return Err(failed("the command vanished as it started".to_owned()));
    };
    let mut out = Pipe::new(child.stdout.take());
    let mut err = Pipe::new(child.stderr.take());
    let mut group = Group {
        child,
        pgid: pid as libc::pid_t,
        reaped: false,
    };
    let cap = grant.max_output_bytes;
    let mut exited = false;
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    let stop = loop {
        if exited && out.reader.is_none() && err.reader.is_none() {
            break None;
        }
        tokio::select! {
            read = out.read() => match read {
                Ok(n) => out.keep(n),
                Err(e) => break Some(failed(format!("cannot read its output: {e}"))),
            },
            read = err.read() => match read {
                Ok(n) => err.keep(n),
                Err(e) => break Some(failed(format!("cannot read its error output: {e}"))),
            },
            _ = exits.recv(), if !exited => {
                if group.leader_exited() {
                    exited = true;
                    // What it left running dies with it; the pipes then reach their end.
                    group.kill();
                }
            }
            () = &mut timer => {
                break Some(RunError::new(
                    RunResult::Timeout,
                    format!(
                        "command {name} did not finish within {} ({whose}); it was killed",
                        ccfleet::duration::format(timeout)
                    ),
                ));
            }
        }
        if (out.data.len() + err.data.len()) as u64 > cap {
            break Some(RunError::new(
                RunResult::OutputCap,
                format!(
                    "command {name} wrote more than its {cap} bytes of output \
                     (max-output-bytes); it was killed"
                ),
            ));
        }
    };
    if let Some(error) = stop {
        group.kill_and_reap().await;
        return Err(error);
    }
    let status: ExitStatus = match group.child.wait().await {
        Ok(status) => status,
        Err(e) => return Err(failed(format!("cannot collect its exit status: {e}"))),
    };
    group.reaped = true;
    Ok(CommandOutput {
        status: status.code(),
        stdout: std::mem::take(&mut out.data),
        stderr: std::mem::take(&mut err.data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_parses_with_its_defaults_and_is_checked() {
        let grants: BTreeMap<String, RunGrant> = serde_json::from_str(
            r#"{"sensors": {"path": "/usr/bin/true", "args": ["-x"]},
                "slow": {"path": "/bin/sleep", "timeout": "250ms", "max-output-bytes": 10,
                         "user": "nobody", "max-processes": 8}}"#,
        )
        .unwrap();
        let sensors = &grants["sensors"];
        assert_eq!(sensors.timeout, DEFAULT_TIMEOUT);
        assert_eq!(sensors.max_output_bytes, DEFAULT_MAX_OUTPUT);
        assert_eq!(sensors.user, None);
        assert_eq!(grants["slow"].timeout, Duration::from_millis(250));
        validate(&grants).unwrap();

        for (json, expected) in [
            (r#"{"x": {"path": "true"}}"#, "must be an absolute path"),
            (
                r#"{"x": {"path": "/bin/true", "timeout": "0s"}}"#,
                "timeout",
            ),
            (
                r#"{"x": {"path": "/bin/true", "max-output-bytes": 0}}"#,
                "max-output-bytes",
            ),
            (r#"{"x": {"path": "/bin/true", "user": ""}}"#, "user"),
            (r#"{"a b": {"path": "/bin/true"}}"#, "a name has"),
            (r#"{"": {"path": "/bin/true"}}"#, "a name has"),
        ] {
            let grants: BTreeMap<String, RunGrant> = serde_json::from_str(json).unwrap();
            let err = validate(&grants).unwrap_err();
            assert!(err.contains(expected), "{json}: {err}");
        }
        assert!(
            serde_json::from_str::<RunGrant>(r#"{"path": "/bin/true", "env": {}}"#).is_err(),
            "a grant has no environment to set"
        );
    }

    #[test]
    fn modes_decide_who_may_run_a_file() {
        // SAFETY: plain data.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFREG | 0o750;
        st.st_uid = 10;
        st.st_gid = 20;
        assert_eq!(unrunnable(&st, 10, &[]), None);
        assert_eq!(unrunnable(&st, 11, &[20]), None);
        assert!(
            unrunnable(&st, 11, &[21])
                .unwrap()
                .contains("not executable")
        );
        assert_eq!(unrunnable(&st, 0, &[]), None);
        st.st_mode = libc::S_IFREG | 0o757;
        assert!(
            unrunnable(&st, 10, &[])
                .unwrap()
                .contains("writable by every user")
        );
        st.st_mode = libc::S_IFDIR | 0o755;
        assert!(
            unrunnable(&st, 10, &[])
                .unwrap()
                .contains("not a regular file")
        );
        st.st_mode = libc::S_IFREG | 0o644;
        assert!(unrunnable(&st, 0, &[]).unwrap().contains("not executable"));
    }

    #[test]
    fn users_are_looked_up_with_their_groups() {
        let root = lookup_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        let err = lookup_user("no-such-user-ccfleet").unwrap_err();
        assert!(err.contains("unknown user"), "{err}");
    }

    #[tokio::test]
    async fn a_call_spends_at_most_the_sum_of_its_commands_timeouts() {
        let grants: BTreeMap<String, RunGrant> = [
            ("a".to_owned(), RunGrant::new("/bin/true")),
            (
                "b".to_owned(),
                RunGrant {
                    timeout: Duration::from_millis(300),
                    ..RunGrant::new("/bin/true")
                },
            ),
            // Unusable grants add nothing.
            ("c".to_owned(), RunGrant::new("/no/such/tool")),
        ]
        .into();
        let grants = std::sync::Arc::new(CommandGrants::open(&grants, Default::default()));
        assert_eq!(
            grants.call_budget(),
            DEFAULT_TIMEOUT + Duration::from_millis(300)
        );
        let mut store = StoreCommands::new(grants.clone());
        store.spent(Duration::from_secs(10));
        let (_, left) = store.begin();
        assert_eq!(left, Duration::ZERO);
        let err = grants.run_within("a", Some(left)).await.unwrap_err();
        assert_eq!(err.result, RunResult::Timeout);
        assert!(err.message.contains("was not started"), "{}", err.message);
        store.new_call();
        assert_eq!(store.begin().1, grants.call_budget());
        let out = grants.run_within("a", Some(store.begin().1)).await.unwrap();
        assert_eq!(out.status, Some(0));
    }

    #[test]
    fn counters_count_by_result() {
        let stats = CommandStats::default();
        stats.record(RunResult::Ok, Duration::from_millis(3));
        stats.record(RunResult::Timeout, Duration::from_secs(1));
        stats.record(RunResult::Timeout, Duration::ZERO);
        let snap = stats.snapshot();
        assert_eq!(snap.count(RunResult::Ok), 1);
        assert_eq!(snap.count(RunResult::Timeout), 2);
        assert_eq!(snap.count(RunResult::Refused), 0);
        assert!((snap.seconds - 1.003).abs() < 1e-9);
        assert_eq!(
            RunResult::ALL.map(|r| r.index()),
            [0, 1, 2, 3, 4, 5],
            "ALL lists the results in index order"
        );
    }
}
