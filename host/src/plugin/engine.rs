//! The shared part of the host: one wasmtime `Engine` with epoch interruption, its ticker, the
//! linkers (with and without WASI) and the compile cache. The ticker advances the epoch only
//! while a call into a plugin runs (`Runtime::enter_call`): an idle agent's ticker thread
//! sleeps until the next call instead of waking every tick. Plugins are loaded here into an
//! `InstancePre`, which every (re)instantiation of the plugin reuses, and each instantiation
//! gets a fresh store from `Runtime::new_store`. This layer knows nothing of supervision.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;
use wasmtime::component::{ComponentType as _, Linker};
use wasmtime::{Config, Engine, Store, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

use super::bindings::PluginPre;
use super::cache::{ComponentCache, content_hash};
use super::commands::{CommandGrants, StoreCommands};
use super::emit::Emitter;
use super::events::{EventSender, PluginEvent};
use super::files::FileGrants;
use super::limits::MemoryLimiter;
use super::logs::LogGate;
use super::native::likwid::LikwidGrant;
use super::native::nvml::NvmlGrant;
use super::native::rocm_smi::RocmSmiGrant;
use super::sink::SinkHandle;
use super::spec::PluginSpec;
use super::state::{self, HostState};
use crate::plugin::HostError;
use crate::plugin::types::Point;

/// Options of a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Where compiled components are cached; no cache when `None`.
    pub cache_dir: Option<PathBuf>,
    /// How often the epoch advances: the granularity of CPU deadlines.
    pub epoch_tick: Duration,
    /// How often plugin files are checked for changes (hot reload).
    pub watch_interval: Duration,
    /// Capacity of the event broadcast channel.
    pub event_capacity: usize,
    /// Host files and directories that hold the embedding program's own secrets (the
    /// agent's token file, NATS credentials, configuration, compile-cache key): refused to
    /// every plugin through `cc:fleet/files`, whatever its `read-files` grant.
    pub secret_files: Vec<PathBuf>,
    /// Directories of the embedding program's state (the fleet's downloads, the compile
    /// cache): a native library (`nvml-library`, `likwid-library`, `rocm-smi-library`, or the
    /// one the environment names) found to
    /// lie in one is never loaded, since what lies there may have come from the fleet.
    pub state_dirs: Vec<PathBuf>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cache_dir: default_cache_dir(),
            epoch_tick: Duration::from_millis(10),
            watch_interval: Duration::from_secs(2),
            event_capacity: 1024,
            secret_files: Vec::new(),
            state_dirs: Vec::new(),
        }
    }
}

/// `$XDG_CACHE_HOME/ccfleet/components`, else `$HOME/.cache/ccfleet/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("ccfleet").join("components"))
}

/// The plugin host's shared engine, linkers and cache. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    plain: Linker<HostState>,
    /// Built at the first plugin granted WASI: several hundred host functions that an agent
    /// of collectors (none of which uses WASI) would otherwise pay for at every start.
    wasi: OnceLock<Linker<HostState>>,
    cache: ComponentCache,
    events: EventSender,
    options: RuntimeOptions,
    secrets: Arc<[PathBuf]>,
    ticker: Ticker,
}

/// A compiled, type-checked plugin, ready to be instantiated any number of times.
#[derive(Clone)]
pub struct LoadedPlugin {
    pub(crate) pre: PluginPre<HostState>,
    /// The SHA-256 of the component file, hex.
    pub hash: String,
    /// Whether the compiled code came from the on-disk cache.
    pub cached: bool,
}

/// What identifies a version of a file without reading it: size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    pub fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

