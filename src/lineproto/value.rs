//! Field values: the decoded value of a field (float, integer, unsigned, bool or string)
//! and the parsing of its text.

use super::error::DecodeErrorKind;
use super::float;
use super::kind::TokenKind;
use super::token::Token;

/// A decoded field value; strings borrow from the input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'a> {
    /// A 64-bit float (no suffix).
    Float(f64),
    /// A signed integer (`i` suffix).
    Int(i64),
    /// An unsigned integer (`u` suffix).
    Uint(u64),
    /// A boolean (`t`, `T`, `true`, `True`, `TRUE` and the `f` spellings).
    Bool(bool),
    /// A quoted string, still escaped; see [`Token::unescape`].
    String(Token<'a>),
}

impl<'a> FieldValue<'a> {
    /// The string token, if this is a string field.
    pub fn as_str_token(&self) -> Option<Token<'a>> {
        match self {
            FieldValue::String(t) => Some(*t),
            _ => None,
        }
    }

    /// The value as a float when it is any number (as cc-metric-store reads `value`).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            FieldValue::Float(v) => Some(v),
            FieldValue::Int(v) => Some(v as f64),
            FieldValue::Uint(v) => Some(v as f64),
            _ => None,
        }
    }
}

/// Parses a non-string field value (the bytes between `=` and the next `,` or white space)
/// as the Go decoder does: the first byte picks the type (`t`/`f` a boolean; a digit, `-`
/// or `.` a number, typed by an `i` or `u` suffix, else a float).
#[inline]
pub(crate) fn parse_unquoted(raw: &[u8]) -> Result<FieldValue<'static>, DecodeErrorKind> {
    match raw.first() {
        Some(b't' | b'T' | b'f' | b'F') => parse_bool(raw).map(FieldValue::Bool),
        Some(b'-' | b'.' | b'0'..=b'9') => match raw.split_last() {
            Some((b'i', body)) => parse_int(body).map(FieldValue::Int),
            Some((b'u', body)) => parse_uint(body).map(FieldValue::Uint),
            _ => float::parse(raw).map(FieldValue::Float),
        },
        Some(_) => Err(DecodeErrorKind::InvalidFieldValue),
        None => Err(DecodeErrorKind::EmptyFieldValue),
    }
}

/// [`parse_unquoted`] of `buf[start..end]`, with a branch-free path for the common
/// integer field (`<1 to 8 digits>i`): the eight bytes ending at the digits are read as one
/// word (the bytes before the value stand in for leading zeros), so no loop runs per digit.
#[inline]
pub(crate) fn parse_unquoted_in(
    buf: &[u8],
    start: usize,
    end: usize,
) -> Result<FieldValue<'static>, DecodeErrorKind> {
    if end >= start + 2 && end >= 9 && buf[end - 1] == b'i' && end - 1 - start <= 8 {
        let digits_end = end - 1;
        let word = u64::from_le_bytes(
            buf[digits_end - 8..digits_end]
                .try_into()
                .expect("eight bytes"),
        );
        // The bytes before the value are the low ones; make them '0'.
        let pad_bits = 8 * (8 - (digits_end - start));
        let pad = (1u64 << pad_bits) - 1;
        let word = (word & !pad) | (0x3030_3030_3030_3030 & pad);
        if let Some(v) = eight_digits(word) {
            // Below 10^8: always an i64.
            return Ok(FieldValue::Int(v as i64));
        }
    }
    parse_unquoted(&buf[start..end])
}

