//! Float syntax of the Go grammar, and Go's shortest `'g'` formatting for the encoder.

use super::error::DecodeErrorKind;

/// Parses a float as Go's `strconv.ParseFloat` does: `[+-]` then decimal digits with an
/// optional `.` and `e` exponent, or `0x` hexadecimal digits with an optional `.` and a
/// mandatory `p` binary exponent; `_` may separate digits. Infinities, NaN and values that
/// overflow are refused.
#[inline]
pub(crate) fn parse(raw: &[u8]) -> Result<f64, DecodeErrorKind> {
    // Plain decimals (`12.5`, `-3`) are most values; they need no separate syntax pass.
    if let Some(v) = parse_short_decimal(raw) {
        return Ok(v);
    }
    let syntax = go_syntax(raw).ok_or(DecodeErrorKind::InvalidFieldValue)?;
    let value = if syntax.hex {
        parse_hex(raw)
    } else if syntax.underscores {
        let digits: Vec<u8> = raw.iter().copied().filter(|&b| b != b'_').collect();
        parse_decimal(&digits)?
    } else {
        parse_decimal(raw)?
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(DecodeErrorKind::OutOfRange)
    }
}

/// A decimal float the syntax check accepted, correctly rounded.
fn parse_decimal(raw: &[u8]) -> Result<f64, DecodeErrorKind> {
    // Only ASCII digits, signs, '.', 'e' and 'E' get here.
    let text = std::str::from_utf8(raw).map_err(|_| DecodeErrorKind::InvalidFieldValue)?;
    text.parse().map_err(|_| DecodeErrorKind::InvalidFieldValue)
}

/// What the syntax check learnt about a float.
struct Syntax {
    hex: bool,
    underscores: bool,
}