impl Runtime {
    /// Creates the engine, starts its epoch ticker and builds the linker without WASI (the one
    /// with WASI is built when a plugin granted WASI first loads).
    pub fn new(options: RuntimeOptions) -> Result<Runtime, HostError> {
        let engine_err = |e: wasmtime::Error| HostError::Engine(format!("{e:#}"));
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            // The WIT world has no async functions; without concurrency support calls into
            // components are several times cheaper.
            .concurrency_support(false)
            // The map from native code back to wasm offsets is only read for the offsets in
            // a trap's backtrace (the function names come from the name section): a tenth
            // of each compiled component, mapped and resident on every node, for a detail of
            // a message.
            .generate_address_map(false);
        let engine = Engine::new(&config).map_err(engine_err)?;
        let ticker = Ticker::spawn(&engine, options.epoch_tick)
            .map_err(|e| HostError::Engine(format!("cannot start the epoch ticker: {e}")))?;

        let mut plain = Linker::new(&engine);
        state::add_to_linker(&mut plain).map_err(engine_err)?;

        let cache = ComponentCache::new(&engine, options.cache_dir.clone());
        let (events, _) = broadcast::channel(options.event_capacity.max(16));
        let secrets = Arc::from(options.secret_files.clone());
        Ok(Runtime {
            inner: Arc::new(Inner {
                engine,
                plain,
                wasi: OnceLock::new(),
                cache,
                events,
                options,
                secrets,
                ticker,
            }),
        })
    }

