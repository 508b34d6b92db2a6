//! How the encoder writes tokens and floats: the escapes of each token kind and Go's
//! shortest float form.
//!
//! Like the encoder, this file needs only `core` and `alloc`: the guest SDK compiles it too.

use alloc::vec::Vec;
use core::fmt::Write as _;

/// A byte 0x00-0x1f or 0x7f, which may not stand in a measurement, key or tag value.
pub(crate) const CONTROL: u8 = 1;
const COMMA: u8 = 2;
const EQUALS: u8 = 4;
const SPACE: u8 = 8;
/// A backslash.
pub(crate) const BACKSLASH: u8 = 16;
const QUOTE: u8 = 32;

/// What a measurement escapes.
pub(crate) const MEASUREMENT_ESCAPES: u8 = COMMA | SPACE;
/// What a tag key, tag value or field key escapes.
pub(crate) const KEY_ESCAPES: u8 = COMMA | EQUALS | SPACE;
/// What the inside of a string field escapes.
pub(crate) const STRING_ESCAPES: u8 = BACKSLASH | QUOTE;

const fn build_classes() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        if super::table::is_non_printable(b as u8) {
            table[b] = CONTROL;
        }
        b += 1;
    }
    table[b',' as usize] = COMMA;
    table[b'=' as usize] = EQUALS;
    table[b' ' as usize] = SPACE;
    table[b'\\' as usize] = BACKSLASH;
    table[b'"' as usize] = QUOTE;
    table
}

static CLASSES: [u8; 256] = build_classes();

/// The classes of all the bytes of a token, or-ed together: what it must escape and whether
/// it may be written at all, found in one pass.
///
/// Tokens of up to eight bytes (most names, keys and tag values) are read without a loop,
/// each byte once or twice: plugins run this code compiled to WebAssembly, where every turn
/// of a loop also checks the call's CPU deadline.
#[inline]
pub(crate) fn classes(bytes: &[u8]) -> u8 {
    let class = |i: usize| CLASSES[bytes[i] as usize];
    let n = bytes.len();
    match n {
        0 => 0,
        1..=3 => class(0) | class(n / 2) | class(n - 1),
        4..=8 => {
            class(0)
                | class(1)
                | class(2)
                | class(3)
                | class(n - 4)
                | class(n - 3)
                | class(n - 2)
                | class(n - 1)
        }
        _ => {
            let eight = |chunk: &[u8]| chunk.iter().fold(0, |acc, &b| acc | CLASSES[b as usize]);
            // The last (partial) chunk again as the last eight bytes, read whole.
            bytes
                .chunks_exact(8)
                .fold(0, |acc, chunk| acc | eight(chunk))
                | eight(&bytes[n - 8..])
        }
    }
}

/// Appends `bytes`; `found` are its [`classes`], and the bytes of the classes in `escapes`
/// get a backslash before them.
#[inline]
pub(crate) fn write_token(bytes: &[u8], found: u8, escapes: u8, out: &mut Vec<u8>) {
    if found & escapes == 0 {
        append(bytes, out);
    } else {
        write_escaped(bytes, escapes, out);
    }
}

