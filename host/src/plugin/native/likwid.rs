//! The LIKWID grant (`capabilities.likwid`): hardware performance counters measured through
//! the LIKWID library on behalf of plugins, for the `likwid` collector (`cc:fleet/likwid`,
//! WIT 0.3.2).
//!
//! LIKWID (`liblikwid.so.5`) keeps its state in process globals and is not thread-safe, so
//! the agent calls it from one dedicated thread per library, as cc-metric-collector does:
//! the thread loads the library at the first call of a granted plugin, initialises its
//! topology, and runs each measurement as cc-metric-collector's `likwid` collector does, one
//! event set after the other (`perfmon_init`, `perfmon_addEventSet`, set up, start, read,
//! wait the round's duration, read, results, stop, `perfmon_finalize`). The formulas are
//! evaluated by the agent ([`super::likwid_metrics`]).
//!
//! The library is `liblikwid.so.5` on the loader's search path, or the file named by the
//! grant's `likwid-library` or, failing that, by [`LIBRARY_ENV`]; its version is checked at
//! load (the file the loader found must be `liblikwid.so.5.<minor>`: the structures read
//! here are those of LIKWID 5). [`ACCESSDAEMON_ENV`] names a directory put before `PATH` for
//! LIKWID to find its access daemon in. Neither comes from a fleet configuration.
//!
//! A measurement whose lock file (`/var/run/likwid.lock` by default) belongs to another user
//! (a job running `likwid-perfctr`) skips the round's event sets and says whose they are,
//! as cc-metric-collector does. Where no counter can be read (a virtual machine without a
//! PMU, no access daemon, no rights for direct access) the call fails with LIKWID's error
//! code and what it usually means; a call LIKWID does not answer within its round and a
//! minute fails too, so a plugin never waits forever.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_double, c_int, c_void};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::likwid_metrics::{MetricValue, Plan, SetResult, Thread};
use super::{Library, LibraryError, library_path};

/// The library loaded when neither the grant nor the environment names one.
pub const DEFAULT_LIBRARY: &str = "liblikwid.so.5";

/// The environment variable naming the library to load instead of [`DEFAULT_LIBRARY`].
pub const LIBRARY_ENV: &str = "CCFLEET_LIKWID_LIBRARY";

/// The environment variable naming the directory of LIKWID's access daemon
/// (cc-metric-collector's `accessdaemon_path`), put before `PATH` when the library loads.
pub const ACCESSDAEMON_ENV: &str = "CCFLEET_LIKWID_ACCESSDAEMON_PATH";

/// The lock file LIKWID's tools take, when the setup names none.
pub const DEFAULT_LOCKFILE: &str = "/var/run/likwid.lock";

/// The most hardware threads looked at, whatever count the library reports.
const MAX_THREADS: u32 = 16384;

/// The longest measurement of one event set.
pub const MAX_DURATION: Duration = Duration::from_secs(600);

/// How long past its measuring time a call waits for the LIKWID thread.
const GRACE: Duration = Duration::from_secs(60);

/// The LIKWID major version whose structures this binds.
const SUPPORTED_MAJOR: u32 = 5;

/// `HWThread` (likwid.h).
#[repr(C)]
struct HwThread {
    thread_id: u32,
    core_id: u32,
    package_id: u32,
    apic_id: u32,
    die_id: u32,
    in_cpu_set: u32,
}

/// `CpuTopology` (likwid.h).
#[repr(C)]
struct CpuTopology {
    num_hw_threads: u32,
    active_hw_threads: u32,
    num_sockets: u32,
    num_dies: u32,
    num_cores_per_socket: u32,
    num_threads_per_core: u32,
    num_cache_levels: u32,
    thread_pool: *const HwThread,
    cache_levels: *const c_void,
    topology_tree: *const c_void,
}

