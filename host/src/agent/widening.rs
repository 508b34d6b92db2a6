//! A second opinion on an admitted fleet plugin entry: whether anything it runs with is wider
//! than the node's ceiling, found without the admission check's own reasoning
//! ([`crate::plugin::Capabilities::within`], [`crate::plugin::ceiling::pattern_covers`]).
//!
//! The admission check decides whether one pattern covers another; this looks at concrete
//! paths instead: from every `read-files` pattern the plugin was granted it derives paths the
//! pattern matches (each `*` as nothing and as a name, each `**` as zero, one and two names,
//! beside a fixed set of sensitive paths) and requires each to be readable under the
//! ceiling's patterns, matched as the plugin's reads are matched at run time
//! ([`crate::plugin::files::Pattern::matches_path`]). Flags, commands, native libraries,
//! directories, limits and the interval are compared field by field.
//!
//! The property tests and the `fleet_ceiling` fuzz target hold every admitted entry to it:
//! nothing the fleet sends widens a grant.

use std::path::{Path, PathBuf};

use crate::PluginSpec;
use crate::plugin::ceiling::Ceiling;
use crate::plugin::files::Pattern;

/// Paths every check also tries: the system's and the agent's likely secrets, kernel and
/// per-process files, and ordinary collector files.
const PROBES: [&str; 18] = [
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/passwd",
    "/etc/ssh/ssh_host_ed25519_key",
    "/root/.ssh/id_rsa",
    "/home/a/.ssh/id_rsa",
    "/proc/loadavg",
    "/proc/1/stat",
    "/proc/self/environ",
    "/proc/kcore",
    "/sys/class/hwmon/hwmon0/temp1_input",
    "/dev/mem",
    "/var/lib/ccfleet/agent.json",
    "/srv/data/a/b",
    "/srv/other",
    "/root/x",
    "/proc/sys/kernel/x",
    "/sys/class/hwmon/temp",
];

/// The most paths derived from one pattern.
const MAX_DERIVED: usize = 64;

/// The first way the admitted `spec` (read from the fleet's `entry`) is wider than
/// `ceiling`, described; `None` when it lies within.
pub fn widening(entry: &serde_json::Value, spec: &PluginSpec, ceiling: &Ceiling) -> Option<String> {
    let caps = &spec.capabilities;
    let top = &ceiling.capabilities;
    for (flag, asked, allowed) in [
        ("wasi", caps.wasi, top.wasi),
        ("mount-info", caps.mount_info, top.mount_info),
        ("nvml", caps.nvml, top.nvml),
        ("likwid", caps.likwid, top.likwid),
        ("rocm-smi", caps.rocm_smi, top.rocm_smi),
    ] {
        if asked && !allowed {
            return Some(format!("{flag} granted beyond the ceiling"));
        }
    }
    if caps.files_root != top.files_root {
        return Some(format!(
            "files-root {:?} is not the node's",
            caps.files_root
        ));
    }
    for (key, asked, flag, node) in [
        (
            "nvml-library",
            &caps.nvml_library,
            caps.nvml,
            &top.nvml_library,
        ),
        (
            "likwid-library",
            &caps.likwid_library,
            caps.likwid,
            &top.likwid_library,
        ),
        (
            "rocm-smi-library",
            &caps.rocm_smi_library,
            caps.rocm_smi,
            &top.rocm_smi_library,
        ),
    ] {
        let expected = if flag { node.as_ref() } else { None };
        if asked.as_ref() != expected {
            return Some(format!("{key} {asked:?} is not the node's {expected:?}"));
        }
        if entry["capabilities"].get(key).is_some() {
            return Some(format!("the fleet named {key} and the entry was admitted"));
        }
    }
    for (name, grant) in &caps.run {
        if top.run.get(name) != Some(grant) {
            return Some(format!("command {name:?} is not the node's definition"));
        }
    }
    for dir in &caps.read_dirs {
        if !top.read_dirs.iter().any(|t| real(dir).starts_with(real(t))) {
            return Some(format!(
                "read-dir {} lies outside the ceiling's",
                dir.display()
            ));
        }
    }
    let ceiling_patterns: Vec<Pattern> = top
        .read_files
        .iter()
        .filter_map(|p| Pattern::parse(p).ok())
        .collect();
    for granted in &caps.read_files {
        let Ok(pattern) = Pattern::parse(granted) else {
            return Some(format!(
                "read-files entry {granted:?} was admitted unparsed"
            ));
        };
        let derived = derive(granted);
        for path in derived.iter().map(String::as_str).chain(PROBES) {
            if pattern.matches_path(path) && !ceiling_patterns.iter().any(|p| p.matches_path(path))
            {
                return Some(format!(
                    "read-files entry {granted:?} reads {path}, which the ceiling does not"
                ));
            }
        }
        if crate::plugin::secrets::names_system_secret(granted) && !top.read_files.contains(granted)
        {
            return Some(format!(
                "the system secret {granted} is not named by the ceiling"
            ));
        }
    }
    if let Err(e) = ceiling.admits_limits(&spec.limits) {
        return Some(format!("limits: {e}"));
    }
    if spec.limits.memory_mb > ceiling.limits.memory_mb {
        return Some("memory-mb above the ceiling's".to_owned());
    }
    if spec
        .collect_interval
        .is_some_and(|every| every < ceiling.min_collect_interval)
    {
        return Some("collect-interval below the ceiling's".to_owned());
    }
    None
}

