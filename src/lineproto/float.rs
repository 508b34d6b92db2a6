//! Float syntax of the Go grammar, and Go's shortest `'g'` formatting for the encoder.

use super::error::DecodeErrorKind;

/// Parses `[-] (digits [. [digits]] [exp] | digits exp | . digits [exp])`, rejecting what
/// Rust's parser would accept beyond the grammar (`inf`, `NaN`, `+1`) and values that
/// overflow to infinity.
#[inline]
pub(crate) fn parse(raw: &[u8]) -> Result<f64, DecodeErrorKind> {
    if !is_grammatical(raw) {
        return Err(DecodeErrorKind::InvalidFieldValue);
    }
    if let Some(v) = parse_short_decimal(raw) {
        return Ok(v);
    }
    // The grammar admits only ASCII digits, '-', '+', '.', 'e' and 'E'.
    let text = std::str::from_utf8(raw).map_err(|_| DecodeErrorKind::InvalidFieldValue)?;
    let value: f64 = text
        .parse()
        .map_err(|_| DecodeErrorKind::InvalidFieldValue)?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(DecodeErrorKind::OutOfRange)
    }
}

/// Exact powers of ten representable in an f64.
const POW10: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// Clinger's fast path for the common metric value (`0.73`, `-12.5`, `42`): with at most 15
/// significant digits and no exponent, mantissa and power of ten are both exact in an f64,
/// so one division is correctly rounded. Anything else returns `None` for the full parser.
#[inline]
fn parse_short_decimal(raw: &[u8]) -> Option<f64> {
    let (neg, body) = match raw.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, raw),
    };
    if body.len() > 16 {
        return None;
    }
    let mut mantissa: u64 = 0;
    let mut frac_digits = 0usize;
    let mut seen_point = false;
    for &b in body {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa * 10 + u64::from(b - b'0');
                frac_digits += usize::from(seen_point);
            }
            b'.' if !seen_point => seen_point = true,
            _ => return None,
        }
    }
    let value = mantissa as f64 / POW10[frac_digits];
    Some(if neg { -value } else { value })
}

#[inline]
fn is_grammatical(raw: &[u8]) -> bool {
    let mut i = usize::from(raw.first() == Some(&b'-'));
    let int_start = i;
    while i < raw.len() && raw[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    let mut frac_digits = 0;
    if i < raw.len() && raw[i] == b'.' {
        i += 1;
        let frac_start = i;
        while i < raw.len() && raw[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - frac_start;
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if i < raw.len() && (raw[i] == b'e' || raw[i] == b'E') {
        i += 1;
        if i < raw.len() && (raw[i] == b'+' || raw[i] == b'-') {
            i += 1;
        }
        let exp_start = i;
        while i < raw.len() && raw[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp_start {
            return false;
        }
    }
    i == raw.len()
}

/// Appends `v` as Go's `strconv.AppendFloat(v, 'g', -1, 64)` does: the shortest digits that
/// round-trip, in exponent form when the decimal exponent is below -4 or at least 6
/// (`1e+06`, `1.5e-05`, `1.7976931348623157e+308`), else in plain form (`12.123`, `0.0001`).
pub(crate) fn format_go_g(v: f64, out: &mut Vec<u8>) {
    use std::io::Write;
    // Rust's `{:e}` yields the same shortest round-trip digits as Go: `d[.ddd]e<exp>`.
    let mut sci = [0u8; 40];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut sci[..]);
        write!(cursor, "{v:e}").expect("40 bytes hold any f64 in exponent form");
        cursor.position() as usize
    };
    let sci = &sci[..len];
    let (neg, sci) = match sci.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, sci),
    };
    let e_at = sci.iter().position(|&b| b == b'e').expect("exponent form");
    let mantissa = &sci[..e_at];
    let exp: i32 = std::str::from_utf8(&sci[e_at + 1..])
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
        out.extend(std::iter::repeat_n(b'0', point.unsigned_abs() as usize));
        out.extend_from_slice(digits);
    } else {
        let point = point as usize;
        if digits.len() <= point {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', point - digits.len()));
        } else {
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(v: f64) -> String {
        let mut out = Vec::new();
        format_go_g(v, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn formats_like_go_strconv_g() {
        assert_eq!(g(1.0), "1");
        assert_eq!(g(11.0), "11");
        assert_eq!(g(12.123), "12.123");
        assert_eq!(g(-0.0), "-0");
        assert_eq!(g(0.0), "0");
        assert_eq!(g(100000.0), "100000");
        assert_eq!(g(1e6), "1e+06");
        assert_eq!(g(1234567.0), "1.234567e+06");
        assert_eq!(g(0.0001), "0.0001");
        assert_eq!(g(0.00001), "1e-05");
        assert_eq!(g(1.5e-7), "1.5e-07");
        assert_eq!(g(f64::MAX), "1.7976931348623157e+308");
        assert_eq!(g(5e-324), "5e-324");
        assert_eq!(g(-6632243.0), "-6.632243e+06");
        assert_eq!(g(0.73), "0.73");
        assert_eq!(g(123456.5), "123456.5");
    }

    #[test]
    fn short_decimals_are_exact() {
        for text in [
            "0.73",
            "-12.5",
            "42",
            "1.",
            ".5",
            "0.1",
            "123456789012345",
            "9007199254740993",
            "0.000000000000001",
            "-0",
        ] {
            let want: f64 = text.parse().unwrap();
            let got = parse(text.as_bytes()).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{text}");
        }
    }

    #[test]
    fn grammar() {
        for ok in ["1", "-1", "1.", ".5", "1e5", "1E+5", "-0.5e-3", "1.e2"] {
            assert!(is_grammatical(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "", "-", ".", "e5", "1e", "+1", "1.2.3", "inf", "NaN", "1e+", "--1", "0x1",
        ] {
            assert!(!is_grammatical(bad.as_bytes()), "{bad}");
        }
    }
}
