//! The data of one plugin's `Store`: its limits, its metric encoder and the implementation of
//! the `cc:fleet/host` imports.

use std::sync::Arc;
use std::time::Instant;

use ccfleet::lineproto::{Encoder, FieldRef};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::cc::fleet::{host, types};
use crate::events::{EventKind, EventSender, PluginEvent};
use crate::sink::{Batch, SinkHandle};
use crate::types::{FieldValue, Level, Point};

/// Longest log message kept from a plugin; the rest is cut so a plugin cannot flood logs.
const MAX_LOG_MESSAGE: usize = 4096;

/// Raised (as a trap) when a plugin grows its memory past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (asked for {requested})")]
pub(crate) struct MemoryLimitExceeded {
    pub limit: usize,
    pub requested: usize,
}

/// Counts every linear memory of the store against one per-plugin budget.
pub(crate) struct MemoryLimiter {
    limit: usize,
    used: usize,
    table_elements: usize,
}

impl MemoryLimiter {
    pub fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            used: 0,
            table_elements: 100_000,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let requested = self.used.saturating_add(desired.saturating_sub(current));
        if requested > self.limit {
            // Trapping (rather than failing the grow) kills the plugin at the allocation
            // site with a clear reason; a guest allocator would abort anyway.
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.limit,
                requested,
            }));
        }
        self.used = requested;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_elements)
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

/// Emit-path state: the reusable encoder and the limits of one batch.
pub(crate) struct Emitter {
    encoder: Encoder,
    order: Vec<usize>,
    max_points: usize,
    max_bytes: usize,
    sink: SinkHandle,
}

impl Emitter {
    pub fn new(sink: SinkHandle, max_points: usize, max_bytes: usize) -> Self {
        Emitter {
            encoder: Encoder::new(),
            order: Vec::new(),
            max_points,
            max_bytes,
            sink,
        }
    }

    /// Encodes the whole batch or nothing; `Err` is the message the plugin sees.
    pub fn encode(&mut self, points: &[Point], now_ns: i64) -> Result<Vec<u8>, String> {
        if points.len() > self.max_points {
            return Err(format!(
                "batch of {} points exceeds this plugin's limit of {}",
                points.len(),
                self.max_points
            ));
        }
        self.encoder.clear();
        for (index, point) in points.iter().enumerate() {
            self.encode_point(point, now_ns).map_err(|e| {
                self.encoder.clear();
                format!("point {index} ({}): {e}", point.measurement)
            })?;
            if self.encoder.len() > self.max_bytes {
                self.encoder.clear();
                return Err(format!(
                    "batch exceeds this plugin's limit of {} bytes",
                    self.max_bytes
                ));
            }
        }
        let lines = self.encoder.take();
        self.encoder.reserve(lines.len());
        Ok(lines)
    }

