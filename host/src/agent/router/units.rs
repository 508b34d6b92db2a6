//! Units and unit prefixes as cc-lib's `ccUnits` reads them, for the `normalize_units` and
//! `change_unit_prefix` stages: a unit string is an optional prefix (`K`, `M`, `G`, ...,
//! `Ki`, `Mi`, ...; `m` for milli) and a measure (`B`, `Flops`, `%`, `degC`, `degF`, `RPM`,
//! `Hz`, `s`, `cyc`, `W`, `J`, `requests`, `packets`, `events`), optionally `/measure`.
//! Spellings are recognised as ccUnits recognises them (`Bytes`, `byte`, `kB`, `MHz`,
//! `Watts`, `Percent`, ...) and normalized to the short form.

use std::sync::LazyLock;

use ccfleet::lineproto::OwnedValue;
use regex::Regex;

/// A unit prefix: its factor and short name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prefix {
    /// The factor (`1e9` for `G`, `1024` for `Ki`).
    pub factor: f64,
    /// The short name (`G`, `Ki`, empty for none).
    pub short: &'static str,
}

const PREFIXES: [(&str, f64, &str); 19] = [
    ("", 1.0, ""),
    ("kK", 1e3, "K"),
    ("M", 1e6, "M"),
    ("gG", 1e9, "G"),
    ("tT", 1e12, "T"),
    ("pP", 1e15, "P"),
    ("eE", 1e18, "E"),
    ("zZ", 1e21, "Z"),
    ("yY", 1e24, "Y"),
    ("m", 1e-3, "m"),
    ("u", 1e-6, "u"),
    ("n", 1e-9, "n"),
    ("kK", 1024.0, "Ki"),
    ("M", 1048576.0, "Mi"),
    ("gG", 1073741824.0, "Gi"),
    ("tT", 1099511627776.0, "Ti"),
    ("pP", 1125899906842624.0, "Pi"),
    ("eE", 1152921504606846976.0, "Ei"),
    ("zZ", 1180591620717411303424.0, "Zi"),
];

impl Prefix {
    /// Reads a prefix (`G`, `k`, `Mi`, or empty for none).
    pub fn parse(s: &str) -> Option<Prefix> {
        let mut chars = s.chars();
        let first = chars.next();
        let rest = chars.as_str();
        PREFIXES.iter().find_map(|(letters, factor, short)| {
            let binary = short.ends_with('i');
            let ok = match first {
                None => letters.is_empty(),
                Some(c) => {
                    !letters.is_empty()
                        && letters.contains(c)
                        && (if binary { rest == "i" } else { rest.is_empty() })
                }
            };
            ok.then_some(Prefix {
                factor: *factor,
                short,
            })
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    Bytes,
    Flops,
    Percentage,
    DegC,
    DegF,
    Rotation,
    Frequency,
    Time,
    Cycles,
    Watt,
    Joule,
    Requests,
    Packets,
    Events,
}

impl Measure {
    fn short(self) -> &'static str {
        match self {
            Measure::Bytes => "B",
            Measure::Flops => "Flops",
            Measure::Percentage => "%",
            Measure::DegC => "degC",
            Measure::DegF => "degF",
            Measure::Rotation => "RPM",
            Measure::Frequency => "Hz",
            Measure::Time => "s",
            Measure::Cycles => "cyc",
            Measure::Watt => "W",
            Measure::Joule => "J",
            Measure::Requests => "requests",
            Measure::Packets => "packets",
            Measure::Events => "events",
        }
    }

    fn parse(s: &str) -> Option<Measure> {
        static TABLE: LazyLock<Vec<(Measure, Regex)>> = LazyLock::new(|| {
            [
                (Measure::Bytes, "^([bB][yY]?[tT]?[eE]?[sS]?)"),
                (Measure::Flops, "^([fF][lL]?[oO]?[pP]?[sS]?)"),
                (Measure::Percentage, "^(%|[pP]ercent)"),
                (Measure::DegC, "^(deg[Cc]|°[cC])"),
                (Measure::DegF, "^(deg[fF]|°[fF])"),
                (Measure::Rotation, "^([rR][pP][mM])"),
                (Measure::Frequency, "^([hH][eE]?[rR]?[tT]?[zZ])"),
                (Measure::Time, "^([sS][eE]?[cC]?[oO]?[nN]?[dD]?[sS]?)"),
                (Measure::Cycles, "^([cC][yY][cC]?[lL]?[eE]?[sS]?)"),
                (Measure::Watt, "^([wW][aA]?[tT]?[tT]?[sS]?)"),
                (Measure::Joule, "^([jJ][oO]?[uU]?[lL]?[eE]?[sS]?)"),
                (
                    Measure::Requests,
                    "^([rR][eE][qQ][uU]?[eE]?[sS]?[tT]?[sS]?)",
                ),
                (Measure::Packets, "^([pP][aA]?[cC]?[kK][eE]?[tT][sS]?)"),
                (Measure::Events, "^([eE][vV]?[eE]?[nN][tT][sS]?)"),
            ]
            .into_iter()
            .filter_map(|(m, re)| Regex::new(re).ok().map(|re| (m, re)))
            .collect()
        });
        TABLE.iter().find(|(_, re)| re.is_match(s)).map(|(m, _)| *m)
    }
}

/// A unit: prefix, measure and an optional divisor measure (`B/s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unit {
    prefix: Prefix,
    measure: Measure,
    per: Option<Measure>,
}

impl Unit {
    /// Reads a unit string; `None` when ccUnits would call it invalid.
    pub fn parse(s: &str) -> Option<Unit> {
        // ccUnits splits at `^([kKmMgGtTpPeEzZyY]?[i]?)(.*)`.
        let b = s.as_bytes();
        let mut split = 0;
        if b.first().is_some_and(|c| b"kKmMgGtTpPeEzZyY".contains(c)) {
            split = 1;
        }
        if b.get(split) == Some(&b'i') {
            split += 1;
        }
        let (pre, rest) = s.split_at(split);
        let mut prefix = Prefix::parse(pre);
        let mut parts = rest.split('/');
        let first = parts.next().unwrap_or("");
        let mut measure = Measure::parse(first);
        if measure.is_none() && matches!(prefix.map(|p| p.short), Some("P" | "E")) {
            // `Percent`, `events`, `packets` start with a prefix letter.
            let whole = format!("{pre}{first}");
            if let Some(m) = Measure::parse(&whole) {
                measure = Some(m);
                prefix = Prefix::parse("");
            }
        }
        let per = parts.next().and_then(Measure::parse);
        let mut prefix = prefix?;
        let measure = measure?;
        match measure {
            Measure::Bytes
            | Measure::Flops
            | Measure::Packets
            | Measure::Events
            | Measure::Cycles
            | Measure::Requests
                if prefix.short == "m" =>
            {
                prefix = Prefix::parse("M")?;
            }
            Measure::Percentage => prefix = Prefix::parse("")?,
            _ => {}
        }
        Some(Unit {
            prefix,
            measure,
            per,
        })
    }

