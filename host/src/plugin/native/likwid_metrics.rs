//! The LIKWID grant's metrics: cc-metric-collector's event sets and formulas checked into a
//! [`Plan`], and a round's counter values turned into metric values the way its `likwid`
//! collector forms them.
//!
//! Formulas are parsed and evaluated by the router's expression engine
//! ([`crate::agent::router::expr`]), so the agent has one expression language, not two: the
//! agent, not the plugin, evaluates them, since the engine is host code and a plugin needs
//! nothing of it but the values. A formula reads the counters of its event set by name,
//! `time` (seconds the set was measured, as LIKWID reports it), `inverseClock` (1 / the base
//! clock in Hz), `gotime` (the configured duration in seconds) and the metrics of its set
//! defined before it; a global metric reads the metrics of every set that was measured,
//! and `gotime`.
//!
//! Scopes, as cc-metric-collector forms them: a `socket` metric is evaluated once per socket
//! on the socket's first hardware thread (where LIKWID counts the socket's uncore counters:
//! memory controllers, energy) and tagged `type=socket,type-id=<socket>`; every other scope
//! is evaluated on each hardware thread and tagged `type=<scope>,type-id=<cpu>` (`node`
//! without `type-id`).
//!
//! Differences from cc-metric-collector, each where its behaviour is an accident:
//! - a formula may use the metrics of its set defined before it with their values
//!   (cc-metric-collector gives them 0);
//! - a formula that cannot be evaluated for a hardware thread (a name without a value there,
//!   a division by zero) gives 0 with `invalid_to_zero` and no value otherwise
//!   (cc-metric-collector sends 0 for an error, nothing for NaN and the infinity for a
//!   division by zero, which line protocol cannot carry).

use std::collections::{BTreeMap, HashMap};

use crate::agent::router::expr::{Expr, Mode, Place, Scope as ExprScope, Value as ExprValue, Var};

/// The most event sets one setup may hold.
pub const MAX_EVENT_SETS: usize = 64;
/// The most events one set may hold.
pub const MAX_EVENTS: usize = 256;
/// The most metrics one set (or the global metrics) may hold.
pub const MAX_METRICS: usize = 256;
/// The longest counter, event or metric name.
pub const MAX_NAME: usize = 128;

/// The scope of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each hardware thread.
    HwThread,
    /// Each hardware thread, tagged `core`.
    Core,
    /// Each socket, on its first hardware thread.
    Socket,
    /// Each hardware thread, tagged `memoryDomain`.
    MemoryDomain,
    /// Each hardware thread, tagged `node` without `type-id`.
    Node,
}

impl Scope {
    /// The scope named `name`, as cc-metric-collector accepts them.
    pub fn parse(name: &str) -> Option<Scope> {
        Some(match name {
            "hwthread" => Scope::HwThread,
            "core" => Scope::Core,
            "socket" => Scope::Socket,
            "memoryDomain" => Scope::MemoryDomain,
            "node" => Scope::Node,
            _ => return None,
        })
    }

    /// The `type` tag.
    pub fn name(self) -> &'static str {
        match self {
            Scope::HwThread => "hwthread",
            Scope::Core => "core",
            Scope::Socket => "socket",
            Scope::MemoryDomain => "memoryDomain",
            Scope::Node => "node",
        }
    }
}

/// A metric as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSpec {
    /// Its name.
    pub name: String,
    /// Its formula.
    pub calc: String,
    /// Its scope's name.
    pub scope: String,
}

/// An event set as configured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventSetSpec {
    /// Counter and event pairs.
    pub events: Vec<(String, String)>,
    /// Its metrics.
    pub metrics: Vec<MetricSpec>,
}

/// A checked metric.
#[derive(Debug, Clone)]
pub struct Metric {
    /// Its name.
    pub name: String,
    /// Its scope.
    pub scope: Scope,
    expr: Expr,
}

/// A checked event set.
#[derive(Debug, Clone)]
pub struct EventSet {
    /// The counters, sorted; results come in this order.
    pub counters: Vec<String>,
    /// LIKWID's event string, `EVENT:COUNTER,...` in the order of [`EventSet::counters`].
    pub event_string: String,
    /// Its metrics.
    pub metrics: Vec<Metric>,
}

/// A checked setup.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The event sets.
    pub sets: Vec<EventSet>,
    /// The global metrics.
    pub globals: Vec<Metric>,
}

