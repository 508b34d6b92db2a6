//! One entry of `capabilities.run`, its defaults and the checks of its settings.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use ccfleet::duration::serde_go;
use ccfleet::untrusted::Untrusted;
use serde::{Deserialize, Serialize};

use super::{DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, MAX_NAME};

/// One entry of `capabilities.run`: a command the plugin may run by the entry's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub(super) fn validate_name(name: &str) -> Result<(), String> {
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
