//! The data of one plugin's `Store` and the host side of its imports, `cc:fleet/host`,
//! `cc:fleet/files` and `cc:fleet/commands`, in both worlds the host serves (0.3 and 0.2).
//!
//! The imports are linked by hand rather than through the generated `Host` traits: the
//! generated code copies every argument into host memory before the function runs, so a
//! plugin's oversized `emit` or log line would be copied (or trap on wasmtime's host-call
//! fuel) before any limit of ours could look at it. Here arguments arrive as views into the
//! plugin's memory (`WasmList`, `WasmStr`): `emit-lines` checks the batch's size first and
//! then checks and copies its lines straight from the plugin's memory (`emit`), `emit` (the
//! typed path of 0.2) checks the number of points first and encodes the points from the
//! plugin's memory under the batch's byte limit without copying them (`emit::PointView`),
//! `log` checks the rate first and copies at most a capped message.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use ccfleet::untrusted::Untrusted;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, ResourceTable, WasmList, WasmStr};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::cc::fleet::commands::Output as CommandOutput;
use super::bindings::cc::fleet::likwid as wl;
use super::commands::{RunError, RunResult, StoreCommands};
use super::emit::{Emitter, EmitterHost, PointView};
use super::events::{EventKind, EventSender, PluginEvent};
use super::files::FileGrants;
use super::limits::MemoryLimiter;
use super::logs::{self, LogGate, MAX_LOG_MESSAGE};
use super::native::likwid::{self, LikwidGrant};
use super::native::likwid_metrics::{EventSetSpec, MetricSpec, Plan};
use super::native::nvml::NvmlGrant;
use super::native::rocm_smi::{self, RocmSmiGrant};
use super::sink::Batch;
use crate::plugin::types::Level;

/// The version of the `cc:fleet` WIT package (`wit/fleet.wit`) the host implements.
/// Components built against 0.3.0 resolve to it: wasmtime matches their `@0.3.0` imports
/// and exports to these semver-compatible ones, whose functions are a superset.
pub(crate) const WIT_VERSION: &str = "0.3.3";

/// The last version of the 0.2 line (`wit/0.2/fleet.wit`), which the host serves too:
/// wasmtime resolves the `@0.2.0` imports of older components to these semver-compatible
/// ones, whose functions are a superset.
pub(crate) const WIT_VERSION_02: &str = "0.2.1";

/// The longest command name `commands.run` looks at.
const MAX_COMMAND_NAME: usize = 256;

/// The message wasmtime gives when a host call copies more than its fuel allows.
pub(crate) const HOSTCALL_FUEL_MESSAGE: &str = "fuel allocated for hostcalls has been exhausted";

/// Everything a plugin's `Store` holds.
pub(crate) struct HostState {
    pub plugin: Arc<str>,
    pub generation: u64,
    pub limiter: MemoryLimiter,
    pub emitter: Emitter,
    pub events: EventSender,
    pub logs: LogGate,
    pub files: FileGrants,
    pub commands: StoreCommands,
    pub nvml: NvmlGrant,
    pub likwid: LikwidGrant,
    pub rocm_smi: RocmSmiGrant,
    /// When the current call must end; checked on every epoch tick.
    pub deadline: Instant,
    pub table: ResourceTable,
    pub wasi: Option<WasiCtx>,
}

impl EmitterHost for HostState {
    fn emitter(&self) -> &Emitter {
        &self.emitter
    }

    fn emitter_mut(&mut self) -> &mut Emitter {
        &mut self.emitter
    }
}

impl HostState {
    pub fn event(&self, kind: EventKind) {
        // Nobody listening is fine: events are for observers only.
        let _ = self.events.send(PluginEvent {
            plugin: self.plugin.clone(),
            generation: self.generation,
            kind,
        });
    }

    /// Reports lines the log gate dropped.
    fn report_dropped(&self, count: u64) {
        if count > 0 {
            tracing::warn!(
                plugin = &*self.plugin,
                dropped = count,
                "plugin log lines dropped over its rate limit"
            );
            self.event(EventKind::LogsDropped { count });
        }
    }

