//! A reader of InfluxDB line protocol, the format `customcmd`'s commands and files write:
//! `measurement[,tag=value...] field=value[,field=value...] [timestamp]`, with InfluxDB's
//! escapes (`\,` and `\ ` in measurements; `\,`, `\=` and `\ ` in tag keys, tag values and
//! field keys; `\"` and `\\` in string fields) and value types (floats, `12i` integers, `12u`
//! unsigned, `"strings"`, booleans). Empty lines and `#` comments are skipped.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// A field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    /// A float (no suffix).
    Float(f64),
    /// An integer (`i`).
    Int(i64),
    /// An unsigned integer (`u`).
    Uint(u64),
    /// A string (quoted).
    Str(String),
    /// A boolean.
    Bool(bool),
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The measurement (the metric name).
    pub measurement: String,
    /// Tags in the order written.
    pub tags: Vec<(String, String)>,
    /// Fields in the order written (at least one).
    pub fields: Vec<(String, Field)>,
    /// The timestamp, if one was written.
    pub time: Option<i64>,
}

/// Every line of `text`; the first malformed one is an error naming its number.
pub fn parse(text: &str) -> Result<Vec<Line>, String> {
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let parsed =
            parse_line(line).map_err(|e| format!("line {}: {e}: {}", number + 1, quote(line)))?;
        lines.push(parsed);
    }
    Ok(lines)
}

fn quote(line: &str) -> String {
    crate::quoted(line, 120)
}

/// Reads up to an unescaped byte of `stops` (or the end), unescaping `\` before a byte of
/// `escapable`. Delimiters and escapes are ASCII, so every cut is at a character boundary.
fn token(s: &str, at: &mut usize, stops: &[u8], escapable: &[u8]) -> String {
    let bytes = s.as_bytes();
    let mut out = String::new();
    let mut start = *at;
    while *at < bytes.len() {
        let b = bytes[*at];
        if b == b'\\' && *at + 1 < bytes.len() && escapable.contains(&bytes[*at + 1]) {
            out.push_str(&s[start..*at]);
            *at += 1;
            start = *at;
            *at += 1;
            continue;
        }
        if stops.contains(&b) {
            break;
        }
        *at += 1;
    }
    out.push_str(&s[start..*at]);
    out
}

fn parse_line(line: &str) -> Result<Line, String> {
    let bytes = line.as_bytes();
    let mut at = 0;
    let measurement = token(line, &mut at, b", ", b", \\");
    if measurement.is_empty() {
        return Err("no measurement".into());
    }
    let mut tags: Vec<(String, String)> = Vec::new();
    while at < bytes.len() && bytes[at] == b',' {
        at += 1;
        let key = token(line, &mut at, b",= ", b",= \\");
        if at >= bytes.len() || bytes[at] != b'=' {
            return Err(format!("tag {key:?} has no value"));
        }
        at += 1;
        let value = token(line, &mut at, b", ", b",= \\");
        if key.is_empty() || value.is_empty() {
            return Err("a tag key or value is empty".into());
        }
        if tags.iter().any(|(k, _)| *k == key) {
            return Err(format!("tag {key:?} is given twice"));
        }
        tags.push((key, value));
    }
    if at >= bytes.len() || bytes[at] != b' ' {
        return Err("no fields".into());
    }
    at += 1;
    let mut fields: Vec<(String, Field)> = Vec::new();
    loop {
        let key = token(line, &mut at, b",= ", b",= \\");
        if key.is_empty() || at >= bytes.len() || bytes[at] != b'=' {
            return Err("a field has no key or no value".into());
        }
        at += 1;
        let value = if bytes.get(at) == Some(&b'"') {
            at += 1;
            let mut text = String::new();
            let mut start = at;
            loop {
                match bytes.get(at) {
                    None => return Err(format!("the string of field {key:?} is not closed")),
                    Some(b'\\') if matches!(bytes.get(at + 1), Some(b'"' | b'\\')) => {
                        text.push_str(&line[start..at]);
                        start = at + 1;
                        at += 2;
                    }
                    Some(b'"') => {
                        text.push_str(&line[start..at]);
                        at += 1;
                        break;
                    }
                    Some(_) => at += 1,
                }
            }
            Field::Str(text)
        } else {
            let raw = token(line, &mut at, b", ", b"");
            scalar(&raw).ok_or_else(|| format!("field {key:?} has no valid value: {raw:?}"))?
        };
        if fields.iter().any(|(k, _)| *k == key) {
            return Err(format!("field {key:?} is given twice"));
        }
        fields.push((key, value));
        match bytes.get(at) {
            Some(b',') => at += 1,
            _ => break,
        }
    }
    let time = match bytes.get(at) {
        None => None,
        Some(b' ') => {
            let raw = line[at + 1..].trim();
            if raw.is_empty() {
                None
            } else {
                Some(
                    raw.parse::<i64>()
                        .map_err(|_| format!("the timestamp is not an integer: {raw:?}"))?,
                )
            }
        }
        Some(_) => return Err("unexpected text after the fields".into()),
    };
    Ok(Line {
        measurement,
        tags,
        fields,
        time,
    })
}

/// A field value other than a string.
fn scalar(raw: &str) -> Option<Field> {
    match raw {
        "t" | "T" | "true" | "True" | "TRUE" => return Some(Field::Bool(true)),
        "f" | "F" | "false" | "False" | "FALSE" => return Some(Field::Bool(false)),
        _ => {}
    }
    if let Some(int) = raw.strip_suffix('i') {
        return int.parse().ok().map(Field::Int);
    }
    if let Some(uint) = raw.strip_suffix('u') {
        return uint.parse().ok().map(Field::Uint);
    }
    // Rust's float syntax also takes `inf` and `NaN`, which line protocol does not have.
    if !raw
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'))
    {
        return None;
    }
    raw.parse::<f64>().ok().map(Field::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn reads_escapes_types_and_timestamps() {
        let lines = parse(
            "# comment\n\
             my\\ metric,type=node,path=a\\,b\\=c value=1.5 1700000000000000000\n\
             \n\
             count,type=socket,type-id=0 value=12i,extra=\"say \\\"hi\\\"\",ok=t\n\
             big value=18446744073709551615u\n",
        )
        .unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].measurement, "my metric");
        assert_eq!(
            lines[0].tags,
            [
                ("type".to_string(), "node".to_string()),
                ("path".to_string(), "a,b=c".to_string())
            ]
        );
        assert_eq!(lines[0].fields, [("value".to_string(), Field::Float(1.5))]);
        assert_eq!(lines[0].time, Some(1_700_000_000_000_000_000));
        assert_eq!(lines[1].fields[0].1, Field::Int(12));
        assert_eq!(lines[1].fields[1].1, Field::Str("say \"hi\"".to_string()));
        assert_eq!(lines[1].fields[2].1, Field::Bool(true));
        assert_eq!(lines[1].time, None);
        assert_eq!(lines[2].fields[0].1, Field::Uint(u64::MAX));
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (text, needle) in [
            ("m\n", "line 1: no fields"),
            (
                "ok value=1\nm,t value=1\n",
                "line 2: tag \"t\" has no value",
            ),
            ("m value=abc\n", "field \"value\" has no valid value"),
            ("m value=\"open\n", "is not closed"),
            ("m value=1 12x\n", "timestamp is not an integer"),
            ("m value=inf\n", "no valid value"),
            ("m,a=1,a=2 value=1\n", "given twice"),
            ("m value=1,value=2\n", "given twice"),
            (" value=1\n", "no measurement"),
            ("m value=\"a\"x\n", "unexpected text"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
