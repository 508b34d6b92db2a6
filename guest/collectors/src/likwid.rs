//! `likwid`: hardware performance counters through LIKWID, as cc-metric-collector's `likwid`
//! collector sends them: one point per metric and hardware thread (`type=hwthread`,
//! `type-id` the CPU) or socket (`type=socket`, `type-id` the socket), `node` without
//! `type-id`, units as the `unit` meta.
//!
//! A plugin cannot call LIKWID (a native library): the agent measures on the plugin's behalf
//! through `cc:fleet/likwid` when the plugin's configuration grants `capabilities.likwid`,
//! and evaluates the formulas with its own expression engine (the router's, so there is one
//! formula language in the agent). This collector reads cc-metric-collector's configuration
//! as it is, hands the event sets and formulas over, and sends the published metrics; the
//! agent answers through [`Counters`]. Natively (tests) any [`Counters`] will do.
//!
//! The library (`liblikwid_path`) and the access daemon (`accessdaemon_path`) are settings of
//! the node, not of a fleet configuration: the agent takes them from its local configuration
//! (`capabilities.likwid-library`) and environment, and this collector ignores the two keys
//! (with a warning once) so an imported configuration still loads. Event sets whose counters
//! belong to another user's measurement this round (LIKWID's lock file is theirs) are
//! skipped, and [`Likwid::skipped_rounds`] counts them.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value as Json;

#[cfg(feature = "json")]
use crate::config::{FromOptions, Options};
use crate::{Sample, Value};

/// How LIKWID reaches the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// The registers directly.
    Direct,
    /// Through LIKWID's access daemon.
    AccessDaemon,
    /// Through perf_event.
    PerfEvent,
}

/// A metric of cc-metric-collector's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Its name.
    pub name: String,
    /// Its formula.
    pub calc: String,
    /// Its type (`hwthread`, `socket`, `node`, ...).
    pub scope: String,
    /// Whether it is sent.
    pub publish: bool,
    /// Its unit, if any.
    pub unit: Option<String>,
}

/// An event set: counter and event pairs, and its metrics.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventSet {
    /// Counter and event pairs.
    pub events: Vec<(String, String)>,
    /// Its metrics.
    pub metrics: Vec<Metric>,
}

/// The collector's settings (cc-metric-collector's keys).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `eventsets`.
    pub event_sets: Vec<EventSet>,
    /// `globalmetrics`.
    pub global_metrics: Vec<Metric>,
    /// `access_mode`.
    pub access_mode: AccessMode,
    /// `lockfile_path`.
    pub lockfile_path: Option<String>,
    /// `force_overwrite`.
    pub force_overwrite: bool,
    /// `invalid_to_zero`.
    pub invalid_to_zero: bool,
    /// How long each event set is measured (cc-metric-collector's global `duration`).
    pub duration_ns: u64,
    /// `keep_counting` (not in cc-metric-collector): with exactly one event set, its
    /// counters keep running between rounds and each round reads what they counted since
    /// the previous one, so a round waits for no measurement window.
    pub keep_counting: bool,
}

/// One metric value from the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricValue {
    /// The metric.
    pub metric: String,
    /// Its scope.
    pub scope: String,
    /// The CPU or socket; `None` for `node`.
    pub scope_id: Option<u32>,
    /// The value.
    pub value: f64,
}

/// One round from the agent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Round {
    /// The metric values.
    pub values: Vec<MetricValue>,
    /// The users whose lock made an event set be skipped, one per skipped set.
    pub skipped: Vec<String>,
}

/// Where measurements come from: the agent's `cc:fleet/likwid`.
pub trait Counters {
    /// Measures one round of `config`.
    fn measure(&mut self, config: &Config) -> Result<Round, String>;
}

/// A collector of what [`Counters`] measure.
pub trait CounterCollector {
    /// The collector's name as cc-metric-collector spells it.
    fn name(&self) -> &'static str;

    /// One collection round; `warn` receives messages worth a log line.
    fn collect(
        &mut self,
        counters: &mut dyn Counters,
        out: &mut Vec<Sample>,
        warn: &mut dyn FnMut(&str),
    ) -> Result<(), String>;
}

/// The `likwid` collector.
#[derive(Debug, Clone, PartialEq)]
pub struct Likwid {
    /// The settings.
    pub config: Config,
    /// The node-local keys the configuration gave, which are ignored (warned about once).
    pub ignored_keys: Vec<String>,
    warned: bool,
    skipped_rounds: u64,
}

impl Likwid {
    /// The collector for `config`.
    pub fn new(config: Config, ignored_keys: Vec<String>) -> Likwid {
        Likwid {
            config,
            ignored_keys,
            warned: false,
            skipped_rounds: 0,
        }
    }

