//! The data of one plugin's `Store` and the host side of its imports, `cc:fleet/host` and
//! `cc:fleet/files`.
//!
//! The imports are linked by hand rather than through the generated `Host` traits: the
//! generated code copies every argument into host memory before the function runs, so a
//! plugin's oversized `emit` or log line would be copied (or trap on wasmtime's host-call
//! fuel) before any limit of ours could look at it. Here arguments arrive as views into the
//! plugin's memory (`WasmList`, `WasmStr`): `emit` checks the number of points first and
//! encodes the points from the plugin's memory under the batch's byte limit without copying
//! them (`emit::PointView`), `log` checks the rate first and copies at most a capped message.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use ccfleet::untrusted::Untrusted;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, ResourceTable, WasmList, WasmStr};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::commands::StoreCommands;
use super::emit::{Emitter, PointView};
use super::events::{EventKind, EventSender, PluginEvent};
use super::files::FileGrants;
use super::limits::MemoryLimiter;
use super::logs::{self, LogGate, MAX_LOG_MESSAGE};
use super::sink::Batch;
use crate::plugin::types::Level;

/// The version of the `cc:fleet` WIT package (`wit/fleet.wit`) the host implements.
///
/// Components built against an older 0.2 version still link: wasmtime resolves their
/// `@0.2.0` imports to these semver-compatible ones, whose functions are a superset.
pub(crate) const WIT_VERSION: &str = "0.2.1";

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
    /// When the current call must end; checked on every epoch tick.
    pub deadline: Instant,
    pub table: ResourceTable,
    pub wasi: Option<WasiCtx>,
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

/// Links `cc:fleet/types`, `cc:fleet/host` and `cc:fleet/files`.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.instance(&format!("cc:fleet/types@{WIT_VERSION}"))?;

    let mut host = linker.instance(&format!("cc:fleet/host@{WIT_VERSION}"))?;
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

    let mut files = linker.instance(&format!("cc:fleet/files@{WIT_VERSION}"))?;
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
