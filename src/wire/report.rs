//! What an agent runs, reported to the server on each configuration poll in the
//! [`HEADER_AGENT_REPORT`](super::HEADER_AGENT_REPORT) header (ccfleet's addition; cc-lib's
//! Go client sends none and is counted as unknown, never as failed).
//!
//! ```text
//! X-CCFleet-Report: applied=8817256; plugins=loadavg@3f0c5b1e9d2a7c4b:running,tempstat@-:backoff
//! ```
//!
//! - `applied`: the configuration revision the agent's plugins run with (`0`: none).
//! - `plugins`: per plugin its name, the first 16 hex digits of the SHA-256 it runs (`-` for a
//!   plugin configured by path rather than by the fleet) and its [`PluginHealth`].
//! - `why` (optional, added after `plugins`): per plugin that is not run, a short reason
//!   from the agent's fixed vocabulary, `name:reason` (`refused` carries the result the
//!   agent counts in `ccfleet_agent_plugin_rollouts_total`, such as `unsigned` or
//!   `beyond_ceiling/capabilities.run`). A server that predates the key ignores it, as it
//!   ignores every key it does not know.
//!
//! ```text
//! X-CCFleet-Report: applied=9; plugins=ipmi@0b1c2d3e4f5a6b7c:refused; why=ipmi:beyond_ceiling/capabilities.run
//! ```
//!
//! Why a header on the poll: every agent polls its configuration already, over REST, so the
//! report costs no request, no connection and no NATS subject of its own; it is a few
//! hundred bytes on a request that is sent anyway, and the server keeps only the latest one
//! per instance. Parsing is bounded: at most [`MAX_REPORT_LEN`] bytes and
//! [`MAX_REPORTED_PLUGINS`] plugins; names are the agent configuration's plugin names
//! (letters, digits, `_`, `-`, `.`).

use std::fmt;

/// The longest report accepted, in bytes.
pub const MAX_REPORT_LEN: usize = 8192;
/// The most plugins a report may list.
pub const MAX_REPORTED_PLUGINS: usize = 128;
/// Hex digits of a plugin's SHA-256 a report carries: enough to tell versions apart.
pub const REPORTED_HASH_LEN: usize = 16;
/// The longest reason (`why`) a report carries for one plugin, in bytes.
pub const MAX_REASON_LEN: usize = 64;

/// How a plugin fares, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginHealth {
    /// Loading or instantiating.
    Starting,
    /// Running.
    Running,
    /// Failed and waiting to restart.
    Restarting,
    /// Failed too often; not restarted until it changes.
    Quarantined,
    /// Its component could not be fetched from the fleet.
    DownloadFailed,
    /// Its component could not be compiled or instantiated.
    LoadFailed,
    /// Stopped.
    Stopped,
    /// Not run: it asks for more than the node's ceiling allows the fleet to grant.
    Refused,
}

impl PluginHealth {
    /// Every value with its name.
    pub const ALL: [(PluginHealth, &'static str); 8] = [
        (PluginHealth::Starting, "starting"),
        (PluginHealth::Running, "running"),
        (PluginHealth::Restarting, "restarting"),
        (PluginHealth::Quarantined, "quarantined"),
        (PluginHealth::DownloadFailed, "download-failed"),
        (PluginHealth::LoadFailed, "load-failed"),
        (PluginHealth::Stopped, "stopped"),
        (PluginHealth::Refused, "refused"),
    ];

    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(h, _)| *h == self)
            .map_or("stopped", |(_, name)| name)
    }

    /// Whether this counts as a failure of the version it runs.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            PluginHealth::Restarting
                | PluginHealth::Quarantined
                | PluginHealth::DownloadFailed
                | PluginHealth::LoadFailed
                | PluginHealth::Refused
        )
    }
}

impl std::str::FromStr for PluginHealth {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        Self::ALL
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(h, _)| *h)
            .ok_or(())
    }
}

/// One plugin of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedPlugin {
    /// The plugin's name in the agent's configuration.
    pub name: String,
    /// The first [`REPORTED_HASH_LEN`] hex digits of its SHA-256, lowercase; `None` for a
    /// plugin configured by path.
    pub sha256: Option<String>,
    /// How it fares.
    pub health: PluginHealth,
    /// Why it is not run, when the agent says (see [`valid_reason`]).
    pub why: Option<String>,
}

/// An agent's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentReport {
    /// The configuration revision the plugins run with (`0`: none).
    pub applied: i64,
    /// Its plugins.
    pub plugins: Vec<ReportedPlugin>,
}