    fn write_log(&self, level: Level, message: String) {
        let plugin = &*self.plugin;
        // `message` is capped already; the margin keeps the cap's own marker.
        let text = Untrusted(&message).capped(MAX_LOG_MESSAGE + 32);
        match level {
            Level::Trace => tracing::trace!(plugin, "{text}"),
            Level::Debug => tracing::debug!(plugin, "{text}"),
            Level::Info => tracing::info!(plugin, "{text}"),
            Level::Warn => tracing::warn!(plugin, "{text}"),
            Level::Error => tracing::error!(plugin, "{text}"),
        }
        self.event(EventKind::Log { level, message });
    }

    /// Reports a granted command that gave no output, within the plugin's log budget: the
    /// plugin gets the message as its error, but an operator learns of a hanging tool or a
    /// replaced executable without the plugin's help.
    fn command_failed(&self, error: &RunError) {
        let admission = self.logs.admit();
        self.report_dropped(admission.report_dropped);
        if admission.admit {
            tracing::warn!(
                plugin = &*self.plugin,
                result = error.result.as_str(),
                "granted command failed: {}",
                Untrusted(&error.message)
            );
        }
    }

    /// Hands an encoded batch of `points` points to the sink.
    fn send(&mut self, lines: Vec<u8>, points: usize) -> Result<(), String> {
        let bytes = lines.len();
        self.emitter
            .sink
            .try_send(Batch {
                plugin: self.plugin.clone(),
                lines: lines.into(),
                points,
            })
            .map_err(|e| e.to_string())?;
        self.event(EventKind::Emitted { points, bytes });
        Ok(())
    }

    fn emit_refused(&self, reason: String) -> String {
        let admission = self.logs.admit();
        self.report_dropped(admission.report_dropped);
        if admission.admit {
            tracing::warn!(
                plugin = &*self.plugin,
                "emit refused: {}",
                Untrusted(&reason)
            );
        }
        self.event(EventKind::EmitRefused {
            reason: reason.clone(),
        });
        reason
    }
}

/// Links the interfaces of both worlds: `cc:fleet/types`, `cc:fleet/host` and
/// `cc:fleet/files` of 0.2 and 0.3, and what 0.3 adds (`host.emit-lines`,
/// `cc:fleet/commands`, since 0.3.1 `cc:fleet/nvml`, since 0.3.2 `cc:fleet/likwid`, since
/// 0.3.3 `cc:fleet/rocm-smi`).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    for version in [WIT_VERSION_02, WIT_VERSION] {
        add_shared(linker, version)?;
    }
    let mut host = linker.instance(&format!("cc:fleet/host@{WIT_VERSION}"))?;
    host.func_wrap(
        "emit-lines",
        |store: StoreContextMut<'_, HostState>, (lines,): (WasmList<u8>,)| {
            Ok((emit_lines(store, lines),))
        },
    )?;
    let mut commands = linker.instance(&format!("cc:fleet/commands@{WIT_VERSION}"))?;
    commands.func_wrap_async(
        "run",
        |store: StoreContextMut<'_, HostState>, (name,): (WasmStr,)| {
            Box::new(run_command(store, name))
        },
    )?;
    let mut nvml = linker.instance(&format!("cc:fleet/nvml@{WIT_VERSION}"))?;
    nvml.func_wrap_async(
        "devices",
        |store: StoreContextMut<'_, HostState>, (mig,): (bool,)| {
            Box::new(async move {
                let result = with_nvml(store, move |nvml| nvml.devices(mig)).await;
                Ok((result,))
            })
        },
    )?;
    nvml.func_wrap_async(
        "read",
        |store: StoreContextMut<'_, HostState>, (device, mig): (u32, Option<u32>)| {
            Box::new(async move {
                let result = with_nvml(store, move |nvml| nvml.read(device, mig)).await;
                Ok((result,))
            })
        },
    )?;
    let mut smi = linker.instance(&format!("cc:fleet/rocm-smi@{WIT_VERSION}"))?;
    smi.func_wrap_async(
        "devices",
        |store: StoreContextMut<'_, HostState>, (): ()| {
            Box::new(async move {
                let result = with_rocm_smi(store, |smi| smi.devices()).await;
                Ok((result,))
            })
        },
    )?;
    smi.func_wrap_async(
        "read",
        |store: StoreContextMut<'_, HostState>, (device,): (u32,)| {
            Box::new(async move {
                let result = with_rocm_smi(store, move |smi| smi.read(device)).await;
                Ok((result,))
            })
        },
    )?;
    let mut lw = linker.instance(&format!("cc:fleet/likwid@{WIT_VERSION}"))?;
    lw.func_wrap_async(
        "topology",
        |mut store: StoreContextMut<'_, HostState>, (): ()| {
            Box::new(async move {
                let grant = store.data().likwid.clone();
                let begun = Instant::now();
                let result = grant.topology().await.map(|threads| {
                    threads
                        .into_iter()
                        .map(|t| wl::Hwthread {
                            cpu: t.cpu,
                            core: t.core,
                            socket: t.socket,
                            die: t.die,
                        })
                        .collect::<Vec<_>>()
                });
                store.data_mut().deadline += begun.elapsed();
                Ok((result,))
            })
        },
    )?;
    lw.func_wrap_async(
        "measure",
        |mut store: StoreContextMut<'_, HostState>, (setup,): (wl::Setup,)| {
            Box::new(async move {
                let grant = store.data().likwid.clone();
                let begun = Instant::now();
                let result = likwid_measure(&grant, setup).await;
                store.data_mut().deadline += begun.elapsed();
                Ok((result,))
            })
        },
    )?;
    Ok(())
}