/// One hardware thread: its CPU number and socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thread {
    /// The CPU number.
    pub cpu: u32,
    /// The socket.
    pub socket: u32,
}

/// What one event set measured: per hardware thread (in the order of the measured CPU
/// list) the counters' values (in the order of [`EventSet::counters`]), and the seconds it
/// was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SetResult {
    /// Counter values by thread, then counter.
    pub values: Vec<Vec<f64>>,
    /// `time`.
    pub time: f64,
}

/// One metric value.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricValue {
    /// The metric.
    pub name: String,
    /// Its scope.
    pub scope: Scope,
    /// The CPU or socket; `None` for `node`.
    pub scope_id: Option<u32>,
    /// The value.
    pub value: f64,
}

/// Whether `name` may name a counter, an event or a metric: letters, digits, `_`, and for
/// events `.`, `:` and `=` (LIKWID's event options); no `,`, which separates events.
fn valid_name(name: &str, extra: &[char]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || extra.contains(&c))
}

/// The names a formula may read while it is checked, each set to 1.
struct CheckScope<'a> {
    known: &'a [String],
    unknown: std::cell::RefCell<Option<String>>,
}

/// The name a variable stands for in a formula.
fn var_name(var: &Var) -> Option<&str> {
    match var {
        Var::Bare(name) | Var::Field(name) => Some(name),
        Var::Time => Some("time"),
        Var::Name => Some("name"),
        Var::MessageType => Some("messagetype"),
        Var::Tag(_) | Var::Meta(_) | Var::Values => None,
    }
}

impl ExprScope for CheckScope<'_> {
    fn get(&self, var: &Var) -> ExprValue {
        match var_name(var) {
            Some(name) if self.known.iter().any(|k| k == name) => ExprValue::Num(1.0),
            other => {
                let mut unknown = self.unknown.borrow_mut();
                if unknown.is_none() {
                    *unknown = Some(other.unwrap_or("a tag or meta entry").to_owned());
                }
                ExprValue::Nil
            }
        }
    }
    fn has(&self, _place: Place, _key: &str) -> bool {
        false
    }
}

/// Parses `spec` and checks that its formula gives a number from the names `known`.
fn metric(spec: &MetricSpec, known: &[String], what: &str) -> Result<Metric, String> {
    if !valid_name(&spec.name, &[]) {
        return Err(format!(
            "{what}: the metric name {:?} is not a name (letters, digits, _)",
            spec.name
        ));
    }
    let scope = Scope::parse(&spec.scope).ok_or_else(|| {
        format!(
            "{what}: metric {}: the type {:?} is none of hwthread, core, socket, \
             memoryDomain, node",
            spec.name, spec.scope
        )
    })?;
    let expr = Expr::parse(&spec.calc, Mode::Condition)
        .map_err(|e| format!("{what}: metric {}: {e}", spec.name))?;
    let check = CheckScope {
        known,
        unknown: std::cell::RefCell::new(None),
    };
    let result = expr.eval(&check);
    if let Some(name) = check.unknown.into_inner() {
        return Err(format!(
            "{what}: metric {}: the formula uses {name:?}, which is none of its counters, \
             time, inverseClock, gotime or an earlier metric",
            spec.name
        ));
    }
    match result {
        Ok(ExprValue::Num(_)) => {}
        // A formula that divides by a difference is not finite with every name at 1: the
        // check is whether it reads known names and gives numbers, which this says.
        Err(e) if e.0.contains("finite") => {}
        Ok(other) => {
            return Err(format!(
                "{what}: metric {}: the formula gives a {}, not a number",
                spec.name,
                match other {
                    ExprValue::Bool(_) => "boolean",
                    ExprValue::Str(_) => "string",
                    ExprValue::List(_) => "list",
                    _ => "nil",
                }
            ));
        }
        Err(e) => return Err(format!("{what}: metric {}: {e}", spec.name)),
    }
    Ok(Metric {
        name: spec.name.clone(),
        scope,
        expr,
    })
}

