//! The router between the agent's plugins and its sinks: cc-metric-collector's
//! `router.json` options, applied to every batch on its way to the sinks.
//!
//! - `hostname_tag` (default `hostname`): the tag that carries the host's short name; added
//!   to a point that lacks it.
//! - `interval_timestamp`: every point's time becomes the start of its interval (the
//!   `interval` key, ccfleet's addition standing in for cc-metric-collector's global
//!   `interval`, default `10s`; intervals are aligned to the Unix epoch).
//! - `num_cache_intervals` (> 0) with `interval_aggregates`: points of an interval that
//!   match an aggregate's `if` are kept; when the interval ends, each aggregate's `function`
//!   is computed over them and sent as a new point stamped with the interval's start.
//! - `max_forward`: accepted (a tuning knob of the Go router's channel reads; batches here
//!   already carry many points).
//! - `process_messages`: cc-lib's message processor ([`super::processor`]); the deprecated
//!   `add_tags`, `delete_tags`, `drop_metrics`, `drop_metrics_if`, `rename_metrics`,
//!   `normalize_units` and `change_unit_prefix` are added to it as cc-metric-collector adds
//!   them (`*` as condition means `true`; `change_unit_prefix` keys are metric names).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ccfleet::lineproto::{Decoder, Encoder, OwnedValue, Point};
use ccfleet::untrusted::Untrusted;
use serde::Deserialize;

use super::expr::{Expr, Mode, Place, Scope, Value, Var};
use super::message::{Message, field_value};
use super::processor::{Condition, KeyRuleConfig, Processor, ProcessorConfig, RuleError};
use super::topology::Topology;

/// Points kept per interval for `interval_aggregates`; beyond it points are not cached (and
/// counted), so a flood cannot grow the agent without bound.
pub const MAX_CACHED_POINTS: usize = 100_000;
/// Distinct failing conditions logged; later ones are only counted.
const MAX_LOGGED_CONDITIONS: usize = 64;

/// A deprecated `add_tags` / `delete_tags` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LegacyTagRule {
    /// The tag.
    pub key: String,
    /// Its value (ignored by `delete_tags`).
    #[serde(default)]
    pub value: String,
    /// The condition (`*` for all).
    #[serde(rename = "if")]
    pub condition: String,
}

/// One `interval_aggregates` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AggregateConfig {
    /// The new metric's name.
    pub name: String,
    /// Which points of the interval take part.
    #[serde(rename = "if")]
    pub condition: String,
    /// The function: `avg(values)`, `sum(mem_total) - sum(mem_free)`, ...
    pub function: String,
    /// Tags of the new metric (`<copy>`: from the first matching point that has it).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Meta information of the new metric (`<copy>` as for tags).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
}

/// The agent's `router` key: cc-metric-collector's `router.json`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// The tag that carries the host name.
    #[serde(default)]
    pub hostname_tag: Option<String>,
    /// Stamp points with their interval's start.
    #[serde(default)]
    pub interval_timestamp: bool,
    /// Intervals kept for aggregates (0: none, and `interval_aggregates` is refused).
    #[serde(default)]
    pub num_cache_intervals: i64,
    /// Accepted for compatibility.
    #[serde(default)]
    pub max_forward: Option<i64>,
    /// New metrics computed at the end of each interval.
    #[serde(default)]
    pub interval_aggregates: Vec<AggregateConfig>,
    /// The interval (ccfleet's addition; cc-metric-collector takes it from its main file).
    #[serde(default)]
    pub interval: Option<String>,
    /// The message processor.
    #[serde(default)]
    pub process_messages: Option<ProcessorConfig>,
    /// Deprecated: tags added under conditions.
    #[serde(default)]
    pub add_tags: Vec<LegacyTagRule>,
    /// Deprecated: tags deleted under conditions.
    #[serde(default)]
    pub delete_tags: Vec<LegacyTagRule>,
    /// Deprecated: metric names dropped.
    #[serde(default)]
    pub drop_metrics: Vec<String>,
    /// Deprecated: conditions that drop.
    #[serde(default)]
    pub drop_metrics_if: Vec<String>,
    /// Deprecated: old name to new name.
    #[serde(default)]
    pub rename_metrics: BTreeMap<String, String>,
    /// Deprecated: normalize units.
    #[serde(default)]
    pub normalize_units: bool,
    /// Deprecated: metric name to new unit prefix.
    #[serde(default)]
    pub change_unit_prefix: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
