//! Timestamp precisions. Needs only `core` and `alloc`: the guest SDK compiles this file too.

use alloc::borrow::ToOwned;
use alloc::string::String;
use core::fmt;
use core::str::FromStr;

/// The unit of the timestamps in line protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// Nanoseconds (the default).
    #[default]
    Nanosecond,
    /// Microseconds.
    Microsecond,
    /// Milliseconds.
    Millisecond,
    /// Seconds (what cc-metric-store's sinks send).
    Second,
}

/// A precision name that is not one of `ns`, `us`, `ms`, `s`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrecisionError(pub String);

impl fmt::Display for PrecisionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown precision {:?} (use ns, us, ms or s)", self.0)
    }
}

impl core::error::Error for PrecisionError {}

impl Precision {
    /// Nanoseconds per unit.
    pub const fn nanos(self) -> i64 {
        match self {
            Precision::Nanosecond => 1,
            Precision::Microsecond => 1_000,
            Precision::Millisecond => 1_000_000,
            Precision::Second => 1_000_000_000,
        }
    }

    /// The short name (`ns`, `us`, `ms`, `s`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Precision::Nanosecond => "ns",
            Precision::Microsecond => "us",
            Precision::Millisecond => "ms",
            Precision::Second => "s",
        }
    }

    /// Scales a timestamp in this unit to nanoseconds; `None` on int64 overflow (which is how
    /// ClusterCockpit detects a timestamp sent in a finer unit than it tried).
    pub const fn to_nanos(self, value: i64) -> Option<i64> {
        value.checked_mul(self.nanos())
    }

    /// Truncates a nanosecond time to this precision (towards the past, as Go's
    /// `Time.Truncate` does for the default time).
    pub const fn truncate(self, nanos: i64) -> i64 {
        nanos - nanos.rem_euclid(self.nanos())
    }
}

impl FromStr for Precision {
    type Err = PrecisionError;

    /// Accepts the names the InfluxDB HTTP APIs and the conformance corpus use
    /// (`n`, `ns`, `1ns`, `u`, `us`, `µs`, `1µs`, `ms`, `1ms`, `s`, `1s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unit = s.strip_prefix('1').unwrap_or(s);
        Ok(match unit {
            "n" | "ns" => Precision::Nanosecond,
            "u" | "us" | "µs" | "μs" => Precision::Microsecond,
            "ms" => Precision::Millisecond,
            "s" => Precision::Second,
            _ => return Err(PrecisionError(s.to_owned())),
        })
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