type FnInt = unsafe extern "C" fn() -> c_int;
type FnVoid = unsafe extern "C" fn();
type FnTopology = unsafe extern "C" fn() -> *const CpuTopology;
type FnMode = unsafe extern "C" fn(c_int);
type FnIntInt = unsafe extern "C" fn(c_int) -> c_int;
type FnPerfmonInit = unsafe extern "C" fn(c_int, *const c_int) -> c_int;
type FnAddEventSet = unsafe extern "C" fn(*const c_char) -> c_int;
type FnResult = unsafe extern "C" fn(c_int, c_int, c_int) -> c_double;
type FnGroupTime = unsafe extern "C" fn(c_int) -> c_double;
type FnCycleClock = unsafe extern "C" fn() -> u64;

/// The functions used; all are required.
struct Functions {
    topology_init: FnInt,
    get_topology: FnTopology,
    hpm_mode: FnMode,
    hpm_init: FnInt,
    hpm_add_thread: FnIntInt,
    perfmon_init: FnPerfmonInit,
    add_event_set: FnAddEventSet,
    setup_counters: FnIntInt,
    start_counters: FnInt,
    stop_counters: FnInt,
    read_counters: FnInt,
    last_result: FnResult,
    last_time: FnGroupTime,
    perfmon_finalize: FnVoid,
    timer_init: FnVoid,
    cycle_clock: FnCycleClock,
}

/// How LIKWID reaches the counters (`HPMmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// The registers directly.
    Direct,
    /// Through the access daemon.
    AccessDaemon,
    /// Through perf_event.
    PerfEvent,
}

impl AccessMode {
    fn code(self) -> c_int {
        match self {
            AccessMode::PerfEvent => -1,
            AccessMode::Direct => 0,
            AccessMode::AccessDaemon => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AccessMode::PerfEvent => "perf_event",
            AccessMode::Direct => "direct",
            AccessMode::AccessDaemon => "accessdaemon",
        }
    }
}

/// One hardware thread as LIKWID reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HwThreadInfo {
    /// The operating system's CPU number (LIKWID's `apicId`).
    pub cpu: u32,
    /// The core.
    pub core: u32,
    /// The socket.
    pub socket: u32,
    /// The die.
    pub die: u32,
}

/// How one round is measured, besides its plan.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The access mode.
    pub access_mode: AccessMode,
    /// The lock file; `None` checks none.
    pub lockfile: Option<PathBuf>,
    /// Set `LIKWID_FORCE`.
    pub force: bool,
    /// Non-finite results as 0.
    pub invalid_to_zero: bool,
    /// How long each event set is measured.
    pub duration: Duration,
    /// With one event set, keep its counters running between rounds.
    pub keep_counting: bool,
}

/// An event set left counting between rounds.
struct Running {
    event_string: String,
    mode: AccessMode,
    gid: c_int,
}

/// The outcome of one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The metric values.
    pub values: Vec<MetricValue>,
    /// The event sets skipped for another user's lock, with that user.
    pub skipped: Vec<String>,
}

/// A loaded library with its topology, on the LIKWID thread.
struct Loaded {
    f: Functions,
    threads: Vec<HwThreadInfo>,
    cpus: Vec<c_int>,
    inverse_clock: f64,
    mode: Option<AccessMode>,
    running: Option<Running>,
    _library: Arc<Library>,
}

