//! [`Lines`]: a batch of points as line protocol, the form in which points cross into the
//! agent (`host.emit-lines`).

use alloc::string::String;
use alloc::vec::Vec;
use core::cell::UnsafeCell;

use crate::lineproto::{Encoder, FieldRef};
use crate::{FieldValue, Point};

/// A batch of points, encoded as line protocol as they are added, and emitted in one call.
///
/// Tags are written sorted by key (as cc-metric-store's writers send them), whatever order
/// they come in. A point that cannot be encoded (no field, an empty or `#`-led name, a
/// repeated tag key, a float that is not finite) is refused by [`Lines::point`] and leaves
/// nothing behind. Keep one `Lines` from round to round: emitting empties it but keeps its
/// memory.
///
/// ```ignore
/// let mut lines = ccfleet_guest::Lines::new();
/// lines.point("load_one", &[("hostname", "n1"), ("type", "node")], &[("value", 0.5.into())], Some(now_ns))?;
/// lines.emit()?;
/// ```
#[derive(Debug, Default)]
pub struct Lines {
    encoder: Encoder,
    /// The order tags are written in, when they do not come sorted (kept for its memory).
    order: Vec<usize>,
    points: usize,
}

impl Lines {
    /// An empty batch.
    pub const fn new() -> Lines {
        Lines {
            encoder: Encoder::new(),
            order: Vec::new(),
            points: 0,
        }
    }

    /// Adds a point: `measurement`, its tags, at least one field, and its time in Unix
    /// nanoseconds (`None`: the agent's time when it receives the batch). On `Err` nothing of
    /// the point is kept; the points added before stay.
    pub fn point<K, V, F>(
        &mut self,
        measurement: &str,
        tags: &[(K, V)],
        fields: &[(F, FieldRef<'_>)],
        time_ns: Option<i64>,
    ) -> Result<(), String>
    where
        K: AsRef<str>,
        V: AsRef<str>,
        F: AsRef<str>,
    {
        let fields = fields.iter().map(|(k, v)| (k.as_ref(), *v));
        let result = self.encode(measurement, tags, fields, time_ns);
        self.finish(measurement, result)
    }

    /// Counts a point written, or names the one refused.
    fn finish(
        &mut self,
        measurement: &str,
        result: Result<(), crate::lineproto::EncodeError>,
    ) -> Result<(), String> {
        match result {
            Ok(()) => {
                self.points += 1;
                Ok(())
            }
            Err(e) => Err(alloc::format!("point {} ({measurement}): {e}", self.points)),
        }
    }

    fn encode<'f, K, V>(
        &mut self,
        measurement: &str,
        tags: &[(K, V)],
        fields: impl Iterator<Item = (&'f str, FieldRef<'f>)>,
        time_ns: Option<i64>,
    ) -> Result<(), crate::lineproto::EncodeError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let enc = &mut self.encoder;
        enc.start_line(measurement)?;
        if tags.is_sorted_by(|a, b| a.0.as_ref() <= b.0.as_ref()) {
            for (key, value) in tags {
                enc.add_tag(key.as_ref(), value.as_ref())?;
            }
        } else {
            // A stable sort: a repeated key stays repeated, and the encoder refuses it.
            self.order.clear();
            self.order.extend(0..tags.len());
            self.order
                .sort_by(|&a, &b| tags[a].0.as_ref().cmp(tags[b].0.as_ref()));
            for &i in &self.order {
                enc.add_tag(tags[i].0.as_ref(), tags[i].1.as_ref())?;
            }
        }
        for (key, value) in fields {
            enc.add_field(key, value)?;
        }
        enc.end_line(time_ns)
    }

    /// Adds a [`Point`].
    pub fn push(&mut self, point: &Point) -> Result<(), String> {
        let fields = point.fields.iter().map(|(k, v)| (k.as_str(), field_ref(v)));
        let result = self.encode(&point.measurement, &point.tags, fields, point.time_ns);
        self.finish(&point.measurement, result)
    }

    /// The number of points added.
    pub fn len(&self) -> usize {
        self.points
    }

    /// Whether no point was added.
    pub fn is_empty(&self) -> bool {
        self.points == 0
    }

    /// The line protocol written so far.
    pub fn as_bytes(&self) -> &[u8] {
        self.encoder.bytes()
    }

    /// Drops the points, keeping the memory.
    pub fn clear(&mut self) {
        self.encoder.clear();
        self.points = 0;
    }

    /// Hands the batch to the agent (`host.emit-lines`) and empties it, whatever the
    /// agent's answer. An empty batch is not sent.
    pub fn emit(&mut self) -> Result<(), String> {
        if self.points == 0 {
            return Ok(());
        }
        let result = crate::bindings::cc::fleet::host::emit_lines(self.encoder.bytes());
        self.clear();
        result
    }
}

/// A WIT field value as the encoder takes it.
pub(crate) fn field_ref(value: &FieldValue) -> FieldRef<'_> {
    match value {
        FieldValue::Float(v) => FieldRef::Float(*v),
        FieldValue::Int(v) => FieldRef::Int(*v),
        FieldValue::Uint(v) => FieldRef::Uint(*v),
        FieldValue::Boolean(v) => FieldRef::Bool(*v),
        FieldValue::Text(v) => FieldRef::Str(v),
    }
}

/// The batch [`crate::emit`] encodes into, kept for its memory.
struct Kept(UnsafeCell<Lines>);

// SAFETY: a component instance runs on one thread, and `with_kept` is never re-entered (it
// calls only the encoder and the host), so at most one reference exists at a time.
unsafe impl Sync for Kept {}

static KEPT: Kept = Kept(UnsafeCell::new(Lines::new()));

/// Runs `f` on the kept batch.
pub(crate) fn with_kept<R>(f: impl FnOnce(&mut Lines) -> R) -> R {
    // SAFETY: see `Kept`.
    f(unsafe { &mut *KEPT.0.get() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::borrow::ToOwned;

    #[test]
    fn writes_sorted_tags_and_refuses_a_bad_point_whole() {
        let mut lines = Lines::new();
        lines
            .point(
                "cpu_user",
                &[("type", "hwthread"), ("hostname", "n 1")],
                &[("value", FieldRef::Float(0.5))],
                Some(7),
            )
            .unwrap();
        let nan = lines.point(
            "x",
            &[("a", "1")],
            &[("value", FieldRef::Float(f64::NAN))],
            None,
        );
        assert_eq!(
            nan.unwrap_err(),
            "point 1 (x): field \"value\" is not a finite number"
        );
        let twice = lines.point(
            "y",
            &[("a", "1"), ("a", "2")],
            &[("v", FieldRef::Int(1))],
            None,
        );
        assert!(twice.unwrap_err().contains("out of order"));
        let mut point = Point::new("up").tag("hostname", "n1");
        point
            .fields
            .push(("ok".to_owned(), FieldValue::Boolean(true)));
        lines.push(&point).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines.as_bytes(),
            b"cpu_user,hostname=n\\ 1,type=hwthread value=0.5 7\nup,hostname=n1 ok=true\n"
        );
        lines.clear();
        assert!(lines.is_empty() && lines.as_bytes().is_empty());
    }
}
