//! The JSON Schema of a rollout file (`rollouts/<name>.json` of the configuration tree), for
//! the book's configuration reference. The file is read by hand in [`super::definition`],
//! key by key; the types here only describe it, and a test holds their keys to the ones
//! `definition` reads.

use std::collections::BTreeMap;

/// A staged rollout: a file `rollouts/<name>.json` of the configuration tree (name: lowercase
/// letters, digits, `-`, `_`). It takes a change to a few members first and further only
/// while they stay healthy, and takes it back when they fail. Every share is a percentage of
/// the reached members that send reports, never a count.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(dead_code)]
struct RolloutFile {
    /// The service type of the members it covers (`ccmc`, ...); one rollout per type and
    /// cluster at a time. Required.
    #[serde(rename = "type")]
    kind: String,
    /// The cluster it is limited to. Default: every cluster of the type.
    cluster: Option<String>,
    /// A layer merged last into the configuration of every member the rollout has reached:
    /// objects merge key by key, lists and values replace, so a `plugins` change lists every
    /// plugin the members run. Any key may be staged. Required.
    change: BTreeMap<String, serde_json::Value>,
    /// The stages, cumulative: stage n holds every member of stages 0 to n. Required.
    stages: Vec<Stage>,
    /// Percent of the reached, reporting members that must run the change before a stage
    /// passes. Default 90.
    min_running: Option<f64>,
    /// Percent of them failing above which the rollout pauses. Default 5.
    max_failed: Option<f64>,
    /// Percent of them failing above which the change is taken back from every member.
    /// Default 10.
    rollback_failed: Option<f64>,
    /// The shortest time each stage runs before it can pass, measured from the stage's start
    /// or resumption (Go duration). Default `0s`.
    min_time: Option<String>,
}

/// One stage: by host names, by share, or both.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(dead_code)]
struct Stage {
    /// Host names this stage adds.
    hosts: Option<Vec<String>>,
    /// The share of the covered members the rollout reaches by the end of this stage, 0 to
    /// 100. Which members a share holds is fixed by a hash of the rollout's name, the cluster
    /// and the host name, so a member never moves between stages and a larger share only
    /// adds members.
    percent: Option<f64>,
    /// This stage's `min-time`. Default: the rollout's.
    min_time: Option<String>,
    /// This stage's `min-running`. Default: the rollout's.
    min_running: Option<f64>,
    /// This stage's `max-failed`. Default: the rollout's.
    max_failed: Option<f64>,
    /// This stage's `rollback-failed`. Default: the rollout's.
    rollback_failed: Option<f64>,
}

/// The JSON Schema of a rollout file, its keys described by their documentation.
pub fn json_schema() -> schemars::Schema {
    schemars::schema_for!(RolloutFile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(schema: &serde_json::Value) -> Vec<String> {
        let mut keys: Vec<String> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn the_schema_has_the_keys_the_definition_reads() {
        let schema = serde_json::to_value(json_schema()).unwrap();
        let mut expected: Vec<String> = super::super::definition::KEYS
            .iter()
            .map(|k| k.to_string())
            .collect();
        expected.sort();
        assert_eq!(keys(&schema), expected);
        let mut expected: Vec<String> = super::super::definition::STAGE_KEYS
            .iter()
            .map(|k| k.to_string())
            .collect();
        expected.sort();
        assert_eq!(keys(&schema["$defs"]["Stage"]), expected);
    }
}