    fn encode_point(&mut self, point: &Point, now_ns: i64) -> Result<(), String> {
        let enc = &mut self.encoder;
        if point.fields.is_empty() {
            return Err("a point needs at least one field".to_owned());
        }
        enc.start_line(&point.measurement)
            .map_err(|e| e.to_string())?;
        // Line protocol wants tags sorted by key (as cc-metric-store's writers produce them);
        // plugins usually send them sorted already, so sort indices only when needed.
        let tags = &point.tags;
        let sorted = tags.windows(2).all(|w| w[0].0 < w[1].0);
        let result = if sorted {
            tags.iter().try_for_each(|(k, v)| enc.add_tag(k, v))
        } else {
            self.order.clear();
            self.order.extend(0..tags.len());
            self.order.sort_by(|&a, &b| tags[a].0.cmp(&tags[b].0));
            self.order
                .iter()
                .try_for_each(|&i| enc.add_tag(&tags[i].0, &tags[i].1))
        };
        result.map_err(|e| e.to_string())?;
        for (key, value) in &point.fields {
            let value = match value {
                FieldValue::Float(v) => FieldRef::Float(*v),
                FieldValue::Int(v) => FieldRef::Int(*v),
                FieldValue::Uint(v) => FieldRef::Uint(*v),
                FieldValue::Boolean(v) => FieldRef::Bool(*v),
                FieldValue::Text(v) => FieldRef::Str(v),
            };
            enc.add_field(key, value).map_err(|e| e.to_string())?;
        }
        enc.end_line(Some(point.time_ns.unwrap_or(now_ns)))
            .map_err(|e| e.to_string())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn point(measurement: &str, tags: &[(&str, &str)], value: f64) -> Point {
        Point {
            measurement: measurement.to_owned(),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            fields: vec![("value".to_owned(), FieldValue::Float(value))],
            time_ns: None,
        }
    }

    fn emitter(max_points: usize, max_bytes: usize) -> Emitter {
        let (sink, _rx) = crate::sink::channel(1);
        Emitter::new(sink, max_points, max_bytes)
    }

    #[test]
    fn encodes_in_metric_store_shape_with_sorted_tags() {
        let mut e = emitter(10, 1 << 20);
        let mut p = point("load_one", &[("type", "node"), ("hostname", "n1")], 0.5);
        p.fields.push(("jobs".to_owned(), FieldValue::Int(3)));
        let mut q = point("up", &[("hostname", "n 2")], 1.0);
        q.fields = vec![
            ("ok".to_owned(), FieldValue::Boolean(true)),
            ("note".to_owned(), FieldValue::Text("a \"b\"".to_owned())),
            ("count".to_owned(), FieldValue::Uint(7)),
        ];
        q.time_ns = Some(42);
        let lines = e.encode(&[p, q], 1_700_000_000_000_000_000).unwrap();
        assert_eq!(
            String::from_utf8(lines).unwrap(),
            "load_one,hostname=n1,type=node value=0.5,jobs=3i 1700000000000000000\n\
             up,hostname=n\\ 2 ok=true,note=\"a \\\"b\\\"\",count=7u 42\n"
        );
    }

    #[test]
    fn a_bad_point_fails_the_whole_batch() {
        let mut e = emitter(10, 1 << 20);
        let mut no_fields = point("x", &[], 1.0);
        no_fields.fields.clear();
        let err = e
            .encode(&[point("ok", &[], 1.0), no_fields], 1)
            .unwrap_err();
        assert_eq!(err, "point 1 (x): a point needs at least one field");
        let err = e.encode(&[point("", &[], 1.0)], 1).unwrap_err();
        assert!(err.starts_with("point 0 ():"), "{err}");
        let err = e.encode(&[point("nan", &[], f64::NAN)], 1).unwrap_err();
        assert!(err.starts_with("point 0 (nan):"), "{err}");
        // Nothing of a failed batch lingers in the encoder.
        let lines = e.encode(&[point("m", &[], 2.0)], 5).unwrap();
        assert_eq!(lines, b"m value=2 5\n");
    }

    #[test]
    fn limits_points_and_bytes() {
        let mut e = emitter(2, 1 << 20);
        let three = [
            point("a", &[], 1.0),
            point("b", &[], 1.0),
            point("c", &[], 1.0),
        ];
        assert_eq!(
            e.encode(&three, 1).unwrap_err(),
            "batch of 3 points exceeds this plugin's limit of 2"
        );
        let mut e = emitter(10, 16);
        assert_eq!(
            e.encode(&three, 1).unwrap_err(),
            "batch exceeds this plugin's limit of 16 bytes"
        );
    }

    #[test]
    fn the_memory_limit_counts_all_memories() {
        use wasmtime::ResourceLimiter as _;
        let mut limiter = MemoryLimiter::new(3 << 20);
        assert!(limiter.memory_growing(0, 2 << 20, None).unwrap());
        // A second memory of 1 MiB still fits, one more byte does not.
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        let err = limiter
            .memory_growing(1 << 20, (1 << 20) + 1, None)
            .unwrap_err();
        let exceeded = err.downcast_ref::<MemoryLimitExceeded>().unwrap();
        assert_eq!(exceeded.limit, 3 << 20);
        assert_eq!(exceeded.requested, (3 << 20) + 1);
    }
}