#[cold]
fn write_escaped(bytes: &[u8], escapes: u8, out: &mut Vec<u8>) {
    out.reserve(bytes.len() + 8);
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if CLASSES[b as usize] & escapes != 0 {
            out.extend_from_slice(&bytes[start..i]);
            out.push(b'\\');
            out.push(b);
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends `bytes`, copying up to 32 of them as two fixed-size, overlapping words.
///
/// Why not `extend_from_slice` alone: a copy of a length known only at run time is a call to
/// `memcpy`, and in a plugin compiled to WebAssembly a `memory.copy` that leaves the
/// plugin's code for the runtime's, several times the cost of copying a short name; a copy
/// of a fixed size is a few loads and stores in place.
#[inline]
pub(crate) fn append(bytes: &[u8], out: &mut Vec<u8>) {
    let n = bytes.len();
    let start = out.len();
    out.reserve(n);
    match n {
        0 => {}
        1..=3 => {
            out.push(bytes[0]);
            if n > 1 {
                out.push(bytes[1]);
            }
            if n > 2 {
                out.push(bytes[2]);
            }
        }
        4..=7 => overlapping::<4>(bytes, start, out),
        8..=16 => overlapping::<8>(bytes, start, out),
        17..=32 => overlapping::<16>(bytes, start, out),
        _ => out.extend_from_slice(bytes),
    }
}

/// Appends `bytes` (`W` to `2 * W` of them) as its first `W` bytes, then its last `W` bytes
/// over the end of the first ones.
#[inline(always)]
fn overlapping<const W: usize>(bytes: &[u8], start: usize, out: &mut Vec<u8>) {
    let n = bytes.len();
    let head: [u8; W] = bytes[..W].try_into().expect("W bytes");
    let tail: [u8; W] = bytes[n - W..].try_into().expect("W bytes");
    out.extend_from_slice(&head);
    out.truncate(start + n - W);
    out.extend_from_slice(&tail);
}

/// Appends `v` as Go's `strconv.AppendFloat(v, 'g', -1, 64)` does: the shortest digits that
/// round-trip, in exponent form when the decimal exponent is below -4 or at least 6
/// (`1e+06`, `1.5e-05`, `1.7976931348623157e+308`), else in plain form (`12.123`, `0.0001`).
pub(crate) fn format_go_g(v: f64, out: &mut Vec<u8>) {
    // Rust's `{:e}` yields the same shortest round-trip digits as Go: `d[.ddd]e<exp>`.
    let mut sci = StackText {
        bytes: [0; 40],
        len: 0,
    };
    write!(sci, "{v:e}").expect("40 bytes hold any f64 in exponent form");
    let sci = &sci.bytes[..sci.len];
    let (neg, sci) = match sci.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, sci),
    };
    let e_at = sci.iter().position(|&b| b == b'e').expect("exponent form");
    let mantissa = &sci[..e_at];
    let exp: i32 = core::str::from_utf8(&sci[e_at + 1..])
        .expect("ASCII")
        .parse()
        .expect("integer exponent");
    let mut digits = [0u8; 20];
    let mut nd = 0;
    for &b in mantissa.iter().filter(|b| b.is_ascii_digit()) {
        digits[nd] = b;
        nd += 1;
    }
    let digits = &digits[..nd];
    if neg {
        out.push(b'-');
    }
    if !(-4..6).contains(&exp) {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let abs = exp.unsigned_abs();
        if abs < 10 {
            out.push(b'0');
        }
        out.extend_from_slice(itoa::Buffer::new().format(abs).as_bytes());
        return;
    }
    // Plain form: the decimal point sits after `exp + 1` digits.
    let point = exp + 1;
    if point <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(core::iter::repeat_n(b'0', point.unsigned_abs() as usize));
        out.extend_from_slice(digits);
    } else {
        let point = point as usize;
        if digits.len() <= point {
            out.extend_from_slice(digits);
            out.extend(core::iter::repeat_n(b'0', point - digits.len()));
        } else {
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        }
    }
}

/// A fixed buffer that `{:e}` of any f64 fits in.
struct StackText {
    bytes: [u8; 40],
    len: usize,
}

impl core::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(core::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// Every string of up to `max` bytes over `alphabet`, in a deterministic sample: all of
    /// them up to three bytes, then each length with every byte of the alphabet at every
    /// position among fillers.
    fn samples(alphabet: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut out = vec![Vec::new()];
        for &a in alphabet {
            for &b in alphabet {
                out.push(vec![a, b]);
                for &c in alphabet {
                    out.push(vec![a, b, c]);
                }
            }
        }
        for len in 1..=max {
            for &special in alphabet {
                for at in 0..len {
                    let mut s = vec![b'x'; len];
                    s[at] = special;
                    out.push(s);
                }
            }
        }
        out
    }

    const ALPHABET: &[u8] = b"a,= \\\"\x01\x1f\x7f\xc3";

    #[test]
    fn classes_are_those_of_every_byte_whatever_the_length() {
        for s in samples(ALPHABET, 70) {
            let every = s.iter().fold(0, |acc, &b| acc | CLASSES[b as usize]);
            assert_eq!(classes(&s), every, "{s:?}");
        }
        assert_eq!(classes(b"host\x7f"), CONTROL);
        assert_eq!(classes(b"a\\"), BACKSLASH);
        assert_eq!(classes(b"hwthread"), 0);
    }

    #[test]
    fn tokens_are_appended_whole_and_escaped_where_their_kind_says() {
        for s in samples(ALPHABET, 70) {
            for escapes in [MEASUREMENT_ESCAPES, KEY_ESCAPES, STRING_ESCAPES] {
                let mut expected = b"before".to_vec();
                for &b in &s {
                    if CLASSES[b as usize] & escapes != 0 {
                        expected.push(b'\\');
                    }
                    expected.push(b);
                }
                let mut out = b"before".to_vec();
                write_token(&s, classes(&s), escapes, &mut out);
                assert_eq!(out, expected, "{s:?} escaping {escapes:#x}");
            }
            let mut out = b"before".to_vec();
            append(&s, &mut out);
            assert_eq!(&out[..6], b"before");
            assert_eq!(&out[6..], &s[..]);
        }
        let mut out = Vec::new();
        write_token(b"a b,c=d", classes(b"a b,c=d"), KEY_ESCAPES, &mut out);
        assert_eq!(out, b"a\\ b\\,c\\=d");
    }
}