    /// Subscribes to the events of every plugin of this runtime.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.inner.events.subscribe()
    }

    /// The options the runtime was created with.
    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// Marks a call into a plugin as running until the guard is dropped: the epoch ticker
    /// advances the epoch (which enforces CPU deadlines and lets long calls yield) only while
    /// at least one such guard is alive. Everything that runs guest code (instantiation and
    /// every export call) must hold one, or a runaway call would never be interrupted.
    pub(crate) fn enter_call(&self) -> ActiveCall {
        self.inner.ticker.enter()
    }

    /// How often the ticker has advanced the epoch so far.
    #[cfg(test)]
    pub(crate) fn epoch_ticks(&self) -> u64 {
        self.inner.ticker.shared.ticks.load(Ordering::Relaxed)
    }

    pub(crate) fn events(&self) -> &EventSender {
        &self.inner.events
    }

    /// Reads, compiles (or takes from the cache) and type-checks a plugin's component. Runs
    /// the compilation on the blocking pool.
    pub async fn load(&self, spec: &PluginSpec) -> Result<LoadedPlugin, HostError> {
        spec.validate()?;
        let this = self.clone();
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || this.load_blocking(&spec))
            .await
            .map_err(|e| HostError::Engine(format!("the compile task failed: {e}")))?
    }

    /// [`Runtime::load`] on the current thread.
    pub fn load_blocking(&self, spec: &PluginSpec) -> Result<LoadedPlugin, HostError> {
        let path = &spec.path;
        let bytes = std::fs::read(path).map_err(|source| HostError::Read {
            path: path.clone(),
            source,
        })?;
        self.load_bytes(spec, &bytes)
    }

    pub(crate) fn load_bytes(
        &self,
        spec: &PluginSpec,
        bytes: &[u8],
    ) -> Result<LoadedPlugin, HostError> {
        let path = &spec.path;
        let plugin = spec.display_name();
        if Engine::detect_precompiled(bytes).is_some() {
            return Err(HostError::Precompiled { path: path.clone() });
        }
        if super::componentize::is_core_module(bytes) {
            return Err(HostError::CoreModule { path: path.clone() });
        }
        let hash = content_hash(bytes);
        let (component, cached) = self
            .inner
            .cache
            .load(&self.inner.engine, &hash, bytes)
            .map_err(|e| HostError::InvalidComponent {
                path: path.clone(),
                reason: format!("{e:#}"),
            })?;
        let granted = spec.capabilities.wasi;
        if !granted {
            let ty = component.component_type();
            if let Some((import, _)) = ty
                .imports(&self.inner.engine)
                .find(|(name, _)| name.starts_with("wasi:"))
            {
                return Err(HostError::WasiNotGranted {
                    plugin,
                    import: import.to_owned(),
                });
            }
        }
        let linker = if granted {
            self.wasi_linker()
                .map_err(|e| HostError::Engine(format!("{e:#}")))?
        } else {
            &self.inner.plain
        };
        let incompatible = |e: wasmtime::Error| HostError::Incompatible {
            plugin: plugin.clone(),
            reason: format!("{e:#}"),
        };
        let pre = linker.instantiate_pre(&component).map_err(incompatible)?;
        let pre = PluginPre::new(pre).map_err(incompatible)?;
        Ok(LoadedPlugin { pre, hash, cached })
    }

    /// The linker with WASI, built on first use (two plugins loading at once may both build
    /// one; the first to finish is kept).
    fn wasi_linker(&self) -> wasmtime::Result<&Linker<HostState>> {
        if let Some(linker) = self.inner.wasi.get() {
            return Ok(linker);
        }
        let mut wasi = Linker::new(&self.inner.engine);
        state::add_to_linker(&mut wasi)?;
        wasmtime_wasi::p2::add_to_linker_async(&mut wasi)?;
        Ok(self.inner.wasi.get_or_init(|| wasi))
    }

    /// Creates a fresh store for one instantiation of a plugin.
    pub(crate) fn new_store(
        &self,
        spec: &PluginSpec,
        plugin: Arc<str>,
        generation: u64,
        sink: SinkHandle,
        logs: LogGate,
        commands: Arc<CommandGrants>,
    ) -> Result<Store<HostState>, HostError> {
        let limits = &spec.limits;
        let caps = &spec.capabilities;
        // The system's secrets are looked up as the store is made: a host key generated
        // later is refused from the plugin's next start on.
        let secrets = super::secrets::for_plugin(&self.inner.secrets, &caps.read_files);
        let files = if caps.read_files.is_empty() && !caps.mount_info {
            FileGrants::none()
        } else {
            FileGrants::new(
                &caps.read_files,
                caps.files_root.as_deref(),
                limits.max_file_bytes as usize,
            )
            .map_err(|reason| HostError::Spec {
                plugin: plugin.to_string(),
                reason,
            })?
            .with_secrets(secrets.clone())
        };
        let files = if caps.mount_info {
            files.with_mount_info()
        } else {
            files
        };
        let wasi = if spec.capabilities.wasi {
            let mut builder = WasiCtx::builder();
            spec.capabilities
                .configure(&mut builder, &secrets)
                .map_err(|e| HostError::Preopen {
                    plugin: plugin.to_string(),
                    path: e.path,
                    reason: e.reason,
                })?;
            Some(builder.build())
        } else {
            None
        };
        let libraries = [
            (
                caps.nvml,
                caps.nvml_library.as_deref(),
                super::nvml::LIBRARY_ENV,
            ),
            (
                caps.likwid,
                caps.likwid_library.as_deref(),
                super::native::likwid::LIBRARY_ENV,
            ),
            (
                caps.rocm_smi,
                caps.rocm_smi_library.as_deref(),
                super::native::rocm_smi::LIBRARY_ENV,
            ),
        ];
        for (_, library, env) in libraries.into_iter().filter(|(granted, ..)| *granted) {
            super::libraries::check(library, env, &self.inner.options.state_dirs).map_err(
                |reason| HostError::Spec {
                    plugin: plugin.to_string(),
                    reason,
                },
            )?;
        }
        let state = HostState {
            plugin: plugin.clone(),
            generation,
            limiter: MemoryLimiter::new(limits.memory_bytes()),
            emitter: Emitter::new(sink, limits.batch_limits()),
            events: self.inner.events.clone(),
            logs,
            files,
            commands: StoreCommands::new(commands),
            nvml: NvmlGrant::new(caps.nvml, caps.nvml_library.as_deref()),
            likwid: LikwidGrant::new(caps.likwid, caps.likwid_library.as_deref()),
            rocm_smi: RocmSmiGrant::new(caps.rocm_smi, caps.rocm_smi_library.as_deref()),
            deadline: Instant::now() + limits.call_timeout,
            table: wasmtime::component::ResourceTable::new(),
            wasi,
        };
        let mut store =
            Store::try_new(&self.inner.engine, state).map_err(|e| HostError::Store {
                plugin: plugin.to_string(),
                reason: format!("{e:#}"),
            })?;
        store.limiter(|s| &mut s.limiter);
        // Host-call fuel bounds what copying one call's arguments to the host may allocate.
        // The `cc:fleet` imports copy nothing up front (`emit` copies its points under a
        // budget of its own, see `state`), but wasmtime charges a list's records before the
        // function runs: the fuel covers the largest list the plugin's memory can hold, so
        // an oversized `emit` reaches its size check instead of trapping. Eagerly copying
        // WASI imports are bounded by the same figure, a little over the memory limit.
        let largest_list = (limits.memory_bytes() / Point::SIZE32)
            .saturating_mul(std::mem::size_of::<Point>())
            .saturating_add(64 << 10);
        store.set_hostcall_fuel(
            largest_list.max((limits.max_emit_bytes as usize).saturating_mul(2)),
        );
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                // Yield at every tick so a long call never holds a runtime worker.
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store.set_epoch_deadline(1);
        Ok(store)
    }
}