struct Aggregate {
    name: String,
    cond: Condition,
    function: Expr,
    function_src: String,
    tags: BTreeMap<String, String>,
    meta: BTreeMap<String, String>,
}

/// What routing one batch gave.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// Newline-terminated lines for the sinks.
    pub lines: Vec<u8>,
    /// Points in `lines`.
    pub points: usize,
    /// Points a rule dropped.
    pub dropped: usize,
    /// Points dropped because a condition failed on them or they could not be re-encoded.
    pub failed: usize,
}

/// Counters over the router's life.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RouterCounters {
    /// Points in.
    pub points_in: u64,
    /// Points a rule dropped.
    pub dropped: u64,
    /// Points that failed (condition errors, encode errors).
    pub failed: u64,
    /// Aggregated points made.
    pub aggregated: u64,
    /// Points not cached because the interval's cache was full.
    pub not_cached: u64,
}

/// The router's counters as `/metrics` reads them, published after each batch and each
/// interval's aggregates (the router itself counts without atomics).
#[derive(Debug, Default)]
pub struct RouterStats {
    points_in: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    aggregated: AtomicU64,
    not_cached: AtomicU64,
}

impl RouterStats {
    fn publish(&self, c: &RouterCounters) {
        for (atomic, value) in [
            (&self.points_in, c.points_in),
            (&self.dropped, c.dropped),
            (&self.failed, c.failed),
            (&self.aggregated, c.aggregated),
            (&self.not_cached, c.not_cached),
        ] {
            atomic.store(value, Ordering::Relaxed);
        }
    }

    /// The counters as last published.
    pub fn snapshot(&self) -> RouterCounters {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RouterCounters {
            points_in: load(&self.points_in),
            dropped: load(&self.dropped),
            failed: load(&self.failed),
            aggregated: load(&self.aggregated),
            not_cached: load(&self.not_cached),
        }
    }
}

/// The compiled router.
#[derive(Debug)]
pub struct Router {
    processor: Processor,
    hostname_tag: Option<String>,
    hostname_tag_configured: bool,
    hostname: String,
    interval_ns: i64,
    interval_timestamp: bool,
    aggregates: Vec<Aggregate>,
    cache: Vec<Message>,
    cache_start: Option<i64>,
    logged: HashSet<String>,
    counters: RouterCounters,
    stats: Arc<RouterStats>,
    topology: Arc<Topology>,
}

/// ccfleet's default interval for `interval_timestamp` and aggregates.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

impl RouterConfig {
    /// The JSON Schema of the `router` section, its keys described by their documentation
    /// (the book's configuration reference is generated from it).
    #[cfg(feature = "schema")]
    pub fn json_schema() -> schemars::Schema {
        schemars::schema_for!(RouterConfig)
    }
}

impl Router {
    /// Compiles the `router` key; `hostname` is the host's name (its short form is used).
    /// Errors name the rule (`router.process_messages.add_tags_if[0]: ...`).
    pub fn new(config: &RouterConfig, hostname: &str) -> Result<Router, String> {
        Router::with_topology(config, hostname, Topology::local())
    }