/// `likwid.measure`: the setup checked into a plan (formulas parsed by the router's
/// expression engine) here, measured on the LIKWID thread. The time it took is not charged to
/// the call's CPU deadline, which moves on by as much: a round waits its duration.
async fn likwid_measure(grant: &LikwidGrant, setup: wl::Setup) -> Result<wl::Round, String> {
    let metric = |m: wl::Metric| MetricSpec {
        name: m.name,
        calc: m.calc,
        scope: m.scope,
    };
    let sets: Vec<EventSetSpec> = setup
        .event_sets
        .into_iter()
        .map(|s| EventSetSpec {
            events: s.events,
            metrics: s.metrics.into_iter().map(metric).collect(),
        })
        .collect();
    let globals: Vec<MetricSpec> = setup.global_metrics.into_iter().map(metric).collect();
    let plan = Plan::new(&sets, &globals)?;
    let settings = likwid::Settings {
        access_mode: match setup.access_mode {
            wl::AccessMode::Direct => likwid::AccessMode::Direct,
            wl::AccessMode::Accessdaemon => likwid::AccessMode::AccessDaemon,
            wl::AccessMode::PerfEvent => likwid::AccessMode::PerfEvent,
        },
        lockfile: setup.lockfile_path.map(std::path::PathBuf::from),
        force: setup.force_overwrite,
        invalid_to_zero: setup.invalid_to_zero,
        duration: std::time::Duration::from_nanos(setup.duration_ns),
        keep_counting: setup.keep_counting,
    };
    let round = grant.measure(plan, settings).await?;
    Ok(wl::Round {
        values: round
            .values
            .into_iter()
            .map(|v| wl::Value {
                metric: v.name,
                scope: v.scope.name().to_owned(),
                scope_id: v.scope_id,
                value: v.value,
            })
            .collect(),
        skipped: round.skipped,
    })
}

/// Runs `f` on the plugin's NVML library (loading it at first use) on a blocking thread,
/// so a slow driver holds no runtime worker. The time it took is not charged to the call's
/// CPU deadline, which moves on by as much: NVML's first initialisation can take seconds
/// on a node without the driver's persistence mode.
async fn with_nvml<R: Send + 'static>(
    mut store: StoreContextMut<'_, HostState>,
    f: impl FnOnce(&super::native::nvml::Nvml) -> Result<R, String> + Send + 'static,
) -> Result<R, String> {
    let grant = store.data().nvml.clone();
    let begun = Instant::now();
    let result = tokio::task::spawn_blocking(move || grant.nvml().and_then(|nvml| f(&nvml)))
        .await
        .unwrap_or_else(|e| Err(format!("the NVML call failed: {e}")));
    store.data_mut().deadline += begun.elapsed();
    result
}

