//! How the encoder writes tokens and floats: the escapes of each token kind and Go's
//! shortest float form.
//!
//! Like the encoder, this file needs only `core` and `alloc`: the guest SDK compiles it too.

use alloc::vec::Vec;
use core::fmt::Write as _;

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