/// Reads the most common numbers in one pass over their bytes, with no separate search
/// for their end: `-?digits(.digits)?` (a float) or `-?digits i` (an integer), at most 19
/// digits (18 for an integer), followed by a comma, white space or the end of `buf`. Returns where the value
/// ends and the value; `None` for anything else, which the full parser then reads.
///
/// A byte at a time: field values are short, and the next field's scan waits for where
/// this one ends, which a predicted byte loop knows sooner than word arithmetic (eight
/// digits at a time measured slower on lines of many integer fields).
#[inline]
pub(crate) fn parse_plain_number(buf: &[u8], start: usize) -> Option<(usize, FieldValue<'static>)> {
    let negative = buf.get(start) == Some(&b'-');
    let mut i = start + usize::from(negative);
    let (mut mantissa, mut digits, mut fraction, mut point) = (0u64, 0usize, 0usize, false);
    loop {
        match buf.get(i) {
            Some(&b @ b'0'..=b'9') => {
                // Up to 19 digits fit the u64 (10^19 - 1 < 2^64); past that the full parser
                // reads the number.
                if digits == MAX_PLAIN_DIGITS {
                    return None;
                }
                mantissa = mantissa * 10 + u64::from(b - b'0');
                digits += 1;
                fraction += usize::from(point);
            }
            Some(b'.') if !point => point = true,
            _ => break,
        }
        i += 1;
    }
    if digits == 0 {
        return None;
    }
    let ends_value = |at: usize| matches!(buf.get(at), None | Some(b',' | b' ' | b'\r' | b'\n'));
    if ends_value(i) {
        let value = if digits <= EXACT_DIGITS {
            // The mantissa and the power of ten are exact in an f64: one division rounds
            // correctly (Clinger's fast path).
            let magnitude = float::exact_decimal(mantissa, fraction);
            if negative { -magnitude } else { magnitude }
        } else {
            // A shortest round-trip float has 16 or 17 digits: the standard library's
            // correctly rounded parser, on what is known to be `-?digits(.digits)?`, which
            // Go's ParseFloat reads the same way (the full parser would only check that
            // syntax again first).
            // SAFETY: the bytes are ASCII digits, a `.` and a leading `-`.
            let text = unsafe { std::str::from_utf8_unchecked(&buf[start..i]) };
            text.parse::<f64>().ok()?
        };
        return Some((i, FieldValue::Float(value)));
    }
    if buf[i] == b'i' && !point && digits <= MAX_INT_DIGITS && ends_value(i + 1) {
        let magnitude = mantissa as i64;
        return Some((
            i + 1,
            FieldValue::Int(if negative { -magnitude } else { magnitude }),
        ));
    }
    None
}

/// The most digits [`parse_plain_number`] reads itself.
const MAX_PLAIN_DIGITS: usize = 19;
/// The most digits of a mantissa that is exact in an f64 with its power of ten.
const EXACT_DIGITS: usize = 15;
/// The most digits of an integer that always fits an i64.
const MAX_INT_DIGITS: usize = 18;

