//! The `fleet-ceiling` an imported configuration carries: what its collectors are granted,
//! so the fleet can roll the same collectors out to the node without anyone editing it.

use serde_json::{Map, Value, json};

/// The ceiling admitting every grant in `grants` (the collectors' `capabilities`) beside the
/// default one's files of `/proc` and `/sys` and the mount table. Flags are set when any
/// collector sets them, lists joined, commands taken as the collectors define them (the
/// first definition of a name wins; the import defines each name once).
pub(crate) fn covering<'a>(grants: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut ceiling = Map::new();
    ceiling.insert("read-files".into(), json!(["/proc/**", "/sys/**"]));
    ceiling.insert("mount-info".into(), json!(true));
    for grant in grants {
        let Value::Object(grant) = grant else {
            continue;
        };
        for (key, value) in grant {
            // An entry the agent would refuse anyway stays out of the ceiling.
            let value = &match (key.as_str(), value) {
                ("read-files", Value::Array(items)) => Value::Array(
                    items
                        .iter()
                        .filter(|i| {
                            i.as_str()
                                .is_some_and(|p| crate::plugin::files::Pattern::parse(p).is_ok())
                        })
                        .cloned()
                        .collect(),
                ),
                _ => value.clone(),
            };
            match (ceiling.get_mut(key), value) {
                (None, value) => {
                    ceiling.insert(key.clone(), value.clone());
                }
                (Some(Value::Bool(have)), Value::Bool(more)) => *have |= *more,
                (Some(Value::Array(have)), Value::Array(more)) => {
                    for item in more {
                        if !have.contains(item) {
                            have.push(item.clone());
                        }
                    }
                }
                (Some(Value::Object(have)), Value::Object(more)) => {
                    for (name, definition) in more {
                        have.entry(name.clone())
                            .or_insert_with(|| definition.clone());
                    }
                }
                _ => {}
            }
        }
    }
    Value::Object(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_joins_the_collectors_grants() {
        let ceiling = covering(&[
            json!({"read-files": ["/proc/loadavg", "/etc/hostname", "relative/**"]}),
            json!({"run": {"ipmi-sensors": {"path": "/usr/bin/ipmitool"}}, "mount-info": true}),
            json!({"nvml": true}),
        ]);
        assert_eq!(
            ceiling,
            json!({"read-files": ["/proc/**", "/sys/**", "/proc/loadavg", "/etc/hostname"],
                   "mount-info": true, "nvml": true,
                   "run": {"ipmi-sensors": {"path": "/usr/bin/ipmitool"}}})
        );
        let parsed: crate::plugin::ceiling::Ceiling = serde_json::from_value(ceiling).unwrap();
        parsed.validate().unwrap();
    }
}