/// The thread that advances the engine's epoch every tick while calls run, and sleeps
/// (parked, not waking at all) while none does.
struct Ticker {
    shared: Arc<TickerShared>,
    thread: std::thread::Thread,
}

struct TickerShared {
    /// Calls into plugins running now.
    active: AtomicUsize,
    /// Set when the runtime is dropped: the thread ends.
    stop: AtomicBool,
    /// Epoch increments so far (for tests and diagnostics).
    ticks: AtomicU64,
}

/// A running call into a plugin, as far as the epoch ticker is concerned: see
/// [`Runtime::enter_call`].
pub(crate) struct ActiveCall {
    shared: Arc<TickerShared>,
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.shared.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    fn spawn(engine: &Engine, tick: Duration) -> std::io::Result<Ticker> {
        let weak = engine.weak();
        let tick = tick.max(Duration::from_millis(1));
        let shared = Arc::new(TickerShared {
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            ticks: AtomicU64::new(0),
        });
        let state = shared.clone();
        let handle = std::thread::Builder::new()
            .name("ccfleet-epoch".to_owned())
            .spawn(move || {
                loop {
                    if state.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if state.active.load(Ordering::SeqCst) == 0 {
                        // `enter` unparks after raising the count, and an unpark that comes
                        // before this park makes it return at once: no call is missed.
                        // Spurious wake-ups just go round the loop.
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(tick);
                    match weak.upgrade() {
                        Some(engine) => {
                            engine.increment_epoch();
                            state.ticks.fetch_add(1, Ordering::Relaxed);
                        }
                        None => return,
                    }
                }
            })?;
        Ok(Ticker {
            shared,
            thread: handle.thread().clone(),
        })
    }

    fn enter(&self) -> ActiveCall {
        if self.shared.active.fetch_add(1, Ordering::SeqCst) == 0 {
            self.thread.unpark();
        }
        ActiveCall {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (up to a generous bound, for a loaded machine) until `ready` holds.
    fn eventually(mut ready: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn the_wasi_linker_is_built_once_and_only_when_asked_for() {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        assert!(runtime.inner.wasi.get().is_none(), "built at start-up");
        let first: *const Linker<HostState> = runtime.wasi_linker().unwrap();
        let second: *const Linker<HostState> = runtime.wasi_linker().unwrap();
        assert_eq!(first, second, "built twice");
    }

    #[test]
    fn an_idle_runtime_does_not_advance_the_epoch_and_a_running_call_does() {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            epoch_tick: Duration::from_millis(1),
            ..RuntimeOptions::default()
        })
        .unwrap();
        // Idle: a hundred ticks' worth of time passes without one.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            runtime.epoch_ticks(),
            0,
            "the ticker woke with no call running"
        );

        let call = runtime.enter_call();
        assert!(
            eventually(|| runtime.epoch_ticks() >= 3),
            "the ticker does not advance the epoch while a call runs"
        );
        // A second, overlapping call keeps it going after the first ends.
        let second = runtime.enter_call();
        drop(call);
        let before = runtime.epoch_ticks();
        assert!(eventually(|| runtime.epoch_ticks() >= before + 3));
        drop(second);

        // Idle again: at most the tick that was under way when the call ended.
        std::thread::sleep(Duration::from_millis(20));
        let idle = runtime.epoch_ticks();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            runtime.epoch_ticks() <= idle + 1,
            "the ticker kept running when idle"
        );
    }
}
