//! The line-protocol encoder.
//!
//! This file, with `format.rs`, `precision.rs` and `table.rs`, needs only `core` and `alloc`:
//! the guest SDK compiles the very same files, so plugins encode their points with this
//! encoder and the host checks them with the decoder beside it.

use alloc::borrow::ToOwned;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::format::{
    self, BACKSLASH, CONTROL, KEY_ESCAPES, MEASUREMENT_ESCAPES, STRING_ESCAPES, append,
    format_go_g, write_token,
};
use super::precision::Precision;

/// Why the encoder refused a point; the partial line is removed from the output.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A measurement, key or tag value is empty, holds a control character or ends in a
    /// backslash (which could not be decoded back).
    InvalidToken {
        /// Which token (`measurement`, `tag key`, `tag value`, `field key`).
        what: &'static str,
        /// The offending text.
        value: String,
    },
    /// Tags must be added in strictly increasing key order.
    TagOrder(String),
    /// NaN and infinities have no line-protocol representation.
    NonFinite(String),
    /// A line needs at least one field.
    NoFields,
    /// The calls came in the wrong order (e.g. a tag after a field).
    Sequence(&'static str),
    /// The timestamp does not fit the encoder's precision.
    TimestampOutOfRange,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::InvalidToken { what, value } => write!(f, "invalid {what} {value:?}"),
            EncodeError::TagOrder(key) => write!(f, "tag key {key:?} out of order"),
            EncodeError::NonFinite(key) => write!(f, "field {key:?} is not a finite number"),
            EncodeError::NoFields => f.write_str("line has no fields"),
            EncodeError::Sequence(what) => write!(f, "encoder misuse: {what}"),
            EncodeError::TimestampOutOfRange => f.write_str("timestamp out of range"),
        }
    }
}

impl core::error::Error for EncodeError {}

/// A field value to encode, borrowed from the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldRef<'a> {
    /// A float, written in Go's shortest `'g'` form.
    Float(f64),
    /// A signed integer, written with an `i` suffix.
    Int(i64),
    /// An unsigned integer, written with a `u` suffix.
    Uint(u64),
    /// A boolean, written as `true` or `false`.
    Bool(bool),
    /// A string, quoted with `\` and `"` escaped.
    Str(&'a str),
}

impl From<f64> for FieldRef<'_> {
    fn from(v: f64) -> Self {
        FieldRef::Float(v)
    }
}
impl From<i64> for FieldRef<'_> {
    fn from(v: i64) -> Self {
        FieldRef::Int(v)
    }
}
impl From<u64> for FieldRef<'_> {
    fn from(v: u64) -> Self {
        FieldRef::Uint(v)
    }
}
impl From<bool> for FieldRef<'_> {
    fn from(v: bool) -> Self {
        FieldRef::Bool(v)
    }
}
impl<'a> From<&'a str> for FieldRef<'a> {
    fn from(v: &'a str) -> Self {
        FieldRef::Str(v)
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Tags,
    Fields,
}

/// Where the line's last tag key is, for the order check of the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastTag {
    /// No tag yet.
    None,
    /// Written as it was given (nothing to escape), at this range of the buffer: a key is
    /// compared there rather than copied for every tag.
    Written(usize, usize),
    /// In [`Encoder::last_tag`] (it was escaped in the buffer).
    Copied,
}