/// The version in a file name `liblikwid.so.<major>.<minor>[...]`.
fn version_of(file: &Path) -> Option<(u32, u32)> {
    let name = file.file_name()?.to_str()?;
    let rest = name.strip_prefix("liblikwid.so.")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// The base clock in Hz as cc-metric-collector takes it: the CPU's `bios_limit` or
/// `base_frequency` (kHz), else LIKWID's measured cycle clock.
fn base_clock(f: &Functions) -> f64 {
    for file in [
        "/sys/devices/system/cpu/cpu0/cpufreq/bios_limit",
        "/sys/devices/system/cpu/cpu0/cpufreq/base_frequency",
    ] {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(khz) = text.trim().parse::<u64>()
            && khz > 0
        {
            return khz as f64 * 1e3;
        }
    }
    // SAFETY: timer_init and timer_getCycleClock take no arguments.
    unsafe { (f.timer_init)() };
    // SAFETY: as above.
    unsafe { (f.cycle_clock)() as f64 }
}

impl Loaded {
    fn load(path: &Path) -> Result<Loaded, LibraryError> {
        let library = Library::open(path)?;
        let shown = library.path().display().to_string();
        let file = library.file(c"perfmon_init");
        match file.as_deref().and_then(version_of) {
            Some((SUPPORTED_MAJOR, _)) => {}
            Some((major, minor)) => {
                return Err(LibraryError::SymbolMissing {
                    library: shown,
                    reason: format!(
                        "LIKWID {major}.{minor} is not supported (this agent binds LIKWID \
                         {SUPPORTED_MAJOR}.x)"
                    ),
                });
            }
            None => {
                return Err(LibraryError::SymbolMissing {
                    library: shown,
                    reason: format!(
                        "cannot tell LIKWID's version from the file {} (expected \
                         liblikwid.so.{SUPPORTED_MAJOR}.<minor>; this agent binds LIKWID \
                         {SUPPORTED_MAJOR}.x)",
                        file.map_or_else(|| "?".to_owned(), |f| f.display().to_string())
                    ),
                });
            }
        }
        let mut missing = Vec::new();
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: each name is resolved as the type of its declaration in likwid.h
                // of LIKWID 5.
                let f = unsafe { library.symbol($name) };
                if f.is_none() {
                    missing.push($name.to_string_lossy().into_owned());
                }
                f
            }};
        }
        let f = (
            sym!(c"topology_init"),
            sym!(c"get_cpuTopology"),
            sym!(c"HPMmode"),
            sym!(c"HPMinit"),
            sym!(c"HPMaddThread"),
            sym!(c"perfmon_init"),
            sym!(c"perfmon_addEventSet"),
            sym!(c"perfmon_setupCounters"),
            sym!(c"perfmon_startCounters"),
            sym!(c"perfmon_stopCounters"),
            sym!(c"perfmon_readCounters"),
            sym!(c"perfmon_getLastResult"),
            sym!(c"perfmon_getLastTimeOfGroup"),
            sym!(c"perfmon_finalize"),
            sym!(c"timer_init"),
            sym!(c"timer_getCycleClock"),
        );
        let (
            Some(topology_init),
            Some(get_topology),
            Some(hpm_mode),
            Some(hpm_init),
            Some(hpm_add_thread),
            Some(perfmon_init),
            Some(add_event_set),
            Some(setup_counters),
            Some(start_counters),
            Some(stop_counters),
            Some(read_counters),
            Some(last_result),
            Some(last_time),
            Some(perfmon_finalize),
            Some(timer_init),
            Some(cycle_clock),
        ) = f
        else {
            return Err(LibraryError::SymbolMissing {
                library: shown,
                reason: format!("the library lacks {}", missing.join(", ")),
            });
        };
        let f = Functions {
            topology_init,
            get_topology,
            hpm_mode,
            hpm_init,
            hpm_add_thread,
            perfmon_init,
            add_event_set,
            setup_counters,
            start_counters,
            stop_counters,
            read_counters,
            last_result,
            last_time,
            perfmon_finalize,
            timer_init,
            cycle_clock,
        };
        // SAFETY: topology_init takes no arguments.
        let rc = unsafe { (f.topology_init)() };
        if rc != 0 {
            return Err(LibraryError::InitFailed {
                function: "topology_init".to_owned(),
                reason: format!("error {rc}"),
            });
        }
        let threads = Self::topology(&f)?;
        let cpus = threads.iter().map(|t| t.cpu as c_int).collect();
        let inverse_clock = 1.0 / base_clock(&f);
        Ok(Loaded {
            f,
            threads,
            cpus,
            inverse_clock,
            mode: None,
            running: None,
            _library: library,
        })
    }

    /// The hardware threads in the CPU set, by CPU number.
    fn topology(f: &Functions) -> Result<Vec<HwThreadInfo>, LibraryError> {
        // SAFETY: get_cpuTopology takes no arguments and returns a pointer to LIKWID's
        // topology (or null).
        let topology = unsafe { (f.get_topology)() };
        let failed = |reason: &str| LibraryError::InitFailed {
            function: "get_cpuTopology".to_owned(),
            reason: reason.to_owned(),
        };
        if topology.is_null() {
            return Err(failed("no topology"));
        }
        // SAFETY: not null; a CpuTopology of LIKWID 5 (the version was checked).
        let topology = unsafe { &*topology };
        if topology.thread_pool.is_null() || topology.num_hw_threads == 0 {
            return Err(failed("no hardware threads"));
        }
        let count = topology.num_hw_threads.min(MAX_THREADS) as usize;
        // SAFETY: LIKWID allocates numHWThreads entries for threadPool; the count is capped.
        let pool = unsafe { std::slice::from_raw_parts(topology.thread_pool, count) };
        let mut threads: Vec<HwThreadInfo> = pool
            .iter()
            .filter(|t| t.in_cpu_set != 0)
            .map(|t| HwThreadInfo {
                cpu: t.apic_id,
                core: t.core_id,
                socket: t.package_id,
                die: t.die_id,
            })
            .collect();
        threads.sort_by_key(|t| t.cpu);
        threads.dedup_by_key(|t| t.cpu);
        if threads.is_empty() {
            return Err(failed("no hardware thread in the CPU set"));
        }
        Ok(threads)
    }

    /// Sets the access mode when it changed (`HPMmode`, and for the access daemon `HPMinit`
    /// and `HPMaddThread` for every thread, as cc-metric-collector does).
    fn access(&mut self, mode: AccessMode) -> Result<(), LibraryError> {
        if self.mode == Some(mode) {
            return Ok(());
        }
        // SAFETY: an access mode code of likwid.h's AccessMode.
        unsafe { (self.f.hpm_mode)(mode.code()) };
        if mode == AccessMode::AccessDaemon {
            // SAFETY: HPMinit takes no arguments.
            let rc = unsafe { (self.f.hpm_init)() };
            if rc != 0 {
                return Err(LibraryError::InitFailed {
                    function: "HPMinit".to_owned(),
                    reason: format!(
                        "error {rc} (is LIKWID's access daemon installed and reachable?)"
                    ),
                });
            }
            for &cpu in &self.cpus {
                // SAFETY: a CPU of LIKWID's topology.
                let rc = unsafe { (self.f.hpm_add_thread)(cpu) };
                if rc != 0 {
                    return Err(LibraryError::Call {
                        function: format!("HPMaddThread({cpu})"),
                        code: rc.into(),
                    });
                }
            }
        }
        self.mode = Some(mode);
        Ok(())
    }

    /// Measures one event set for `duration`.
    fn measure_set(
        &mut self,
        event_string: &str,
        counters: usize,
        duration: Duration,
        mode: AccessMode,
    ) -> Result<SetResult, String> {
        let f = &self.f;
        let events =
            CString::new(event_string).map_err(|_| "an event string holds a NUL".to_owned())?;
        // SAFETY: the CPU list has cpus.len() entries, all of LIKWID's topology.
        let rc = unsafe { (f.perfmon_init)(self.cpus.len() as c_int, self.cpus.as_ptr()) };
        if rc != 0 {
            return Err(format!(
                "perfmon_init failed with error {rc}: the performance counters cannot be \
                 reached in {} mode (a virtual machine without a PMU, no rights for direct \
                 access, or no access daemon)",
                mode.name()
            ));
        }
        let finalize = || {
            // SAFETY: after a successful perfmon_init.
            unsafe { (f.perfmon_finalize)() }
        };
        let step = |name: &str, rc: c_int| {
            if rc == 0 {
                Ok(())
            } else {
                finalize();
                Err(format!(
                    "{name} failed with error {rc} for the events {event_string}"
                ))
            }
        };
        // SAFETY: a NUL-terminated event string.
        let gid = unsafe { (f.add_event_set)(events.as_ptr()) };
        if gid < 0 {
            finalize();
            return Err(format!(
                "perfmon_addEventSet failed with error {gid} for the events {event_string} \
                 (an event or counter this CPU does not have?)"
            ));
        }
        // SAFETY: a group id from perfmon_addEventSet.
        step("perfmon_setupCounters", unsafe { (f.setup_counters)(gid) })?;
        // SAFETY: no arguments; counters set up.
        step("perfmon_startCounters", unsafe { (f.start_counters)() })?;
        // SAFETY: as above.
        step("perfmon_readCounters", unsafe { (f.read_counters)() })?;
        std::thread::sleep(duration);
        // SAFETY: as above.
        step("perfmon_readCounters", unsafe { (f.read_counters)() })?;
        let values = (0..self.cpus.len())
            .map(|tid| {
                (0..counters)
                    .map(|event| {
                        // SAFETY: a group id, an event index below the set's count and a
                        // thread index below the CPU list's length.
                        unsafe { (f.last_result)(gid, event as c_int, tid as c_int) }
                    })
                    .collect()
            })
            .collect();
        // SAFETY: a group id from perfmon_addEventSet.
        let time = unsafe { (f.last_time)(gid) };
        // SAFETY: no arguments; counters started.
        step("perfmon_stopCounters", unsafe { (f.stop_counters)() })?;
        finalize();
        Ok(SetResult { values, time })
    }

    /// Stops an event set left counting.
    fn stop_running(&mut self) {
        if self.running.take().is_some() {
            // SAFETY: counters started by perfmon_startCounters after perfmon_init.
            unsafe { (self.f.stop_counters)() };
            // SAFETY: after a successful perfmon_init.
            unsafe { (self.f.perfmon_finalize)() };
        }
    }

    /// Reads an event set left counting: what it counted since the previous read. Starts
    /// it (and waits `duration` once) when it is not running yet.
    fn read_running(
        &mut self,
        event_string: &str,
        counters: usize,
        duration: Duration,
        mode: AccessMode,
    ) -> Result<SetResult, String> {
        let same = self
            .running
            .as_ref()
            .is_some_and(|r| r.event_string == event_string && r.mode == mode);
        if !same {
            self.stop_running();
        }
        let f = &self.f;
        let gid = match &self.running {
            Some(r) => r.gid,
            None => {
                let events = CString::new(event_string)
                    .map_err(|_| "an event string holds a NUL".to_owned())?;
                // SAFETY: the CPU list has cpus.len() entries, all of LIKWID's topology.
                let rc = unsafe { (f.perfmon_init)(self.cpus.len() as c_int, self.cpus.as_ptr()) };
                if rc != 0 {
                    return Err(format!(
                        "perfmon_init failed with error {rc}: the performance counters cannot \
                         be reached in {} mode",
                        mode.name()
                    ));
                }
                // SAFETY: a NUL-terminated event string.
                let gid = unsafe { (f.add_event_set)(events.as_ptr()) };
                // SAFETY: a group id from perfmon_addEventSet; no arguments after.
                let rc = if gid < 0 {
                    gid
                } else {
                    let mut rc = unsafe { (f.setup_counters)(gid) };
                    if rc == 0 {
                        // SAFETY: counters set up.
                        rc = unsafe { (f.start_counters)() };
                    }
                    if rc == 0 {
                        // SAFETY: counters started.
                        rc = unsafe { (f.read_counters)() };
                    }
                    rc
                };
                if rc != 0 {
                    // SAFETY: after a successful perfmon_init.
                    unsafe { (f.perfmon_finalize)() };
                    return Err(format!(
                        "starting the events {event_string} failed with error {rc}"
                    ));
                }
                self.running = Some(Running {
                    event_string: event_string.to_owned(),
                    mode,
                    gid,
                });
                std::thread::sleep(duration);
                gid
            }
        };
        let f = &self.f;
        // SAFETY: counters started.
        let rc = unsafe { (f.read_counters)() };
        if rc != 0 {
            self.stop_running();
            return Err(format!(
                "perfmon_readCounters failed with error {rc} for the events {event_string}"
            ));
        }
        let values = (0..self.cpus.len())
            .map(|tid| {
                (0..counters)
                    // SAFETY: a group id, an event index below the set's count and a
                    // thread index below the CPU list's length.
                    .map(|event| unsafe { (f.last_result)(gid, event as c_int, tid as c_int) })
                    .collect()
            })
            .collect();
        // SAFETY: a group id from perfmon_addEventSet.
        let time = unsafe { (f.last_time)(gid) };
        Ok(SetResult { values, time })
    }

    fn measure(&mut self, plan: &Plan, settings: &Settings) -> Result<Round, String> {
        if settings.force {
            // SAFETY: LIKWID reads LIKWID_FORCE from the environment and has no other way to
            // be told; it is set on this thread, the only one that calls LIKWID, and only
            // ever to 1 (cc-metric-collector sets it the same way).
            unsafe { std::env::set_var("LIKWID_FORCE", "1") };
        }
        self.access(settings.access_mode)
            .map_err(|e| e.to_string())?;
        let keep = settings.keep_counting && plan.sets.len() == 1;
        if !keep {
            self.stop_running();
        }
        let mut results = Vec::with_capacity(plan.sets.len());
        let mut skipped = Vec::new();
        for set in &plan.sets {
            if let Some(owner) = settings.lockfile.as_deref().and_then(foreign_owner) {
                // The counters are another user's: let go of them.
                self.stop_running();
                skipped.push(owner);
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                results.push(None);
                continue;
            }
            let result = if keep {
                self.read_running(
                    &set.event_string,
                    set.counters.len(),
                    settings.duration,
                    settings.access_mode,
                )?
            } else {
                self.measure_set(
                    &set.event_string,
                    set.counters.len(),
                    settings.duration,
                    settings.access_mode,
                )?
            };
            results.push(Some(result));
        }
        let threads: Vec<Thread> = self
            .threads
            .iter()
            .map(|t| Thread {
                cpu: t.cpu,
                socket: t.socket,
            })
            .collect();
        let values = plan.evaluate(
            &threads,
            &results,
            self.inverse_clock,
            settings.duration.as_secs_f64(),
            settings.invalid_to_zero,
        );
        Ok(Round { values, skipped })
    }
}

