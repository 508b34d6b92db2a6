//! Untrusted strings in logs: escaped and capped.
//!
//! Names, hostnames, error strings from peers and messages from plugins come from outside the
//! process. Logged raw, a newline forges a log line, an ESC sequence rewrites an operator's
//! terminal and a megabyte string buries everything around it. [`Untrusted`] wraps such a
//! string for `Display`: printable text passes unchanged, every control character (and the
//! quote and backslash that would make the escaping ambiguous) is written as a Rust-style
//! escape, and the text is cut after a fixed number of characters with the count of what was
//! left out.
//!
//! ```
//! use ccfleet::untrusted::Untrusted;
//!
//! let name = "node1\nERROR forged line\x1b[2J";
//! assert_eq!(
//!     Untrusted(name).to_string(),
//!     r"node1\nERROR forged line\u{1b}[2J"
//! );
//! let long = "x".repeat(1000);
//! assert!(Untrusted(&long).to_string().ends_with("… (744 more bytes)"));
//! ```

use std::fmt::{self, Write};

/// How many bytes of an untrusted string are shown by default.
pub const DEFAULT_CAP: usize = 256;

/// A string from outside the process, escaped and capped at [`DEFAULT_CAP`] bytes when
/// displayed. Use [`Untrusted::capped`] for another cap.
#[derive(Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

impl<'a> Untrusted<'a> {
    /// The same string with a cap of `cap` bytes instead of [`DEFAULT_CAP`].
    pub fn capped(self, cap: usize) -> Capped<'a> {
        Capped { text: self.0, cap }
    }

    /// Wraps bytes that may not be UTF-8; invalid sequences are shown as `\x..` escapes.
    pub fn bytes(bytes: &'a [u8]) -> UntrustedBytes<'a> {
        UntrustedBytes {
            bytes,
            cap: DEFAULT_CAP,
        }
    }
}

/// An untrusted string with its own cap; see [`Untrusted::capped`].
#[derive(Clone, Copy)]
pub struct Capped<'a> {
    text: &'a str,
    cap: usize,
}

/// Untrusted bytes; see [`Untrusted::bytes`].
#[derive(Clone, Copy)]
pub struct UntrustedBytes<'a> {
    bytes: &'a [u8],
    cap: usize,
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0.as_bytes(), DEFAULT_CAP)
    }
}

impl fmt::Debug for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        write_escaped(f, self.0.as_bytes(), DEFAULT_CAP)?;
        f.write_char('"')
    }
}

impl fmt::Display for Capped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.text.as_bytes(), self.cap)
    }
}

impl fmt::Debug for Capped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        write_escaped(f, self.text.as_bytes(), self.cap)?;
        f.write_char('"')
    }
}

impl fmt::Display for UntrustedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.bytes, self.cap)
    }
}

impl fmt::Debug for UntrustedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        write_escaped(f, self.bytes, self.cap)?;
        f.write_char('"')
    }
}

/// Escapes `bytes` into `out`, cut at the last whole character within `cap` input bytes.
fn write_escaped(out: &mut impl Write, bytes: &[u8], cap: usize) -> fmt::Result {
    let mut rest = &bytes[..bytes.len().min(cap)];
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                write_str_escaped(out, text)?;
                rest = &[];
            }
            Err(e) => {
                let (good, tail) = rest.split_at(e.valid_up_to());
                write_str_escaped(out, std::str::from_utf8(good).unwrap_or_default())?;
                match e.error_len() {
                    Some(n) => {
                        for b in &tail[..n] {
                            write!(out, "\\x{b:02x}")?;
                        }
                        rest = &tail[n..];
                    }
                    // An incomplete sequence at the very end of the input.
                    None if bytes.len() <= cap => {
                        for b in tail {
                            write!(out, "\\x{b:02x}")?;
                        }
                        return Ok(());
                    }
                    // A character cut by the cap: counted as left out.
                    None => {
                        let shown = bytes.len().min(cap) - tail.len();
                        return write!(out, "… ({} more bytes)", bytes.len() - shown);
                    }
                }
            }
        }
    }
    if bytes.len() > cap {
        write!(out, "… ({} more bytes)", bytes.len() - cap)?;
    }
    Ok(())
}

fn write_str_escaped(out: &mut impl Write, text: &str) -> fmt::Result {
    let mut start = 0;
    for (i, c) in text.char_indices() {
        let needs = c.is_control() || c == '"' || c == '\\' || is_bidi_or_invisible(c);
        if needs {
            out.write_str(&text[start..i])?;
            match c {
                '\n' => out.write_str("\\n")?,
                '\r' => out.write_str("\\r")?,
                '\t' => out.write_str("\\t")?,
                '"' => out.write_str("\\\"")?,
                '\\' => out.write_str("\\\\")?,
                c => write!(out, "\\u{{{:x}}}", c as u32)?,
            }
            start = i + c.len_utf8();
        }
    }
    out.write_str(&text[start..])
}

/// Characters that reorder or hide text on a terminal (Trojan Source) without being
/// control characters in Unicode's sense.
fn is_bidi_or_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_is_unchanged() {
        assert_eq!(Untrusted("node-01.cluster").to_string(), "node-01.cluster");
        assert_eq!(Untrusted("ünïcödé").to_string(), "ünïcödé");
    }

    #[test]
    fn control_characters_cannot_forge_a_line_or_drive_a_terminal() {
        let shown = Untrusted("a\nb\rc\td\0e\x1b[31mf\u{7f}g\u{202e}h").to_string();
        assert_eq!(shown, r"a\nb\rc\td\u{0}e\u{1b}[31mf\u{7f}g\u{202e}h");
        assert!(!shown.chars().any(char::is_control));
    }

    #[test]
    fn quotes_and_backslashes_are_escaped_so_the_form_is_unambiguous() {
        assert_eq!(Untrusted(r#"a"b\n"#).to_string(), r#"a\"b\\n"#);
        assert_eq!(format!("{:?}", Untrusted("x\"y")), r#""x\"y""#);
    }

    #[test]
    fn long_strings_are_cut_with_the_count_of_what_was_left_out() {
        let long = "y".repeat(300);
        assert_eq!(
            Untrusted(&long).to_string(),
            format!("{}… (44 more bytes)", "y".repeat(256))
        );
        assert_eq!(
            Untrusted("abcdef").capped(3).to_string(),
            "abc… (3 more bytes)"
        );
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        // 'é' is two bytes; a cap of 3 falls inside the second one.
        assert_eq!(Untrusted("éé").capped(3).to_string(), "é… (2 more bytes)");
    }

    #[test]
    fn invalid_utf8_is_shown_as_byte_escapes() {
        assert_eq!(Untrusted::bytes(b"a\xffb").to_string(), r"a\xffb");
        assert_eq!(Untrusted::bytes(b"a\xff\nb").to_string(), r"a\xff\nb");
        assert_eq!(Untrusted::bytes(b"a\xc3").to_string(), r"a\xc3");
    }
}
