//! Go-style durations (`1m30s`, `1.5h`, `500ms`), the syntax every ClusterCockpit config uses.
//!
//! One parser serves every duration in ccfleet (client, server and agent configs), so an
//! operator can copy a value from a Go service's config and get the same meaning.

use std::fmt;
use std::time::Duration;

/// A duration string that Go's `time.ParseDuration` would reject, or one ccfleet cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is empty.
    #[error("empty duration")]
    Empty,
    /// The string does not follow `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`.
    #[error("invalid duration {0:?}")]
    Invalid(String),
    /// A number is followed by no unit, or a unit Go does not know.
    #[error("unknown or missing unit in duration {0:?} (use ns, us, µs, ms, s, m or h)")]
    Unit(String),
    /// The value exceeds what Go's int64 nanoseconds can hold.
    #[error("duration {0:?} overflows")]
    Overflow(String),
    /// A negative duration where only non-negative ones make sense.
    #[error("duration {0:?} is negative")]
    Negative(String),
}

const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration into signed nanoseconds, exactly as `time.ParseDuration` does
/// (fractions are truncated to whole nanoseconds, the total must fit in an `i64`).
pub fn parse_nanos(s: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(s.to_owned());
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let (neg, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(DurationError::Unit(s.to_owned()));
        }
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .ok_or_else(|| DurationError::Unit(s.to_owned()))?;
        let overflow = || DurationError::Overflow(s.to_owned());
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut value = whole.checked_mul(scale).ok_or_else(overflow)?;
        // Go scales the fraction in floating point (and so rounds `0.3333333333333333333h`
        // to exactly 20m); do the same so both agree on every input.
        let mut frac: u64 = 0;
        let mut frac_scale = 1.0f64;
        for digit in frac_part.bytes() {
            match frac
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
            {
                Some(v) if v <= i64::MAX as u64 => {
                    frac = v;
                    frac_scale *= 10.0;
                }
                _ => break,
            }
        }
        if frac > 0 {
            value += (frac as f64 * (scale as f64 / frac_scale)) as u128;
        }
        total = total.checked_add(value).ok_or_else(overflow)?;
        if total > i64::MAX as u128 + u128::from(neg) {
            return Err(overflow());
        }
    }
    if neg {
        Ok((total as i128).wrapping_neg() as i64)
    } else {
        Ok(total as i64)
    }
}

/// Parses a Go duration that must not be negative.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let nanos = parse_nanos(s)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Negative(s.to_owned()))
}

/// Formats a duration the way Go's `Duration.String` does (`1m30s`, `1.5s`, `500ms`, `0s`).
pub fn format(d: Duration) -> String {
    GoDuration(d).to_string()
}

/// A [`Duration`] that displays in Go's notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000_000_000 {
            let (unit, scale) = if nanos < 1_000 {
                ("ns", 1)
            } else if nanos < 1_000_000 {
                ("µs", 1_000)
            } else {
                ("ms", 1_000_000)
            };
            write_fraction(f, nanos, scale)?;
            return f.write_str(unit);
        }
        let hours = nanos / 3_600_000_000_000;
        let minutes = nanos / 60_000_000_000 % 60;
        let sec_nanos = nanos % 60_000_000_000;
        if hours > 0 {
            write!(f, "{hours}h{minutes}m")?;
        } else if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write_fraction(f, sec_nanos, 1_000_000_000)?;
        f.write_str("s")
    }
}

fn write_fraction(f: &mut fmt::Formatter<'_>, value: u128, scale: u128) -> fmt::Result {
    let whole = value / scale;
    let mut frac = value % scale;
    write!(f, "{whole}")?;
    if frac == 0 {
        return Ok(());
    }
    let mut width = scale.ilog10() as usize;
    while frac.is_multiple_of(10) {
        frac /= 10;
        width -= 1;
    }
    write!(f, ".{frac:0width$}")
}

/// serde helpers for config fields written as Go duration strings.
pub mod serde_go {
    use super::{GoDuration, parse};
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Deserializes a Go duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    /// Serializes a duration as a Go duration string.
    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&GoDuration(*v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_examples() {
        let cases = [
            ("0", 0),
            ("5s", 5_000_000_000),
            ("30s", 30_000_000_000),
            ("1478s", 1_478_000_000_000),
            ("-5s", -5_000_000_000),
            ("+5s", 5_000_000_000),
            ("-0", 0),
            ("5.0s", 5_000_000_000),
            ("5.6s", 5_600_000_000),
            ("5.s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.0s", 1_000_000_000),
            ("1.004s", 1_004_000_000),
            ("100.00100s", 100_001_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12µs", 12_000),
            ("12μs", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14_000_000_000),
            ("15m", 900_000_000_000),
            ("16h", 57_600_000_000_000),
            ("3h30m", 12_600_000_000_000),
            ("10.5s4m", 250_500_000_000),
            ("-2m3.4s", -123_400_000_000),
            ("1h2m3s4ms5us6ns", 3_723_004_005_006),
            ("39h9m14.425s", 140_954_425_000_000),
            ("52763797000ns", 52_763_797_000),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036.854775807s", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("1.5h", 5_400_000_000_000),
            ("1m30s", 90_000_000_000),
            ("500ms", 500_000_000),
        ];
        for (input, want) in cases {
            assert_eq!(parse_nanos(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "often",
            "1.5.5s",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "9223372036854ms775us808ns",
            "-9223372036854775809ns",
        ] {
            assert!(parse_nanos(bad).is_err(), "{bad:?} should fail");
        }
        assert!(matches!(parse("-1s"), Err(DurationError::Negative(_))));
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (240_000_000_000, "4m0s"),
            (90_000_000_000, "1m30s"),
            (18_000_000_000_000 + 600_000_000_000, "5h10m0s"),
            (30_000_000_000, "30s"),
        ];
        for (nanos, want) in cases {
            assert_eq!(format(Duration::from_nanos(nanos)), want);
        }
    }
}
