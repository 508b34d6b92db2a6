//! One message on its way through the router: a decoded line-protocol point plus the meta
//! information cc-metric-collector's messages carry.
//!
//! Line protocol has no meta information, so a message starts with none, exactly as a
//! cc-metric-collector message read back from line protocol does; a rule may add meta
//! (`add_meta_if`, `move_tag_to_meta_if`, renames store `oldname`), conditions may read it,
//! and it is dropped when the message is encoded for the sinks (cc-metric-collector's sinks
//! also leave meta out unless told to send it as tags: move it to a tag for that). The units
//! stages read the unit from meta `unit` and otherwise from a `unit` tag, which is where the
//! collectors put it on the wire.

use std::collections::BTreeMap;

use ccfleet::lineproto::{OwnedValue, Point};

use super::expr::{Place, Scope, Value, Var};
use super::topology::Topology;

/// A point with meta information.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// The point: name, tags, fields, time.
    pub point: Point,
    /// Meta information (empty unless a rule adds some).
    pub meta: BTreeMap<String, String>,
}

impl Message {
    /// A message of `point` without meta information.
    pub fn new(point: Point) -> Message {
        Message {
            point,
            meta: BTreeMap::new(),
        }
    }

    /// The message name (the measurement).
    pub fn name(&self) -> &str {
        &self.point.measurement
    }

    /// A tag's value.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.point
            .tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Adds or replaces a tag.
    pub fn set_tag(&mut self, key: &str, value: &str) {
        match self.point.tags.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.to_owned(),
            None => self.point.tags.push((key.to_owned(), value.to_owned())),
        }
    }

    /// Removes a tag, giving its value.
    pub fn remove_tag(&mut self, key: &str) -> Option<String> {
        let i = self.point.tags.iter().position(|(k, _)| k == key)?;
        Some(self.point.tags.remove(i).1)
    }

    /// A field's value.
    pub fn field(&self, key: &str) -> Option<&OwnedValue> {
        self.point
            .fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Adds or replaces a field.
    pub fn set_field(&mut self, key: &str, value: OwnedValue) {
        match self.point.fields.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.point.fields.push((key.to_owned(), value)),
        }
    }

    /// Removes a field, giving its value.
    pub fn remove_field(&mut self, key: &str) -> Option<OwnedValue> {
        let i = self.point.fields.iter().position(|(k, _)| k == key)?;
        Some(self.point.fields.remove(i).1)
    }

    /// `metric`, `event`, `log` or `control` by the field that makes the message one
    /// (cc-specifications), else `unknown`.
    pub fn message_type(&self) -> &'static str {
        for (k, _) in &self.point.fields {
            match k.as_str() {
                "value" => return "metric",
                "event" => return "event",
                "log" => return "log",
                "control" => return "control",
                _ => {}
            }
        }
        "unknown"
    }
}

/// A field value as a condition sees it.
pub fn field_value(v: &OwnedValue) -> Value {
    match v {
        OwnedValue::Float(f) => Value::Num(*f),
        OwnedValue::Int(i) => Value::Num(*i as f64),
        OwnedValue::Uint(u) => Value::Num(*u as f64),
        OwnedValue::Bool(b) => Value::Bool(*b),
        OwnedValue::String(s) => Value::Str(s.clone()),
    }
}

/// A field value as text (moving a field to a tag or meta), as Go's `%v` prints it.
pub fn field_text(v: &OwnedValue) -> String {
    match v {
        OwnedValue::Float(f) => f.to_string(),
        OwnedValue::Int(i) => i.to_string(),
        OwnedValue::Uint(u) => u.to_string(),
        OwnedValue::Bool(b) => b.to_string(),
        OwnedValue::String(s) => s.clone(),
    }
}

/// A message with the processor's base environment: what conditions read.
pub struct MessageScope<'a> {
    /// The message.
    pub msg: &'a Message,
    /// `add_base_env` constants.
    pub env: &'a BTreeMap<String, Value>,
    /// The CPU topology for the topology functions.
    pub topology: &'a Topology,
}

impl Scope for MessageScope<'_> {
    fn get(&self, var: &Var) -> Value {
        let m = self.msg;
        let text = |s: Option<&str>| s.map_or(Value::Nil, |s| Value::Str(s.to_owned()));
        match var {
            Var::Name => Value::Str(m.name().to_owned()),
            Var::Time => m.point.time.map_or(Value::Nil, |ns| {
                Value::Num(ns.div_euclid(1_000_000_000) as f64)
            }),
            Var::MessageType => Value::Str(m.message_type().to_owned()),
            Var::Tag(k) => text(m.tag(k)),
            Var::Meta(k) => text(m.meta.get(k).map(String::as_str)),
            Var::Field(k) => m.field(k).map_or(Value::Nil, field_value),
            Var::Bare(k) => {
                if let Some(v) = m.tag(k) {
                    Value::Str(v.to_owned())
                } else if let Some(v) = m.meta.get(k) {
                    Value::Str(v.clone())
                } else if let Some(v) = m.field(k) {
                    field_value(v)
                } else {
                    self.env.get(k).cloned().unwrap_or(Value::Nil)
                }
            }
            Var::Values => Value::Nil,
        }
    }

    fn has(&self, place: Place, key: &str) -> bool {
        match place {
            Place::Tag => self.msg.tag(key).is_some(),
            Place::Meta => self.msg.meta.contains_key(key),
            Place::Field => self.msg.field(key).is_some(),
        }
    }

    fn topology(&self) -> Option<&Topology> {
        Some(self.topology)
    }

    fn text(&self, var: &Var) -> Option<Option<&str>> {
        let m = self.msg;
        Some(match var {
            Var::Name => Some(m.name()),
            Var::MessageType => Some(m.message_type()),
            Var::Tag(k) => m.tag(k),
            Var::Meta(k) => m.meta.get(k).map(String::as_str),
            _ => return None,
        })
    }
}
