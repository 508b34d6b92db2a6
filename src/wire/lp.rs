//! The line writer cc-lib's `ccMessage.ToLineProtocol` uses for fleet events
//! (influxdb-client-go's `write.PointToLineProtocol`): tags in key order, escapes for
//! measurement and keys (a tab, CR or LF in a name or tag becomes two backslashes and `t`,
//! `r` or `n`), string fields with `\` and `"` escaped, nanosecond time, `\n`.

fn escape_name(s: &str, out: &mut Vec<u8>, is_special: impl Fn(u8) -> bool) {
    for &b in s.as_bytes() {
        match b {
            // Go writes these as two backslashes and a letter, which a decoder reads back
            // literally (a backslash is not an escape in names and tags).
            b'\n' => out.extend_from_slice(br"\\n"),
            b'\r' => out.extend_from_slice(br"\\r"),
            b'\t' => out.extend_from_slice(br"\\t"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tab_cr_or_lf_in_a_tag_is_written_as_two_backslashes_and_a_letter() {
        let mut out = Vec::new();
        write_event_line(&mut out, "m\tx", &[("k\n", "a\tb\rc\nd e")], b"{}", 7);
        let want = concat!(r#"m\\tx,k\\n=a\\tb\\rc\\nd\ e event="{}" 7"#, "\n");
        assert_eq!(out, want.as_bytes());
    }
}
