//! `GET /healthz`: whether the server's dependencies work, for load balancers and
//! watchdogs.
//!
//! Each dependency is checked and named: the registry database must take a write (see
//! [`Registry::writable`]) and NATS, when configured, must be connected. All fine answers
//! `200` with the details; anything down answers `503` naming what is down:
//!
//! ```text
//! {"status":"ok","down":[],"checks":{"database":"ok","nats":"ok"}}
//! {"status":"unavailable","down":["nats"],"checks":{"database":"ok","nats":"disconnected"}}
//! ```
//!
//! A server that works but loses heartbeats answers `200` with status `degraded`, the
//! affected part in `degraded` and the reason in `checks` (both only present then): NATS
//! dropping heartbeat messages at the subscription (a slow-consumer episode, see
//! [`SlowConsumer`](super::slow_consumer::SlowConsumer)) is not a reason to take the server out
//! of a load balancer, but is one to raise a setting or add servers:
//!
//! ```text
//! {"status":"degraded","down":[],"degraded":["heartbeats"],"checks":{"database":"ok","nats":"ok","heartbeats":"dropping: ..."}}
//! ```
//!
//! A configuration tree whose latest rescan failed, or whose rescan hangs, degrades the
//! server the same way (`config-tree`): it serves the previous generation meanwhile. So does
//! a registry that started on a full disk and serves what its file holds while something
//! it needs waits for space (`registry`, see [`Registry::degraded`]).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::metrics::Metrics;
use super::registry::Registry;

/// How long the database probe may wait for the registry (busy with a large batch, or
/// stuck) before the database counts as down.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/healthz` checks.
#[derive(Clone)]
pub(crate) struct Health {
    registry: Registry,
    nats: Option<async_nats::Client>,
    metrics: Arc<Metrics>,
}

/// The outcome of one check: `ok`, or what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Check(String);

impl Check {
    fn ok() -> Check {
        Check("ok".into())
    }

    fn is_ok(&self) -> bool {
        self.0 == "ok"
    }
}

/// The `/healthz` body.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    status: &'static str,
    down: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    degraded: Vec<&'static str>,
    checks: Checks,
}

#[derive(Debug, Serialize)]
struct Checks {
    database: Check,
    /// `not configured` when the server runs without NATS (REST only), which is not down.
    nats: Check,
    /// Only while NATS drops heartbeat messages at the subscription.
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeats: Option<Check>,
    /// Only while the configuration tree's latest rescan failed or one is stuck: the server
    /// serves the previous generation.
    #[serde(rename = "config-tree", skip_serializing_if = "Option::is_none")]
    config_tree: Option<Check>,
    /// Only while the registry works with less than it should (a schema change waiting
    /// for space).
    #[serde(skip_serializing_if = "Option::is_none")]
    registry: Option<Check>,
}

impl Report {
    fn new(
        database: Check,
        nats: Option<Check>,
        dropping: Option<String>,
        rescan: Option<String>,
        registry: Option<String>,
    ) -> Report {
        let mut down = Vec::new();
        if !database.is_ok() {
            down.push("database");
        }
        let nats = match nats {
            Some(check) => {
                if !check.is_ok() {
                    down.push("nats");
                }
                check
            }
            None => Check("not configured".into()),
        };
        let mut degraded = Vec::new();
        if dropping.is_some() {
            degraded.push("heartbeats");
        }
        if rescan.is_some() {
            degraded.push("config-tree");
        }
        if registry.is_some() {
            degraded.push("registry");
        }
        Report {
            status: match (down.is_empty(), degraded.is_empty()) {
                (false, _) => "unavailable",
                (true, false) => "degraded",
                (true, true) => "ok",
            },
            down,
            degraded,
            checks: Checks {
                database,
                nats,
                heartbeats: dropping.map(Check),
                config_tree: rescan.map(Check),
                registry: registry.map(Check),
            },
        }
    }

    /// Whether every dependency works (a degraded server is healthy).
    pub(crate) fn healthy(&self) -> bool {
        self.down.is_empty()
    }
}

impl Health {
    pub(crate) fn new(
        registry: Registry,
        nats: Option<async_nats::Client>,
        metrics: Arc<Metrics>,
    ) -> Health {
        Health {
            registry,
            nats,
            metrics,
        }
    }

