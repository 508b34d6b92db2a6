//! What a plugin may reach beyond the `cc:fleet/host` interface, and the one place where
//! those grants become a WASI context.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// Capabilities granted to a plugin. Nothing is granted by default: the plugin sees only
/// the `cc:fleet/host` interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Capabilities {
    /// Links WASI (clocks, random, stdio discarded; no network, no environment). A component
    /// importing WASI without this grant is refused at load.
    #[serde(default)]
    pub wasi: bool,
    /// Host directories the plugin may read, each visible under the same path. Needs `wasi`.
    #[serde(default)]
    pub read_dirs: Vec<PathBuf>,
}

impl Capabilities {
    /// Adds the grants to a WASI context. A fresh `WasiCtxBuilder` grants nothing: stdin is
    /// closed, stdout and stderr are discarded, no directory is preopened, no environment
    /// variable or argument is set, and every network address is denied. Only the lines
    /// below widen that.
    pub fn configure(&self, builder: &mut WasiCtxBuilder) -> Result<(), GrantError> {
        for dir in &self.read_dirs {
            let guest = dir.to_string_lossy();
            builder
                .preopened_dir(dir, guest.as_ref(), FsPerms::ReadOnly)
                .map_err(|e| GrantError {
                    path: dir.clone(),
                    reason: format!("{e:#}"),
                })?;
        }
        Ok(())
    }
}

/// A grant that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantError {
    /// The path that was to be granted.
    pub path: PathBuf,
    /// Why it could not be.
    pub reason: String,
}