/// Appends line protocol to a reusable buffer, writing what the Go v2 encoder writes.
///
/// Calls go `start_line`, `add_tag`*, `add_field`+, `end_line`. A call that fails removes the
/// partial line, so the buffer only ever holds whole lines. In strict mode (the default)
/// tokens are validated and tags must come in increasing key order; lax mode skips both.
///
/// ```
/// use ccfleet::lineproto::Encoder;
///
/// let mut enc = Encoder::new();
/// enc.start_line("load_one").unwrap();
/// enc.add_tag("hostname", "node 1").unwrap();
/// enc.add_tag("type", "node").unwrap();
/// enc.add_field("value", 0.5).unwrap();
/// enc.end_line(Some(1_700_000_000_000_000_000)).unwrap();
/// assert_eq!(enc.bytes(), b"load_one,hostname=node\\ 1,type=node value=0.5 1700000000000000000\n");
/// ```
#[derive(Debug, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
    precision: Precision,
    lax: bool,
    state: State,
    line_start: usize,
    last: LastTag,
    last_tag: String,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// A strict encoder writing nanosecond timestamps.
    pub const fn new() -> Self {
        Encoder {
            buf: Vec::new(),
            precision: Precision::Nanosecond,
            lax: false,
            state: State::Idle,
            line_start: 0,
            last: LastTag::None,
            last_tag: String::new(),
        }
    }

    /// Sets the unit timestamps are written in (they are given in nanoseconds).
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// Lax mode skips token validation and the tag order check (faster; the caller
    /// guarantees valid input).
    pub fn set_lax(&mut self, lax: bool) {
        self.lax = lax;
    }

    /// Pre-allocates room for `additional` more bytes.
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// The complete lines written so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.complete_len()]
    }

    /// Takes the complete lines out, leaving the encoder empty (a line in progress is
    /// dropped).
    pub fn take(&mut self) -> Vec<u8> {
        self.buf.truncate(self.complete_len());
        self.state = State::Idle;
        self.line_start = 0;
        core::mem::take(&mut self.buf)
    }

    /// Empties the buffer, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.state = State::Idle;
        self.line_start = 0;
    }

    /// The length in bytes of the complete lines.
    pub fn len(&self) -> usize {
        self.complete_len()
    }

    /// Whether no complete line has been written.
    pub fn is_empty(&self) -> bool {
        self.complete_len() == 0
    }

    fn complete_len(&self) -> usize {
        if self.state == State::Idle {
            self.buf.len()
        } else {
            self.line_start
        }
    }

    fn abort<T>(&mut self, error: EncodeError) -> Result<T, EncodeError> {
        self.buf.truncate(self.line_start);
        self.state = State::Idle;
        Err(error)
    }

    /// The [`format::classes`] of a token, checked (in strict mode) that it can be written
    /// and read back: not empty, no control character, no backslash at its end.
    fn token(&self, what: &'static str, s: &str) -> Result<u8, EncodeError> {
        let bytes = s.as_bytes();
        let found = format::classes(bytes);
        if !self.lax
            && (bytes.is_empty()
                || found & CONTROL != 0
                || (found & BACKSLASH != 0 && bytes.ends_with(b"\\")))
        {
            return Err(EncodeError::InvalidToken {
                what,
                value: s.to_owned(),
            });
        }
        Ok(found)
    }

    /// The line's last tag key, as it was given.
    fn last_tag(&self) -> Option<&[u8]> {
        match self.last {
            LastTag::None => None,
            LastTag::Written(start, end) => self.buf.get(start..end),
            LastTag::Copied => Some(self.last_tag.as_bytes()),
        }
    }

    /// Begins a line with its measurement.
    pub fn start_line(&mut self, measurement: &str) -> Result<(), EncodeError> {
        if self.state != State::Idle {
            return self.abort(EncodeError::Sequence("start_line before end_line"));
        }
        self.line_start = self.buf.len();
        self.state = State::Tags;
        self.last = LastTag::None;
        let found = match self.token("measurement", measurement) {
            Ok(found) => found,
            Err(e) => return self.abort(e),
        };
        // A leading `#` would read back as a comment, and no escape can prevent that.
        if !self.lax && measurement.starts_with('#') {
            return self.abort(EncodeError::InvalidToken {
                what: "measurement",
                value: measurement.to_owned(),
            });
        }
        write_token(
            measurement.as_bytes(),
            found,
            MEASUREMENT_ESCAPES,
            &mut self.buf,
        );
        Ok(())
    }

    /// Adds a tag; in strict mode keys must increase.
    pub fn add_tag(&mut self, key: &str, value: &str) -> Result<(), EncodeError> {
        if self.state != State::Tags {
            return self.abort(EncodeError::Sequence("add_tag outside the tag section"));
        }
        let (key_found, value_found) = match self
            .token("tag key", key)
            .and_then(|k| Ok((k, self.token("tag value", value)?)))
        {
            Ok(found) => found,
            Err(e) => return self.abort(e),
        };
        if !self.lax && self.last_tag().is_some_and(|last| key.as_bytes() <= last) {
            return self.abort(EncodeError::TagOrder(key.to_owned()));
        }
        self.buf.push(b',');
        let key_at = self.buf.len();
        write_token(key.as_bytes(), key_found, KEY_ESCAPES, &mut self.buf);
        if !self.lax {
            self.last = if key_found & KEY_ESCAPES == 0 {
                LastTag::Written(key_at, self.buf.len())
            } else {
                self.last_tag.clear();
                self.last_tag.push_str(key);
                LastTag::Copied
            };
        }
        self.buf.push(b'=');
        write_token(value.as_bytes(), value_found, KEY_ESCAPES, &mut self.buf);
        Ok(())
    }

    /// Adds a field.
    pub fn add_field<'v>(
        &mut self,
        key: &str,
        value: impl Into<FieldRef<'v>>,
    ) -> Result<(), EncodeError> {
        let value = value.into();
        match self.state {
            State::Idle => return self.abort(EncodeError::Sequence("add_field before start_line")),
            State::Tags => self.buf.push(b' '),
            State::Fields => self.buf.push(b','),
        }
        self.state = State::Fields;
        let found = match self.token("field key", key) {
            Ok(found) => found,
            Err(e) => return self.abort(e),
        };
        write_token(key.as_bytes(), found, KEY_ESCAPES, &mut self.buf);
        self.buf.push(b'=');
        match value {
            FieldRef::Float(v) => {
                if !v.is_finite() {
                    return self.abort(EncodeError::NonFinite(key.to_owned()));
                }
                format_go_g(v, &mut self.buf);
            }
            FieldRef::Int(v) => {
                append(itoa::Buffer::new().format(v).as_bytes(), &mut self.buf);
                self.buf.push(b'i');
            }
            FieldRef::Uint(v) => {
                append(itoa::Buffer::new().format(v).as_bytes(), &mut self.buf);
                self.buf.push(b'u');
            }
            FieldRef::Bool(v) => self
                .buf
                .extend_from_slice(if v { b"true" } else { b"false" }),
            FieldRef::Str(s) => {
                self.buf.push(b'"');
                let bytes = s.as_bytes();
                write_token(bytes, format::classes(bytes), STRING_ESCAPES, &mut self.buf);
                self.buf.push(b'"');
            }
        }
        Ok(())
    }

    /// Ends the line with an optional timestamp in Unix nanoseconds (written in the
    /// encoder's precision) and a newline.
    pub fn end_line(&mut self, time_ns: Option<i64>) -> Result<(), EncodeError> {
        match self.state {
            State::Fields => {}
            State::Idle => return self.abort(EncodeError::Sequence("end_line before start_line")),
            State::Tags => return self.abort(EncodeError::NoFields),
        }
        if let Some(t) = time_ns {
            self.buf.push(b' ');
            let scaled = t / self.precision.nanos();
            append(itoa::Buffer::new().format(scaled).as_bytes(), &mut self.buf);
        }
        self.buf.push(b'\n');
        self.state = State::Idle;
        self.line_start = self.buf.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_cannot_be_read_back() {
        let mut enc = Encoder::new();
        assert!(enc.start_line("#cpu").is_err());
        enc.start_line("cpu").unwrap();
        enc.add_tag("b", "1").unwrap();
        assert_eq!(
            enc.add_tag("a", "1"),
            Err(EncodeError::TagOrder("a".into()))
        );
        enc.start_line("cpu").unwrap();
        assert!(enc.add_tag("k", "v\\").is_err());
        enc.start_line("cpu").unwrap();
        assert!(enc.add_field("f", f64::NAN).is_err());
        enc.start_line("cpu").unwrap();
        assert_eq!(enc.end_line(None), Err(EncodeError::NoFields));
        assert!(enc.is_empty(), "failed lines leave nothing behind");
        enc.start_line("cpu").unwrap();
        enc.add_field("n", 1i64).unwrap();
        enc.add_field("u", 2u64).unwrap();
        enc.add_field("s", "a\"b").unwrap();
        enc.end_line(Some(5)).unwrap();
        assert_eq!(enc.bytes(), b"cpu n=1i,u=2u,s=\"a\\\"b\" 5\n");
    }

    #[test]
    fn tag_order_is_that_of_the_keys_as_given_whether_escaped_or_not() {
        let mut enc = Encoder::new();
        enc.start_line("m").unwrap();
        // "a b" escapes to "a\\ b", which sorts after "a!" although the key sorts before it.
        enc.add_tag("a b", "1").unwrap();
        enc.add_tag("a!", "2").unwrap();
        enc.add_tag("a,c", "3").unwrap();
        assert_eq!(
            enc.add_tag("a,c", "4"),
            Err(EncodeError::TagOrder("a,c".into()))
        );
        enc.start_line("m").unwrap();
        enc.add_tag("hostname", "n1").unwrap();
        enc.add_tag("type", "node").unwrap();
        assert_eq!(
            enc.add_tag("type", "x"),
            Err(EncodeError::TagOrder("type".into()))
        );
        enc.start_line("m").unwrap();
        enc.add_tag("z", "1").unwrap();
        enc.add_field("v", 1i64).unwrap();
        enc.end_line(Some(1_700_000_000_123_456_789)).unwrap();
        // A new line starts a new order.
        enc.start_line("m").unwrap();
        enc.add_tag("a b", "x").unwrap();
        enc.add_tag("b", "").unwrap_err();
        enc.start_line("m").unwrap();
        enc.add_tag("a", "\\x").unwrap();
        enc.add_field("v", -12i64).unwrap();
        enc.add_field("w", 123_456_789_012u64).unwrap();
        enc.end_line(None).unwrap();
        assert_eq!(
            enc.bytes(),
            b"m,z=1 v=1i 1700000000123456789\nm,a=\\x v=-12i,w=123456789012u\n"
        );
    }
}
