//! One plugin entry of the fleet's `plugins` list, read as the fleet may write it and held
//! to the node's ceiling ([`crate::plugin::ceiling`]).
//!
//! An entry has `name`, `sha256`, `config` (the plugin's own data, never checked), and
//! `collect-interval`, `limits` and `capabilities`, each within the ceiling. A command is
//! named, not defined: `"run": ["ipmi-sensors"]` (or `{"ipmi-sensors": {}}`, or the node's
//! very definition, as older trees write it) runs the command the ceiling defines under
//! that name. A native library is the node's: with `nvml` (`likwid`) granted, the plugin
//! loads the ceiling's `nvml-library` (`likwid-library`, `rocm-smi-library`), else the
//! environment's, else the system's.

use std::path::Path;

use ccfleet::untrusted::Untrusted;
use serde::Deserialize;

use crate::PluginSpec;
use crate::plugin::ceiling::{Ceiling, Escalation};
use crate::plugin::{Capabilities, Limits};

/// A fleet plugin entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FleetEntry {
    name: String,
    sha256: String,
    #[serde(default)]
    config: Option<serde_json::Value>,
    #[serde(default)]
    collect_interval: Option<String>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    capabilities: Option<serde_json::Value>,
}

/// An entry read and checked.
#[derive(Debug)]
pub enum Checked {
    /// Within the ceiling: the plugin to run, its component in the download directory.
    Admitted {
        /// The fleet's name for it.
        name: String,
        /// Its component's SHA-256.
        sha256: String,
        /// How it runs (boxed: it is most of the entry).
        spec: Box<PluginSpec>,
    },
    /// Beyond the ceiling: not run.
    Refused {
        /// The fleet's name for it.
        name: String,
        /// Its component's SHA-256.
        sha256: String,
        /// The first grant found beyond the ceiling.
        escalation: Escalation,
    },
}

/// Reads one entry; `Err` for an entry that is not a plugin entry at all (the whole list is
/// then kept as it was), [`Checked::Refused`] for one asking for more than the ceiling.
pub fn check(entry: &serde_json::Value, dir: &Path, ceiling: &Ceiling) -> Result<Checked, String> {
    let Some(object) = entry.as_object() else {
        return Err("not an object".to_owned());
    };
    if object.contains_key("path") {
        return Err("a fleet plugin is named by sha256, not by path".to_owned());
    }
    if !matches!(object.get("sha256"), Some(serde_json::Value::String(_))) {
        return Err("sha256 is missing or not a string".to_owned());
    }
    match object.get("name") {
        Some(serde_json::Value::String(name)) if !name.trim().is_empty() => {}
        _ => return Err("name is missing (a fleet plugin needs one)".to_owned()),
    }
    let entry: FleetEntry = ccfleet::json_config::from_value(entry.clone(), "")
        .map_err(|e| Untrusted(&e.to_string()).capped(300).to_string())?;
    if !ccfleet::server::plugins::is_sha256(&entry.sha256) {
        return Err("sha256 must be 64 lowercase hexadecimal digits".to_owned());
    }
    let collect_interval = entry
        .collect_interval
        .as_deref()
        .map(ccfleet::duration::parse)
        .transpose()
        .map_err(|e| format!("collect-interval: {e}"))?;
    let (name, sha256) = (entry.name, entry.sha256);
    let refuse = |escalation: Escalation| Checked::Refused {
        name: name.clone(),
        sha256: sha256.clone(),
        escalation,
    };
    let caps = match named_commands(entry.capabilities, ceiling) {
        Ok(caps) => caps,
        Err(Named::Escalation(e)) => return Ok(refuse(e)),
        Err(Named::Invalid(why)) => return Err(why),
    };
    let mut caps: Capabilities = ccfleet::json_config::from_value(caps, "capabilities")
        .map_err(|e| Untrusted(&e.to_string()).capped(300).to_string())?;
    if let Err(e) = caps
        .within(&ceiling.capabilities)
        .and_then(|()| ceiling.admits_limits(&entry.limits))
        .and_then(|()| ceiling.admits_interval(collect_interval))
    {
        return Ok(refuse(e));
    }
    // What the node decides, whatever the fleet wrote.
    caps.files_root = ceiling.capabilities.files_root.clone();
    // Each native library is the node's: the fleet sets a flag, never a path.
    caps.nvml_library = ceiling
        .capabilities
        .nvml_library
        .clone()
        .filter(|_| caps.nvml);
    caps.likwid_library = ceiling
        .capabilities
        .likwid_library
        .clone()
        .filter(|_| caps.likwid);
    caps.rocm_smi_library = ceiling
        .capabilities
        .rocm_smi_library
        .clone()
        .filter(|_| caps.rocm_smi);
    let spec = PluginSpec {
        name: Some(name.clone()),
        path: dir.join(format!("{sha256}.wasm")),
        config: entry
            .config
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new())),
        collect_interval,
        limits: entry.limits,
        capabilities: caps,
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(Checked::Admitted {
        name,
        sha256,
        spec: Box::new(spec),
    })
}

