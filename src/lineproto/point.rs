use super::decoder::Line;
use super::encoder::{EncodeError, Encoder, FieldRef};
use super::value::FieldValue;

/// An owned field value, for points built in memory or kept beyond the input buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedValue {
    /// A 64-bit float.
    Float(f64),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
    /// A boolean.
    Bool(bool),
    /// An (unescaped) string.
    String(String),
}

impl From<FieldValue<'_>> for OwnedValue {
    fn from(value: FieldValue<'_>) -> Self {
        match value {
            FieldValue::Float(v) => OwnedValue::Float(v),
            FieldValue::Int(v) => OwnedValue::Int(v),
            FieldValue::Uint(v) => OwnedValue::Uint(v),
            FieldValue::Bool(v) => OwnedValue::Bool(v),
            FieldValue::String(t) => OwnedValue::String(t.unescape().into_owned()),
        }
    }
}

/// An owned point: what `ccfleet decode` prints and what the encoder can write.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Point {
    /// The measurement name.
    pub measurement: String,
    /// Tags as `(key, value)`.
    pub tags: Vec<(String, String)>,
    /// Fields as `(key, value)`.
    pub fields: Vec<(String, OwnedValue)>,
    /// Unix nanoseconds, if the point has a time.
    pub time: Option<i64>,
}

/// A point that decodes but does not make a valid series.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointError {
    /// The same tag key appears twice (the series would be ambiguous).
    #[error("duplicate tag key {0:?}")]
    DuplicateTag(String),
}

impl Point {
    /// Copies a decoded line, unescaping every token; the time is the line's own or the
    /// decoder's default.
    pub fn from_line(line: &Line<'_>) -> Point {
        Point {
            measurement: line.measurement().unescape().into_owned(),
            tags: line
                .tags()
                .map(|(k, v)| (k.unescape().into_owned(), v.unescape().into_owned()))
                .collect(),
            fields: line
                .fields()
                .map(|(k, v)| (k.unescape().into_owned(), OwnedValue::from(v)))
                .collect(),
            time: line.time_or_default(),
        }
    }

    /// Sorts the tags by key (byte order, as the Go encoder requires) and rejects a repeated
    /// key, which is how InfluxDB and the conformance corpus treat a series.
    pub fn normalize_tags(&mut self) -> Result<(), PointError> {
        self.tags.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        if let Some(dup) = self.tags.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(PointError::DuplicateTag(dup[0].0.clone()));
        }
        Ok(())
    }

    /// The point in the conformance corpus's JSON shape:
    /// `{"name", "tags": [{"key","value"}], "fields": [{"key","value":{"float"|...: v}}], "time"}`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let fields: Vec<_> = self
            .fields
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    OwnedValue::Float(v) => json!({ "float": v }),
                    OwnedValue::Int(v) => json!({ "int": v }),
                    OwnedValue::Uint(v) => json!({ "uint": v }),
                    OwnedValue::Bool(v) => json!({ "bool": v }),
                    OwnedValue::String(v) => json!({ "string": v }),
                };
                json!({ "key": key, "value": value })
            })
            .collect();
        let tags: Vec<_> = self
            .tags
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        json!({ "name": self.measurement, "tags": tags, "fields": fields, "time": self.time })
    }
}

impl<'a> From<&'a OwnedValue> for FieldRef<'a> {
    fn from(v: &'a OwnedValue) -> Self {
        match v {
            OwnedValue::Float(v) => FieldRef::Float(*v),
            OwnedValue::Int(v) => FieldRef::Int(*v),
            OwnedValue::Uint(v) => FieldRef::Uint(*v),
            OwnedValue::Bool(v) => FieldRef::Bool(*v),
            OwnedValue::String(v) => FieldRef::Str(v),
        }
    }
}

impl Encoder {
    /// Writes a whole point; with `sort_tags` its tags are written in key order (as strict
    /// mode requires) without changing the point.
    pub fn encode_point(&mut self, point: &Point, sort_tags: bool) -> Result<(), EncodeError> {
        self.start_line(&point.measurement)?;
        if sort_tags && !point.tags.windows(2).all(|w| w[0].0 < w[1].0) {
            let mut tags: Vec<&(String, String)> = point.tags.iter().collect();
            tags.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            for (k, v) in tags {
                self.add_tag(k, v)?;
            }
        } else {
            for (k, v) in &point.tags {
                self.add_tag(k, v)?;
            }
        }
        for (k, v) in &point.fields {
            self.add_field(k, v)?;
        }
        self.end_line(point.time)
    }
}
