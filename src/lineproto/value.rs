use super::error::DecodeErrorKind;
use super::float;
use super::token::{Token, TokenKind};

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

fn parse_bool(raw: &[u8]) -> Result<bool, DecodeErrorKind> {
    match raw {
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => Ok(true),
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => Ok(false),
        _ => Err(DecodeErrorKind::InvalidFieldValue),
    }
}

/// Accumulates decimal digits into a u64; `None` when not all digits or empty, `Some(None)`
/// on overflow.
#[inline]
fn digits_u64(digits: &[u8]) -> Option<Option<u64>> {
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    let mut overflow = false;
    for &d in digits {
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