/// Whether `reason` can travel as a plugin's `why`: 1 to [`MAX_REASON_LEN`] bytes of
/// letters, digits, `_`, `-`, `.` and `/`, so it needs no escaping in the header, the logs
/// or the status page.
pub fn valid_reason(reason: &str) -> bool {
    !reason.is_empty()
        && reason.len() <= MAX_REASON_LEN
        && reason
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The reported form of a SHA-256 (its first [`REPORTED_HASH_LEN`] digits, lowercase).
pub fn reported_hash(sha256: &str) -> String {
    sha256
        .chars()
        .take(REPORTED_HASH_LEN)
        .collect::<String>()
        .to_ascii_lowercase()
}

impl AgentReport {
    /// Parses a header value; `Err` names the problem.
    pub fn parse(text: &str) -> Result<AgentReport, String> {
        if text.len() > MAX_REPORT_LEN {
            return Err(format!("longer than {MAX_REPORT_LEN} bytes"));
        }
        let mut report = AgentReport::default();
        let mut seen_applied = false;
        let mut reasons: Vec<(&str, &str)> = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{}` is not key=value", cut(part)))?;
            match key.trim() {
                "applied" => {
                    report.applied = value
                        .trim()
                        .parse()
                        .map_err(|_| format!("applied `{}` is not a revision", cut(value)))?;
                    seen_applied = true;
                }
                "plugins" => {
                    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                        if report.plugins.len() == MAX_REPORTED_PLUGINS {
                            return Err(format!("more than {MAX_REPORTED_PLUGINS} plugins"));
                        }
                        report.plugins.push(parse_plugin(item)?);
                    }
                }
                "why" => {
                    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                        let (name, reason) = item
                            .split_once(':')
                            .ok_or_else(|| format!("why `{}` is not name:reason", cut(item)))?;
                        if !valid_reason(reason) {
                            return Err(format!(
                                "why of `{}`: `{}` is not a reason",
                                cut(name),
                                cut(reason)
                            ));
                        }
                        if reasons.len() == MAX_REPORTED_PLUGINS {
                            return Err(format!("more than {MAX_REPORTED_PLUGINS} reasons"));
                        }
                        reasons.push((name, reason));
                    }
                }
                // Later versions may add keys; an older server ignores them.
                _ => {}
            }
        }
        if !seen_applied {
            return Err("no `applied` revision".to_owned());
        }
        // A reason for a plugin the report does not list says nothing: left out.
        for (name, reason) in reasons {
            if let Some(plugin) = report.plugins.iter_mut().find(|p| p.name == name) {
                plugin.why = Some(reason.to_owned());
            }
        }
        Ok(report)
    }

    /// The plugin of that name.
    pub fn plugin(&self, name: &str) -> Option<&ReportedPlugin> {
        self.plugins.iter().find(|p| p.name == name)
    }
}

fn cut(s: &str) -> String {
    s.chars().take(40).flat_map(char::escape_default).collect()
}

fn parse_plugin(item: &str) -> Result<ReportedPlugin, String> {
    let bad = || format!("plugin `{}` is not name@sha256:state", cut(item));
    let (name, rest) = item.split_once('@').ok_or_else(bad)?;
    let (hash, health) = rest.rsplit_once(':').ok_or_else(bad)?;
    if !valid_name(name) {
        return Err(format!("plugin name `{}` is not allowed", cut(name)));
    }
    let sha256 = match hash {
        "-" => None,
        h if !h.is_empty()
            && h.len() <= 64
            && h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) =>
        {
            Some(reported_hash(h))
        }
        _ => return Err(format!("plugin `{name}`: `{}` is not a SHA-256", cut(hash))),
    };
    let health = health
        .parse()
        .map_err(|()| format!("plugin `{name}`: unknown state `{}`", cut(health)))?;
    Ok(ReportedPlugin {
        name: name.to_owned(),
        sha256,
        health,
        why: None,
    })
}

impl fmt::Display for AgentReport {
    /// The header value; plugins with a name a report cannot carry are left out, and so
    /// are reasons it cannot carry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "applied={}; plugins=", self.applied)?;
        let carried = || {
            self.plugins
                .iter()
                .filter(|p| valid_name(&p.name))
                .take(MAX_REPORTED_PLUGINS)
        };
        let mut first = true;
        for p in carried() {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            let hash = p
                .sha256
                .as_deref()
                .map_or_else(|| "-".to_owned(), reported_hash);
            write!(f, "{}@{hash}:{}", p.name, p.health.as_str())?;
        }
        let mut first = true;
        for p in carried() {
            let Some(why) = p.why.as_deref().filter(|w| valid_reason(w)) else {
                continue;
            };
            f.write_str(if first { "; why=" } else { "," })?;
            first = false;
            write!(f, "{}:{why}", p.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str, sha: Option<&str>, health: PluginHealth) -> ReportedPlugin {
        ReportedPlugin {
            name: name.to_owned(),
            sha256: sha.map(str::to_owned),
            health,
            why: None,
        }
    }

    #[test]
    fn a_report_round_trips_with_the_hash_cut_to_sixteen_digits() {
        let report = AgentReport {
            applied: 8_817_256,
            plugins: vec![
                plugin(
                    "loadavg",
                    Some("3f0c5b1e9d2a7c4b8e6f1a0d5c9b2e7f4a8d1c6b3e0f9a2d7c5b8e1f4a0d3c6b"),
                    PluginHealth::Running,
                ),
                plugin("tempstat", None, PluginHealth::Restarting),
            ],
        };
        let text = report.to_string();
        assert_eq!(
            text,
            "applied=8817256; plugins=loadavg@3f0c5b1e9d2a7c4b:running,tempstat@-:restarting"
        );
        let parsed = AgentReport::parse(&text).unwrap();
        assert_eq!(parsed.applied, 8_817_256);
        assert_eq!(
            parsed.plugins[0].sha256.as_deref(),
            Some("3f0c5b1e9d2a7c4b")
        );
        assert_eq!(
            parsed.plugins[1],
            plugin("tempstat", None, PluginHealth::Restarting)
        );
    }

    #[test]
    fn bad_reports_are_refused_naming_the_problem() {
        for (text, problem) in [
            ("plugins=a@-:running", "no `applied`"),
            ("applied=x", "not a revision"),
            ("applied=1; plugins=a-running", "not name@sha256:state"),
            ("applied=1; plugins=a b@-:running", "not allowed"),
            ("applied=1; plugins=a@XYZ:running", "not a SHA-256"),
            ("applied=1; plugins=a@-:dancing", "unknown state"),
            ("applied", "not key=value"),
        ] {
            let e = AgentReport::parse(text).unwrap_err();
            assert!(e.contains(problem), "{text}: {e}");
        }
        let long = format!("applied=1; plugins={}", "a@-:running,".repeat(1000));
        assert!(AgentReport::parse(&long).unwrap_err().contains("longer"));
        let many = format!("applied=1; plugins={}", "a@-:running,".repeat(200));
        assert!(AgentReport::parse(&many).unwrap_err().contains("more than"));
    }

    #[test]
    fn a_reason_travels_with_its_plugin_and_old_reports_still_parse() {
        let mut refused = plugin("ipmi", Some("0b1c2d3e4f5a6b7c"), PluginHealth::Refused);
        refused.why = Some("beyond_ceiling/capabilities.run".to_owned());
        let mut odd = plugin("odd", None, PluginHealth::Refused);
        odd.why = Some("has space".to_owned());
        let report = AgentReport {
            applied: 9,
            plugins: vec![
                plugin("loadavg", None, PluginHealth::Running),
                refused.clone(),
                odd,
            ],
        };
        let text = report.to_string();
        assert_eq!(
            text,
            "applied=9; plugins=loadavg@-:running,ipmi@0b1c2d3e4f5a6b7c:refused,odd@-:refused; \
             why=ipmi:beyond_ceiling/capabilities.run"
        );
        let parsed = AgentReport::parse(&text).unwrap();
        assert_eq!(parsed.plugin("ipmi"), Some(&refused));
        assert_eq!(parsed.plugin("odd").unwrap().why, None);
        // `why` before `plugins`, and a reason for a plugin not listed.
        let parsed =
            AgentReport::parse("applied=1; why=a:unsigned,b:x; plugins=a@-:refused").unwrap();
        assert_eq!(parsed.plugin("a").unwrap().why.as_deref(), Some("unsigned"));
        assert_eq!(parsed.plugins.len(), 1);
        for (text, problem) in [
            ("applied=1; plugins=a@-:refused; why=a", "not name:reason"),
            ("applied=1; plugins=a@-:refused; why=a:", "not a reason"),
            ("applied=1; plugins=a@-:refused; why=a:b c", "not a reason"),
            ("applied=1; plugins=a@-:refused; why=a:<b>", "not a reason"),
        ] {
            let e = AgentReport::parse(text).unwrap_err();
            assert!(e.contains(problem), "{text}: {e}");
        }
        let long = format!("applied=1; plugins=a@-:refused; why=a:{}", "x".repeat(65));
        assert!(
            AgentReport::parse(&long)
                .unwrap_err()
                .contains("not a reason")
        );
    }

    #[test]
    fn unknown_keys_are_ignored_for_later_versions() {
        let r = AgentReport::parse("applied=5; future=1; plugins=").unwrap();
        assert_eq!(r.applied, 5);
        assert!(r.plugins.is_empty());
    }

    #[test]
    fn arbitrary_text_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let alphabet = b"applied=;plugins@:,-0123456789abcdef runningxwhy/\xff";
        for _ in 0..20_000 {
            let mut s = Vec::new();
            for _ in 0..(seed % 80) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let _ = AgentReport::parse(&String::from_utf8_lossy(&s));
        }
    }
}