enum Named {
    Escalation(Escalation),
    Invalid(String),
}

/// The capabilities with each command the fleet names replaced by the ceiling's definition
/// of that name; a definition the fleet writes itself is left for
/// [`Capabilities::within`] to compare with the node's.
fn named_commands(
    caps: Option<serde_json::Value>,
    ceiling: &Ceiling,
) -> Result<serde_json::Value, Named> {
    let mut caps = match caps {
        None => return Ok(serde_json::Value::Object(serde_json::Map::new())),
        Some(serde_json::Value::Object(caps)) => caps,
        Some(_) => return Err(Named::Invalid("capabilities is not an object".to_owned())),
    };
    let Some(run) = caps.remove("run") else {
        return Ok(serde_json::Value::Object(caps));
    };
    let names: Vec<(String, Option<serde_json::Value>)> = match run {
        serde_json::Value::Array(list) => list
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(name) => Ok((name, None)),
                _ => Err(Named::Invalid(
                    "capabilities.run: a list of command names".to_owned(),
                )),
            })
            .collect::<Result<_, _>>()?,
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(name, v)| match v {
                serde_json::Value::Object(o) if o.is_empty() => (name, None),
                v => (name, Some(v)),
            })
            .collect(),
        _ => {
            return Err(Named::Invalid(
                "capabilities.run: a list of command names".to_owned(),
            ));
        }
    };
    let mut out = serde_json::Map::new();
    for (name, written) in names {
        let value = match written {
            Some(v) => v,
            None => match ceiling.capabilities.run.get(&name) {
                Some(defined) => serde_json::to_value(defined)
                    .map_err(|e| Named::Invalid(format!("capabilities.run.{name}: {e}")))?,
                None => {
                    return Err(Named::Escalation(Escalation {
                        grant: format!("capabilities.run.{name}"),
                    }));
                }
            },
        };
        out.insert(name, value);
    }
    caps.insert("run".to_owned(), serde_json::Value::Object(out));
    Ok(serde_json::Value::Object(caps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::commands::RunGrant;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn ceiling() -> Ceiling {
        let mut top = Ceiling::default();
        let mut sensors = RunGrant::new("/usr/bin/ipmitool");
        sensors.args = vec!["sensor".into()];
        top.capabilities.run.insert("ipmi-sensors".into(), sensors);
        top.capabilities.nvml = true;
        top.capabilities.nvml_library = Some("/opt/nvidia/libnvidia-ml.so.1".into());
        top.capabilities.likwid = true;
        top.capabilities.likwid_library = Some("/apps/likwid/lib/liblikwid.so.5".into());
        top.capabilities.rocm_smi = true;
        top.capabilities.rocm_smi_library = Some("/opt/rocm/lib/librocm_smi64.so.5".into());
        top
    }

    fn refused(entry: serde_json::Value) -> String {
        match check(&entry, Path::new("/d"), &ceiling()).unwrap() {
            Checked::Refused { escalation, .. } => escalation.grant,
            Checked::Admitted { spec, .. } => panic!("admitted: {spec:?}"),
        }
    }

    fn admitted(entry: serde_json::Value) -> PluginSpec {
        match check(&entry, Path::new("/d"), &ceiling()).unwrap() {
            Checked::Admitted { spec, .. } => *spec,
            Checked::Refused { escalation, .. } => panic!("refused: {escalation}"),
        }
    }

    #[test]
    fn a_named_command_runs_the_nodes_definition() {
        for run in [
            serde_json::json!(["ipmi-sensors"]),
            serde_json::json!({"ipmi-sensors": {}}),
            serde_json::json!({"ipmi-sensors": {"path": "/usr/bin/ipmitool", "args": ["sensor"]}}),
        ] {
            let spec = admitted(serde_json::json!({"name": "ipmi", "sha256": SHA,
                "capabilities": {"run": run}}));
            let grant = &spec.capabilities.run["ipmi-sensors"];
            assert_eq!(grant.path, Path::new("/usr/bin/ipmitool"));
            assert_eq!(grant.args, ["sensor"]);
        }
        let why = refused(serde_json::json!({"name": "ipmi", "sha256": SHA,
            "capabilities": {"run": {"ipmi-sensors": {"path": "/bin/sh",
                "args": ["-c", "id"], "user": "root"}}}}));
        assert!(why.contains("definition of its own"), "{why}");
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "capabilities": {"run": ["pwn"]}}));
        assert!(why.contains("capabilities.run.pwn"), "{why}");
    }

    #[test]
    fn the_nodes_library_is_loaded_and_the_fleets_refused() {
        let spec = admitted(serde_json::json!({"name": "gpu", "sha256": SHA,
            "capabilities": {"nvml": true}}));
        assert_eq!(
            spec.capabilities.nvml_library.as_deref(),
            Some(Path::new("/opt/nvidia/libnvidia-ml.so.1"))
        );
        let why = refused(serde_json::json!({"name": "gpu", "sha256": SHA,
            "capabilities": {"nvml": true, "nvml-library": "/tmp/evil.so"}}));
        assert!(why.contains("nvml-library"), "{why}");
        assert_eq!(spec.capabilities.likwid_library, None);
    }

    #[test]
    fn the_nodes_rocm_smi_library_is_loaded_and_the_fleets_refused() {
        let spec = admitted(serde_json::json!({"name": "amd", "sha256": SHA,
            "capabilities": {"rocm-smi": true}}));
        assert_eq!(
            spec.capabilities.rocm_smi_library.as_deref(),
            Some(Path::new("/opt/rocm/lib/librocm_smi64.so.5"))
        );
        assert_eq!(spec.capabilities.nvml_library, None);
        for library in ["/tmp/evil.so", "/opt/rocm/lib/librocm_smi64.so.5"] {
            let why = refused(serde_json::json!({"name": "amd", "sha256": SHA,
                "capabilities": {"rocm-smi": true, "rocm-smi-library": library}}));
            assert!(why.contains("rocm-smi-library"), "{why}");
        }
        let mut plain = Ceiling::default();
        plain.capabilities.rocm_smi_library = Some("/opt/rocm/lib/librocm_smi64.so.5".into());
        let entry = serde_json::json!({"name": "amd", "sha256": SHA,
            "capabilities": {"rocm-smi": true}});
        match check(&entry, Path::new("/d"), &plain).unwrap() {
            Checked::Refused { escalation, .. } => {
                assert_eq!(escalation.grant, "capabilities.rocm-smi")
            }
            Checked::Admitted { spec, .. } => panic!("admitted: {spec:?}"),
        }
    }

    #[test]
    fn the_nodes_likwid_library_is_loaded_and_the_fleets_refused() {
        let spec = admitted(serde_json::json!({"name": "counters", "sha256": SHA,
            "capabilities": {"likwid": true}}));
        assert_eq!(
            spec.capabilities.likwid_library.as_deref(),
            Some(Path::new("/apps/likwid/lib/liblikwid.so.5"))
        );
        assert_eq!(spec.capabilities.nvml_library, None);
        for library in ["/tmp/evil.so", "/apps/likwid/lib/liblikwid.so.5"] {
            let why = refused(serde_json::json!({"name": "counters", "sha256": SHA,
                "capabilities": {"likwid": true, "likwid-library": library}}));
            assert!(why.contains("likwid-library"), "{why}");
        }
        let mut plain = Ceiling::default();
        plain.capabilities.likwid_library = Some("/apps/likwid/lib/liblikwid.so.5".into());
        let entry = serde_json::json!({"name": "counters", "sha256": SHA,
            "capabilities": {"likwid": true}});
        match check(&entry, Path::new("/d"), &plain).unwrap() {
            Checked::Refused { escalation, .. } => {
                assert_eq!(escalation.grant, "capabilities.likwid")
            }
            Checked::Admitted { spec, .. } => panic!("admitted: {spec:?}"),
        }
    }

    #[test]
    fn limits_intervals_and_files_are_held_to_the_ceiling() {
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "limits": {"memory-mb": 768}}));
        assert!(why.contains("limits.memory-mb 768"), "{why}");
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "limits": {"log-lines-per-second": 100000, "log-burst": 100000}}));
        assert!(why.contains("limits.log"), "{why}");
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "collect-interval": "1ms"}));
        assert!(why.contains("collect-interval 1ms"), "{why}");
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "capabilities": {"read-files": ["/**"]}}));
        assert!(why.contains("read-files entry /**"), "{why}");
        let why = refused(serde_json::json!({"name": "x", "sha256": SHA,
            "capabilities": {"wasi": true, "read-dirs": ["/etc"]}}));
        assert!(why.contains("capabilities.wasi"), "{why}");
        let spec = admitted(serde_json::json!({"name": "x", "sha256": SHA,
            "collect-interval": "10s", "limits": {"memory-mb": 16},
            "capabilities": {"read-files": ["/proc/loadavg"]}, "config": {"a": 1}}));
        assert_eq!(spec.limits.memory_mb, 16);
        assert_eq!(spec.config, serde_json::json!({"a": 1}));
        assert_eq!(spec.path, Path::new(&format!("/d/{SHA}.wasm")));
    }

    #[test]
    fn malformed_entries_are_errors_not_refusals() {
        for (entry, why) in [
            (
                serde_json::json!({"name": "x", "sha256": SHA, "path": "/etc/shadow"}),
                "not by path",
            ),
            (
                serde_json::json!({"name": "x", "sha256": SHA, "colour": 1}),
                "colour",
            ),
            (
                serde_json::json!({"name": "x", "sha256": SHA, "capabilities": {"colour": 1}}),
                "colour",
            ),
            (
                serde_json::json!({"name": "x", "sha256": SHA, "capabilities": {"run": 3}}),
                "command names",
            ),
            (serde_json::json!({"sha256": SHA}), "name is missing"),
        ] {
            let err = check(&entry, Path::new("/d"), &ceiling()).unwrap_err();
            assert!(err.contains(why), "{entry}: {err}");
        }
    }
}

