//! The emit path: a plugin's points become one batch of line protocol, checked against the
//! plugin's limits, or nothing.
//!
//! `emit-lines` (0.3) hands over line protocol the plugin encoded itself: the host checks
//! every line with the project's decoder, as the sinks' consumers will decode it, and copies
//! what passes straight out of the plugin's memory ([`Emitter::check_lines`]); nothing is
//! decoded into owned values or encoded again. `emit` (the typed path of 0.2) is encoded
//! straight from the plugin's memory ([`Emitter::encode_from`]): the points' texts are read
//! in place, not copied into host strings first, and the byte limit bounds what the host
//! does before any point is looked at.

use std::borrow::Cow;

use ccfleet::lineproto::{BatchError, BatchLimits, Encoder, FieldRef, check_batch};
use ccfleet::untrusted::Untrusted;
use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, WasmList, WasmStr};

use super::sink::SinkHandle;
#[cfg(test)]
use crate::plugin::types::{FieldValue, Point};

/// `cc:fleet/types.point` as a view into the plugin's memory: lifting it copies no text.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct PointView {
    measurement: WasmStr,
    tags: WasmList<(WasmStr, WasmStr)>,
    fields: WasmList<(WasmStr, FieldView)>,
    #[component(name = "time-ns")]
    time_ns: Option<i64>,
}

/// `cc:fleet/types.field-value`, its text as a view.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum FieldView {
    #[component(name = "float")]
    Float(f64),
    #[component(name = "int")]
    Int(i64),
    #[component(name = "uint")]
    Uint(u64),
    #[component(name = "boolean")]
    Boolean(bool),
    #[component(name = "text")]
    Text(WasmStr),
}

/// A field value with its text borrowed.
enum Value<S> {
    Float(f64),
    Int(i64),
    Uint(u64),
    Boolean(bool),
    Text(S),
}

impl<S: AsRef<str>> Value<S> {
    fn as_field(&self) -> FieldRef<'_> {
        match self {
            Value::Float(v) => FieldRef::Float(*v),
            Value::Int(v) => FieldRef::Int(*v),
            Value::Uint(v) => FieldRef::Uint(*v),
            Value::Boolean(v) => FieldRef::Bool(*v),
            Value::Text(v) => FieldRef::Str(v.as_ref()),
        }
    }

    fn text_len(&self) -> usize {
        match self {
            Value::Text(v) => v.as_ref().len(),
            _ => 0,
        }
    }
}

#[cfg(test)]
impl<'a> Value<&'a str> {
    fn of(value: &'a FieldValue) -> Self {
        match value {
            FieldValue::Float(v) => Value::Float(*v),
            FieldValue::Int(v) => Value::Int(*v),
            FieldValue::Uint(v) => Value::Uint(*v),
            FieldValue::Boolean(v) => Value::Boolean(*v),
            FieldValue::Text(v) => Value::Text(v.as_str()),
        }
    }
}

/// A store's data that holds an [`Emitter`]: the emit path reads the plugin's memory through
/// the store and writes with the emitter inside it, without naming the host's whole state
/// (which names this file's types in turn).
pub(crate) trait EmitterHost {
    /// The emitter, to read its limits.
    fn emitter(&self) -> &Emitter;
    /// The emitter, to write with.
    fn emitter_mut(&mut self) -> &mut Emitter;
}

/// Emit-path state: the limits of one batch and the writer, with its reusable encoder.
pub(crate) struct Emitter {
    writer: Writer,
    /// The lists of views a batch is read through, kept (empty) for the next batch: a
    /// collector emits every round, and growing them afresh each time cost more than
    /// encoding its few points.
    views: Views,
    limits: BatchLimits,
    pub(crate) sink: SinkHandle,
}

/// A batch's points, tags and fields as views into the plugin's memory; empty between
/// batches.
#[derive(Default)]
struct Views {
    points: Vec<PointView>,
    tags: Vec<(WasmStr, WasmStr)>,
    fields: Vec<(WasmStr, FieldView)>,
}

/// How many points, and tags or fields, the lists of [`Views`] keep room for between
/// batches: a collector's round on a large node (`cpustat` on 256 hardware threads is about
/// 2 800 points with 11 000 tags), while one batch near the plugin's limits (up to a million
/// tags under the default 4 MiB) does not leave tens of megabytes held for the plugin's
/// lifetime.
const POINTS_KEPT: usize = 4096;
const ENTRIES_KEPT: usize = 16384;

impl Views {
    fn clear(&mut self) {
        recycle(&mut self.points, POINTS_KEPT);
        recycle(&mut self.tags, ENTRIES_KEPT);
        recycle(&mut self.fields, ENTRIES_KEPT);
    }
}