/// Runs `f` on the plugin's ROCm SMI library (loading it at first use) on a blocking thread,
/// as [`with_nvml`] does, and gives up after [`rocm_smi::CALL_TIMEOUT`] and a little: a call
/// stuck in the driver fails instead of holding the plugin (its thread is left to finish).
async fn with_rocm_smi<R: Send + 'static>(
    mut store: StoreContextMut<'_, HostState>,
    f: impl FnOnce(&rocm_smi::RocmSmi) -> Result<R, String> + Send + 'static,
) -> Result<R, String> {
    let grant = store.data().rocm_smi.clone();
    let begun = Instant::now();
    let call = tokio::task::spawn_blocking(move || grant.rocm_smi().and_then(|smi| f(&smi)));
    // The library's own waits (for the lock of a call before) end at the timeout; this one
    // covers a call that never returns.
    let limit = rocm_smi::CALL_TIMEOUT * 2 + std::time::Duration::from_secs(1);
    let result = match tokio::time::timeout(limit, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(format!("the ROCm SMI call failed: {e}")),
        Err(_) => Err(format!(
            "ROCm SMI did not answer within {} s (a stuck driver?)",
            limit.as_secs()
        )),
    };
    store.data_mut().deadline += begun.elapsed();
    result
}

/// `commands.run`: the call's fiber is suspended while the command runs, so no runtime
/// worker waits for it. The time it took is charged to the call's command time and not to
/// its CPU deadline, which moves on by as much (see [`StoreCommands`]).
async fn run_command(
    mut store: StoreContextMut<'_, HostState>,
    name: WasmStr,
) -> wasmtime::Result<(Result<CommandOutput, String>,)> {
    let (grants, left) = store.data().commands.begin();
    // A name is short: a longer one is no grant, and is not copied.
    let name = match name.to_str(&store) {
        Ok(name) if name.len() > MAX_COMMAND_NAME => Err("the command name is too long"),
        Ok(name) => Ok(name.into_owned()),
        Err(_) => Err("the command name is not valid UTF-8"),
    };
    let name = match name {
        Ok(name) => name,
        Err(reason) => {
            grants
                .stats()
                .record(RunResult::Refused, std::time::Duration::ZERO);
            return Ok((Err(reason.to_owned()),));
        }
    };
    let begun = Instant::now();
    let result = grants.run_within(&name, Some(left)).await;
    let took = begun.elapsed();
    let state = store.data_mut();
    state.commands.spent(took);
    state.deadline += took;
    let result = match result {
        Ok(output) => Ok(CommandOutput {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        }),
        Err(error) => {
            state.command_failed(&error);
            Err(error.message)
        }
    };
    Ok((result,))
}

/// Links what both worlds have, under `version`.
fn add_shared(linker: &mut Linker<HostState>, version: &str) -> wasmtime::Result<()> {
    linker.instance(&format!("cc:fleet/types@{version}"))?;

    let mut host = linker.instance(&format!("cc:fleet/host@{version}"))?;
    host.func_wrap(
        "log",
        |store: StoreContextMut<'_, HostState>, (level, message): (Level, WasmStr)| {
            log(store, level, message);
            Ok(())
        },
    )?;
    host.func_wrap(
        "emit",
        |store: StoreContextMut<'_, HostState>, (points,): (WasmList<PointView>,)| {
            Ok((emit(store, points)?,))
        },
    )?;
    host.func_wrap("now-ns", |_: StoreContextMut<'_, HostState>, (): ()| {
        Ok((ccfleet::wire::now_ns(),))
    })?;

    let mut files = linker.instance(&format!("cc:fleet/files@{version}"))?;
    files.func_wrap(
        "read",
        |store: StoreContextMut<'_, HostState>, (path,): (WasmStr,)| {
            let result = with_path(&store, &path, |grants, path| grants.read(path));
            Ok((result,))
        },
    )?;
    files.func_wrap(
        "list-dir",
        |store: StoreContextMut<'_, HostState>, (path,): (WasmStr,)| {
            let result = with_path(&store, &path, |grants, path| grants.list(path));
            Ok((result,))
        },
    )?;
    files.func_wrap(
        "statvfs",
        |store: StoreContextMut<'_, HostState>, (path,): (WasmStr,)| {
            let result = with_path(&store, &path, |grants, path| grants.statvfs(path));
            Ok((result,))
        },
    )?;
    Ok(())
}

