//! The line writer cc-lib's `ccMessage.ToLineProtocol` uses for fleet events
//! (influxdb-client-go's `write.PointToLineProtocol`): tags in key order, escapes for
//! measurement and keys, string fields with `\` and `"` escaped, nanosecond time, `\n`.

fn escape_name(s: &str, out: &mut Vec<u8>, is_special: impl Fn(u8) -> bool) {
    for &b in s.as_bytes() {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ if is_special(b) => {
                out.push(b'\\');
                out.push(b);
            }
            _ => out.push(b),
        }
    }
}

/// Appends one event line: `measurement,tags event="<payload>" <time>\n`. `tags` must be
/// sorted by key (the fleet's tag sets are fixed and already are).
pub(crate) fn write_event_line(
    out: &mut Vec<u8>,
    measurement: &str,
    tags: &[(&str, &str)],
    payload: &[u8],
    time_ns: i64,
) {
    debug_assert!(tags.windows(2).all(|w| w[0].0 < w[1].0));
    escape_name(measurement, out, |b| b == b' ' || b == b',');
    for (key, value) in tags {
        out.push(b',');
        escape_name(key, out, |b| matches!(b, b' ' | b',' | b'='));
        out.push(b'=');
        escape_name(value, out, |b| matches!(b, b' ' | b',' | b'='));
    }
    out.extend_from_slice(b" event=\"");
    out.reserve(payload.len() + payload.len() / 4 + 24);
    let mut start = 0;
    for (i, &b) in payload.iter().enumerate() {
        if b == b'"' || b == b'\\' {
            out.extend_from_slice(&payload[start..i]);
            out.push(b'\\');
            out.push(b);
            start = i + 1;
        }
    }
    out.extend_from_slice(&payload[start..]);
    out.extend_from_slice(b"\" ");
    out.extend_from_slice(itoa::Buffer::new().format(time_ns).as_bytes());
    out.push(b'\n');
}