/// The owner of `lockfile` when it exists and is not this process's user: by name when the
/// user database has it, else by number.
fn foreign_owner(lockfile: &Path) -> Option<String> {
    let meta = std::fs::metadata(lockfile).ok()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let uid = meta.uid();
    if uid == me {
        return None;
    }
    Some(user_name(uid).unwrap_or_else(|| uid.to_string()))
}

/// The name of user `uid`.
fn user_name(uid: u32) -> Option<String> {
    let mut buffer = vec![0 as c_char; 4096];
    // SAFETY: passwd is plain data, valid when zeroed.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: the entry, a buffer of the given length and the result pointer, as declared.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // SAFETY: not null, NUL-terminated within the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    Some(
        ccfleet::untrusted::Untrusted(&name.to_string_lossy())
            .capped(64)
            .to_string(),
    )
}

/// Event sets skipped since start because another user held LIKWID's lock file.
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Event sets skipped since the agent started because LIKWID's lock file belonged to
/// another user (the agent's `/metrics` reports it).
pub fn skipped_event_sets() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// Work for the LIKWID thread.
type Job = Box<dyn FnOnce(&mut Option<Result<Loaded, LibraryError>>) + Send>;

/// The LIKWID threads, by library.
static WORKERS: Mutex<Option<HashMap<PathBuf, mpsc::Sender<Job>>>> = Mutex::new(None);

