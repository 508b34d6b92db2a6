//! The `ccfleet agent` binary as a child process: its configuration written to a file, its log
//! (stderr) captured line by line, signals sent with `kill`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running agent process; killed (SIGKILL) when dropped.
pub struct AgentProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl AgentProcess {
    /// Writes `config` to `dir/agent.json` and starts `ccfleet agent` on it with the default
    /// log filter (RUST_LOG unset) and no colours.
    pub fn start(dir: &Path, config: &serde_json::Value) -> AgentProcess {
        AgentProcess::start_command("agent", dir, config)
    }

    /// [`AgentProcess::start`] with `env` added to the agent's environment.
    pub fn start_with_env(
        dir: &Path,
        config: &serde_json::Value,
        env: &[(&str, &str)],
    ) -> AgentProcess {
        AgentProcess::start_full("agent", dir, config, env)
    }

    /// [`AgentProcess::start`] for another command taking `--config` (`server`).
    pub fn start_command(command: &str, dir: &Path, config: &serde_json::Value) -> AgentProcess {
        AgentProcess::start_full(command, dir, config, &[])
    }

    fn start_full(
        command: &str,
        dir: &Path,
        config: &serde_json::Value,
        env: &[(&str, &str)],
    ) -> AgentProcess {
        let path = dir.join(format!("{command}.json"));
        std::fs::write(&path, config.to_string()).expect("write the configuration");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
            .envs(env.iter().copied())
            .arg(command)
            .arg("--config")
            .arg(&path)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start ccfleet {command}: {e}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        let name = command.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                // Shown when the test fails (or with --nocapture).
                eprintln!("{name} | {line}");
                lines.lock().unwrap().push(line);
            }
        });
        AgentProcess { child, log }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Log lines from index `from` on.
    pub fn log_since(&self, from: usize) -> Vec<String> {
        self.log()[from.min(self.log().len())..].to_vec()
    }

    /// Waits until a log line contains `needle`; panics with the log after `timeout`, or when
    /// the process exits first.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().iter().any(|l| l.contains(needle)) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader thread catch up before looking a last time.
                std::thread::sleep(Duration::from_millis(100));
                if self.log().iter().any(|l| l.contains(needle)) {
                    return;
                }
                panic!("the agent exited ({status}) before logging {needle:?}");
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg("-s")
            .arg(signal)
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} failed: {status}");
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // The reader thread gets the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