/// Powers of ten as integers, for joining runs of digits.
pub(crate) const POW10_U64: [u64; 17] = {
    let mut table = [1u64; 17];
    let mut i = 1;
    while i < 17 {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

/// How many of the word's bytes, from the lowest, are ASCII digits before the first one
/// that is not (0 to 8).
#[inline(always)]
pub(crate) fn digit_run(word: u64) -> usize {
    // Digits become 0..=9. Adding 0x76 sets a byte's high bit from 10 up; a byte with its
    // high bit set already is not a digit either. A carry out of a byte (from 0x8a up) only
    // disturbs bytes after a non-digit, so the lowest flagged byte is exact.
    let a = word ^ 0x3030_3030_3030_3030;
    let not_digit = (a.wrapping_add(0x7676_7676_7676_7676) | a) & 0x8080_8080_8080_8080;
    (not_digit.trailing_zeros() / 8) as usize
}

/// The value of the first `n` (0 to 8) bytes of the word, which are ASCII digits.
#[inline(always)]
pub(crate) fn digits_value(word: u64, n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    // The digits move to the top bytes; the zero bytes shifted in below them are leading
    // zeros.
    combine_digits((word ^ 0x3030_3030_3030_3030) << (8 * (8 - n)))
}

fn parse_bool(raw: &[u8]) -> Result<bool, DecodeErrorKind> {
    match raw {
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => Ok(true),
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => Ok(false),
        _ => Err(DecodeErrorKind::InvalidFieldValue),
    }
}

/// Accumulates decimal digits into a u64; `None` when not all digits or empty, `Some(None)`
/// on overflow.
///
/// Timestamps have 19 digits, so the first 16 are taken eight at a time from one word
/// (the digit check and the conversion are a few multiplications instead of a chain of
/// eight dependent ones); the rest one by one, with overflow checks.
#[inline]
fn digits_u64(digits: &[u8]) -> Option<Option<u64>> {
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    let mut i = 0;
    // Two words at most: 16 digits stay below 10^16, far from overflowing.
    while i < 16 {
        let Some(chunk) = digits.get(i..i + 8) else {
            break;
        };
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        match eight_digits(word) {
            Some(v) => value = value * 100_000_000 + v,
            None => break,
        }
        i += 8;
    }
    // Up to 19 digits fit a u64 whatever they are; only later ones need overflow checks
    // (a checked multiplication per digit would double the cost of every short number).
    let unchecked_end = digits.len().min(19);
    while i < unchecked_end {
        let d = digits[i].wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        value = value * 10 + u64::from(d);
        i += 1;
    }
    let mut overflow = false;
    for &d in &digits[i..] {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
    }
    Some((!overflow).then_some(value))
}

/// The value of eight ASCII digits in a little-endian word (the first digit in the lowest
/// byte), or `None` when any byte is not a digit.
#[inline(always)]
fn eight_digits(word: u64) -> Option<u64> {
    // Each byte's high nibble must be 3 and its low nibble at most 9 (adding 6 keeps the
    // high nibble 3 only then).
    let high = word & 0xf0f0_f0f0_f0f0_f0f0;
    let carried = (word.wrapping_add(0x0606_0606_0606_0606) & 0xf0f0_f0f0_f0f0_f0f0) >> 4;
    if high | carried != 0x3333_3333_3333_3333 {
        return None;
    }
    Some(combine_digits(word - 0x3030_3030_3030_3030))
}

/// The value of eight digit values (0 to 9, one per byte, the first in the lowest byte).
#[inline(always)]
fn combine_digits(v: u64) -> u64 {
    // Pairwise: bytes to 2-digit, 2-digit to 4-digit, 4-digit to 8-digit values.
    let v = (v * 10) + (v >> 8);
    let v = (((v & 0x0000_00ff_0000_00ff).wrapping_mul(0x000f_4240_0000_0064))
        .wrapping_add(((v >> 16) & 0x0000_00ff_0000_00ff).wrapping_mul(0x0000_2710_0000_0001)))
        >> 32;
    v & 0xffff_ffff
}

#[inline]
fn parse_uint(body: &[u8]) -> Result<u64, DecodeErrorKind> {
    match digits_u64(body) {
        None => Err(DecodeErrorKind::InvalidFieldValue),
        Some(None) => Err(DecodeErrorKind::OutOfRange),
        Some(Some(v)) => Ok(v),
    }
}

#[inline]
pub(crate) fn parse_int(body: &[u8]) -> Result<i64, DecodeErrorKind> {
    let (neg, digits) = match body.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, body),
    };
    let magnitude = match digits_u64(digits) {
        None => return Err(DecodeErrorKind::InvalidFieldValue),
        Some(None) => return Err(DecodeErrorKind::OutOfRange),
        Some(Some(v)) => v,
    };
    if neg {
        if magnitude <= i64::MAX as u64 + 1 {
            Ok((magnitude as i64).wrapping_neg())
        } else {
            Err(DecodeErrorKind::OutOfRange)
        }
    } else {
        i64::try_from(magnitude).map_err(|_| DecodeErrorKind::OutOfRange)
    }
}

