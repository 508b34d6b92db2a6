//! Commands the agent's configuration grants this plugin (`capabilities.run`), by name: each
//! stands for a fixed executable and argument vector the operator chose. Needs an agent of
//! WIT 0.3 or later.

use alloc::string::String;

pub use crate::bindings::cc::fleet::commands::Output;

/// Runs the command granted as `name` and returns what it wrote; an error when it is not
/// granted, cannot start, times out or writes more than its cap.
pub fn run(name: &str) -> Result<Output, String> {
    crate::bindings::cc::fleet::commands::run(name)
}

impl Output {
    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// Standard output as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}
