//! The agent's health, by the liveness/readiness convention of service supervisors:
//! `GET /healthz` says whether the agent is alive, `GET /readyz` whether it does its job.
//!
//! - Alive: the process answers and its long-running loops (the fleet client, the metric
//!   output, the configuration forwarder, the fleet plugin rollout) still run. A loop that
//!   ended (a panic, say) does not come back: restarting the agent is the cure, which is what
//!   a failing liveness probe leads to.
//! - Ready: registered with the fleet, every sink delivering (its latest write succeeded),
//!   NATS connected where configured, every plugin running, and every plugin the fleet names
//!   downloaded and running in the version named. Each of these can recover by itself, so a
//!   supervisor should wait, not restart.
//!
//! Both answer 200 or 503 with a JSON body: `status`, the `reasons` for a 503 (each naming
//! the part and why, e.g. the fleet server's URL and its error), and the state of each part.
//! Nothing secret is shown: no token, no instance id, no NATS address, fleet URLs without
//! their user information.

use std::collections::BTreeMap;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::observe::Observed;
use crate::plugin::PluginState;

/// Longest error text a reason quotes (the rest is cut).
const MAX_REASON_DETAIL: usize = 300;
/// Longest plugin name shown (fleet plugin names come from the fleet configuration).
const MAX_NAME: usize = 100;

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
fn capped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

fn state_name(state: PluginState) -> &'static str {
    super::observe::STATES
        .iter()
        .find(|(s, _)| *s == state)
        .map_or("unknown", |(_, name)| name)
}

/// A health answer: 200 or 503 and its JSON body.
pub(crate) struct Report {
    pub status: StatusCode,
    pub body: Value,
}

impl IntoResponse for Report {
    fn into_response(self) -> Response {
        let mut body = self.body.to_string();
        body.push('\n');
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

impl Report {
    fn new(reasons: Vec<String>, ok: &str, not_ok: &str, mut parts: Value) -> Report {
        let healthy = reasons.is_empty();
        parts["status"] = json!(if healthy { ok } else { not_ok });
        parts["reasons"] = json!(reasons);
        Report {
            status: if healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            body: parts,
        }
    }
}

impl Observed {
    /// `/healthz`: alive while every loop runs.
    pub(crate) fn liveness(&self) -> Report {
        let loops = self.loops.states();
        let reasons = loops
            .iter()
            .filter(|(_, runs)| !runs)
            .map(|(name, _)| format!("the {name} loop has ended"))
            .collect();
        let parts: BTreeMap<&str, &str> = loops
            .iter()
            .map(|(name, runs)| (*name, if *runs { "running" } else { "ended" }))
            .collect();
        Report::new(reasons, "alive", "not alive", json!({ "loops": parts }))
    }

    /// `/readyz`: ready while registered, every sink delivers, NATS (if configured) is
    /// connected, every plugin runs and every plugin the fleet names runs in its version.
    pub(crate) fn readiness(&self) -> Report {
        let mut reasons = Vec::new();

        let registered = self.client.registered();
        let failures = self.client.failures();
        if !registered {
            let reason = match failures.iter().find(|f| f.op == "register") {
                Some(f) => format!(
                    "not registered with the fleet server {}: {}",
                    f.server,
                    capped(&f.error, MAX_REASON_DETAIL)
                ),
                None => format!(
                    "not registered with the fleet server {} yet",
                    self.client.current_server()
                ),
            };
            reasons.push(reason);
        }
        let fleet = json!({
            "registered": registered,
            "server": self.client.current_server(),
            "servers": self.client.servers().into_iter()
                .map(|(url, down)| json!({"url": url, "down": down}))
                .collect::<Vec<_>>(),
            "failing": failures.iter()
                .map(|f| json!({"op": f.op, "server": f.server,
                                "error": capped(&f.error, MAX_REASON_DETAIL)}))
                .collect::<Vec<_>>(),
        });

        let nats = self.nats_connected();
        if nats == Some(false) {
            reasons.push("NATS is not connected".to_owned());
        }

        let mut sinks = Vec::new();
        for sink in &self.sinks {
            let failure = sink.counters.delivery_failure();
            if let Some(why) = &failure {
                reasons.push(format!(
                    "sink {} ({}) is not delivering: {}",
                    sink.name,
                    sink.kind.as_str(),
                    capped(why, MAX_REASON_DETAIL)
                ));
            }
            sinks.push(json!({
                "name": sink.name,
                "type": sink.kind.as_str(),
                "delivering": failure.is_none(),
                "error": failure.map(|why| capped(&why, MAX_REASON_DETAIL)),
            }));
        }

        let mut plugins = Vec::new();
        for plugin in self
            .plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let status = plugin.status.borrow().clone();
            let name = capped(&plugin.name, MAX_NAME);
            let failure = status
                .last_failure
                .as_ref()
                .map(|f| capped(&f.to_string(), MAX_REASON_DETAIL));
            if status.state != PluginState::Running {
                reasons.push(match (&failure, status.state) {
                    (Some(why), PluginState::Quarantined | PluginState::LoadFailed) => {
                        format!("plugin {name} is {}: {why}", state_name(status.state))
                    }
                    _ => format!("plugin {name} is {}", state_name(status.state)),
                });
            }
            plugins.push(json!({
                "name": name,
                "state": state_name(status.state),
                "sha256": status.hash,
            }));
        }

        let mut fleet_plugins = Vec::new();
        if let Some(assignments) = &self.assignments {
            for (name, assignment) in assignments.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let name = capped(name, MAX_NAME);
                if let Some(problem) = &assignment.problem {
                    reasons.push(format!(
                        "plugin {name} named by the fleet (sha256 {}) does not run: {}",
                        assignment.sha256,
                        capped(problem, MAX_REASON_DETAIL)
                    ));
                }
                fleet_plugins.push(json!({
                    "name": name,
                    "sha256": assignment.sha256,
                    "running": assignment.problem.is_none(),
                    "error": assignment.problem.as_deref().map(|p| capped(p, MAX_REASON_DETAIL)),
                }));
            }
        }

        Report::new(
            reasons,
            "ready",
            "not ready",
            json!({
                "fleet": fleet,
                "nats": nats.map(|up| if up { "connected" } else { "disconnected" }),
                "sinks": sinks,
                "plugins": plugins,
                "fleet_plugins": fleet_plugins,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::loops::Loops;

    #[test]
    fn a_loop_counts_as_ended_once_its_token_is_gone_even_by_a_panic() {
        let loops = Loops::default();
        let kept = loops.track("kept");
        let ended = loops.track("ended");
        drop(ended);
        let panicked = loops.track("panicked");
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _token = panicked;
            panic!("a loop fails");
        }));
        assert!(result.is_err());
        assert_eq!(
            loops.states(),
            [("kept", true), ("ended", false), ("panicked", false)]
        );
        drop(kept);
    }

    #[test]
    fn reasons_are_cut_on_a_character_boundary() {
        assert_eq!(capped("short", 10), "short");
        let cut = capped(&"é".repeat(10), 5);
        assert_eq!(cut, "éé…");
    }
}