    /// The short form (`GB`, `MHz`, `KB/s`).
    pub fn short(&self) -> String {
        match self.per {
            Some(per) => format!(
                "{}{}/{}",
                self.prefix.short,
                self.measure.short(),
                per.short()
            ),
            None => format!("{}{}", self.prefix.short, self.measure.short()),
        }
    }

    /// The unit with `prefix` and the factor that converts a value to it.
    pub fn with_prefix(&self, prefix: Prefix) -> (f64, Unit) {
        let factor = self.prefix.factor / prefix.factor;
        (factor, Unit { prefix, ..*self })
    }
}

/// Scales a field value by `factor`, keeping its type (integers truncate, as ccUnits does).
pub fn scale(v: &OwnedValue, factor: f64) -> Option<OwnedValue> {
    Some(match v {
        OwnedValue::Float(f) => OwnedValue::Float(f * factor),
        OwnedValue::Int(i) => OwnedValue::Int((*i as f64 * factor) as i64),
        OwnedValue::Uint(u) => OwnedValue::Uint((*u as f64 * factor) as u64),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_normalize_to_the_short_form() {
        for (input, short) in [
            ("Bytes", "B"),
            ("kB", "KB"),
            ("KByte", "KB"),
            ("MHz", "MHz"),
            ("Watts", "W"),
            ("Percent", "%"),
            ("percent", "%"),
            ("events", "events"),
            ("packets", "packets"),
            ("degC", "degC"),
            ("GFlops/s", "GFlops/s"),
            ("mB", "MB"),
            ("msec", "ms"),
            ("KiB", "KiB"),
            ("cycles", "cyc"),
        ] {
            assert_eq!(
                Unit::parse(input).map(|u| u.short()).as_deref(),
                Some(short),
                "{input}"
            );
        }
        for bad in ["", "K", "xyz", "mib"] {
            assert_eq!(Unit::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn kilobytes_become_gigabytes_by_a_factor_of_a_million() {
        let u = Unit::parse("kB").unwrap();
        let (factor, out) = u.with_prefix(Prefix::parse("G").unwrap());
        assert_eq!(out.short(), "GB");
        assert_eq!(factor, 1e-6);
        assert_eq!(
            scale(&OwnedValue::Float(16e6), factor),
            Some(OwnedValue::Float(16.0))
        );
        assert_eq!(
            scale(&OwnedValue::Int(16_500_000), factor),
            Some(OwnedValue::Int(16))
        );
    }
}