/// The `fleet_ceiling` fuzz target's check, also replayed over its seeds by the tests: `data`
/// is a ceiling and a fleet plugin entry, one JSON text each, separated by the first newline
/// (a ceiling that does not read as one, or is invalid, is the default ceiling; a first line
/// only is the entry). Returns the widening of the entry when it is admitted and wider
/// ([`widening`]); reading and checking never panic.
pub fn check_fuzz_input(data: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(data);
    let (ceiling, entry) = text.split_once('\n').unwrap_or(("", &text));
    let ceiling = ccfleet::json_config::from_str::<Ceiling>(ceiling)
        .ok()
        .filter(|c| c.validate().is_ok())
        .unwrap_or_default();
    let entry: serde_json::Value = serde_json::from_str(entry).ok()?;
    match super::fleet_entry::check(&entry, Path::new("/d"), &ceiling) {
        Ok(super::fleet_entry::Checked::Admitted { spec, .. }) => widening(&entry, &spec, &ceiling),
        _ => None,
    }
}

/// `path` resolved on the host as it is now, else as written (as the admission check
/// compares directories).
fn real(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Paths `pattern` matches: each `**` as zero, one and two names, each `*` as nothing and as
/// `x` (all the stars of a name alike); at most [`MAX_DERIVED`].
fn derive(pattern: &str) -> Vec<String> {
    let mut paths = vec![String::new()];
    for name in pattern.split('/').filter(|n| !n.is_empty()) {
        let choices: Vec<String> = if name == "**" {
            vec![String::new(), "/a".to_owned(), "/a/b".to_owned()]
        } else if name.contains('*') {
            vec![
                format!("/{}", name.replace('*', "")),
                format!("/{}", name.replace('*', "x")),
            ]
        } else {
            vec![format!("/{name}")]
        };
        paths = paths
            .iter()
            .flat_map(|p| choices.iter().map(move |c| format!("{p}{c}")))
            .take(MAX_DERIVED)
            .collect();
    }
    paths
        .into_iter()
        .map(|p| if p.is_empty() { "/".to_owned() } else { p })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target's seeds and past failures hold in the ordinary test suite, and the
    /// seeds meant to be admitted are (so the check says something about them).
    #[test]
    fn the_fuzz_seeds_and_past_failures_hold() {
        let inputs = crate::fuzz_inputs::inputs("fleet_ceiling");
        for (path, data) in &inputs {
            assert_eq!(check_fuzz_input(data), None, "{}", path.display());
        }
        assert!(inputs.len() >= 4, "{} inputs", inputs.len());
        let fuzz = crate::fuzz_inputs::fuzz_dir();
        for admitted in ["within-default", "site-ceiling"] {
            let text =
                std::fs::read_to_string(fuzz.join("seeds/fleet_ceiling").join(admitted)).unwrap();
            let (ceiling, entry) = text.split_once('\n').unwrap();
            let ceiling: Ceiling = ccfleet::json_config::from_str(ceiling).unwrap_or_default();
            let entry = serde_json::from_str(entry).unwrap();
            assert!(
                matches!(
                    super::super::fleet_entry::check(&entry, Path::new("/d"), &ceiling),
                    Ok(super::super::fleet_entry::Checked::Admitted { .. })
                ),
                "{admitted} is not admitted"
            );
        }
    }

    #[test]
    fn paths_are_derived_from_every_wildcard() {
        assert_eq!(derive("/proc/loadavg"), ["/proc/loadavg"]);
        assert_eq!(
            derive("/sys/**/temp*"),
            [
                "/sys/temp",
                "/sys/tempx",
                "/sys/a/temp",
                "/sys/a/tempx",
                "/sys/a/b/temp",
                "/sys/a/b/tempx"
            ]
        );
        assert_eq!(derive("/**"), ["/", "/a", "/a/b"]);
        assert!(derive(&"/**".repeat(30)).len() <= MAX_DERIVED);
    }

    #[test]
    fn a_wider_grant_is_found() {
        let top = Ceiling::default();
        let mut spec = PluginSpec::new("/d/x.wasm");
        let entry = serde_json::json!({"capabilities": {}});
        assert_eq!(widening(&entry, &spec, &top), None);
        spec.capabilities.read_files = vec!["/proc/**".to_owned()];
        assert_eq!(widening(&entry, &spec, &top), None);
        for (files, found) in [
            ("/etc/*", "reads /etc/"),
            ("/**", "reads /"),
            ("/srv/*/a/*", "reads /srv/"),
        ] {
            spec.capabilities.read_files = vec![files.to_owned()];
            let why = widening(&entry, &spec, &top).unwrap();
            assert!(why.contains(found), "{files}: {why}");
        }
        spec.capabilities.read_files.clear();
        spec.capabilities.wasi = true;
        assert!(widening(&entry, &spec, &top).unwrap().contains("wasi"));
        spec.capabilities.wasi = false;
        spec.capabilities.nvml_library = Some("/tmp/evil.so".into());
        assert!(
            widening(&entry, &spec, &top)
                .unwrap()
                .contains("nvml-library")
        );
        spec.capabilities.nvml_library = None;
        spec.limits.memory_mb = top.limits.memory_mb + 1;
        assert!(widening(&entry, &spec, &top).unwrap().contains("memory-mb"));
    }
}