impl Plan {
    /// Checks the event sets and global metrics: names, scopes, and that every formula reads
    /// only what it may.
    pub fn new(sets: &[EventSetSpec], globals: &[MetricSpec]) -> Result<Plan, String> {
        if sets.is_empty() {
            return Err("no event set given (eventsets)".to_owned());
        }
        if sets.len() > MAX_EVENT_SETS {
            return Err(format!("more than {MAX_EVENT_SETS} event sets"));
        }
        if globals.len() > MAX_METRICS {
            return Err(format!("more than {MAX_METRICS} global metrics"));
        }
        let mut checked = Vec::with_capacity(sets.len());
        let mut all_metrics: Vec<String> = vec!["gotime".to_owned()];
        for (i, set) in sets.iter().enumerate() {
            let what = format!("event set {i}");
            if set.events.is_empty() {
                return Err(format!("{what}: no events given"));
            }
            if set.events.len() > MAX_EVENTS || set.metrics.len() > MAX_METRICS {
                return Err(format!(
                    "{what}: more than {MAX_EVENTS} events or {MAX_METRICS} metrics"
                ));
            }
            let mut events: BTreeMap<&str, &str> = BTreeMap::new();
            for (counter, event) in &set.events {
                if !valid_name(counter, &[]) {
                    return Err(format!(
                        "{what}: the counter {counter:?} is not a name (letters, digits, _)"
                    ));
                }
                if !valid_name(event, &['.', ':', '=']) {
                    return Err(format!(
                        "{what}: the event {event:?} of {counter} is not an event name"
                    ));
                }
                if events.insert(counter, event).is_some() {
                    return Err(format!("{what}: the counter {counter} is given twice"));
                }
            }
            let counters: Vec<String> = events.keys().map(|c| (*c).to_owned()).collect();
            let event_string = events
                .iter()
                .map(|(counter, event)| format!("{event}:{counter}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut known: Vec<String> = counters.clone();
            known.extend(["time", "inverseClock", "gotime"].map(str::to_owned));
            let mut metrics = Vec::with_capacity(set.metrics.len());
            for spec in &set.metrics {
                let m = metric(spec, &known, &what)?;
                known.push(m.name.clone());
                all_metrics.push(m.name.clone());
                metrics.push(m);
            }
            checked.push(EventSet {
                counters,
                event_string,
                metrics,
            });
        }
        let globals = globals
            .iter()
            .map(|spec| metric(spec, &all_metrics, "globalmetrics"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Plan {
            sets: checked,
            globals,
        })
    }
}

/// The values a formula reads at one hardware thread.
struct Values<'a> {
    values: &'a HashMap<&'a str, f64>,
}

impl ExprScope for Values<'_> {
    fn get(&self, var: &Var) -> ExprValue {
        match var_name(var).and_then(|name| self.values.get(name)) {
            Some(v) => ExprValue::Num(*v),
            None => ExprValue::Nil,
        }
    }
    fn has(&self, _place: Place, _key: &str) -> bool {
        false
    }
}

/// The index in `threads` of each socket's first hardware thread (the lowest CPU number),
/// by socket.
fn socket_leaders(threads: &[Thread]) -> BTreeMap<u32, usize> {
    let mut leaders: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, t) in threads.iter().enumerate() {
        leaders
            .entry(t.socket)
            .and_modify(|l| {
                if threads[*l].cpu > t.cpu {
                    *l = i;
                }
            })
            .or_insert(i);
    }
    leaders
}

/// Where a metric of `scope` is evaluated: (thread index, scope id).
fn places(
    scope: Scope,
    threads: &[Thread],
    leaders: &BTreeMap<u32, usize>,
) -> Vec<(usize, Option<u32>)> {
    match scope {
        Scope::Socket => leaders.iter().map(|(s, i)| (*i, Some(*s))).collect(),
        Scope::Node => (0..threads.len()).map(|i| (i, None)).collect(),
        _ => threads
            .iter()
            .enumerate()
            .map(|(i, t)| (i, Some(t.cpu)))
            .collect(),
    }
}

/// A value as sent: non-finite or failed values are 0 with `invalid_to_zero`, else none.
fn finish(value: Option<f64>, invalid_to_zero: bool) -> Option<f64> {
    match value {
        Some(v) if v.is_finite() => Some(v),
        _ => invalid_to_zero.then_some(0.0),
    }
}

fn number(expr: &Expr, scope: &Values<'_>) -> Option<f64> {
    match expr.eval(scope) {
        Ok(ExprValue::Num(v)) => Some(v),
        _ => None,
    }
}