/// Checks the whole of `raw` against Go's float syntax.
fn go_syntax(raw: &[u8]) -> Option<Syntax> {
    let mut i = usize::from(matches!(raw.first(), Some(b'+' | b'-')));
    let hex = i + 2 < raw.len() && raw[i] == b'0' && raw[i + 1] | 0x20 == b'x';
    if hex {
        i += 2;
    }
    let (mut digits, mut dot, mut underscores) = (false, false, false);
    while i < raw.len() {
        match raw[i] {
            b'_' => underscores = true,
            b'.' if !dot => dot = true,
            b'0'..=b'9' => digits = true,
            b if hex && matches!(b | 0x20, b'a'..=b'f') => digits = true,
            _ => break,
        }
        i += 1;
    }
    if !digits {
        return None;
    }
    let exponent = if hex { b'p' } else { b'e' };
    if i < raw.len() && raw[i] | 0x20 == exponent {
        i += 1;
        if matches!(raw.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !raw.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while i < raw.len() && (raw[i].is_ascii_digit() || raw[i] == b'_') {
            underscores |= raw[i] == b'_';
            i += 1;
        }
    } else if hex {
        return None;
    }
    if i != raw.len() || (underscores && !underscores_separate_digits(raw, hex)) {
        return None;
    }
    Some(Syntax { hex, underscores })
}

/// Go's rule for `_`: only between digits, or between the `0x` prefix and a digit.
fn underscores_separate_digits(raw: &[u8], hex: bool) -> bool {
    let body = raw
        .strip_prefix(b"-")
        .or_else(|| raw.strip_prefix(b"+"))
        .unwrap_or(raw);
    // What came last: a digit (the prefix counts as one), an underscore, or anything else.
    #[derive(PartialEq)]
    enum Last {
        Start,
        Digit,
        Underscore,
        Other,
    }
    let (mut last, rest) = if hex {
        (Last::Digit, &body[2..])
    } else {
        (Last::Start, body)
    };
    for &b in rest {
        let digit = b.is_ascii_digit() || (hex && matches!(b | 0x20, b'a'..=b'f'));
        last = if digit {
            Last::Digit
        } else if b == b'_' {
            if last != Last::Digit {
                return false;
            }
            Last::Underscore
        } else if last == Last::Underscore {
            return false;
        } else {
            Last::Other
        };
    }
    last != Last::Underscore
}

/// A hexadecimal float the syntax check accepted, rounded to nearest, ties to even.
fn parse_hex(raw: &[u8]) -> f64 {
    let negative = raw.first() == Some(&b'-');
    let mut i = usize::from(matches!(raw.first(), Some(b'+' | b'-'))) + 2;
    // The first 16 significant digits, whether any later digit was non-zero, how many
    // significant digits there were in all and how many before the point.
    let (mut mantissa, mut kept, mut sticky) = (0u64, 0i64, false);
    let (mut seen, mut before_point): (i64, Option<i64>) = (0, None);
    let mut leading_zeros_after_point = 0i64;
    while i < raw.len() {
        let b = raw[i];
        let digit = match b {
            b'_' => {
                i += 1;
                continue;
            }
            b'.' => {
                before_point = Some(seen);
                i += 1;
                continue;
            }
            b'0'..=b'9' => b - b'0',
            b if matches!(b | 0x20, b'a'..=b'f') => (b | 0x20) - b'a' + 10,
            _ => break,
        };
        i += 1;
        if digit == 0 && seen == 0 {
            leading_zeros_after_point += i64::from(before_point.is_some());
            continue;
        }
        seen += 1;
        if kept < 16 {
            mantissa = mantissa << 4 | u64::from(digit);
            kept += 1;
        } else if digit != 0 {
            sticky = true;
        }
    }
    // The `p` exponent, saturated far beyond the range of any float.
    i += 1;
    let exponent_negative = raw.get(i) == Some(&b'-');
    i += usize::from(matches!(raw.get(i), Some(b'+' | b'-')));
    let mut exponent = 0i64;
    for &b in &raw[i..] {
        if b.is_ascii_digit() {
            exponent = (exponent * 10 + i64::from(b - b'0')).min(1 << 20);
        }
    }
    if exponent_negative {
        exponent = -exponent;
    }
    let point = before_point.unwrap_or(seen) - leading_zeros_after_point;
    let exp2 = 4 * (point - kept) + exponent;
    let magnitude = round_to_f64(mantissa, exp2, sticky);
    if negative { -magnitude } else { magnitude }
}

/// `mantissa * 2^exp2` (plus a little more when `sticky`), rounded to nearest, ties to even,
/// with subnormals; infinity when too large.
fn round_to_f64(mantissa: u64, exp2: i64, sticky: bool) -> f64 {
    if mantissa == 0 {
        return 0.0;
    }
    let zeros = mantissa.leading_zeros();
    let m = mantissa << zeros;
    // The value is m * 2^(top - 63) with m in [2^63, 2^64).
    let top = exp2 + 63 - i64::from(zeros);
    if top > 1023 {
        return f64::INFINITY;
    }
    // Bits of m dropped: 11 for a normal number, more below the normal range.
    let shift = 11 + (-1022 - top).max(0);
    if shift > 64 {
        return 0.0;
    }
    let (kept, rest, half) = if shift == 64 {
        (0u64, m, 1u64 << 63)
    } else {
        (m >> shift, m & ((1u64 << shift) - 1), 1u64 << (shift - 1))
    };
    let round_up = rest > half || (rest == half && (sticky || kept & 1 == 1));
    let mut kept = kept + u64::from(round_up);
    let mut top = top;
    if shift == 11 && kept == 1 << 53 {
        kept >>= 1;
        top += 1;
        if top > 1023 {
            return f64::INFINITY;
        }
    }
    if shift > 11 {
        // Subnormal (or, after rounding up, the smallest normal): the bits are the value.
        f64::from_bits(kept)
    } else {
        f64::from_bits(((top + 1023) as u64) << 52 | (kept & ((1u64 << 52) - 1)))
    }
}

/// Exact powers of ten representable in an f64.
/// `mantissa / 10^fraction_digits`, correctly rounded when `mantissa` has at most 16
/// digits and `fraction_digits` is at most 15 (both are then exact in an f64, so the one
/// division rounds once).
#[inline(always)]
pub(crate) fn exact_decimal(mantissa: u64, fraction_digits: usize) -> f64 {
    mantissa as f64 / POW10[fraction_digits]
}

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
    if body.is_empty() || body == b"." {
        return None;
    }
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
    let value = exact_decimal(mantissa, frac_digits);
    Some(if neg { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::super::format::format_go_g;
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
        // `+1` is Go syntax; the decoder never gets here with a leading `+`.
        for ok in [
            "1",
            "-1",
            "1.",
            ".5",
            "1e5",
            "1E+5",
            "-0.5e-3",
            "1.e2",
            "+1",
            "1_000.5",
            "0x1p0",
            "0X_1.8P+1_0",
            "0x.8p1",
        ] {
            assert!(go_syntax(ok.as_bytes()).is_some(), "{ok}");
        }
        for bad in [
            "", "-", ".", "e5", "1e", "1.2.3", "inf", "NaN", "1e+", "--1", "0x1", "0x", "0xp1",
            "_1", "1_", "1__0", "1_.5", "1._5", "0x1p", "1e_1", "0x1.8e1",
        ] {
            assert!(go_syntax(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn hexadecimal_floats_round_to_nearest_even() {
        let cases: [(&str, f64); 9] = [
            ("0x1p-2", 0.25),
            ("-0x1.8p1", -3.0),
            ("0x1p-1074", f64::from_bits(1)),
            ("0x1p-1075", 0.0),
            ("0x1.8p-1075", f64::from_bits(1)),
            ("0x1.fffffffffffff8p0", 2.0),
            (
                "0x1.fffffffffffff7p0",
                f64::from_bits(0x3fff_ffff_ffff_ffff),
            ),
            ("0x1.fffffffffffffp1023", f64::MAX),
            ("0x00000000000000000001p4", 16.0),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text.as_bytes()), Ok(want), "{text}");
        }
        assert_eq!(parse(b"0x1p1024"), Err(DecodeErrorKind::OutOfRange));
    }
}