/// Empties `list`, keeping its allocation unless it holds room for more than `kept` entries.
fn recycle<T>(list: &mut Vec<T>, kept: usize) {
    list.clear();
    list.shrink_to(kept);
}

/// The message a plugin sees for a batch of lines the check refused, naming its own limits
/// as such.
fn refusal(error: &BatchError) -> String {
    error
        .to_string()
        .replace("the limit", "this plugin's limit")
}

/// Encodes one batch under the byte limit.
#[derive(Default)]
struct Writer {
    encoder: Encoder,
    max_bytes: usize,
    max_line_len: usize,
}

impl Writer {
    /// The message for a batch over the byte limit; the batch so far is dropped.
    fn too_large(&mut self) -> String {
        self.encoder.clear();
        format!(
            "batch exceeds this plugin's limit of {} bytes",
            self.max_bytes
        )
    }

    /// Room left in the batch, in bytes.
    fn room(&self) -> usize {
        self.max_bytes.saturating_sub(self.encoder.len())
    }

    /// Appends point `index`; on failure the batch so far is dropped and the error is the
    /// message the plugin sees.
    fn point<K: AsRef<str>, V: AsRef<str>, F: AsRef<str>, T: AsRef<str>>(
        &mut self,
        index: usize,
        measurement: &str,
        tags: &mut [(K, V)],
        fields: &[(F, Value<T>)],
        time_ns: i64,
    ) -> Result<(), String> {
        let before = self.encoder.len();
        let written = self.line(measurement, tags, fields, time_ns);
        // The line without its newline, as the check of `emit-lines` measures it.
        let written = written.and_then(|()| {
            let len = self.encoder.len() - before - 1;
            if len > self.max_line_len {
                return Err(format!(
                    "line of {len} bytes exceeds this plugin's limit of {}",
                    self.max_line_len
                ));
            }
            Ok(())
        });
        if let Err(e) = written {
            self.encoder.clear();
            return Err(format!(
                "point {index} ({}): {e}",
                Untrusted(measurement).capped(64)
            ));
        }
        if self.encoder.len() > self.max_bytes {
            return Err(self.too_large());
        }
        Ok(())
    }

    fn line<K: AsRef<str>, V: AsRef<str>, F: AsRef<str>, T: AsRef<str>>(
        &mut self,
        measurement: &str,
        tags: &mut [(K, V)],
        fields: &[(F, Value<T>)],
        time_ns: i64,
    ) -> Result<(), String> {
        let enc = &mut self.encoder;
        if fields.is_empty() {
            return Err("a point needs at least one field".to_owned());
        }
        enc.start_line(measurement).map_err(|e| e.to_string())?;
        // Line protocol wants tags sorted by key (as cc-metric-store's writers produce them);
        // plugins usually send them sorted already. The sort is stable, so repeated keys
        // keep their order (and the encoder refuses them).
        if !tags.is_sorted_by(|a, b| a.0.as_ref() <= b.0.as_ref()) {
            tags.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        }
        for (key, value) in tags.iter() {
            enc.add_tag(key.as_ref(), value.as_ref())
                .map_err(|e| e.to_string())?;
        }
        for (key, value) in fields {
            enc.add_field(key.as_ref(), value.as_field())
                .map_err(|e| e.to_string())?;
        }
        enc.end_line(Some(time_ns)).map_err(|e| e.to_string())
    }

    /// The encoded batch; the encoder keeps an allocation of its size for the next one.
    fn finish(&mut self) -> Vec<u8> {
        let lines = self.encoder.take();
        self.encoder.reserve(lines.len());
        lines
    }
}

impl Emitter {
    pub fn new(sink: SinkHandle, limits: BatchLimits) -> Self {
        Emitter {
            writer: Writer {
                encoder: Encoder::new(),
                max_bytes: limits.max_bytes,
                max_line_len: limits.max_line_len,
            },
            views: Views::default(),
            limits,
            sink,
        }
    }

    /// Checks the number of points, before anything of the batch is looked at.
    pub fn check_count(&self, points: usize) -> Result<(), String> {
        if points > self.limits.max_points {
            return Err(format!(
                "batch of {points} points exceeds this plugin's limit of {}",
                self.limits.max_points
            ));
        }
        Ok(())
    }