impl Plan {
    /// The metric values of one round: `results` has one entry per event set, `None` for a
    /// set that was skipped. `inverse_clock` is 1 / the base clock in Hz, `gotime` the
    /// configured duration in seconds.
    pub fn evaluate(
        &self,
        threads: &[Thread],
        results: &[Option<SetResult>],
        inverse_clock: f64,
        gotime: f64,
        invalid_to_zero: bool,
    ) -> Vec<MetricValue> {
        let leaders = socket_leaders(threads);
        let mut out = Vec::new();
        // Each measured set's metric values by thread, for the global metrics.
        let mut metric_values: Vec<HashMap<&str, f64>> = vec![HashMap::new(); threads.len()];
        for (set, result) in self.sets.iter().zip(results) {
            let Some(result) = result else { continue };
            let mut params: Vec<HashMap<&str, f64>> = (0..threads.len())
                .map(|t| {
                    let mut p: HashMap<&str, f64> = set
                        .counters
                        .iter()
                        .enumerate()
                        .map(|(c, name)| {
                            let v = result
                                .values
                                .get(t)
                                .and_then(|row| row.get(c))
                                .copied()
                                .unwrap_or(f64::NAN);
                            let v = if invalid_to_zero && !v.is_finite() {
                                0.0
                            } else {
                                v
                            };
                            (name.as_str(), v)
                        })
                        .collect();
                    p.insert("time", result.time);
                    p.insert("inverseClock", inverse_clock);
                    p.insert("gotime", gotime);
                    p
                })
                .collect();
            for m in &set.metrics {
                for (t, scope_id) in places(m.scope, threads, &leaders) {
                    let value = number(&m.expr, &Values { values: &params[t] });
                    let Some(value) = finish(value, invalid_to_zero) else {
                        continue;
                    };
                    params[t].insert(m.name.as_str(), value);
                    metric_values[t].insert(m.name.as_str(), value);
                    out.push(MetricValue {
                        name: m.name.clone(),
                        scope: m.scope,
                        scope_id,
                        value,
                    });
                }
            }
        }
        if results.iter().any(Option::is_some) {
            for values in &mut metric_values {
                values.insert("gotime", gotime);
            }
            for m in &self.globals {
                for (t, scope_id) in places(m.scope, threads, &leaders) {
                    let value = number(
                        &m.expr,
                        &Values {
                            values: &metric_values[t],
                        },
                    );
                    let Some(value) = finish(value, invalid_to_zero) else {
                        continue;
                    };
                    out.push(MetricValue {
                        name: m.name.clone(),
                        scope: m.scope,
                        scope_id,
                        value,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, calc: &str, scope: &str) -> MetricSpec {
        MetricSpec {
            name: name.into(),
            calc: calc.into(),
            scope: scope.into(),
        }
    }

    fn set(events: &[(&str, &str)], metrics: Vec<MetricSpec>) -> EventSetSpec {
        EventSetSpec {
            events: events
                .iter()
                .map(|(c, e)| ((*c).to_owned(), (*e).to_owned()))
                .collect(),
            metrics,
        }
    }

    #[test]
    fn event_strings_are_sorted_by_counter_and_formulas_are_checked() {
        let plan = Plan::new(
            &[set(
                &[("PMC1", "B"), ("FIXC0", "INSTR_RETIRED_ANY"), ("PMC0", "A")],
                vec![m("x", "PMC0/time", "hwthread"), m("y", "x*2", "socket")],
            )],
            &[m("z", "x+y", "hwthread")],
        )
        .unwrap();
        assert_eq!(
            plan.sets[0].event_string,
            "INSTR_RETIRED_ANY:FIXC0,A:PMC0,B:PMC1"
        );
        let unknown = Plan::new(
            &[set(&[("PMC0", "A")], vec![m("x", "PMC9", "hwthread")])],
            &[],
        )
        .unwrap_err();
        assert!(unknown.contains("\"PMC9\""), "{unknown}");
        let later = Plan::new(
            &[set(
                &[("PMC0", "A")],
                vec![m("x", "y", "hwthread"), m("y", "1", "hwthread")],
            )],
            &[],
        )
        .unwrap_err();
        assert!(later.contains("\"y\""), "{later}");
        let scope =
            Plan::new(&[set(&[("PMC0", "A")], vec![m("x", "PMC0", "die")])], &[]).unwrap_err();
        assert!(scope.contains("\"die\""), "{scope}");
        let comma = Plan::new(&[set(&[("PMC0", "A,B:PMC1")], vec![])], &[]).unwrap_err();
        assert!(comma.contains("not an event name"), "{comma}");
        let boolean = Plan::new(
            &[set(&[("PMC0", "A")], vec![m("x", "PMC0 > 1", "node")])],
            &[],
        )
        .unwrap_err();
        assert!(boolean.contains("boolean"), "{boolean}");
    }

    #[test]
    fn socket_metrics_are_taken_on_the_first_thread_of_each_socket() {
        let plan = Plan::new(
            &[set(
                &[("PMC0", "A"), ("PWR0", "E")],
                vec![
                    m("a", "PMC0/time", "hwthread"),
                    m("p", "PWR0/time", "socket"),
                ],
            )],
            &[m("g", "a*2", "hwthread"), m("n", "a", "node")],
        )
        .unwrap();
        let threads = [
            Thread { cpu: 2, socket: 1 },
            Thread { cpu: 0, socket: 0 },
            Thread { cpu: 1, socket: 1 },
        ];
        let result = SetResult {
            values: vec![vec![4.0, 0.0], vec![6.0, 10.0], vec![8.0, 20.0]],
            time: 2.0,
        };
        let got = plan.evaluate(&threads, &[Some(result)], 1e-9, 2.0, false);
        let find = |name: &str, id: Option<u32>| {
            got.iter()
                .find(|v| v.name == name && v.scope_id == id)
                .map(|v| v.value)
        };
        assert_eq!(find("a", Some(2)), Some(2.0));
        assert_eq!(find("p", Some(0)), Some(5.0));
        // Socket 1's first thread is CPU 1, whatever order the threads come in.
        assert_eq!(find("p", Some(1)), Some(10.0));
        assert_eq!(find("g", Some(0)), Some(6.0));
        assert_eq!(got.iter().filter(|v| v.name == "n").count(), 3);
        assert!(
            got.iter()
                .filter(|v| v.name == "n")
                .all(|v| v.scope_id.is_none())
        );
    }

    #[test]
    fn failures_are_zero_with_invalid_to_zero_and_absent_without() {
        let plan = Plan::new(
            &[set(&[("PMC0", "A")], vec![m("r", "PMC0/time", "hwthread")])],
            &[],
        )
        .unwrap();
        let threads = [Thread { cpu: 0, socket: 0 }];
        let zero_time = SetResult {
            values: vec![vec![1.0]],
            time: 0.0,
        };
        let none = plan.evaluate(&threads, &[Some(zero_time.clone())], 1.0, 1.0, false);
        assert!(none.is_empty(), "{none:?}");
        let zero = plan.evaluate(&threads, &[Some(zero_time)], 1.0, 1.0, true);
        assert_eq!(zero[0].value, 0.0);
        assert!(plan.evaluate(&threads, &[None], 1.0, 1.0, true).is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any event sets and formulas, from names that exist and bytes that do not: the
        /// check never panics, and an accepted plan evaluates any counter values (NaN,
        /// infinities, zeros) to finite values only.
        #[test]
        fn any_formulas_and_event_sets_check_and_evaluate_without_panic(
            events in proptest::collection::vec(("(PMC[0-3]|FIXC[0-2]|[A-Z,:]{0,6})", "[A-Z_:,=.]{0,12}"), 0..5),
            formulas in proptest::collection::vec(
                ("[a-z]{1,3}", "(PMC[0-3]|FIXC[0-2]|time|inverseClock|gotime|[a-z]{1,3}|[0-9.eE+-]{1,4}|[-+*/%() ]|==|&&|'x'|true|len\\(|sum\\(){1,12}", "(hwthread|socket|node|core|memoryDomain|die)"),
                0..5,
            ),
            values in proptest::collection::vec(proptest::prelude::any::<f64>(), 0..12),
            time in proptest::prelude::any::<f64>(),
            invalid_to_zero in proptest::prelude::any::<bool>(),
        ) {
            let metrics: Vec<MetricSpec> = formulas
                .iter()
                .map(|(name, calc, scope)| m(name, calc, scope))
                .collect();
            let (local, global) = metrics.split_at(metrics.len() / 2);
            let spec = EventSetSpec { events: events.clone(), metrics: local.to_vec() };
            if let Ok(plan) = Plan::new(&[spec], global) {
                let threads = [Thread { cpu: 0, socket: 0 }, Thread { cpu: 5, socket: 1 }];
                let rows = vec![values.clone(), values.iter().rev().copied().collect()];
                let result = SetResult { values: rows, time };
                for v in plan.evaluate(&threads, &[Some(result)], 1e-9, 1.0, invalid_to_zero) {
                    proptest::prop_assert!(v.value.is_finite(), "{v:?}");
                }
            }
        }
    }
}
