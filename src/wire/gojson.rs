//! JSON encoded byte for byte as Go's `encoding/json` encodes it.
//!
//! serde_json already writes compact output with Go's escapes for quotes, backslashes and
//! control characters; Go additionally escapes `<`, `>`, `&`, U+2028 and U+2029 (HTML-safe
//! output). Fleet payloads and configuration revisions must match Go's bytes, so they go
//! through this module.

use std::io;

use serde::Serialize;

/// A serde_json formatter adding Go's HTML-safe escapes.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escaped.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// Appends `value` as Go's `json.Marshal` would write it.
pub fn to_writer<W: io::Write, T: Serialize + ?Sized>(
    writer: W,
    value: &T,
) -> Result<(), serde_json::Error> {
    let mut ser = serde_json::Serializer::with_formatter(writer, GoFormatter);
    value.serialize(&mut ser)
}

/// `value` as Go's `json.Marshal` would write it.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(128);
    to_writer(&mut out, value)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_safe_like_go() {
        let v = serde_json::json!({"b": "<a&b>\u{2028}", "a": "\"\\\n\u{1}"});
        assert_eq!(
            String::from_utf8(to_vec(&v).unwrap()).unwrap(),
            r#"{"a":"\"\\\n\u0001","b":"\u003ca\u0026b\u003e\u2028"}"#
        );
    }
}