    /// Checks every dependency.
    pub(crate) async fn check(&self) -> Report {
        let database = match tokio::time::timeout(DATABASE_TIMEOUT, self.registry.writable()).await
        {
            Ok(Ok(())) => Check::ok(),
            Ok(Err(e)) => Check(format!("writes fail: {e}")),
            Err(_) => Check(format!(
                "no answer within {}",
                crate::duration::format(DATABASE_TIMEOUT)
            )),
        };
        let nats = self.nats.as_ref().map(|client| {
            use async_nats::connection::State;
            match client.connection_state() {
                State::Connected => Check::ok(),
                State::Pending => Check("connecting".into()),
                State::Disconnected => Check("disconnected".into()),
            }
        });
        Report::new(
            database,
            nats,
            self.metrics.slow_consumer.status(),
            self.metrics.rescan.problem(std::time::Instant::now()),
            self.registry.degraded(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_each_dependency_that_is_down() {
        let json = |r: &Report| serde_json::to_string(r).unwrap();
        let fine = Report::new(Check::ok(), Some(Check::ok()), None, None, None);
        assert!(fine.healthy());
        assert_eq!(
            json(&fine),
            r#"{"status":"ok","down":[],"checks":{"database":"ok","nats":"ok"}}"#
        );
        let rest_only = Report::new(Check::ok(), None, None, None, None);
        assert!(rest_only.healthy());
        assert!(json(&rest_only).contains(r#""nats":"not configured""#));
        let both = Report::new(
            Check("writes fail: disk full".into()),
            Some(Check("disconnected".into())),
            None,
            None,
            None,
        );
        assert!(!both.healthy());
        assert_eq!(
            json(&both),
            r#"{"status":"unavailable","down":["database","nats"],"checks":{"database":"writes fail: disk full","nats":"disconnected"}}"#
        );
    }

    #[test]
    fn a_failed_rescan_degrades_a_working_server_and_names_the_error() {
        let report = Report::new(
            Check::ok(),
            None,
            None,
            Some("the latest rescan failed, serving the previous generation: x".into()),
            None,
        );
        assert!(report.healthy());
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            json.starts_with(r#"{"status":"degraded","down":[],"degraded":["config-tree"]"#),
            "{json}"
        );
        assert!(
            json.contains(r#""config-tree":"the latest rescan failed"#),
            "{json}"
        );
    }

    #[test]
    fn dropped_heartbeats_degrade_a_working_server_without_taking_it_down() {
        let json = |r: &Report| serde_json::to_string(r).unwrap();
        let dropping = Report::new(
            Check::ok(),
            Some(Check::ok()),
            Some("dropping: at least 3".into()),
            None,
            None,
        );
        assert!(dropping.healthy());
        assert_eq!(
            json(&dropping),
            r#"{"status":"degraded","down":[],"degraded":["heartbeats"],"checks":{"database":"ok","nats":"ok","heartbeats":"dropping: at least 3"}}"#
        );
        let and_down = Report::new(
            Check::ok(),
            Some(Check("disconnected".into())),
            Some("dropping: at least 3".into()),
            None,
            None,
        );
        assert!(!and_down.healthy());
        assert!(
            json(&and_down).starts_with(
                r#"{"status":"unavailable","down":["nats"],"degraded":["heartbeats"]"#
            )
        );
    }

    #[test]
    fn a_registry_waiting_for_space_degrades_the_server_and_says_why() {
        let report = Report::new(
            Check("writes fail: database or disk is full".into()),
            None,
            None,
            None,
            Some("a schema change waits for space".into()),
        );
        assert!(!report.healthy());
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            json.starts_with(
                r#"{"status":"unavailable","down":["database"],"degraded":["registry"]"#
            ),
            "{json}"
        );
        assert!(
            json.contains(r#""registry":"a schema change waits for space""#),
            "{json}"
        );
        let reads_only = Report::new(Check::ok(), None, None, None, Some("x".into()));
        assert!(reads_only.healthy());
        assert!(
            serde_json::to_string(&reads_only)
                .unwrap()
                .starts_with(r#"{"status":"degraded""#)
        );
    }
}
