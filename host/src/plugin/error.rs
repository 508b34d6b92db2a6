//! Errors of the plugin host.

use std::path::PathBuf;
use std::time::Duration;

/// Why a plugin could not be loaded or set up.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The component file could not be read.
    #[error("cannot read plugin file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is a core WebAssembly module, not a component.
    #[error(
        "{path} is a core WebAssembly module, not a component: turn it into one with \
         `ccfleet plugin componentize` (scripts/build-guests.sh does this)"
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The file is a precompiled artifact, which the host only loads from its own cache.
    #[error(
        "{path} is a precompiled wasmtime artifact; give the plugin's component (.wasm) instead"
    )]
    Precompiled {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a valid component.
    #[error("{path} is not a valid WebAssembly component: {reason}")]
    InvalidComponent {
        /// The file.
        path: PathBuf,
        /// What wasmtime reported.
        reason: String,
    },
    /// The component imports WASI but its configuration grants none.
    #[error(
        "plugin {plugin} imports {import}, but its configuration grants no WASI \
         (set capabilities.wasi to grant it)"
    )]
    WasiNotGranted {
        /// The plugin name.
        plugin: String,
        /// The first WASI import found.
        import: String,
    },
    /// The component does not match the `cc:fleet` plugin world.
    #[error("plugin {plugin} does not fit the cc:fleet plugin world: {reason}")]
    Incompatible {
        /// The plugin name.
        plugin: String,
        /// What the linker reported.
        reason: String,
    },
    /// A directory named in `capabilities.read-dirs` could not be granted: it is missing, or
    /// it is, lies in or holds a kernel file system such as `/proc`.
    #[error("plugin {plugin}: cannot grant directory {path}: {reason}")]
    Preopen {
        /// The plugin name.
        plugin: String,
        /// The directory.
        path: PathBuf,
        /// Why it could not be opened.
        reason: String,
    },
    /// The plugin specification is inconsistent.
    #[error("plugin {plugin}: {reason}")]
    Spec {
        /// The plugin name.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
    /// The wasmtime engine could not be set up.
    #[error("cannot set up the wasmtime engine: {0}")]
    Engine(String),
    /// A store for the plugin could not be created.
    #[error("plugin {plugin}: cannot create a store: {reason}")]
    Store {
        /// The plugin name.
        plugin: String,
        /// What wasmtime reported.
        reason: String,
    },
    /// Componentizing a core module failed.
    #[error("cannot componentize {path}: {reason}")]
    Componentize {
        /// The input file.
        path: PathBuf,
        /// What wit-component reported.
        reason: String,
    },
}

/// Why a plugin's store was torn down. Every failure kills only that plugin's store; the
/// supervisor restarts it within its budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The plugin trapped (a panic, `unreachable`, a bad memory access, ...).
    #[error("{call} trapped: {message}")]
    Trap {
        /// The exported function (or `instantiate`).
        call: &'static str,
        /// The trap, as wasmtime describes it.
        message: String,
    },
    /// The call ran past its CPU deadline and was interrupted.
    #[error("{call} exceeded its deadline of {limit:?}")]
    Deadline {
        /// The exported function (or `instantiate`).
        call: &'static str,
        /// The per-call limit.
        limit: Duration,
    },
    /// The plugin tried to grow its memory past its limit.
    #[error("{call} exceeded the memory limit of {limit} bytes (asked for {requested})")]
    MemoryLimit {
        /// The exported function (or `instantiate`).
        call: &'static str,
        /// The plugin's limit in bytes, summed over its linear memories.
        limit: usize,
        /// The total the growth would have reached.
        requested: usize,
    },
    /// A host call copied more of the plugin's data than the host allows for one call.
    #[error("{call} ended: a host call copied more data than the host allows for one call")]
    HostCallFuel {
        /// The exported function (or `instantiate`) during which the host call was made.
        call: &'static str,
    },
    /// `init` returned an error: the plugin rejects its configuration.
    #[error("init failed: {0}")]
    Init(String),
    /// The store could not be set up (e.g. a granted directory is missing).
    #[error("{0}")]
    Setup(String),
}

impl Failure {
    /// A short name of the failure kind, for logs and status.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Trap { .. } => "trap",
            Failure::Deadline { .. } => "deadline",
            Failure::MemoryLimit { .. } => "memory-limit",
            Failure::HostCallFuel { .. } => "host-call-fuel",
            Failure::Init(_) => "init",
            Failure::Setup(_) => "setup",
        }
    }

    /// The exported function the failure ended, if it happened in one.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Failure::Trap { call, .. }
            | Failure::Deadline { call, .. }
            | Failure::MemoryLimit { call, .. }
            | Failure::HostCallFuel { call } => Some(call),
            Failure::Init(_) => Some("init"),
            Failure::Setup(_) => None,
        }
    }
}