    /// Checks the tags and fields of point `index` against the limits, before they are read.
    fn check_entries(&self, index: usize, tags: usize, fields: usize) -> Result<(), String> {
        let limits = &self.limits;
        if tags > limits.max_tags {
            return Err(format!(
                "point {index}: {tags} tags exceed this plugin's limit of {}",
                limits.max_tags
            ));
        }
        if fields > limits.max_fields {
            return Err(format!(
                "point {index}: {fields} fields exceed this plugin's limit of {}",
                limits.max_fields
            ));
        }
        Ok(())
    }

    /// Checks a batch of line protocol (`host.emit-lines`) in the plugin's memory: the
    /// checked lines, with the time appended where a line has none, and their number; or the
    /// message the plugin sees, with the number of lines refused. The lines are read in
    /// place: the plugin cannot run while its host call does, so what was checked is what
    /// is copied.
    pub fn check_lines<T: EmitterHost>(
        store: &mut StoreContextMut<'_, T>,
        lines: &WasmList<u8>,
        now_ns: fn() -> i64,
    ) -> Result<(Vec<u8>, usize), (String, usize)> {
        let limits = store.data().emitter().limits;
        let input = lines.as_le_slice(&*store);
        let mut out = Vec::new();
        match check_batch(input, &limits, &mut || now_ns(), &mut out) {
            Ok(points) => Ok((out, points)),
            Err(error) => {
                let refused = input.iter().filter(|&&b| b == b'\n').count()
                    + usize::from(input.last().is_some_and(|&b| b != b'\n'));
                Err((refusal(&error), refused))
            }
        }
    }

    /// Encodes the whole batch or nothing; `Err` is the message the plugin sees.
    #[cfg(test)]
    pub fn encode(&mut self, points: &[Point], now_ns: i64) -> Result<Vec<u8>, String> {
        self.check_count(points.len())?;
        self.writer.encoder.clear();
        for (index, point) in points.iter().enumerate() {
            self.check_entries(index, point.tags.len(), point.fields.len())?;
            let writer = &mut self.writer;
            let mut tags: Vec<(&str, &str)> = point
                .tags
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let fields: Vec<(&str, Value<&str>)> = point
                .fields
                .iter()
                .map(|(k, v)| (k.as_str(), Value::of(v)))
                .collect();
            writer.point(
                index,
                &point.measurement,
                &mut tags,
                &fields,
                point.time_ns.unwrap_or(now_ns),
            )?;
        }
        Ok(self.writer.finish())
    }

    /// Encodes a batch straight from the plugin's memory: the whole batch or nothing.
    /// `Ok(Err(_))` is the message the plugin sees; `Err(_)` is a malformed call (text that
    /// is not UTF-8), which traps. Points without a time get `now_ns()`, read once, and only
    /// when such a point comes (collectors stamp every point themselves).
    pub fn encode_from<T: EmitterHost>(
        store: &mut StoreContextMut<'_, T>,
        points: &WasmList<PointView>,
        now_ns: fn() -> i64,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        if let Err(reason) = store.data().emitter().check_count(points.len()) {
            return Ok(Err(reason));
        }
        // The texts borrow the plugin's memory while the writer, part of the store's
        // data, writes: it steps out of the store meanwhile.
        let emitter = store.data_mut().emitter_mut();
        let limits = emitter.limits;
        let mut writer = std::mem::take(&mut emitter.writer);
        let mut views = std::mem::take(&mut emitter.views);
        let outcome = encode_views(store, &limits, &mut writer, &mut views, points, now_ns);
        let outcome = outcome.map(|encoded| encoded.map(|()| writer.finish()));
        writer.encoder.clear();
        views.clear();
        let emitter = store.data_mut().emitter_mut();
        emitter.writer = writer;
        emitter.views = views;
        outcome
    }
}