/// The sender of `library`'s thread, starting it at first use.
fn worker(library: &Path) -> Result<mpsc::Sender<Job>, String> {
    let mut workers = WORKERS.lock().unwrap_or_else(|e| e.into_inner());
    let workers = workers.get_or_insert_with(HashMap::new);
    if let Some(tx) = workers.get(library) {
        return Ok(tx.clone());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    let path = library.to_path_buf();
    std::thread::Builder::new()
        .name("likwid".to_owned())
        .spawn(move || {
            let mut state: Option<Result<Loaded, LibraryError>> = None;
            while let Ok(job) = rx.recv() {
                if state.is_none() {
                    prepend_accessdaemon_path();
                    state = Some(Loaded::load(&path));
                }
                job(&mut state);
            }
        })
        .map_err(|e| format!("cannot start the LIKWID thread: {e}"))?;
    workers.insert(library.to_path_buf(), tx.clone());
    Ok(tx)
}

/// Puts [`ACCESSDAEMON_ENV`]'s directory before `PATH`, once, before the library loads.
fn prepend_accessdaemon_path() {
    let Some(dir) = std::env::var_os(ACCESSDAEMON_ENV) else {
        return;
    };
    let mut path = dir;
    if let Some(old) = std::env::var_os("PATH") {
        path.push(":");
        path.push(old);
    }
    // SAFETY: LIKWID finds its access daemon through PATH, as cc-metric-collector's
    // `accessdaemon_path` arranges; this runs once per library, on its LIKWID thread,
    // before the library is loaded, from a setting of the agent's own environment.
    unsafe { std::env::set_var("PATH", path) };
}

/// One plugin's LIKWID grant: not granted, or the library to use.
#[derive(Debug, Clone, Default)]
pub(crate) struct LikwidGrant {
    library: Option<PathBuf>,
}

impl LikwidGrant {
    /// The grant of a plugin whose `capabilities.likwid` is `granted`, loading `library` (or
    /// [`LIBRARY_ENV`]'s file, or [`DEFAULT_LIBRARY`]).
    pub fn new(granted: bool, library: Option<&Path>) -> LikwidGrant {
        LikwidGrant {
            library: granted.then(|| library_path(library, LIBRARY_ENV, DEFAULT_LIBRARY)),
        }
    }

    /// Runs `f` on the library's thread and waits for it at most `limit`.
    async fn call<R: Send + 'static>(
        &self,
        limit: Duration,
        f: impl FnOnce(&mut Loaded) -> Result<R, String> + Send + 'static,
    ) -> Result<R, String> {
        let Some(library) = &self.library else {
            return Err("LIKWID is not granted to this plugin (capabilities.likwid)".to_owned());
        };
        let tx = worker(library)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |state| {
            let result = match state {
                Some(Ok(loaded)) => f(loaded),
                Some(Err(e)) => Err(format!("LIKWID is not available on this host: {e}")),
                None => Err("LIKWID was not loaded".to_owned()),
            };
            let _ = reply.send(result);
        });
        tx.send(job)
            .map_err(|_| "the LIKWID thread has ended".to_owned())?;
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the LIKWID thread ended during the call".to_owned()),
            Err(_) => Err(format!(
                "LIKWID did not answer within {} s (a hung access daemon or driver?)",
                limit.as_secs()
            )),
        }
    }

    /// The hardware threads.
    pub async fn topology(&self) -> Result<Vec<HwThreadInfo>, String> {
        self.call(GRACE, |loaded| Ok(loaded.threads.clone())).await
    }

    /// Measures one round of `plan`.
    pub async fn measure(&self, plan: Plan, settings: Settings) -> Result<Round, String> {
        if settings.duration > MAX_DURATION {
            return Err(format!(
                "the measurement duration is longer than {} s",
                MAX_DURATION.as_secs()
            ));
        }
        let limit = settings.duration * plan.sets.len() as u32 + GRACE;
        self.call(limit, move |loaded| loaded.measure(&plan, &settings))
            .await
    }
}

/// The hardware threads LIKWID at `library` reports, loading it on its thread as a grant
/// would (for `ccfleet` diagnostics and tests of a node's real library).
pub async fn topology(library: &Path) -> Result<Vec<HwThreadInfo>, String> {
    LikwidGrant::new(true, Some(library)).topology().await
}

/// Measures one round of `plan` with LIKWID at `library`, on its thread, as a granted
/// plugin's `measure` call does (for benches of the host's share of a round; the library's
/// thread and state are the ones a plugin granted the same file would use).
pub async fn measure(library: &Path, plan: Plan, settings: Settings) -> Result<Round, String> {
    LikwidGrant::new(true, Some(library))
        .measure(plan, settings)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_file_name() {
        assert_eq!(
            version_of(Path::new("/usr/lib/liblikwid.so.5.2")),
            Some((5, 2))
        );
        assert_eq!(version_of(Path::new("liblikwid.so.5")), Some((5, 0)));
        assert_eq!(version_of(Path::new("liblikwid.so.4.3.4")), Some((4, 3)));
        assert_eq!(version_of(Path::new("liblikwid.so")), None);
        assert_eq!(version_of(Path::new("libother.so.5.2")), None);
    }
}