    /// [`Router::new`] with the CPU topology the topology functions read.
    pub fn with_topology(
        config: &RouterConfig,
        hostname: &str,
        topology: Arc<Topology>,
    ) -> Result<Router, String> {
        let mut processor = match &config.process_messages {
            Some(p) => Processor::new(p, "router.process_messages")?,
            None => Processor::new(&ProcessorConfig::default(), "router")?,
        };
        for name in &config.drop_metrics {
            processor.add_drop_name(name);
        }
        for (i, c) in config.drop_metrics_if.iter().enumerate() {
            processor.add_drop_if(c, &format!("router.drop_metrics_if[{i}]"))?;
        }
        for (kind, list, field) in [
            ("add_tags_if", &config.add_tags, "add_tags"),
            ("delete_tags_if", &config.delete_tags, "delete_tags"),
        ] {
            for (i, r) in list.iter().enumerate() {
                let condition = if r.condition.trim() == "*" {
                    "true".to_owned()
                } else {
                    r.condition.clone()
                };
                let rule = KeyRuleConfig {
                    key: r.key.clone(),
                    value: r.value.clone(),
                    condition,
                };
                processor.add_key_rule(kind, &rule, &format!("router.{field}[{i}]"))?;
            }
        }
        for (from, to) in &config.rename_metrics {
            processor.add_rename(from, to, &format!("router.rename_metrics[{from:?}]"))?;
        }
        for (name, prefix) in &config.change_unit_prefix {
            let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
            processor.add_change_prefix(
                &format!("name == '{quoted}'"),
                prefix,
                &format!("router.change_unit_prefix[{name:?}]"),
            )?;
        }
        if config.normalize_units {
            processor.set_normalize_units(true);
        }
        processor.set_topology(topology.clone());
        if config.num_cache_intervals < 0 {
            return Err("router.num_cache_intervals must not be negative".into());
        }
        if let Some(m) = config.max_forward
            && m < 1
        {
            return Err("router.max_forward must be at least 1".into());
        }
        if !config.interval_aggregates.is_empty() && config.num_cache_intervals == 0 {
            return Err(
                "router.interval_aggregates needs num_cache_intervals > 0 (as in cc-metric-collector)"
                    .into(),
            );
        }
        let interval = match &config.interval {
            Some(text) => ccfleet::duration::parse(text)
                .map_err(|e| format!("router.interval: {text:?} is not a duration: {e}"))?,
            None => DEFAULT_INTERVAL,
        };
        let interval_ns = i64::try_from(interval.as_nanos()).unwrap_or(i64::MAX);
        if interval_ns < 1_000_000 {
            return Err("router.interval must be at least 1ms".into());
        }
        let mut aggregates = Vec::new();
        let mut names = HashSet::new();
        for (i, a) in config.interval_aggregates.iter().enumerate() {
            let at = format!("router.interval_aggregates[{i}]");
            if a.name.is_empty() {
                return Err(format!("{at}: name is empty"));
            }
            if !names.insert(a.name.clone()) {
                return Err(format!("{at}: a second aggregate named {:?}", a.name));
            }
            let function = Expr::parse(&a.function, Mode::Aggregate)
                .map_err(|e| format!("{at}.function: {e}"))?;
            aggregates.push(Aggregate {
                name: a.name.clone(),
                cond: Condition::parse(&a.condition, &format!("{at}.if"))?,
                function,
                function_src: a.function.clone(),
                tags: a.tags.clone(),
                meta: a.meta.clone(),
            });
        }
        let hostname_tag = match &config.hostname_tag {
            Some(t) if t.is_empty() => return Err("router.hostname_tag is empty".into()),
            Some(t) => Some(t.clone()),
            None => Some("hostname".to_owned()),
        };
        Ok(Router {
            processor,
            hostname_tag,
            hostname_tag_configured: config.hostname_tag.is_some(),
            hostname: hostname.split('.').next().unwrap_or(hostname).to_owned(),
            interval_ns,
            interval_timestamp: config.interval_timestamp,
            aggregates,
            cache: Vec::new(),
            cache_start: None,
            logged: HashSet::new(),
            counters: RouterCounters::default(),
            stats: Arc::default(),
            topology,
        })
    }

    /// Whether the router changes anything; when not, batches pass untouched (and are not
    /// even decoded).
    pub fn is_active(&self) -> bool {
        // The plugins tag `hostname` themselves, so the default hostname rule alone changes
        // nothing worth decoding every batch for; a configured `hostname_tag` does.
        !self.processor.is_empty()
            || self.interval_timestamp
            || !self.aggregates.is_empty()
            || self.hostname_tag_configured
    }

    /// The counters so far.
    pub fn counters(&self) -> RouterCounters {
        self.counters
    }

    /// The counters shared with readers on other tasks (`/metrics`).
    pub fn stats(&self) -> Arc<RouterStats> {
        self.stats.clone()
    }

    /// The interval length in nanoseconds.
    pub fn interval_ns(&self) -> i64 {
        self.interval_ns
    }

