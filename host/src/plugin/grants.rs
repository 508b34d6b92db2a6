//! What a plugin may reach, in one log line: the effective grants of a specification (after
//! the node's ceiling made its choices), logged once when the plugin first starts, so an
//! operator sees what each plugin, the fleet's included, actually got.
//!
//! Shown: capability names, `read-files` patterns, `read-dirs`, `files-root`, command names
//! (never their arguments or users), the native libraries granted (a library's path when the
//! configuration names it, never the value of an environment variable), the limits and the
//! collect interval. Every part that may come from the fleet is escaped and capped
//! ([`Untrusted`]); a plugin's own `config` is never shown (it may hold anything).

use std::fmt::Write as _;

use ccfleet::untrusted::Untrusted;

use super::PluginSpec;

/// The most entries of one list shown; the rest is counted.
const MAX_LISTED: usize = 32;
/// The most bytes of one entry shown.
const MAX_ENTRY: usize = 200;

/// Appends `key [a, b, …]` for a non-empty list.
fn list<'a>(out: &mut Vec<String>, key: &str, items: impl ExactSizeIterator<Item = &'a str>) {
    let total = items.len();
    if total == 0 {
        return;
    }
    let mut text = format!("{key} [");
    for (i, item) in items.take(MAX_LISTED).enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        let _ = write!(text, "{}", Untrusted(item).capped(MAX_ENTRY));
    }
    if total > MAX_LISTED {
        let _ = write!(text, ", … {} more", total - MAX_LISTED);
    }
    text.push(']');
    out.push(text);
}

/// A native library grant: its name and where its library comes from.
fn library(out: &mut Vec<String>, name: &str, path: Option<&std::path::Path>) {
    match path {
        Some(path) => out.push(format!(
            "{name} (library {})",
            Untrusted(&path.to_string_lossy()).capped(MAX_ENTRY)
        )),
        None => out.push(format!(
            "{name} (library from the environment or the loader's search path)"
        )),
    }
}

/// The grants of `spec`, e.g. `read-files [/proc/loadavg]; run [ipmi-sensors]; limits
/// memory-mb=64 call-timeout=1s …; collect-interval 10s`.
pub fn summary(spec: &PluginSpec) -> String {
    let caps = &spec.capabilities;
    let mut parts = Vec::new();
    if caps.wasi {
        parts.push("wasi".to_owned());
    }
    let dirs: Vec<String> = caps
        .read_dirs
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    list(&mut parts, "read-dirs", dirs.iter().map(String::as_str));
    list(
        &mut parts,
        "read-files",
        caps.read_files.iter().map(String::as_str),
    );
    if let Some(root) = &caps.files_root {
        parts.push(format!(
            "files-root {}",
            Untrusted(&root.to_string_lossy()).capped(MAX_ENTRY)
        ));
    }
    if caps.mount_info {
        parts.push("mount-info".to_owned());
    }
    list(&mut parts, "run", caps.run.keys().map(String::as_str));
    if caps.nvml {
        library(&mut parts, "nvml", caps.nvml_library.as_deref());
    }
    if caps.likwid {
        library(&mut parts, "likwid", caps.likwid_library.as_deref());
    }
    if caps.rocm_smi {
        library(&mut parts, "rocm-smi", caps.rocm_smi_library.as_deref());
    }
    if parts.is_empty() {
        parts.push("no capabilities".to_owned());
    }
    let mut limits = String::from("limits");
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(&spec.limits) {
        for (key, value) in map {
            match value {
                serde_json::Value::String(s) => {
                    let _ = write!(limits, " {key}={}", Untrusted(&s).capped(40));
                }
                other => {
                    let _ = write!(limits, " {key}={other}");
                }
            }
        }
    }
    parts.push(limits);
    match spec.collect_interval {
        Some(every) => parts.push(format!(
            "collect-interval {}",
            ccfleet::duration::format(every)
        )),
        None => parts.push("no collect-interval".to_owned()),
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::plugin::commands::RunGrant;

    #[test]
    fn every_grant_is_named_and_nothing_secret_is_shown() {
        let mut spec = PluginSpec::new("/d/x.wasm");
        spec.config = serde_json::json!({"password": "hunter2"});
        spec.collect_interval = Some(Duration::from_secs(10));
        spec.limits.memory_mb = 48;
        let caps = &mut spec.capabilities;
        caps.read_files = vec!["/proc/loadavg".into(), "/sys/class/hwmon/**".into()];
        caps.mount_info = true;
        let mut grant = RunGrant::new("/usr/bin/ipmitool");
        grant.args = vec!["--password-file=/etc/ipmi.secret".into()];
        grant.user = Some("ipmi".into());
        caps.run.insert("ipmi-sensors".into(), grant);
        caps.nvml = true;
        caps.nvml_library = Some(PathBuf::from("/opt/nvidia/libnvidia-ml.so.1"));
        caps.likwid = true;
        caps.rocm_smi = true;
        caps.rocm_smi_library = Some(PathBuf::from("/opt/rocm/lib/librocm_smi64.so.5"));
        let text = summary(&spec);
        for shown in [
            "read-files [/proc/loadavg, /sys/class/hwmon/**]",
            "mount-info",
            "run [ipmi-sensors]",
            "nvml (library /opt/nvidia/libnvidia-ml.so.1)",
            "likwid (library from the environment",
            "rocm-smi (library /opt/rocm/lib/librocm_smi64.so.5)",
            "memory-mb=48",
            "call-timeout=",
            "collect-interval 10s",
        ] {
            assert!(text.contains(shown), "{shown} missing: {text}");
        }
        for hidden in [
            "hunter2",
            "password-file",
            "ipmi.secret",
            "ipmitool",
            "user",
        ] {
            assert!(!text.contains(hidden), "{hidden} shown: {text}");
        }
    }

    #[test]
    fn fleet_text_is_escaped_and_long_lists_are_cut() {
        let mut spec = PluginSpec::new("/d/x.wasm");
        spec.capabilities.read_files = (0..40).map(|i| format!("/proc/{i}\n")).collect();
        let text = summary(&spec);
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains(r"/proc/0\n"), "{text}");
        assert!(text.contains("… 8 more"), "{text}");
        assert!(summary(&PluginSpec::new("/d/y.wasm")).starts_with("no capabilities; limits"));
    }
}