/// Builds the string variant from a validated raw token.
pub(crate) fn string_value(raw: &str, escaped: bool) -> FieldValue<'_> {
    FieldValue::String(Token::new(raw, escaped, TokenKind::StringField))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_digits_at_a_time_agree_with_a_byte_loop() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut bytes = *format!("{:08}", seed % 100_000_000)
                .as_bytes()
                .first_chunk::<8>()
                .unwrap();
            if round % 2 == 1 {
                // One byte anything at all.
                bytes[(seed >> 32) as usize % 8] = (seed >> 40) as u8;
            }
            let want = bytes.iter().all(u8::is_ascii_digit).then(|| {
                bytes
                    .iter()
                    .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'))
            });
            assert_eq!(eight_digits(u64::from_le_bytes(bytes)), want, "{bytes:?}");
        }
        for byte in 0..=255u8 {
            for lane in 0..8 {
                let mut bytes = *b"12345678";
                bytes[lane] = byte;
                let all = bytes.iter().all(u8::is_ascii_digit);
                assert_eq!(
                    eight_digits(u64::from_le_bytes(bytes)).is_some(),
                    all,
                    "{bytes:?}"
                );
            }
        }
        for digits in [
            "0",
            "12345678",
            "1234567890123456",
            "123456789012345678901234567890",
            "-99999999999999999999999i",
            "1734000000000000000",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999",
            "123456781234567x",
            "12345678x",
        ] {
            let want = digits
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| digits.parse::<u64>().ok());
            assert_eq!(digits_u64(digits.as_bytes()), want, "{digits}");
        }
    }

    #[test]
    fn integers_read_from_the_word_before_them_agree_with_the_plain_parser() {
        let values = [
            "0i",
            "7i",
            "12345678i",
            "123456789i",
            "-5i",
            "1_0i",
            "00i",
            "1.5i",
            "i",
            "9i",
            "1e3",
            "3u",
            "t",
            "42",
        ];
        for value in values {
            for prefix in [
                "",
                "k=",
                "key_number_0=",
                "x\\ y=",
                "\u{ff}\u{ff}\u{ff}\u{ff}=",
                "99999999=",
                "123",
            ] {
                let line = format!("{prefix}{value}");
                let buf = line.as_bytes();
                assert_eq!(
                    parse_unquoted_in(buf, prefix.len(), buf.len()),
                    parse_unquoted(value.as_bytes()),
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn plain_numbers_read_in_one_pass_agree_with_the_full_parser() {
        let values = [
            "0",
            "-0",
            "1",
            "1.",
            ".5",
            "-.5",
            "-1.25",
            "12.345",
            "123456789012345",
            "1234567890123456",
            "0.000000000000001",
            "42.869705743739853",
            "-0.12345678901234567",
            "0.30000000000000004",
            "1234567890123456789",
            "12345678901234567890",
            "1.7976931348623157",
            "99999999999999999.99",
            ".1234567890123456789",
            "-.1234567890123456789",
            "999999999999999999i",
            "-999999999999999999i",
            "1234567890123456789i",
            "9223372036854775807i",
            "7i",
            "-7i",
            "-0i",
            "123456789012345i",
            "1.5i",
            "1e3",
            "1_0",
            "0x1p-2",
            "-",
            ".",
            "-.",
            "1.2.3",
            "3u",
            "1ii",
            "1i2",
            "12a",
            "t",
        ];
        for value in values {
            for after in ["", ",", " ", "\r", "\n", "x", "=", "i"] {
                let text = format!("f={value}{after}");
                let buf = text.as_bytes();
                let full_end = buf[2..]
                    .iter()
                    .position(|b| matches!(b, b',' | b' ' | b'\r' | b'\n'))
                    .map_or(buf.len(), |p| p + 2);
                let full = parse_unquoted(&buf[2..full_end]).ok();
                // What the one-pass reader leaves (`None`) is left to the full parser.
                if let Some((end, got)) = parse_plain_number(buf, 2) {
                    assert_eq!(end, full_end, "{text:?}");
                    assert_eq!(Some(got), full, "{text:?}");
                    if let (FieldValue::Float(a), Some(FieldValue::Float(b))) = (got, full) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{text:?}");
                    }
                }
            }
        }
        assert!(parse_plain_number(b"f=12.345 1", 2).is_some());
        // Shortest round-trip floats (16, 17 digits) are read here too.
        assert!(parse_plain_number(b"f=42.869705743739853 1", 2).is_some());
        assert!(parse_plain_number(b"f=-0.12345678901234567,g", 2).is_some());
        assert!(parse_plain_number(b"f=404i,g", 2).is_some());
    }

    #[test]
    fn digit_runs_and_their_values_agree_with_a_byte_loop() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let bytes_of = |seed: u64| {
            let mut bytes = seed.to_le_bytes();
            // Mostly digits, with any byte anywhere.
            for (i, b) in bytes.iter_mut().enumerate() {
                if (seed >> (i * 3)) & 3 != 0 {
                    *b = b'0' + *b % 10;
                }
            }
            bytes
        };
        let mut words: Vec<[u8; 8]> = Vec::new();
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            words.push(bytes_of(seed));
        }
        for byte in 0..=255u8 {
            for lane in 0..8 {
                let mut bytes = *b"98765432";
                bytes[lane] = byte;
                words.push(bytes);
                // A byte that carries out when 0x76 is added, before digits.
                bytes[(lane + 1) % 8] = 0xff;
                words.push(bytes);
            }
        }
        for bytes in words {
            let word = u64::from_le_bytes(bytes);
            let run = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
            assert_eq!(digit_run(word), run, "{bytes:?}");
            let want = bytes[..run]
                .iter()
                .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'));
            assert_eq!(digits_value(word, run), want, "{bytes:?}");
        }
    }

    #[test]
    fn parses_each_type() {
        assert_eq!(parse_unquoted(b"1"), Ok(FieldValue::Float(1.0)));
        assert_eq!(parse_unquoted(b"-1.5e3"), Ok(FieldValue::Float(-1500.0)));
        assert_eq!(parse_unquoted(b"1."), Ok(FieldValue::Float(1.0)));
        assert_eq!(parse_unquoted(b".5"), Ok(FieldValue::Float(0.5)));
        assert_eq!(
            parse_unquoted(b"-9223372036854775808i"),
            Ok(FieldValue::Int(i64::MIN))
        );
        assert_eq!(
            parse_unquoted(b"9223372036854775808i"),
            Err(DecodeErrorKind::OutOfRange)
        );
        assert_eq!(
            parse_unquoted(b"18446744073709551615u"),
            Ok(FieldValue::Uint(u64::MAX))
        );
        assert_eq!(
            parse_unquoted(b"18446744073709551616u"),
            Err(DecodeErrorKind::OutOfRange)
        );
        assert_eq!(
            parse_unquoted(b"-1u"),
            Err(DecodeErrorKind::InvalidFieldValue)
        );
        assert_eq!(parse_unquoted(b"TRUE"), Ok(FieldValue::Bool(true)));
        assert_eq!(parse_unquoted(b"False"), Ok(FieldValue::Bool(false)));
        assert!(parse_unquoted(b"tRUE").is_err());
        assert!(parse_unquoted(b"NaN").is_err());
        assert!(parse_unquoted(b"inf").is_err());
        assert!(parse_unquoted(b"1e400").is_err());
        assert!(parse_unquoted(b"+1").is_err());
        assert!(parse_unquoted(b"1i2").is_err());
        // Go's float syntax: digit separators and hexadecimal mantissas with a binary
        // exponent; the first byte decides the type.
        assert_eq!(parse_unquoted(b"1_0"), Ok(FieldValue::Float(10.0)));
        assert_eq!(parse_unquoted(b"0x1p-2"), Ok(FieldValue::Float(0.25)));
        assert_eq!(parse_unquoted(b"-0x1.8p1"), Ok(FieldValue::Float(-3.0)));
        assert_eq!(parse_unquoted(b"1e1_0"), Ok(FieldValue::Float(1e10)));
        assert!(parse_unquoted(b"1__0").is_err());
        assert!(parse_unquoted(b"1_").is_err());
        assert!(parse_unquoted(b"0x10").is_err());
        assert!(parse_unquoted(b"1_0i").is_err());
        assert!(parse_unquoted(b"Ta").is_err());
    }
}