fn log(mut store: StoreContextMut<'_, HostState>, level: Level, message: WasmStr) {
    // The rate is checked before the message is even looked at.
    let admission = store.data().logs.admit();
    store.data().report_dropped(admission.report_dropped);
    if !admission.admit {
        return;
    }
    let text = match message.to_str(&store) {
        Ok(text) => logs::cap(&text, MAX_LOG_MESSAGE),
        Err(_) => "(a log message that is not valid UTF-8)".to_owned(),
    };
    store.data_mut().write_log(level, text);
}

fn emit(
    mut store: StoreContextMut<'_, HostState>,
    points: WasmList<PointView>,
) -> wasmtime::Result<Result<(), String>> {
    let count = points.len();
    // The points are read in place, not copied: the writer's byte limit bounds what the
    // host allocates, so wasmtime's host-call fuel (which counts the views as if they were
    // copies) must not end a batch the limit admits.
    let call_fuel = store.hostcall_fuel();
    store.set_hostcall_fuel(usize::MAX);
    let encoded = Emitter::encode_from(&mut store, &points, ccfleet::wire::now_ns);
    store.set_hostcall_fuel(call_fuel);
    // Anything else than a refusal is a malformed call (bad UTF-8, an out-of-bounds list):
    // a trap.
    let outcome = match encoded? {
        // A full or closed sink counts the points itself.
        Ok(lines) => store.data_mut().send(lines, count),
        Err(reason) => {
            store.data().emitter.sink.count_refused(count);
            Err(reason)
        }
    };
    Ok(outcome.map_err(|reason| store.data().emit_refused(reason)))
}

/// `host.emit-lines`: the batch is checked and copied straight from the plugin's memory
/// (see `emit::Emitter::check_lines`); a refusal is the plugin's error, never a trap.
fn emit_lines(
    mut store: StoreContextMut<'_, HostState>,
    lines: WasmList<u8>,
) -> Result<(), String> {
    let outcome = match Emitter::check_lines(&mut store, &lines, ccfleet::wire::now_ns) {
        // A full or closed sink counts the points itself.
        Ok((lines, points)) if points > 0 => store.data_mut().send(lines, points),
        Ok(_) => Ok(()),
        Err((reason, points)) => {
            store.data().emitter.sink.count_refused(points);
            Err(reason)
        }
    };
    outcome.map_err(|reason| store.data().emit_refused(reason))
}

fn with_path<R>(
    store: &StoreContextMut<'_, HostState>,
    path: &WasmStr,
    f: impl FnOnce(&FileGrants, &str) -> Result<R, String>,
) -> Result<R, String> {
    let path: Cow<'_, str> = match path.to_str(store) {
        Ok(path) => path,
        Err(_) => return Err("the path is not valid UTF-8".to_owned()),
    };
    if path.len() > super::files::MAX_PATH {
        return Err("the path is too long".to_owned());
    }
    // Copy the (short) path so the plugin's memory is not borrowed during file I/O.
    let path = path.into_owned();
    f(&store.data().files, &path)
}

/// Whether a wasmtime error is the host-call fuel running out.
pub(crate) fn is_hostcall_fuel(error: &wasmtime::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.to_string().contains(HOSTCALL_FUEL_MESSAGE))
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        // Only plugins granted WASI are linked against it, and they always get a context;
        // the fallback is an empty context, which grants nothing.
        let ctx = self.wasi.get_or_insert_with(|| WasiCtx::builder().build());
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}
