//! Escape rules per token kind, identical to the Go reference decoder and encoder.

use super::token::TokenKind;

/// What a backslash followed by `next` stands for in a token of `kind`, or `None` when the
/// backslash is literal there.
#[inline]
fn escaped_text(kind: TokenKind, next: u8) -> Option<&'static str> {
    match (kind, next) {
        (TokenKind::Measurement, b' ') | (TokenKind::Key, b' ') => Some(" "),
        (TokenKind::Measurement, b',') | (TokenKind::Key, b',') => Some(","),
        (TokenKind::Key, b'=') => Some("="),
        (TokenKind::StringField, b'\\') => Some("\\"),
        (TokenKind::StringField, b'"') => Some("\""),
        (TokenKind::StringField, b'n') => Some("\n"),
        (TokenKind::StringField, b'r') => Some("\r"),
        (TokenKind::StringField, b't') => Some("\t"),
        _ => None,
    }
}

/// Calls `emit` with the unescaped text in pieces, each borrowed from `raw` or a static
/// escape, so callers append or compare without allocating. Pieces are cut next to ASCII
/// backslashes, so each is a valid `str`.
#[inline]
fn for_each_piece(raw: &str, kind: TokenKind, mut emit: impl FnMut(&str) -> bool) -> bool {
    let bytes = raw.as_bytes();
    let mut start = 0;
    let mut from = 0;
    while let Some(at) = super::scan::find1(bytes, from, b'\\') {
        let Some(&next) = bytes.get(at + 1) else {
            break;
        };
        match escaped_text(kind, next) {
            Some(text) => {
                if !emit(&raw[start..at]) || !emit(text) {
                    return false;
                }
                start = at + 2;
                from = at + 2;
            }
            // A literal backslash stays, and the byte after it is looked at afresh, so that
            // `\\,` in a tag reads as a literal backslash then an escaped comma.
            None => from = at + 1,
        }
    }
    emit(&raw[start..])
}

/// Appends the unescaped form of `raw` to `out`, block at a time (see `simd`).
#[inline]
pub(crate) fn unescape_into(raw: &str, kind: TokenKind, out: &mut String) {
    super::simd::unescape_into(raw, kind, out)
}

/// Whether the unescaped form of `raw` equals `s`.
pub(crate) fn unescaped_eq(raw: &str, kind: TokenKind, s: &str) -> bool {
    let mut rest = s;
    let all_matched = for_each_piece(raw, kind, |piece| match rest.strip_prefix(piece) {
        Some(tail) => {
            rest = tail;
            true
        }
        None => false,
    });
    all_matched && rest.is_empty()
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

    /// A byte-at-a-time reference for `unescape_into`.
    fn reference(raw: &str, kind: TokenKind) -> String {
        let mut out = String::new();
        for_each_piece(raw, kind, |piece| {
            out.push_str(piece);
            true
        });
        out
    }

    #[test]
    fn word_copy_agrees_with_piecewise_unescaping_for_every_length_and_position() {
        // Tokens of 0..=80 bytes with each escape (or a lone trailing backslash) at every
        // position: every split between whole words and the tail.
        let escapes = ["\\", "\\\\", "\\\"", "\\n", "\\ ", "\\,", "\\=", "\\x", "é"];
        for n in 0..=80 {
            for at in 0..=n {
                for escape in escapes {
                    let raw = format!("{}{escape}{}", "a".repeat(at), "b".repeat(n - at));
                    for kind in [
                        TokenKind::Measurement,
                        TokenKind::Key,
                        TokenKind::StringField,
                    ] {
                        assert_eq!(unescape(&raw, kind), reference(&raw, kind), "{raw:?}");
                        assert!(unescaped_eq(&raw, kind, &reference(&raw, kind)));
                    }
                }
            }
        }
    }

    #[test]
    fn word_copy_agrees_with_piecewise_unescaping() {
        let alphabet = [
            "a",
            "\\",
            "\"",
            " ",
            ",",
            "=",
            "n",
            "t",
            "é",
            "xxxxxxxxxx",
            "😀",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5000 {
            let mut raw = String::new();
            for _ in 0..(seed % 40) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                raw.push_str(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            for kind in [
                TokenKind::Measurement,
                TokenKind::Key,
                TokenKind::StringField,
            ] {
                let mut out = String::from("prefix:");
                unescape_into(&raw, kind, &mut out);
                assert_eq!(
                    out,
                    format!("prefix:{}", reference(&raw, kind)),
                    "{raw:?} {kind:?}"
                );
            }
        }
    }
}