    fn interval_start(&self, now_ns: i64) -> i64 {
        now_ns - now_ns.rem_euclid(self.interval_ns)
    }

    fn note(&mut self, e: &RuleError) {
        self.counters.failed += 1;
        if self.logged.len() < MAX_LOGGED_CONDITIONS && self.logged.insert(e.condition.clone()) {
            tracing::warn!(
                condition = %Untrusted(&e.condition).capped(200),
                error = %Untrusted(&e.why).capped(300),
                "a router condition failed on a point; the point is dropped (further failures of this condition are only counted)"
            );
        }
    }

    /// Routes one batch of line protocol at time `now_ns`; aggregates of an interval that
    /// has ended are computed first and come at the front of the result.
    pub fn route(&mut self, lines: &[u8], now_ns: i64) -> Routed {
        let mut out = self.flush(now_ns);
        let stamp = self.interval_start(now_ns);
        let mut enc = Encoder::new();
        for line in Decoder::new(lines) {
            self.counters.points_in += 1;
            let line = match line {
                Ok(l) => l,
                Err(e) => {
                    // The emit path checks plugin output, so this is a defect upstream.
                    out.failed += 1;
                    self.counters.failed += 1;
                    tracing::warn!(error = %Untrusted(&e.to_string()).capped(300), "the router could not read a point");
                    continue;
                }
            };
            let mut msg = Message::new(Point::from_line(&line));
            if let Some(tag) = &self.hostname_tag
                && msg.tag(tag).is_none()
            {
                msg.set_tag(tag, &self.hostname);
            }
            if self.interval_timestamp {
                msg.point.time = Some(stamp);
            }
            match process_isolated(&self.processor, &mut msg) {
                Ok(true) => self.encode(&msg, &mut enc, &mut out),
                Ok(false) => {
                    out.dropped += 1;
                    self.counters.dropped += 1;
                }
                Err(e) => {
                    out.failed += 1;
                    self.note(&e);
                    continue;
                }
            }
            // A dropped point still counts for the aggregates: cc-metric-collector's README
            // drops an aggregate's inputs with the aggregate's own condition in
            // `drop_metrics_if` when only the aggregate is wanted.
            self.cache_point(msg);
        }
        out.lines.extend_from_slice(enc.bytes());
        self.stats.publish(&self.counters);
        out
    }

    fn encode(&mut self, msg: &Message, enc: &mut Encoder, out: &mut Routed) {
        match enc.encode_point(&msg.point, true) {
            Ok(()) => out.points += 1,
            Err(e) => {
                out.failed += 1;
                self.counters.failed += 1;
                if self.logged.len() < MAX_LOGGED_CONDITIONS
                    && self.logged.insert(format!("encode {}", msg.name()))
                {
                    tracing::warn!(
                        metric = %Untrusted(msg.name()).capped(100),
                        error = %Untrusted(&e.to_string()).capped(300),
                        "a routed point is not valid line protocol (an empty tag value?); dropped"
                    );
                }
            }
        }
    }

    fn cache_point(&mut self, msg: Message) {
        if self.aggregates.is_empty() {
            return;
        }
        let empty = BTreeMap::new();
        let wanted = self
            .aggregates
            .iter()
            .any(|a| a.cond.test(&msg, &empty, &self.topology).unwrap_or(false));
        if !wanted {
            return;
        }
        if self.cache.len() >= MAX_CACHED_POINTS {
            self.counters.not_cached += 1;
            return;
        }
        self.cache.push(msg);
    }

    /// Computes the aggregates of an interval that ended before `now_ns` (call it on a
    /// timer, too, so aggregates do not wait for the next batch).
    pub fn flush(&mut self, now_ns: i64) -> Routed {
        let mut out = Routed::default();
        if self.aggregates.is_empty() {
            return out;
        }
        let current = self.interval_start(now_ns);
        let Some(start) = self.cache_start else {
            self.cache_start = Some(current);
            return out;
        };
        if start >= current {
            return out;
        }
        self.cache_start = Some(current);
        let cached = std::mem::take(&mut self.cache);
        let mut enc = Encoder::new();
        for i in 0..self.aggregates.len() {
            let Some(mut msg) = self.aggregate(i, &cached, start) else {
                continue;
            };
            // As in cc-metric-collector, aggregates pass the hostname rule like any point.
            if let Some(tag) = &self.hostname_tag
                && msg.tag(tag).is_none()
            {
                msg.set_tag(tag, &self.hostname);
            }
            match process_isolated(&self.processor, &mut msg) {
                Ok(true) => {
                    self.counters.aggregated += 1;
                    self.encode(&msg, &mut enc, &mut out);
                }
                Ok(false) => out.dropped += 1,
                Err(e) => {
                    out.failed += 1;
                    self.note(&e);
                }
            }
        }
        out.lines = enc.take();
        self.stats.publish(&self.counters);
        out
    }

