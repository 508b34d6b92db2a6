//! A staged rollout as the configuration tree defines it: `rollouts/<name>.json`.
//!
//! ```json
//! {
//!   "type": "ccmc",
//!   "cluster": "fritz",
//!   "change": {"plugins": [{"name": "loadavg", "sha256": "3f0c…", "collect-interval": "10s"}]},
//!   "stages": [
//!     {"hosts": ["f0101", "f0102"], "min-time": "2m"},
//!     {"percent": 10, "min-time": "5m"},
//!     {"percent": 100}
//!   ],
//!   "min-running": 90,
//!   "max-failed": 5,
//!   "rollback-failed": 10
//! }
//! ```
//!
//! - `change` is a layer merged last into the configuration of every member the rollout has
//!   reached (objects merge, arrays and values replace: a `plugins` change lists every
//!   plugin). A member not reached, or every member after a rollback, is served the tree as
//!   it is.
//! - Stages are cumulative: stage *n* holds every member of stages 0 to *n*. A stage names
//!   host names, a share of the members (`percent`), or both. Which members a share holds
//!   is fixed by a hash of the rollout's name, the cluster and the host name, so a member
//!   never moves between stages while the rollout runs.
//! - Gates, per stage or for all: `min-time` (default `0s`) before it can pass,
//!   `min-running` (percent of the reporting members reached so far that run the change,
//!   default 90), `max-failed` (percent failing above which the rollout pauses, default 5)
//!   and `rollback-failed` (percent failing above which the change is taken back from every
//!   member, default 10). All three are percentages of the reporting members, not counts.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::wire::ServiceType;

/// Share units: a percent is 100 buckets.
pub const BUCKETS: u32 = 10_000;

/// One stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Host names this stage adds.
    pub hosts: Vec<String>,
    /// The share of members this stage reaches, in [`BUCKETS`] (cumulative with earlier
    /// stages' shares: the largest so far counts).
    pub share: u32,
    /// The shortest time the stage runs before it can pass.
    pub min_time: Duration,
    /// Percent of reporting reached members that must run the change.
    pub min_running: f64,
    /// Percent of reporting reached members failing above which the rollout pauses.
    pub max_failed: f64,
    /// Percent failing above which the rollout is rolled back.
    pub rollback_failed: f64,
}

impl Stage {
    /// The stage's reach and gates in words, for `server --check-config`. The failure gates
    /// are shares of the reporting members, like `min-running`; `"max-failed": 2` reads as
    /// two members where it means 2 %, so the unit is always spelled out.
    pub fn describe(&self) -> String {
        let mut reach = Vec::new();
        if !self.hosts.is_empty() {
            reach.push(format!("host(s) {}", self.hosts.join(",")));
        }
        if self.share > 0 {
            reach.push(format!(
                "{} % of the members",
                f64::from(self.share) * 100.0 / f64::from(BUCKETS)
            ));
        }
        if reach.is_empty() {
            reach.push("no members beyond the earlier stages".to_owned());
        }
        format!(
            "{}; passes after min-time {} with min-running {} % of the reporting members running it; pauses when more than max-failed {} % of them fail; rolls back when more than rollback-failed {} % fail",
            reach.join(" and "),
            crate::duration::format(self.min_time),
            self.min_running,
            self.max_failed,
            self.rollback_failed
        )
    }
}

/// A parsed rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// Its name (the file's name without `.json`).
    pub name: String,
    /// The service type it applies to.
    pub service_type: ServiceType,
    /// The cluster it is limited to, if any.
    pub cluster: Option<String>,
    /// The layer merged into reached members' configuration.
    pub change: Map<String, Value>,
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// `(plugin name, sha256)` of every plugin the change names by content.
    pub plugins: Vec<(String, String)>,
    /// Identifies this content: a changed definition is a new rollout.
    pub digest: i64,
}

