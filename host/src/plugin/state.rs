//! The data of one plugin's `Store`: its limits, its metric encoder and the implementation of
//! the `cc:fleet/host` imports.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::cc::fleet::{host, types};
use super::emit::Emitter;
use super::events::{EventKind, EventSender, PluginEvent};
use super::limits::MemoryLimiter;
use super::sink::Batch;
use crate::plugin::types::{Level, Point};

/// Longest log message kept from a plugin; the rest is cut so a plugin cannot flood logs.
const MAX_LOG_MESSAGE: usize = 4096;
/// Everything a plugin's `Store` holds.
pub(crate) struct HostState {
    pub plugin: Arc<str>,
    pub generation: u64,
    pub limiter: MemoryLimiter,
    pub emitter: Emitter,
    pub events: EventSender,
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
}

impl types::Host for HostState {}

impl host::Host for HostState {
    fn log(&mut self, level: Level, mut message: String) -> wasmtime::Result<()> {
        if message.len() > MAX_LOG_MESSAGE {
            let mut cut = MAX_LOG_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
        self.event(EventKind::Log { level, message });
        Ok(())
    }

    fn emit(&mut self, points: Vec<Point>) -> wasmtime::Result<Result<(), String>> {
        let outcome = self
            .emitter
            .encode(&points, ccfleet::wire::now_ns())
            .and_then(|lines| {
                let bytes = lines.len();
                self.emitter
                    .sink
                    .try_send(Batch {
                        plugin: self.plugin.clone(),
                        lines: lines.into(),
                        points: points.len(),
                    })
                    .map(|()| bytes)
                    .map_err(|e| e.to_string())
            });
        match outcome {
            Ok(bytes) => {
                self.event(EventKind::Emitted {
                    points: points.len(),
                    bytes,
                });
                Ok(Ok(()))
            }
            Err(reason) => {
                tracing::warn!(plugin = &*self.plugin, "emit refused: {reason}");
                self.event(EventKind::EmitRefused {
                    reason: reason.clone(),
                });
                Ok(Err(reason))
            }
        }
    }

    fn now_ns(&mut self) -> wasmtime::Result<i64> {
        Ok(ccfleet::wire::now_ns())
    }
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