    /// Rounds in which at least one event set was skipped for another user's lock.
    pub fn skipped_rounds(&self) -> u64 {
        self.skipped_rounds
    }

    fn metric(&self, name: &str) -> Option<&Metric> {
        self.config
            .event_sets
            .iter()
            .flat_map(|s| s.metrics.iter())
            .chain(self.config.global_metrics.iter())
            .find(|m| m.name == name)
    }
}

impl CounterCollector for Likwid {
    fn name(&self) -> &'static str {
        "likwid"
    }

    fn collect(
        &mut self,
        counters: &mut dyn Counters,
        out: &mut Vec<Sample>,
        warn: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        if !self.warned && !self.ignored_keys.is_empty() {
            self.warned = true;
            warn(&format!(
                "ignoring {}: the LIKWID library and access daemon are set on the node \
                 (capabilities.likwid-library, CCFLEET_LIKWID_ACCESSDAEMON_PATH)",
                self.ignored_keys.join(", ")
            ));
        }
        let round = counters.measure(&self.config)?;
        if !round.skipped.is_empty() {
            self.skipped_rounds += 1;
            warn(&format!(
                "skipped {} event set(s): the performance counters are in use by {}",
                round.skipped.len(),
                round.skipped[0]
            ));
        }
        for v in round.values {
            let Some(metric) = self.metric(&v.metric) else {
                continue;
            };
            if !metric.publish || !v.value.is_finite() {
                continue;
            }
            let mut sample = Sample::new(
                v.metric.clone(),
                &[("type", &v.scope)],
                Value::Float(v.value),
            );
            if let Some(id) = v.scope_id {
                sample = sample.with_tag("type-id", &id.to_string());
            }
            if let Some(unit) = &metric.unit {
                sample = sample.unit(unit);
            }
            out.push(sample);
        }
        Ok(())
    }
}

/// A duration as cc-metric-collector writes them (`10s`, `500ms`, `1m30s`), in nanoseconds.
pub fn parse_duration(text: &str) -> Option<u64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        let part = number * scale;
        if !part.is_finite() || !(0.0..=1e18).contains(&part) {
            return None;
        }
        total = total.checked_add(part as u64)?;
    }
    Some(total)
}

fn metrics(key: &str, value: Option<&Json>) -> Result<Vec<Metric>, String> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Json::Array(items) = value else {
        return Err(format!("likwid: `{key}` must be a list of metrics"));
    };
    items
        .iter()
        .map(|item| {
            let text = |k: &str| -> Result<Option<String>, String> {
                match item.get(k) {
                    None | Some(Json::Null) => Ok(None),
                    Some(Json::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(format!("likwid: `{key}`: `{k}` must be a string")),
                }
            };
            let need = |k: &str| -> Result<String, String> {
                text(k)?.ok_or_else(|| format!("likwid: `{key}`: a metric lacks `{k}`"))
            };
            if let Json::Object(map) = item
                && let Some(unknown) = map.keys().find(|k| {
                    !matches!(
                        k.as_str(),
                        "name"
                            | "calc"
                            | "type"
                            | "publish"
                            | "unit"
                            | "send_core_total_values"
                            | "send_socket_total_values"
                            | "send_node_total_values"
                    )
                })
            {
                return Err(format!("likwid: `{key}`: unknown metric key `{unknown}`"));
            }
            Ok(Metric {
                name: need("name")?,
                calc: need("calc")?,
                scope: need("type")?,
                publish: match item.get("publish") {
                    None | Some(Json::Null) => false,
                    Some(Json::Bool(b)) => *b,
                    Some(_) => return Err(format!("likwid: `{key}`: `publish` must be a boolean")),
                },
                unit: text("unit")?.filter(|u| !u.is_empty()),
            })
        })
        .collect()
}