pub(crate) const KEYS: [&str; 8] = [
    "type",
    "cluster",
    "change",
    "stages",
    "min-running",
    "max-failed",
    "rollback-failed",
    "min-time",
];
pub(crate) const STAGE_KEYS: [&str; 6] = [
    "hosts",
    "percent",
    "min-time",
    "min-running",
    "max-failed",
    "rollback-failed",
];

/// A rollout name: what a file name and a subject token can both hold.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'))
}

fn percent(value: Option<&Value>, key: &str, default: f64) -> Result<f64, String> {
    match value {
        None => Ok(default),
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..=100.0).contains(&p) => Ok(p),
            Some(p) => Err(format!(
                "`{key}` is {p}: it is a percentage of the reporting members, 0 to 100"
            )),
            None => Err(format!(
                "`{key}` must be a number: a percentage of the reporting members, 0 to 100"
            )),
        },
    }
}

fn duration(value: Option<&Value>, key: &str, default: Duration) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(Value::String(s)) => {
            crate::duration::parse(s).map_err(|e| format!("`{key}` {s:?}: {e}"))
        }
        Some(_) => Err(format!("`{key}` must be a duration such as \"5m\"")),
    }
}

/// Where a member falls among the rollout's shares: a fixed bucket below [`BUCKETS`].
pub fn bucket(rollout: &str, cluster: &str, hostname: &str) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [rollout, "|", cluster, "|", hostname] {
        for &b in part.as_bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    (hash % u64::from(BUCKETS)) as u32
}

