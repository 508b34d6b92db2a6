//! Running a prepared command: the child's setup, its process group, its pipes, and
//! the wait under its timeout and output cap.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, RawFd};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use super::PATH;
use super::outcome::{CommandOutput, RunError, RunResult};
use super::prepared::Prepared;

/// How long the host waits for a killed process to be reaped before leaving that to the
/// runtime's background reaper (a process stuck in the kernel cannot die at once).
const REAP_GRACE: Duration = Duration::from_millis(500);

/// How much of a pipe is read at a time.
const READ_CHUNK: usize = 64 << 10;

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
pub(super) async fn execute(
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
