//! How a run ends: its output, or an error with the kind of ending it was.

use std::fmt;

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

    pub(super) fn index(self) -> usize {
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
    pub(super) fn new(result: RunResult, message: String) -> RunError {
        RunError { result, message }
    }
}
