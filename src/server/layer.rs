//! Parsing one config-tree layer the way Go's `json.Unmarshal` into `map[string]any` does.
//!
//! cc-backend reads layers with Go's `encoding/json`, which differs from serde_json where
//! authored files can tell:
//!
//! - nesting up to 10 000 levels is fine (serde_json stops at 128);
//! - a top-level `null` is an empty layer, not an error;
//! - inside strings, every byte that is not part of valid UTF-8 becomes U+FFFD, and so does a
//!   `\u` escape of a lone surrogate (serde_json refuses both);
//! - numbers are float64 (out of float64's range is an error);
//! - of duplicate keys the last wins.
//!
//! The parser is iterative, so depth costs heap, not stack. Values this deep still make the
//! recursive operations on [`Value`] (clone, drop, serializing) deep; callers run those on a
//! grown stack when [`Parsed::depth`] exceeds [`SHALLOW_DEPTH`].

use serde_json::{Map, Number, Value};

/// Go's `encoding/json` nesting limit (`maxNestingDepth`).
pub const MAX_DEPTH: usize = 10_000;
/// Values up to this depth are handled on an ordinary thread stack.
pub const SHALLOW_DEPTH: usize = 128;
/// The stack to grow to for deeper values: generous for [`MAX_DEPTH`] levels of recursion in
/// an unoptimised build; it is reserved, and only the pages used are touched.
pub const DEEP_STACK: usize = 256 << 20;

/// A parsed layer and the deepest nesting it contains.
#[derive(Debug)]
pub struct Parsed {
    /// The layer's keys (empty for a top-level `null`).
    pub map: Map<String, Value>,
    /// The nesting depth of the layer, the top-level object counting as 1.
    pub depth: usize,
}

/// Runs `f` on a stack deep enough for values nested [`MAX_DEPTH`] levels, when `depth` says
/// it may need one.
pub fn with_stack_for<R>(depth: usize, f: impl FnOnce() -> R) -> R {
    if depth > SHALLOW_DEPTH {
        stacker::grow(DEEP_STACK, f)
    } else {
        f()
    }
}

enum Frame {
    Array(Vec<Value>),
    Object(Map<String, Value>, String),
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
}

fn error(message: String) -> serde_json::Error {
    <serde_json::Error as serde::de::Error>::custom(message)
}