impl Config {
    /// Reads the event sets and global metrics of cc-metric-collector's configuration.
    pub fn event_sets(value: Option<&Json>) -> Result<Vec<EventSet>, String> {
        let Some(Json::Array(sets)) = value else {
            return Err("likwid: `eventsets` must be a list of event sets".to_owned());
        };
        sets.iter()
            .map(|set| {
                let Some(Json::Object(events)) = set.get("events") else {
                    return Err("likwid: an event set lacks its `events` object".to_owned());
                };
                let events = events
                    .iter()
                    .map(|(counter, event)| match event {
                        Json::String(e) => Ok((counter.clone(), e.clone())),
                        _ => Err(format!(
                            "likwid: the event of counter {counter} must be a string"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(EventSet {
                    events,
                    metrics: metrics("metrics", set.get("metrics"))?,
                })
            })
            .collect()
    }

    /// Reads `globalmetrics`.
    pub fn global_metrics(value: Option<&Json>) -> Result<Vec<Metric>, String> {
        metrics("globalmetrics", value)
    }

    /// Reads `access_mode`.
    pub fn access_mode(text: Option<&str>) -> Result<AccessMode, String> {
        Ok(match text.unwrap_or("direct") {
            "direct" => AccessMode::Direct,
            "accessdaemon" => AccessMode::AccessDaemon,
            "perf_event" => AccessMode::PerfEvent,
            other => {
                return Err(format!(
                    "likwid: `access_mode` {:?} is none of direct, accessdaemon, perf_event",
                    crate::quoted(other, 40)
                ));
            }
        })
    }
}

// Beside the collector rather than in `config.rs` because its options are nested JSON the
// collector's own parsers read.
#[cfg(feature = "json")]
impl FromOptions for Likwid {
    const NAME: &'static str = "likwid";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let mut ignored = Vec::new();
        for key in ["liblikwid_path", "accessdaemon_path"] {
            if o.json(key).is_some() {
                ignored.push(key.to_owned());
            }
        }
        let duration = o.string("duration")?.unwrap_or_else(|| "1s".to_owned());
        let duration_ns = parse_duration(&duration)
            .filter(|ns| *ns > 0)
            .ok_or_else(|| {
                format!(
                    "likwid: `duration` {:?} is not a duration such as 10s or 500ms",
                    crate::quoted(&duration, 40)
                )
            })?;
        let config = Config {
            event_sets: Config::event_sets(o.json("eventsets").as_ref())?,
            global_metrics: Config::global_metrics(o.json("globalmetrics").as_ref())?,
            access_mode: Config::access_mode(o.string("access_mode")?.as_deref())?,
            lockfile_path: Some(
                o.string("lockfile_path")?
                    .unwrap_or_else(|| "/var/run/likwid.lock".to_owned()),
            ),
            force_overwrite: o.bool("force_overwrite", false)?,
            invalid_to_zero: o.bool("invalid_to_zero", false)?,
            duration_ns,
            keep_counting: o.bool("keep_counting", false)?,
        };
        if config.keep_counting && config.event_sets.len() != 1 {
            return Err(format!(
                "likwid: `keep_counting` needs exactly one event set (there are {}): \
                 the counters cannot keep counting while event sets take turns",
                config.event_sets.len()
            ));
        }
        Ok(Likwid::new(config, ignored))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_go_writes_them() {
        assert_eq!(parse_duration("10s"), Some(10_000_000_000));
        assert_eq!(parse_duration("500ms"), Some(500_000_000));
        assert_eq!(parse_duration("1m30s"), Some(90_000_000_000));
        assert_eq!(parse_duration("1.5s"), Some(1_500_000_000));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration(""), None);
    }

    struct Fixed(Round);

    impl Counters for Fixed {
        fn measure(&mut self, _config: &Config) -> Result<Round, String> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn published_metrics_are_sent_with_their_scope_and_unit() {
        let json: Json = serde_json::from_str(
            r#"[{"events": {"PMC0": "A"}, "metrics": [
                {"name": "a", "calc": "PMC0", "type": "hwthread", "publish": true, "unit": "x"},
                {"name": "b", "calc": "PMC0", "type": "node", "publish": false}]}]"#,
        )
        .unwrap();
        let config = Config {
            event_sets: Config::event_sets(Some(&json)).unwrap(),
            global_metrics: Vec::new(),
            access_mode: AccessMode::Direct,
            lockfile_path: None,
            force_overwrite: false,
            invalid_to_zero: false,
            duration_ns: 1,
            keep_counting: false,
        };
        let mut likwid = Likwid::new(config, Vec::new());
        let mut counters = Fixed(Round {
            values: alloc::vec![
                MetricValue {
                    metric: "a".into(),
                    scope: "hwthread".into(),
                    scope_id: Some(3),
                    value: 2.5,
                },
                MetricValue {
                    metric: "b".into(),
                    scope: "node".into(),
                    scope_id: None,
                    value: 1.0,
                },
            ],
            skipped: alloc::vec!["alice".into()],
        });
        let mut out = Vec::new();
        let mut warnings = Vec::new();
        likwid
            .collect(&mut counters, &mut out, &mut |w| {
                warnings.push(w.to_owned())
            })
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "a");
        assert_eq!(out[0].unit.as_deref(), Some("x"));
        assert!(out[0].tags.contains(&("type-id".into(), "3".into())));
        assert_eq!(likwid.skipped_rounds(), 1);
        assert!(warnings[0].contains("alice"), "{warnings:?}");
    }
}