    fn aggregate(&mut self, i: usize, cached: &[Message], start: i64) -> Option<Message> {
        let a = &self.aggregates[i];
        let empty = BTreeMap::new();
        let mut matched = Vec::new();
        let mut failure = None;
        for m in cached {
            match a.cond.test(m, &empty, &self.topology) {
                Ok(true) => matched.push(m),
                Ok(false) => {}
                Err(e) => failure = Some(e),
            }
        }
        let values: Vec<Value> = matched
            .iter()
            .filter_map(|m| m.field("value").map(field_value))
            .collect();
        let result = if values.is_empty() {
            None
        } else {
            Some(a.function.eval(&AggregateScope {
                matched: &matched,
                values,
                topology: &self.topology,
            }))
        };
        let name = a.name.clone();
        let tags = copy_from(&a.tags, &matched, |m, k| m.tag(k).map(str::to_owned));
        let meta = copy_from(&a.meta, &matched, |m, k| m.meta.get(k).cloned());
        let source = a.function_src.clone();
        if let Some(e) = failure {
            self.note(&e);
        }
        let value = match result? {
            Ok(Value::Num(n)) if n.is_finite() => OwnedValue::Float(n),
            Ok(Value::Str(s)) => OwnedValue::String(s),
            Ok(Value::Bool(b)) => OwnedValue::Bool(b),
            Ok(other) => {
                self.note(&RuleError {
                    condition: source,
                    why: format!("the function gave {other}, not a number"),
                });
                return None;
            }
            Err(e) => {
                self.note(&RuleError {
                    condition: source,
                    why: e.0,
                });
                return None;
            }
        };
        let mut point = Point {
            measurement: name,
            tags: tags.into_iter().collect(),
            fields: vec![("value".to_owned(), value)],
            time: Some(start),
        };
        point.tags.sort();
        Some(Message { point, meta })
    }
}

/// Runs the processor on one message so that nothing it does to that message can end the
/// pipeline: evaluation is written not to panic, and should a defect make it panic all the
/// same, the message is counted as failed and the next one is processed. Only `msg` is
/// touched inside, and it is discarded after a panic, so no broken state outlives it.
fn process_isolated(processor: &Processor, msg: &mut Message) -> Result<bool, RuleError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| processor.process(msg)))
        .unwrap_or_else(|_| {
            Err(RuleError {
                condition: "(message processor)".to_owned(),
                why: "processing this point failed unexpectedly".to_owned(),
            })
        })
}

fn copy_from(
    spec: &BTreeMap<String, String>,
    matched: &[&Message],
    get: impl Fn(&Message, &str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in spec {
        if v == "<copy>" {
            if let Some(found) = matched.iter().find_map(|m| get(m, k)) {
                out.insert(k.clone(), found);
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// What an aggregate's function reads: `values`, and a metric name for that metric's values.
struct AggregateScope<'a> {
    matched: &'a [&'a Message],
    values: Vec<Value>,
    topology: &'a Topology,
}

impl Scope for AggregateScope<'_> {
    fn get(&self, var: &Var) -> Value {
        match var {
            Var::Values => Value::List(self.values.clone()),
            Var::Bare(name) => Value::List(
                self.matched
                    .iter()
                    .filter(|m| m.name() == name)
                    .filter_map(|m| m.field("value").map(field_value))
                    .collect(),
            ),
            _ => Value::Nil,
        }
    }

    fn has(&self, _place: Place, _key: &str) -> bool {
        false
    }

    fn topology(&self) -> Option<&Topology> {
        Some(self.topology)
    }
}