impl Parser<'_> {
    fn fail<T>(&self, what: &str) -> Result<T, serde_json::Error> {
        let before = &self.data[..self.pos.min(self.data.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = before.len()
            - before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        Err(error(format!("{what} at line {line} column {column}")))
    }

    fn unexpected<T>(&self, looking_for: &str) -> Result<T, serde_json::Error> {
        match self.data.get(self.pos) {
            None => self.fail(&format!("unexpected end of input {looking_for}")),
            Some(&b) if b.is_ascii_graphic() => {
                self.fail(&format!("invalid character '{}' {looking_for}", b as char))
            }
            Some(&b) => self.fail(&format!("invalid byte 0x{b:02x} {looking_for}")),
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.data.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.data.get(self.pos) == Some(&b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &[u8], value: Value) -> Result<Value, serde_json::Error> {
        if self.data[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(value)
        } else {
            self.unexpected("in literal")
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.data.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// JSON's number grammar, read as float64 like Go's `any` decoding.
    fn number(&mut self) -> Result<Value, serde_json::Error> {
        let start = self.pos;
        self.eat(b'-');
        if !self.eat(b'0') && self.digits() == 0 {
            return self.unexpected("in numeric literal");
        }
        if self.eat(b'.') && self.digits() == 0 {
            return self.unexpected("after decimal point in numeric literal");
        }
        if self.eat(b'e') || self.eat(b'E') {
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if self.digits() == 0 {
                return self.unexpected("in exponent of numeric literal");
            }
        }
        let text = std::str::from_utf8(&self.data[start..self.pos]).expect("ASCII digits");
        match text.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Ok(Value::Number(n)),
            None => {
                self.pos = start;
                self.fail(&format!("number {text} is out of the float64 range"))
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.data.get(self.pos..self.pos + 4)?;
        let text = std::str::from_utf8(digits).ok()?;
        let value = u32::from_str_radix(text, 16).ok()?;
        // from_str_radix accepts a sign; JSON does not.
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        self.pos += 4;
        Some(value)
    }

    /// A string starting at the opening quote.
    fn string(&mut self) -> Result<String, serde_json::Error> {
        debug_assert_eq!(self.data[self.pos], b'"');
        self.pos += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.data.get(self.pos) else {
                return self.unexpected("in string literal");
            };
            match b {
                b'"' => {
                    self.pos += 1;
                    return Ok(go_lossy_utf8(out));
                }
                b'\\' => {
                    self.pos += 1;
                    let Some(&escape) = self.data.get(self.pos) else {
                        return self.unexpected("in string escape code");
                    };
                    self.pos += 1;
                    let simple = match escape {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        b'u' => None,
                        _ => {
                            self.pos -= 1;
                            return self.unexpected("in string escape code");
                        }
                    };
                    if let Some(byte) = simple {
                        out.push(byte);
                        continue;
                    }
                    let Some(unit) = self.hex4() else {
                        return self.unexpected("in \\u hexadecimal character escape");
                    };
                    let c = if (0xD800..0xDC00).contains(&unit) {
                        // A high surrogate counts only with a low one right after it; else it
                        // is U+FFFD and what follows is read on its own.
                        let save = self.pos;
                        let low = if self.data[self.pos..].starts_with(b"\\u") {
                            self.pos += 2;
                            self.hex4().filter(|l| (0xDC00..0xE000).contains(l))
                        } else {
                            None
                        };
                        match low {
                            Some(low) => {
                                char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                                    .unwrap_or(char::REPLACEMENT_CHARACTER)
                            }
                            None => {
                                self.pos = save;
                                char::REPLACEMENT_CHARACTER
                            }
                        }
                    } else {
                        char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER)
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..0x20 => return self.unexpected("in string literal"),
                _ => {
                    out.push(b);
                    self.pos += 1;
                }
            }
        }
    }

    fn key(&mut self) -> Result<String, serde_json::Error> {
        if self.data.get(self.pos) != Some(&b'"') {
            return self.unexpected("looking for beginning of object key string");
        }
        let key = self.string()?;
        self.skip_ws();
        if !self.eat(b':') {
            return self.unexpected("after object key");
        }
        Ok(key)
    }
}

/// Go's replacement of invalid UTF-8: each byte that does not start a complete, valid
/// sequence becomes one U+FFFD.
fn go_lossy_utf8(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            let bytes = e.into_bytes();
            let mut out = String::with_capacity(bytes.len() + 8);
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match std::str::from_utf8(rest) {
                    Ok(s) => {
                        out.push_str(s);
                        break;
                    }
                    Err(e) => {
                        let (good, bad) = rest.split_at(e.valid_up_to());
                        out.push_str(std::str::from_utf8(good).expect("checked valid"));
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &bad[1..];
                    }
                }
            }
            out
        }
    }
}

/// Parses a layer file. The top level must be an object or `null`.
pub fn parse(data: &[u8]) -> Result<Parsed, serde_json::Error> {
    let mut p = Parser { data, pos: 0 };
    let mut stack: Vec<Frame> = Vec::new();
    let mut depth = 0;
    let top = 'value: loop {
        p.skip_ws();
        let mut value = match p.data.get(p.pos) {
            Some(&open @ (b'{' | b'[')) => {
                if stack.len() + 1 > MAX_DEPTH {
                    return p.fail(&format!("nesting deeper than {MAX_DEPTH} levels"));
                }
                p.pos += 1;
                depth = depth.max(stack.len() + 1);
                p.skip_ws();
                if open == b'{' {
                    if p.eat(b'}') {
                        Value::Object(Map::new())
                    } else {
                        let key = p.key()?;
                        stack.push(Frame::Object(Map::new(), key));
                        continue 'value;
                    }
                } else if p.eat(b']') {
                    Value::Array(Vec::new())
                } else {
                    stack.push(Frame::Array(Vec::new()));
                    continue 'value;
                }
            }
            Some(b'"') => Value::String(p.string()?),
            Some(b't') => p.literal(b"true", Value::Bool(true))?,
            Some(b'f') => p.literal(b"false", Value::Bool(false))?,
            Some(b'n') => p.literal(b"null", Value::Null)?,
            Some(b'-' | b'0'..=b'9') => p.number()?,
            _ => return p.unexpected("looking for beginning of value"),
        };
        // A value is complete: hand it to its container, closing containers that end here.
        loop {
            p.skip_ws();
            match stack.last_mut() {
                None => break 'value value,
                Some(Frame::Array(items)) => {
                    items.push(value);
                    if p.eat(b',') {
                        continue 'value;
                    }
                    if !p.eat(b']') {
                        return p.unexpected("after array element");
                    }
                    let Some(Frame::Array(items)) = stack.pop() else {
                        unreachable!("the last frame is an array")
                    };
                    value = Value::Array(items);
                }
                Some(Frame::Object(map, key)) => {
                    map.insert(std::mem::take(key), value);
                    if p.eat(b',') {
                        p.skip_ws();
                        *key = p.key()?;
                        continue 'value;
                    }
                    if !p.eat(b'}') {
                        return p.unexpected("after object key:value pair");
                    }
                    let Some(Frame::Object(map, _)) = stack.pop() else {
                        unreachable!("the last frame is an object")
                    };
                    value = Value::Object(map);
                }
            }
        }
    };
    if p.pos != data.len() {
        return p.unexpected("after top-level value");
    }
    match top {
        Value::Object(map) => Ok(Parsed { map, depth }),
        Value::Null => Ok(Parsed {
            map: Map::new(),
            depth: 1,
        }),
        other => Err(error(format!(
            "a layer must be a JSON object (or null), not {}",
            match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                _ => "a boolean",
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(text: &[u8]) -> Value {
        Value::Object(parse(text).unwrap().map)
    }

    #[test]
    fn ordinary_json_reads_as_serde_json_reads_it() {
        let text = br#" {"a": [1, -0, 2.5e3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9"], "b": {"c": {}}, "d": []} "#;
        let expected: Value = serde_json::from_slice(text).unwrap();
        let got = ok(text);
        assert_eq!(got["a"][6], expected["a"][6]);
        assert_eq!(got["b"], expected["b"]);
        assert_eq!(got["a"][2].as_f64(), Some(2500.0));
        assert_eq!(got["a"][1].as_f64().map(f64::is_sign_negative), Some(true));
    }

    #[test]
    fn a_top_level_null_is_an_empty_layer() {
        assert_eq!(ok(b" null\n"), json!({}));
    }

    #[test]
    fn nesting_up_to_go_limit_is_accepted_and_beyond_it_refused() {
        let nested = |n: usize| {
            let mut s = String::from("{\"a\":");
            s.push_str(&"[".repeat(n - 1));
            s.push_str(&"]".repeat(n - 1));
            s.push('}');
            s
        };
        let parsed = parse(nested(MAX_DEPTH).as_bytes()).unwrap();
        assert_eq!(parsed.depth, MAX_DEPTH);
        with_stack_for(parsed.depth, move || drop(parsed));
        let err = parse(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err();
        assert!(
            err.to_string().contains("nesting deeper than 10000"),
            "{err}"
        );
    }

    #[test]
    fn lone_surrogates_and_invalid_utf8_become_replacement_characters() {
        let v = ok(br#"{"a":"x\ud800y","b":"\udc00","c":"\ud83d\ude00","d":"\ud800\u0041"}"#);
        assert_eq!(v["a"], "x\u{fffd}y");
        assert_eq!(v["b"], "\u{fffd}");
        assert_eq!(v["c"], "\u{1f600}");
        assert_eq!(v["d"], "\u{fffd}A");
        // One U+FFFD per byte, as Go's decoder does: a truncated 3-byte sequence gives two.
        let v = ok(b"{\"a\":\"x\xe2\x82y\xff\"}");
        assert_eq!(v["a"], "x\u{fffd}\u{fffd}y\u{fffd}");
    }

    #[test]
    fn duplicate_keys_keep_the_last_value() {
        assert_eq!(
            ok(br#"{"a":{"x":1},"a":{"y":2}}"#),
            json!({"a": {"y": 2.0}})
        );
    }

    #[test]
    fn malformed_layers_are_refused_with_a_position() {
        for (text, what) in [
            (&b"[1]"[..], "not an array"),
            (b"\"s\"", "not a string"),
            (b"", "unexpected end"),
            (b"{\"a\": }", "invalid character '}'"),
            (b"{\"a\":1,}", "object key"),
            (b"{\"a\":[1,]}", "beginning of value"),
            (b"{\"a\":01}", "after object key:value"),
            (b"{\"a\":1e999}", "float64 range"),
            (b"{\"a\":\"\x01\"}", "in string literal"),
            (b"{\"a\":\"\\x\"}", "escape"),
            (b"{\"a\":\"\\u12G4\"}", "hexadecimal"),
            (b"{} {}", "after top-level value"),
            (b"{\"a\":tru}", "in literal"),
            (b"\xef\xbb\xbf{}", "looking for beginning of value"),
            (b"{\"a\":-}", "numeric literal"),
            (b"{\"a\":1.}", "decimal point"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.contains(what),
                "{:?}: {err}",
                String::from_utf8_lossy(text)
            );
            if !what.starts_with("not ") {
                assert!(err.contains("line 1"), "{err}");
            }
        }
        let err = parse(b"{\n  \"a\": x\n}").unwrap_err().to_string();
        assert!(err.contains("line 2 column 8"), "{err}");
    }
}