impl Definition {
    /// Parses `rollouts/<name>.json`; an error names the key and the problem.
    pub fn parse(name: &str, layer: &Map<String, Value>) -> Result<Definition, String> {
        if !valid_name(name) {
            return Err(format!(
                "the name {name:?} is not a rollout name (lowercase letters, digits, - and _, at most 64)"
            ));
        }
        if let Some(key) = layer.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key `{key}` (known: {})", KEYS.join(", ")));
        }
        let service_type: ServiceType = match layer.get("type") {
            Some(Value::String(code)) => code
                .parse()
                .map_err(|_| format!("`type` {code:?} is not a service type"))?,
            _ => return Err("`type` (a service type such as \"ccmc\") is required".to_owned()),
        };
        let cluster = match layer.get("cluster") {
            None => None,
            Some(Value::String(c)) => {
                super::super::names::check_cluster(c).map_err(|e| format!("`cluster`: {e}"))?;
                Some(c.clone())
            }
            Some(_) => return Err("`cluster` must be a string".to_owned()),
        };
        let change = match layer.get("change") {
            Some(Value::Object(m)) if !m.is_empty() => m.clone(),
            _ => {
                return Err(
                    "`change` (the layer to roll out, a non-empty object) is required".to_owned(),
                );
            }
        };
        let mut plugins = Vec::new();
        if let Some(list) = change.get("plugins") {
            let Value::Array(list) = list else {
                return Err("`change.plugins` must be a list".to_owned());
            };
            for entry in list {
                if let Some(Value::String(sha)) = entry.get("sha256") {
                    if sha.len() != 64
                        || !sha
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    {
                        return Err(format!(
                            "`change.plugins`: {sha:?} is not a SHA-256 (64 lowercase hex digits)"
                        ));
                    }
                    let name = entry
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if name.is_empty() {
                        return Err(
                            "`change.plugins`: a plugin named by sha256 needs a `name` to be reported by".to_owned(),
                        );
                    }
                    plugins.push((name.to_owned(), sha.clone()));
                }
            }
        }
        let min_running = percent(layer.get("min-running"), "min-running", 90.0)?;
        let max_failed = percent(layer.get("max-failed"), "max-failed", 5.0)?;
        let rollback_failed = percent(layer.get("rollback-failed"), "rollback-failed", 10.0)?;
        let min_time = duration(layer.get("min-time"), "min-time", Duration::ZERO)?;
        let Some(Value::Array(raw_stages)) = layer.get("stages") else {
            return Err("`stages` (a list of at least one stage) is required".to_owned());
        };
        if raw_stages.is_empty() {
            return Err("`stages` is empty".to_owned());
        }
        let mut stages = Vec::new();
        let mut share_so_far = 0;
        for (i, raw) in raw_stages.iter().enumerate() {
            let at = |e: String| format!("stages[{i}]: {e}");
            let Value::Object(raw) = raw else {
                return Err(at("a stage must be an object".to_owned()));
            };
            if let Some(key) = raw.keys().find(|k| !STAGE_KEYS.contains(&k.as_str())) {
                return Err(at(format!(
                    "unknown key `{key}` (known: {})",
                    STAGE_KEYS.join(", ")
                )));
            }
            let mut hosts = Vec::new();
            if let Some(list) = raw.get("hosts") {
                let Value::Array(list) = list else {
                    return Err(at("`hosts` must be a list of host names".to_owned()));
                };
                for host in list {
                    let Value::String(host) = host else {
                        return Err(at("`hosts` must be a list of host names".to_owned()));
                    };
                    super::super::names::check_hostname(host)
                        .map_err(|e| at(format!("`hosts`: {e}")))?;
                    hosts.push(host.clone());
                }
            }
            let share = match raw.get("percent") {
                None => share_so_far,
                Some(_) => {
                    let p = percent(raw.get("percent"), "percent", 0.0).map_err(at)?;
                    let share = (p * f64::from(BUCKETS) / 100.0).round() as u32;
                    if share < share_so_far {
                        return Err(at(format!(
                            "`percent` {p} is below an earlier stage's: stages only grow"
                        )));
                    }
                    share
                }
            };
            if hosts.is_empty() && share == share_so_far && (i > 0 || share == 0) {
                return Err(at(
                    "the stage adds no member (name `hosts` or a larger `percent`)".to_owned(),
                ));
            }
            share_so_far = share;
            let stage_rollback = percent(
                raw.get("rollback-failed"),
                "rollback-failed",
                rollback_failed,
            )
            .map_err(at)?;
            let stage_max = percent(raw.get("max-failed"), "max-failed", max_failed).map_err(at)?;
            if stage_max > stage_rollback {
                return Err(at(format!(
                    "`max-failed` {stage_max} % is above `rollback-failed` {stage_rollback} %: the rollout would roll back before it pauses (both are percentages of the reporting members)"
                )));
            }
            stages.push(Stage {
                hosts,
                share,
                min_time: duration(raw.get("min-time"), "min-time", min_time).map_err(at)?,
                min_running: percent(raw.get("min-running"), "min-running", min_running)
                    .map_err(at)?,
                max_failed: stage_max,
                rollback_failed: stage_rollback,
            });
        }
        let mut text = Vec::new();
        super::super::configtree::write_go_json(&mut text, &Value::Object(layer.clone()));
        Ok(Definition {
            name: name.to_owned(),
            service_type,
            cluster,
            change,
            stages,
            plugins,
            digest: super::super::configtree::revision_of(&text),
        })
    }

    /// Whether a member of this type and cluster is in the rollout's scope.
    pub fn covers(&self, service_type: ServiceType, cluster: &str) -> bool {
        service_type == self.service_type && self.cluster.as_deref().is_none_or(|c| c == cluster)
    }

    /// Whether stage `stage` (cumulative) holds the member.
    pub fn reaches(&self, stage: usize, cluster: &str, hostname: &str) -> bool {
        let upto = &self.stages[..=stage.min(self.stages.len() - 1)];
        if upto.iter().any(|s| s.hosts.iter().any(|h| h == hostname)) {
            return true;
        }
        let share = upto.iter().map(|s| s.share).max().unwrap_or(0);
        share > 0 && bucket(&self.name, cluster, hostname) < share
    }

    /// The cache key of the change as served: the rollout and its content.
    pub fn overlay_key(&self) -> String {
        format!("rollout:{}:{}", self.name, self.digest)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_stage_is_described_with_its_failure_gates_as_percentages() {
        let stage = Stage {
            hosts: vec!["f0101".to_owned()],
            share: 1_000,
            min_time: Duration::from_secs(600),
            min_running: 95.0,
            max_failed: 2.0,
            rollback_failed: 5.0,
        };
        let text = stage.describe();
        for part in [
            "host(s) f0101 and 10 % of the members",
            "min-time 10m0s",
            "min-running 95 %",
            "more than max-failed 2 % of them fail",
            "more than rollback-failed 5 % fail",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }

    fn parse(v: Value) -> Result<Definition, String> {
        let Value::Object(m) = v else { panic!() };
        Definition::parse("canary", &m)
    }

    fn good() -> Value {
        json!({"type": "ccmc", "change": {"plugins": [{"name": "loadavg", "sha256": "a".repeat(64)}]},
               "stages": [{"hosts": ["n1"]}, {"percent": 10}, {"percent": 100}]})
    }

    #[test]
    fn a_definition_parses_with_defaults() {
        let d = parse(good()).unwrap();
        assert_eq!(d.stages.len(), 3);
        assert_eq!(d.stages[1].share, 1000);
        assert_eq!(d.stages[0].min_running, 90.0);
        assert_eq!(d.plugins, vec![("loadavg".to_owned(), "a".repeat(64))]);
        assert!(d.reaches(0, "c", "n1"));
        assert!(
            d.reaches(2, "c", "anything"),
            "100 percent reaches everyone"
        );
    }

    #[test]
    fn shares_are_stable_and_about_their_size() {
        let d = parse(good()).unwrap();
        let reached: Vec<bool> = (0..2000)
            .map(|i| d.reaches(1, "fritz", &format!("f{i:04}")))
            .collect();
        let count = reached.iter().filter(|r| **r).count();
        assert!((120..=280).contains(&count), "about 10 % of 2000: {count}");
        let again: Vec<bool> = (0..2000)
            .map(|i| d.reaches(1, "fritz", &format!("f{i:04}")))
            .collect();
        assert_eq!(reached, again);
        for i in 0..2000 {
            let host = format!("f{i:04}");
            assert!(
                !d.reaches(1, "fritz", &host) || d.reaches(2, "fritz", &host),
                "cumulative"
            );
        }
    }

    #[test]
    fn bad_definitions_are_refused_naming_the_problem() {
        let sha = "a".repeat(64);
        for (v, problem) in [
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 150}]}),
                "0 to 100",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 50}, {"percent": 20}]}),
                "only grow",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 50}, {"min-time": "1m"}]}),
                "adds no member",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"hosts": ["bad host"]}]}),
                "`hosts`",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": []}),
                "empty",
            ),
            (
                json!({"type": "nope", "change": {"x": 1}, "stages": [{"percent": 1}]}),
                "not a service type",
            ),
            (
                json!({"type": "ccmc", "stages": [{"percent": 1}]}),
                "`change`",
            ),
            (
                json!({"type": "ccmc", "change": {"plugins": [{"name": "x", "sha256": "ABC"}]}, "stages": [{"percent": 1}]}),
                "not a SHA-256",
            ),
            (
                json!({"type": "ccmc", "change": {"plugins": [{"sha256": sha}]}, "stages": [{"percent": 1}]}),
                "needs a `name`",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 1, "max-failed": 50}]}),
                "above `rollback-failed`",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 1, "min-time": "soon"}]}),
                "min-time",
            ),
            (
                json!({"type": "ccmc", "change": {"x": 1}, "stages": [{"percent": 1}], "speed": 2}),
                "unknown key `speed`",
            ),
        ] {
            let e = parse(v.clone()).unwrap_err();
            assert!(e.contains(problem), "{v}: {e}");
        }
        let Value::Object(m) = good() else { panic!() };
        assert!(
            Definition::parse("Bad Name", &m)
                .unwrap_err()
                .contains("not a rollout name")
        );
    }

    #[test]
    fn a_changed_definition_has_another_digest() {
        let a = parse(good()).unwrap();
        let mut changed = good();
        changed["stages"][1]["percent"] = json!(20);
        assert_ne!(a.digest, parse(changed).unwrap().digest);
        assert_eq!(a.digest, parse(good()).unwrap().digest);
    }
}
