//! Finding where a measurement or key token ends, in a line being validated and again in
//! one already validated.

use crate::lineproto::simd::{self, StopWindow};
use crate::lineproto::table::KEY_STOP;

/// Scans a measurement or key token from `i` as the Go decoder does: up to the first stop
/// byte, where a backslash followed by one of `escapes` takes that byte into the token and
/// any other backslash is a literal one. Returns the end, whether the token holds a
/// backslash, and whether it holds a byte above 0x7f (its UTF-8 must then be checked).
#[inline]
pub(super) fn scan_token(
    window: &mut StopWindow,
    buf: &[u8],
    mut i: usize,
    stop: &[bool; 256],
    escapes: &[u8],
) -> (usize, bool, bool) {
    let mut escaped = false;
    let mut high = false;
    let with_equals = stop[usize::from(b'=')];
    loop {
        i = window.skip(buf, i, with_equals);
        match buf.get(i) {
            Some(b'\\') => {
                escaped = true;
                match buf.get(i + 1) {
                    Some(next) if escapes.contains(next) => i += 2,
                    Some(_) => i += 1,
                    None => return (buf.len(), escaped, high),
                }
            }
            Some(&b) if b >= 0x80 => {
                high = true;
                i += 1;
            }
            _ => return (i, escaped, high),
        }
    }
}

/// The end of a key or tag value at `i` in a section the decoder validated, which ends at
/// the first `end` byte (`=` after a key, a comma or the section's end after a tag value)
/// unless a backslash comes first; then the token scanner takes over. Returns the end and
/// whether the token holds a backslash.
#[inline(always)]
pub(super) fn validated_token_end(section: &[u8], i: usize, end: u8) -> (usize, bool) {
    let at = simd::find2(section, i, end, b'\\');
    if section.get(at) != Some(&b'\\') {
        return (at, false);
    }
    let (at, escaped, _) = scan_token(&mut StopWindow::new(), section, i, &KEY_STOP, b",= ");
    (at, escaped)
}

/// Views bytes of a validated line as text.
#[inline]
pub(super) fn as_str(bytes: &[u8]) -> &str {
    debug_assert!(std::str::from_utf8(bytes).is_ok());
    // SAFETY: every line is checked to be valid UTF-8 before any `Line` is handed out, and
    // tokens are cut only next to ASCII delimiters, which are always character boundaries.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}
