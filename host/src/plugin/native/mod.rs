//! Native libraries read on behalf of plugins: what the NVML, LIKWID and ROCm SMI grants
//! share. A WebAssembly plugin cannot call a native library, so the agent loads it with
//! `dlopen` at a granted plugin's first call and answers through a WIT interface.
//!
//! - [`Library::open`] loads each path once per process and keeps it loaded (the libraries'
//!   handles and internal state point into them); [`Library::symbol`] resolves a function;
//! - `library_path`: the library is the grant's (the agent's local configuration), else
//!   the environment variable's, else the default name on the loader's search path; never a
//!   path from a fleet configuration;
//! - [`LibraryError`]: why a library cannot serve (not installed, a symbol missing, its
//!   initialisation failed, a call returned an error code).
//!
//! [`nvml`], [`likwid`] and [`rocm_smi`] each hold their library's function table and readings;
//! [`likwid_metrics`] turns LIKWID's counters into cc-metric-collector's metrics.

pub mod likwid;
pub mod likwid_fuzz;
pub mod likwid_metrics;
pub mod nvml;
pub mod rocm_smi;

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ccfleet::untrusted::Untrusted;

/// The longest library error quoted in a message.
pub(crate) const MAX_REASON: usize = 300;

/// Why a native library cannot serve a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryError {
    /// The library could not be loaded (not installed on this node, or not loadable).
    NotInstalled {
        /// The library.
        library: String,
        /// The loader's reason.
        reason: String,
    },
    /// A function the agent needs is missing (another library, or an unsupported version).
    SymbolMissing {
        /// The library.
        library: String,
        /// The missing functions, or what the version check found.
        reason: String,
    },
    /// The library's initialisation failed.
    InitFailed {
        /// The initialising function.
        function: String,
        /// Its error.
        reason: String,
    },
    /// A call returned an error code.
    Call {
        /// The function.
        function: String,
        /// Its return code.
        code: i64,
    },
}

impl fmt::Display for LibraryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LibraryError::NotInstalled { library, reason } => {
                write!(f, "cannot load {library}: {reason}")
            }
            LibraryError::SymbolMissing { library, reason } => write!(f, "{library}: {reason}"),
            LibraryError::InitFailed { function, reason } => {
                write!(f, "{function} failed: {reason}")
            }
            LibraryError::Call { function, code } => {
                write!(f, "{function} failed with error {code}")
            }
        }
    }
}

impl std::error::Error for LibraryError {}

/// A loaded native library, never unloaded.
pub struct Library {
    handle: *mut c_void,
    path: PathBuf,
}

// SAFETY: a library handle is a plain address, valid for the life of the process (the
// library is never closed); dlsym may be called from any thread.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// The libraries loaded so far, by the name they were loaded by.
static LOADED: Mutex<Option<HashMap<PathBuf, Arc<Library>>>> = Mutex::new(None);

/// The last `dlerror()` text, capped and escaped.
pub(crate) fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local, NUL-terminated string or null.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        return "unknown error".to_owned();
    }
    // SAFETY: not null, NUL-terminated by dlerror.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    Untrusted(&text).capped(MAX_REASON).to_string()
}

impl Library {
    /// The library at `path` (a file, or a bare name the loader looks up), loaded once per
    /// process with `RTLD_LOCAL`, so its symbols reach no other library.
    pub fn open(path: &Path) -> Result<Arc<Library>, LibraryError> {
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = loaded.get_or_insert_with(HashMap::new);
        if let Some(library) = loaded.get(path) {
            return Ok(library.clone());
        }
        let shown = Untrusted(&path.to_string_lossy())
            .capped(MAX_REASON)
            .to_string();
        let name =
            CString::new(path.as_os_str().as_bytes()).map_err(|_| LibraryError::NotInstalled {
                library: shown.clone(),
                reason: "the library path holds a NUL byte".to_owned(),
            })?;
        // SAFETY: loading a library runs its initialisers; that is what the grant is for.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LibraryError::NotInstalled {
                library: shown,
                reason: dl_error(),
            });
        }
        let library = Arc::new(Library {
            handle,
            path: path.to_path_buf(),
        });
        loaded.insert(path.to_path_buf(), library.clone());
        Ok(library)
    }

    /// The name the library was loaded by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves `name` as a function of type `F` (a function pointer type).
    ///
    /// # Safety
    /// `F` must be the function's true type.
    pub unsafe fn symbol<F: Copy>(&self, name: &CStr) -> Option<F> {
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: the handle came from dlopen, the name is NUL-terminated.
        let address = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if address.is_null() {
            None
        } else {
            // SAFETY: a function pointer has the size of a data pointer on the platforms
            // that have dlsym (checked above); the caller vouches for the type.
            Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
        }
    }

    /// The file the loader found for this library (resolving the search path and links),
    /// from the address of `function`, one of its symbols.
    pub fn file(&self, function: &CStr) -> Option<PathBuf> {
        // SAFETY: the handle came from dlopen, the name is NUL-terminated.
        let address = unsafe { libc::dlsym(self.handle, function.as_ptr()) };
        if address.is_null() {
            return None;
        }
        // SAFETY: Dl_info is plain data (pointers and integers), valid when zeroed.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: an address inside a loaded object and a struct to fill.
        let found = unsafe { libc::dladdr(address, &mut info) };
        if found == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: not null, NUL-terminated by the loader.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
        Some(std::fs::canonicalize(&path).unwrap_or(path))
    }
}

/// The library a grant loads: the grant's own (from the agent's local configuration), else
/// the file the environment variable `env` names, else `default` on the search path.
pub(crate) fn library_path(grant: Option<&Path>, env: &str, default: &str) -> PathBuf {
    grant
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(env).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(default))
}
