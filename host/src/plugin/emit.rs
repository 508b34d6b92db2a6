//! The emit path: a plugin's points become one batch of line protocol, checked against the
//! plugin's limits, or nothing.

use ccfleet::lineproto::{Encoder, FieldRef};
use ccfleet::untrusted::Untrusted;

use super::sink::SinkHandle;
use crate::plugin::types::{FieldValue, Point};

/// Emit-path state: the reusable encoder and the limits of one batch.
pub(crate) struct Emitter {
    encoder: Encoder,
    order: Vec<usize>,
    max_points: usize,
    max_bytes: usize,
    pub(crate) sink: SinkHandle,
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

    /// Checks the number of points, before anything of the batch is copied to the host.
    pub fn check_count(&self, points: usize) -> Result<(), String> {
        if points > self.max_points {
            return Err(format!(
                "batch of {points} points exceeds this plugin's limit of {}",
                self.max_points
            ));
        }
        Ok(())
    }

    /// What copying a batch to the host may allocate (wasmtime's host-call fuel, roughly
    /// bytes): twice the encoded limit leaves room for the records around the text.
    pub fn lift_budget(&self) -> usize {
        self.max_bytes.saturating_mul(2)
    }

    /// The message for a batch whose copy ran past [`Emitter::lift_budget`].
    pub fn too_large(&self) -> String {
        format!(
            "batch exceeds this plugin's limit of {} bytes",
            self.max_bytes
        )
    }

    /// Encodes the whole batch or nothing; `Err` is the message the plugin sees.
    pub fn encode(&mut self, points: &[Point], now_ns: i64) -> Result<Vec<u8>, String> {
        self.check_count(points.len())?;
        self.encoder.clear();
        for (index, point) in points.iter().enumerate() {
            self.encode_point(point, now_ns).map_err(|e| {
                self.encoder.clear();
                format!(
                    "point {index} ({}): {e}",
                    Untrusted(&point.measurement).capped(64)
                )
            })?;
            if self.encoder.len() > self.max_bytes {
                self.encoder.clear();
                return Err(self.too_large());
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
}