fn encode_views<T: EmitterHost>(
    store: &mut StoreContextMut<'_, T>,
    limits: &BatchLimits,
    writer: &mut Writer,
    views: &mut Views,
    points: &WasmList<PointView>,
    now_ns: fn() -> i64,
) -> wasmtime::Result<Result<(), String>> {
    writer.encoder.clear();
    let mut now = None;
    // First the points and their lists, as views (bounds-checked, no text read yet). Every
    // tag takes at least 4 bytes (`,k=v`), every field 3 (`k=1`): lists that cannot fit in
    // the batch, whatever they hold, are not even looked at. (`views` arrive empty.)
    for view in points.iter(&mut *store)? {
        views.points.push(view?);
    }
    let Views {
        points: point_views,
        tags: tag_views,
        fields: field_views,
    } = views;
    let mut least = 0usize;
    for (index, view) in point_views.iter().enumerate() {
        if view.tags.len() > limits.max_tags || view.fields.len() > limits.max_fields {
            let emitter = store.data().emitter();
            return Ok(emitter.check_entries(index, view.tags.len(), view.fields.len()));
        }
        least = least
            .saturating_add(view.tags.len().saturating_mul(4))
            .saturating_add(view.fields.len().saturating_mul(3));
        if least > writer.max_bytes {
            return Ok(Err(writer.too_large()));
        }
        for tag in view.tags.iter(&mut *store)? {
            tag_views.push(tag?);
        }
        for field in view.fields.iter(&mut *store)? {
            field_views.push(field?);
        }
    }
    // Then the texts, borrowed from the plugin's memory for the whole batch, so the lists
    // of borrowed texts are reused from point to point.
    let memory = &*store;
    let mut tags: Vec<(Cow<'_, str>, Cow<'_, str>)> = Vec::new();
    let mut fields: Vec<(Cow<'_, str>, Value<Cow<'_, str>>)> = Vec::new();
    let (mut tag_views, mut field_views) = (tag_views.iter(), field_views.iter());
    for (index, view) in point_views.iter().enumerate() {
        let room = writer.room();
        let measurement = view.measurement.to_str(memory)?;
        tags.clear();
        for (key, value) in tag_views.by_ref().take(view.tags.len()) {
            tags.push((key.to_str(memory)?, value.to_str(memory)?));
        }
        fields.clear();
        for (key, value) in field_views.by_ref().take(view.fields.len()) {
            let value = match value {
                FieldView::Float(v) => Value::Float(*v),
                FieldView::Int(v) => Value::Int(*v),
                FieldView::Uint(v) => Value::Uint(*v),
                FieldView::Boolean(v) => Value::Boolean(*v),
                FieldView::Text(text) => Value::Text(text.to_str(memory)?),
            };
            fields.push((key.to_str(memory)?, value));
        }
        // Escaping only lengthens text: raw text past the room cannot fit either, and is
        // not copied into the batch.
        let raw = measurement.len()
            + tags.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + fields
                .iter()
                .map(|(k, v)| k.len() + v.text_len())
                .sum::<usize>();
        if raw > room {
            return Ok(Err(writer.too_large()));
        }
        let time = match view.time_ns {
            Some(time) => time,
            None => *now.get_or_insert_with(now_ns),
        };
        if let Err(reason) = writer.point(index, &measurement, &mut tags, &fields, time) {
            return Ok(Err(reason));
        }
    }
    Ok(Ok(()))
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
        let (sink, _rx) = crate::plugin::sink::channel(1);
        Emitter::new(
            sink,
            BatchLimits {
                max_points,
                max_bytes,
                ..BatchLimits::default()
            },
        )
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
    fn the_view_lists_keep_a_round_s_room_but_not_a_huge_batch_s() {
        let mut small: Vec<u64> = Vec::with_capacity(100);
        small.extend(0..100);
        recycle(&mut small, ENTRIES_KEPT);
        assert!(small.is_empty());
        assert_eq!(small.capacity(), 100, "a round's room is kept");
        let mut huge: Vec<u64> = (0..1_000_000).collect();
        recycle(&mut huge, ENTRIES_KEPT);
        assert!(huge.is_empty());
        assert!(huge.capacity() <= ENTRIES_KEPT, "kept {}", huge.capacity());
    }

    #[test]
    fn the_typed_path_keeps_the_tag_field_and_line_limits_of_emit_lines() {
        let (sink, _rx) = crate::plugin::sink::channel(1);
        let limits = BatchLimits {
            max_tags: 1,
            max_fields: 1,
            max_line_len: 24,
            ..BatchLimits::default()
        };
        let mut e = Emitter::new(sink, limits);
        let two_tags = point("m", &[("a", "1"), ("b", "2")], 1.0);
        assert_eq!(
            e.encode(&[two_tags], 1).unwrap_err(),
            "point 0: 2 tags exceed this plugin's limit of 1"
        );
        let mut two_fields = point("m", &[], 1.0);
        two_fields.fields.push(("w".to_owned(), FieldValue::Int(2)));
        assert_eq!(
            e.encode(&[point("ok", &[], 1.0), two_fields], 1)
                .unwrap_err(),
            "point 1: 2 fields exceed this plugin's limit of 1"
        );
        let long = point("measurement_name_long", &[("a", "1")], 1.0);
        assert_eq!(
            e.encode(&[long], 1).unwrap_err(),
            "point 0 (measurement_name_long): line of 35 bytes exceeds this plugin's limit of 24"
        );
        assert_eq!(
            e.encode(&[point("m", &[("a", "1")], 1.0)], 1).unwrap(),
            b"m,a=1 value=1 1\n"
        );
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
}