/// Property: nothing the fleet sends widens a grant past the ceiling.
#[cfg(test)]
mod widening {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use serde_json::{Value, json};

    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    const PATTERNS: [&str; 12] = [
        "/**",
        "/proc/**",
        "/proc/loadavg",
        "/proc/*/stat",
        "/sys/**",
        "/sys/class/*/temp",
        "/etc/shadow",
        "/etc/**",
        "/home/*/.ssh/id_rsa",
        "/root/x",
        "/srv/data/**",
        "/*",
    ];
    const DIRS: [&str; 4] = ["/etc", "/srv/data", "/srv/data/a", "/var/lib"];

    fn pick<T: Clone + std::fmt::Debug + 'static>(pool: &'static [T]) -> impl Strategy<Value = T> {
        proptest::sample::select(pool)
    }

    fn command() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            Just(json!({"path": "/bin/echo", "args": ["node"]})),
            Just(json!({"path": "/bin/sh", "args": ["-c", "id"], "user": "root"})),
            Just(json!({"path": "/bin/echo", "args": ["node"], "timeout": "24h"})),
        ]
    }

    /// Capabilities each grant of which is present with probability `p` (a fleet's entries
    /// ask for little, most of them within a ceiling; a ceiling grants much).
    fn capabilities(p: f64) -> impl Strategy<Value = Value> {
        let some = move |list: BoxedStrategy<Vec<&'static str>>| {
            proptest::option::weighted(p, list).prop_map(Option::unwrap_or_default)
        };
        (
            proptest::bool::weighted(p),
            some(proptest::collection::vec(pick(&DIRS), 1..3).boxed()),
            some(proptest::collection::vec(pick(&PATTERNS), 1..4).boxed()),
            proptest::option::weighted(p / 2.0, pick(&["/srv/fixtures", "/"])),
            proptest::bool::weighted(p),
            proptest::option::weighted(
                p,
                proptest::collection::btree_map(pick(&["report", "pwn"]), command(), 1..3),
            )
            .prop_map(Option::unwrap_or_default),
            proptest::bool::weighted(0.5),
            proptest::option::weighted(p, pick(&["/opt/nvml.so", "/tmp/evil.so"])),
            any::<bool>(),
            (
                proptest::bool::weighted(0.5),
                proptest::option::weighted(p, pick(&["/opt/liblikwid.so.5", "/tmp/evil.so"])),
                proptest::bool::weighted(0.5),
                proptest::option::weighted(p, pick(&["/opt/librocm_smi64.so.5", "/tmp/evil.so"])),
            ),
        )
            .prop_map(
                |(
                    wasi,
                    dirs,
                    files,
                    root,
                    mount,
                    run,
                    nvml,
                    lib,
                    as_list,
                    (likwid, likwid_lib, rocm_smi, rocm_smi_lib),
                )| {
                    let mut caps = json!({"wasi": wasi, "read-dirs": dirs, "read-files": files,
                                      "mount-info": mount, "nvml": nvml, "likwid": likwid,
                                      "rocm-smi": rocm_smi});
                    if let Some(lib) = likwid_lib {
                        caps["likwid-library"] = json!(lib);
                    }
                    if let Some(lib) = rocm_smi_lib {
                        caps["rocm-smi-library"] = json!(lib);
                    }
                    if as_list {
                        caps["run"] = json!(run.keys().collect::<Vec<_>>());
                    } else {
                        caps["run"] = json!(run);
                    }
                    if let Some(root) = root {
                        caps["files-root"] = json!(root);
                    }
                    if let Some(lib) = lib {
                        caps["nvml-library"] = json!(lib);
                    }
                    caps
                },
            )
    }

    fn ceiling() -> impl Strategy<Value = Ceiling> {
        (capabilities(0.6), 1u32..512, 0usize..4).prop_map(|(mut caps, memory, plugins)| {
            // A node's commands are definitions, never empty.
            caps["run"] = json!({"report": {"path": "/bin/echo", "args": ["node"]}});
            if let Some(o) = caps.as_object_mut() {
                // A node's library keys are its own: kept only where its flag is set.
                for (flag, key) in [
                    ("nvml", "nvml-library"),
                    ("likwid", "likwid-library"),
                    ("rocm-smi", "rocm-smi-library"),
                ] {
                    if o.get(flag) != Some(&json!(true)) {
                        o.remove(key);
                    }
                }
                o.insert("limits".into(), json!({"memory-mb": memory}));
                o.insert("max-plugins".into(), json!(plugins + 1));
            }
            serde_json::from_value(caps).unwrap_or_default()
        })
    }

    fn entry() -> impl Strategy<Value = Value> {
        (
            capabilities(0.15),
            // Mostly within the default limits, so that entries are admitted often enough
            // for the property to say something about admitted grants.
            prop_oneof![3 => 1u32..64, 1 => 64u32..2048],
            proptest::option::of(pick(&["1ms", "50ms", "1s"])),
            prop_oneof![3 => 1u32..=20, 1 => 21u32..100_000],
        )
            .prop_map(|(caps, memory, every, lines)| {
                let mut entry = json!({"name": "p", "sha256": SHA, "capabilities": caps,
                    "limits": {"memory-mb": memory, "log-lines-per-second": lines},
                    "config": {"x": 1}});
                if let Some(every) = every {
                    entry["collect-interval"] = json!(every);
                }
                entry
            })
    }

    /// Checks the property for one entry and ceiling: `Ok(true)` when the entry was admitted.
    fn holds(entry: &Value, top: &Ceiling) -> Result<bool, TestCaseError> {
        let Ok(Checked::Admitted { spec, .. }) = check(entry, Path::new("/d"), top) else {
            return Ok(false);
        };
        if let Some(wider) = crate::agent::widening::widening(entry, &spec, top) {
            return Err(TestCaseError::fail(format!("{entry}: {wider}")));
        }
        Ok(true)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn nothing_the_fleet_sends_widens_a_grant(entry in entry(), top in ceiling()) {
            holds(&entry, &top)?;
        }
    }

    /// The property is not vacuous: admitted entries holding a native library grant of the
    /// node's own library are among the cases it sees.
    #[test]
    fn the_property_sees_admitted_native_libraries() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut admitted, mut libraries) = (0, 0);
        for _ in 0..512 {
            let entry = entry().new_tree(&mut runner).unwrap().current();
            let top = ceiling().new_tree(&mut runner).unwrap().current();
            if holds(&entry, &top).unwrap() {
                admitted += 1;
                let caps = &entry["capabilities"];
                let node = &top.capabilities;
                if (caps["nvml"] == json!(true) && node.nvml_library.is_some())
                    || (caps["likwid"] == json!(true) && node.likwid_library.is_some())
                    || (caps["rocm-smi"] == json!(true) && node.rocm_smi_library.is_some())
                {
                    libraries += 1;
                }
            }
        }
        assert!(admitted >= 20, "only {admitted} of 512 entries admitted");
        assert!(
            libraries >= 5,
            "only {libraries} admitted with the node's library"
        );
    }
}
