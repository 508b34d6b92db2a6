//! Escape rules per token kind, identical to the Go reference decoder and encoder.

use super::token::TokenKind;

/// The character a backslash followed by `next` stands for in a token of `kind`, or `None`
/// when the backslash is literal there.
#[inline]
fn escaped_char(kind: TokenKind, next: u8) -> Option<u8> {
    match (kind, next) {
        (TokenKind::Measurement, b' ' | b',') => Some(next),
        (TokenKind::Key, b' ' | b',' | b'=') => Some(next),
        (TokenKind::StringField, b'\\' | b'"') => Some(next),
        (TokenKind::StringField, b'n') => Some(b'\n'),
        (TokenKind::StringField, b'r') => Some(b'\r'),
        (TokenKind::StringField, b't') => Some(b'\t'),
        _ => None,
    }
}

/// Calls `emit` with the unescaped text in pieces; the pieces are borrowed from `raw` or
/// one-byte escapes, so callers can append or compare without allocating.
#[inline]
fn for_each_piece(raw: &str, kind: TokenKind, mut emit: impl FnMut(&[u8]) -> bool) -> bool {
    let bytes = raw.as_bytes();
    let mut start = 0;
    while let Some(offset) = memchr::memchr(b'\\', &bytes[start..]) {
        let at = start + offset;
        let Some(&next) = bytes.get(at + 1) else {
            break;
        };
        match escaped_char(kind, next) {
            Some(c) => {
                if !emit(&bytes[start..at]) || !emit(&[c]) {
                    return false;
                }
                start = at + 2;
            }
            None => {
                // A literal backslash: keep it and look again from the next byte, so that
                // `\\,` in a tag reads as a literal backslash then an escaped comma.
                if !emit(&bytes[start..at + 1]) {
                    return false;
                }
                start = at + 1;
            }
        }
    }
    emit(&bytes[start..])
}

/// Appends the unescaped form of `raw` to `out`.
pub(crate) fn unescape_into(raw: &str, kind: TokenKind, out: &mut String) {
    let mut bytes = std::mem::take(out).into_bytes();
    for_each_piece(raw, kind, |piece| {
        bytes.extend_from_slice(piece);
        true
    });
    // Every piece is either a run of `raw` cut at ASCII bytes or an ASCII escape, so the
    // result is valid UTF-8; the checked conversion keeps this free of `unsafe`.
    *out = String::from_utf8(bytes).expect("unescaping keeps UTF-8 valid");
}

/// Whether the unescaped form of `raw` equals `s`.
pub(crate) fn unescaped_eq(raw: &str, kind: TokenKind, s: &str) -> bool {
    let mut rest = s.as_bytes();
    let all_matched = for_each_piece(raw, kind, |piece| match rest.strip_prefix(piece) {
        Some(tail) => {
            rest = tail;
            true
        }
        None => false,
    });
    all_matched && rest.is_empty()
}

/// Appends `s` escaped for a measurement (`,` and space).
pub(crate) fn escape_measurement(s: &str, out: &mut Vec<u8>) {
    escape_with(s, out, |b| matches!(b, b',' | b' '));
}

/// Appends `s` escaped for a tag key, tag value or field key (`,`, `=` and space).
pub(crate) fn escape_key(s: &str, out: &mut Vec<u8>) {
    escape_with(s, out, |b| matches!(b, b',' | b'=' | b' '));
}

/// Appends `s` escaped for the inside of a string field (`\` and `"`).
pub(crate) fn escape_string_field(s: &str, out: &mut Vec<u8>) {
    escape_with(s, out, |b| matches!(b, b'\\' | b'"'));
}

#[inline]
fn escape_with(s: &str, out: &mut Vec<u8>, needs_escape: impl Fn(u8) -> bool) {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| needs_escape(b)) {
        out.extend_from_slice(bytes);
        return;
    }
    out.reserve(bytes.len() + 8);
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if needs_escape(b) {
            out.extend_from_slice(&bytes[start..i]);
            out.push(b'\\');
            out.push(b);
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unescape(raw: &str, kind: TokenKind) -> String {
        let mut out = String::new();
        unescape_into(raw, kind, &mut out);
        out
    }

    #[test]
    fn backslash_collapses_only_in_strings() {
        assert_eq!(unescape(r"two\\\ words", TokenKind::Key), r"two\\ words");
        assert_eq!(unescape(r"\\,\,\t", TokenKind::Key), r"\,,\t");
        assert_eq!(unescape(r"a\\b", TokenKind::Measurement), r"a\\b");
        assert_eq!(unescape(r"a\=b", TokenKind::Measurement), r"a\=b");
        assert_eq!(unescape(r"a\\b\n", TokenKind::StringField), "a\\b\n");
        assert_eq!(unescape(r#"\"q\"\x"#, TokenKind::StringField), r#""q"\x"#);
        assert!(unescaped_eq(r"a\ b", TokenKind::Key, "a b"));
        assert!(!unescaped_eq(r"a\ b", TokenKind::Key, "a b c"));
        assert!(!unescaped_eq(r"a\ b", TokenKind::Key, "a"));
    }
}
