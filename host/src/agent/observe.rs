//! The agent's optional monitoring listener (`metrics-addr`): `GET /metrics` in the
//! Prometheus text format, `GET /healthz` (alive) and `GET /readyz` (ready; see
//! [`super::health`]).
//!
//! Everything shown is about this agent's own work: plugin states, restarts, quarantines,
//! calls and their latency, points emitted and dropped, granted commands run, the metric
//! output, the fleet and NATS
//! connections, the fleet server in use and the configuration revision. Nothing secret is
//! shown: no instance id, no token, no NATS address or credentials, fleet server URLs only
//! without their user information; plugin names come from the agent's own configuration and
//! the revision is escaped and capped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ccfleet::client::{self, Client};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::sinks::{SinkCounters, SinkInfo};
use crate::plugin::commands::RunResult;
use crate::plugin::stats::{CALLS, LATENCY_BUCKETS};
use crate::plugin::{PluginState, PluginStats, PluginStatus};

/// The content type of the Prometheus text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Longest configuration revision shown; a longer one is cut (it comes from cc-backend).
const MAX_REVISION: usize = 128;

/// Picks one counter of a sink.
type Counter = fn(&SinkCounters) -> &std::sync::atomic::AtomicU64;

/// Every plugin state, in the order the `state` label lists them.
pub(super) const STATES: [(PluginState, &str); 6] = [
    (PluginState::Starting, "starting"),
    (PluginState::Running, "running"),
    (PluginState::Backoff, "backoff"),
    (PluginState::Quarantined, "quarantined"),
    (PluginState::LoadFailed, "load_failed"),
    (PluginState::Stopped, "stopped"),
];

/// The configuration the plugins run with now.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConfigState {
    pub revision: String,
    pub source: client::Source,
}

/// Results of rollouts, for `ccfleet_agent_plugin_rollouts_total{plugin,result}`.
pub(crate) type RolloutCounts = Mutex<BTreeMap<(String, &'static str), u64>>;

/// One plugin as the listener sees it.
pub(crate) struct ObservedPlugin {
    pub name: Arc<str>,
    pub status: watch::Receiver<PluginStatus>,
    pub stats: Arc<PluginStats>,
}

/// What the listener reads; all of it is shared with the running agent.
pub(crate) struct Observed {
    /// The agent's own plugins, then the fleet's (which a rollout swaps).
    pub plugins: Arc<std::sync::RwLock<Vec<ObservedPlugin>>>,
    /// Rollout results of fleet plugins by plugin and result.
    pub rollouts: Arc<RolloutCounts>,
    pub sinks: Vec<SinkInfo>,
    pub client: Client,
    pub nats: Option<async_nats::Client>,
    pub config: watch::Receiver<ConfigState>,
    /// The agent's long-running loops, for `/healthz`.
    pub loops: Arc<super::loops::Loops>,
    /// The plugins the fleet names and whether they run (`None` without a rollout).
    pub assignments: Option<Arc<super::loops::Assignments>>,
    /// The router's counters (`None` when no router changes points).
    pub router: Option<Arc<super::router::RouterStats>>,
}

/// Escapes a Prometheus label value (backslash, quote, newline).
fn label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn cap(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

impl Observed {
    pub(super) fn nats_connected(&self) -> Option<bool> {
        self.nats
            .as_ref()
            .map(|c| c.connection_state() == async_nats::connection::State::Connected)
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        header(
            &mut out,
            "ccfleet_build_info",
            "gauge",
            "The running ccfleet build (always 1).",
        );
        let _ = writeln!(
            out,
            "ccfleet_build_info{{component=\"agent\",version=\"{}\"}} 1",
            label(env!("CARGO_PKG_VERSION"))
        );

        let (statuses, stats): (Vec<(String, PluginStatus)>, Vec<_>) = self
            .plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| {
                (
                    (label(&p.name), p.status.borrow().clone()),
                    p.stats.snapshot(),
                )
            })
            .unzip();

        header(
            &mut out,
            "ccfleet_agent_plugin_info",
            "gauge",
            "The SHA-256 of the component each plugin runs (always 1).",
        );
        for (name, status) in &statuses {
            if let Some(hash) = &status.hash {
                let _ = writeln!(
                    out,
                    "ccfleet_agent_plugin_info{{plugin=\"{name}\",sha256=\"{}\"}} 1",
                    label(hash)
                );
            }
        }
        header(
            &mut out,
            "ccfleet_agent_plugin_rollouts_total",
            "counter",
            "Fleet plugin rollouts by result: swapped (the new version runs), download_failed, \
             hash_mismatch, store_failed, instantiate_failed (the old version kept running); \
             refused: beyond_ceiling, unsigned, signature_untrusted, signature_mismatch, \
             signature_malformed.",
        );
        for ((plugin, result), n) in self
            .rollouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "ccfleet_agent_plugin_rollouts_total{{plugin=\"{}\",result=\"{result}\"}} {n}",
                label(cap(plugin, MAX_REVISION))
            );
        }

        header(
            &mut out,
            "ccfleet_agent_plugin_state",
            "gauge",
            "1 for the state each plugin is in, 0 for the others.",
        );
        for (name, status) in &statuses {
            for (state, state_name) in STATES {
                let _ = writeln!(
                    out,
                    "ccfleet_agent_plugin_state{{plugin=\"{name}\",state=\"{state_name}\"}} {}",
                    u8::from(status.state == state)
                );
            }
        }
        header(
            &mut out,
            "ccfleet_agent_plugin_generation",
            "gauge",
            "The plugin's current instantiation, counted from 1.",
        );
        for (name, status) in &statuses {
            let _ = writeln!(
                out,
                "ccfleet_agent_plugin_generation{{plugin=\"{name}\"}} {}",
                status.generation
            );
        }
        let per_plugin =
            |out: &mut String, metric: &str, help: &str, value: &dyn Fn(usize) -> u64| {
                header(out, metric, "counter", help);
                for (i, (name, _)) in statuses.iter().enumerate() {
                    let _ = writeln!(out, "{metric}{{plugin=\"{name}\"}} {}", value(i));
                }
            };
        per_plugin(
            &mut out,
            "ccfleet_agent_plugin_restarts_total",
            "Restarts of the plugin after a failure.",
            &|i| stats[i].restarts,
        );
        per_plugin(
            &mut out,
            "ccfleet_agent_plugin_quarantines_total",
            "Times the plugin spent its restart budget and was quarantined.",
            &|i| stats[i].quarantines,
        );
        per_plugin(
            &mut out,
            "ccfleet_agent_points_emitted_total",
            "Points the plugin emitted that were handed to the metric output.",
            &|i| stats[i].points_emitted,
        );

        header(
            &mut out,
            "ccfleet_agent_points_dropped_total",
            "counter",
            "Points the plugin emitted that were dropped: refused (malformed or over its limits), \
             sink_full (the output fell behind), sink_closed (the output had stopped).",
        );
        for (i, (name, _)) in statuses.iter().enumerate() {
            for (reason, n) in [
                ("refused", stats[i].points_refused),
                ("sink_full", stats[i].points_sink_full),
                ("sink_closed", stats[i].points_sink_closed),
            ] {
                let _ = writeln!(
                    out,
                    "ccfleet_agent_points_dropped_total{{plugin=\"{name}\",reason=\"{reason}\"}} {n}"
                );
            }
        }

        header(
            &mut out,
            "ccfleet_agent_plugin_calls_total",
            "counter",
            "Calls into the plugin by function and result: ok, error (the plugin's own error, \
             survived), failed (trap, deadline or memory limit; the instance was dropped).",
        );
        for (i, (name, _)) in statuses.iter().enumerate() {
            for (call, snap) in CALLS.iter().zip(&stats[i].calls) {
                for (result, n) in [
                    ("ok", snap.ok),
                    ("error", snap.error),
                    ("failed", snap.failed),
                ] {
                    let _ = writeln!(
                        out,
                        "ccfleet_agent_plugin_calls_total{{plugin=\"{name}\",call=\"{call}\",result=\"{result}\"}} {n}"
                    );
                }
            }
        }
        header(
            &mut out,
            "ccfleet_agent_plugin_call_duration_seconds",
            "histogram",
            "How long calls into the plugin took (init includes instantiation).",
        );
        for (i, (name, _)) in statuses.iter().enumerate() {
            for (call, snap) in CALLS.iter().zip(&stats[i].calls) {
                let labels = format!("plugin=\"{name}\",call=\"{call}\"");
                let mut cumulative = 0;
                for (bound, n) in LATENCY_BUCKETS.iter().zip(&snap.buckets) {
                    cumulative += n;
                    let _ = writeln!(
                        out,
                        "ccfleet_agent_plugin_call_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                    );
                }
                // The count is the sum of the buckets, so the two always agree.
                cumulative += snap.buckets.last().copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "ccfleet_agent_plugin_call_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {cumulative}\n\
                     ccfleet_agent_plugin_call_duration_seconds_sum{{{labels}}} {}\n\
                     ccfleet_agent_plugin_call_duration_seconds_count{{{labels}}} {cumulative}",
                    snap.seconds
                );
            }
        }

        header(
            &mut out,
            "ccfleet_agent_plugin_command_runs_total",
            "counter",
            "Granted commands the plugin asked to run, by result: ok (exit status 0), \
             exit_nonzero (another status or a signal; the output went to the plugin), timeout \
             and output_cap (killed), failed (could not be run: unusable since start-up, \
             replaced, or the start failed), refused (a name not granted).",
        );
        for (i, (name, _)) in statuses.iter().enumerate() {
            for result in RunResult::ALL {
                let _ = writeln!(
                    out,
                    "ccfleet_agent_plugin_command_runs_total{{plugin=\"{name}\",result=\"{}\"}} {}",
                    result.as_str(),
                    stats[i].commands.count(result)
                );
            }
        }
        header(
            &mut out,
            "ccfleet_agent_plugin_command_seconds_total",
            "counter",
            "Time the plugin's granted commands ran.",
        );
        for (i, (name, _)) in statuses.iter().enumerate() {
            let _ = writeln!(
                out,
                "ccfleet_agent_plugin_command_seconds_total{{plugin=\"{name}\"}} {}",
                stats[i].commands.seconds
            );
        }

        header(
            &mut out,
            "ccfleet_agent_likwid_skipped_event_sets_total",
            "counter",
            "LIKWID event sets not measured because LIKWID's lock file belonged to another \
             user (a job measuring with likwid-perfctr): the counters were theirs.",
        );
        let _ = writeln!(
            out,
            "ccfleet_agent_likwid_skipped_event_sets_total {}",
            crate::plugin::native::likwid::skipped_event_sets()
        );

        self.render_sinks(&mut out);
        self.render_router(&mut out);

        let _ = write!(
            out,
            "# HELP ccfleet_agent_fleet_registered 1 while the agent holds an instance id from cc-backend.\n\
             # TYPE ccfleet_agent_fleet_registered gauge\n\
             ccfleet_agent_fleet_registered {}\n",
            u8::from(self.client.registered())
        );
        let _ = write!(
            out,
            "# HELP ccfleet_agent_fleet_operations_failing Fleet operations (register, heartbeat, config, subscribe) failing now; 0 while cc-backend answers.\n\
             # TYPE ccfleet_agent_fleet_operations_failing gauge\n\
             ccfleet_agent_fleet_operations_failing {}\n",
            self.client.failing_operations()
        );
        header(
            &mut out,
            "ccfleet_agent_fleet_server_info",
            "gauge",
            "The fleet server requests go to now (its URL without user information; always 1).",
        );
        let _ = writeln!(
            out,
            "ccfleet_agent_fleet_server_info{{url=\"{}\"}} 1",
            label(self.client.current_server())
        );
        header(
            &mut out,
            "ccfleet_agent_fleet_server_down",
            "gauge",
            "1 for each configured fleet server that failed and has not answered a health probe since.",
        );
        for (url, down) in self.client.servers() {
            let _ = writeln!(
                out,
                "ccfleet_agent_fleet_server_down{{url=\"{}\"}} {}",
                label(&url),
                u8::from(down)
            );
        }
        header(
            &mut out,
            "ccfleet_agent_fleet_instance_replacements_total",
            "counter",
            "Times the fleet server no longer knew this agent's instance and it registered again; \
             growing at every heartbeat, another service registers with the same cluster, host \
             name and type.",
        );
        let _ = writeln!(
            out,
            "ccfleet_agent_fleet_instance_replacements_total {}",
            self.client.replacements()
        );
        header(
            &mut out,
            "ccfleet_agent_fleet_server_changes_total",
            "counter",
            "Times the agent moved to another fleet server: failovers and returns to a preferred one.",
        );
        let _ = writeln!(
            out,
            "ccfleet_agent_fleet_server_changes_total {}",
            self.client.server_changes()
        );
        if let Some(connected) = self.nats_connected() {
            let _ = write!(
                out,
                "# HELP ccfleet_agent_nats_connected 1 while the NATS connection is up.\n\
                 # TYPE ccfleet_agent_nats_connected gauge\n\
                 ccfleet_agent_nats_connected {}\n",
                u8::from(connected)
            );
        }
        let rosters = self.client.roster_stats();
        header(
            &mut out,
            "ccfleet_agent_rosters_total",
            "counter",
            "Discovery rosters received, by result.",
        );
        for (result, n) in [
            ("accepted", rosters.accepted),
            ("too_large", rosters.too_large),
            ("too_many_providers", rosters.too_many_providers),
            ("bad_signature", rosters.bad_signature),
            ("stale", rosters.stale),
            ("malformed", rosters.malformed),
        ] {
            let _ = writeln!(
                out,
                "ccfleet_agent_rosters_total{{result=\"{result}\"}} {n}"
            );
        }
        let config = self.config.borrow().clone();
        let _ = write!(
            out,
            "# HELP ccfleet_agent_config_info The configuration the plugins run with: its revision and where it came from (fleet, cache or none).\n\
             # TYPE ccfleet_agent_config_info gauge\n\
             ccfleet_agent_config_info{{revision=\"{}\",source=\"{}\"}} 1\n",
            label(cap(&config.revision, MAX_REVISION)),
            config.source.as_str()
        );
        out
    }

    /// Every sink's counters, labelled by the sink's name.
    fn render_router(&self, out: &mut String) {
        let Some(router) = &self.router else {
            return;
        };
        let c = router.snapshot();
        header(
            out,
            "ccfleet_agent_router_points_total",
            "counter",
            "Points through the router by result: in (from the plugins), dropped (by a rule), \
             failed (a condition failed on the point, or it was no longer valid line protocol), \
             aggregated (made by interval_aggregates), not_cached (left out of a full \
             aggregate cache).",
        );
        for (result, n) in [
            ("in", c.points_in),
            ("dropped", c.dropped),
            ("failed", c.failed),
            ("aggregated", c.aggregated),
            ("not_cached", c.not_cached),
        ] {
            let _ = writeln!(
                out,
                "ccfleet_agent_router_points_total{{result=\"{result}\"}} {n}"
            );
        }
    }

    fn render_sinks(&self, out: &mut String) {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let families: [(&str, &str, Counter); 4] = [
            (
                "ccfleet_agent_sink_batches_total",
                "Writes (NATS publishes, cc-metric-store requests, stdout writes) the sink made.",
                |c| &c.batches,
            ),
            (
                "ccfleet_agent_sink_points_total",
                "Points the sink sent.",
                |c| &c.sent,
            ),
            (
                "ccfleet_agent_sink_errors_total",
                "Writes of the sink that failed (each attempt, retried or not).",
                |c| &c.errors,
            ),
            (
                "ccfleet_agent_sink_retries_total",
                "Failed cc-metric-store requests kept for another try.",
                |c| &c.retried,
            ),
        ];
        for (metric, help, counter) in families {
            header(out, metric, "counter", help);
            for sink in &self.sinks {
                let _ = writeln!(
                    out,
                    "{metric}{{sink=\"{}\",type=\"{}\"}} {}",
                    label(&sink.name),
                    sink.kind.as_str(),
                    load(counter(&sink.counters))
                );
            }
        }
        header(
            out,
            "ccfleet_agent_sink_delivering",
            "gauge",
            "1 while the sink's latest write succeeded (or it has not written yet), 0 while it fails.",
        );
        for sink in &self.sinks {
            let _ = writeln!(
                out,
                "ccfleet_agent_sink_delivering{{sink=\"{}\",type=\"{}\"}} {}",
                label(&sink.name),
                sink.kind.as_str(),
                u8::from(sink.counters.delivery_failure().is_none())
            );
        }
        header(
            out,
            "ccfleet_agent_sink_points_lost_total",
            "counter",
            "Points the sink dropped, whatever the reason.",
        );
        for sink in &self.sinks {
            let _ = writeln!(
                out,
                "ccfleet_agent_sink_points_lost_total{{sink=\"{}\",type=\"{}\"}} {}",
                label(&sink.name),
                sink.kind.as_str(),
                sink.counters.dropped()
            );
        }
        header(
            out,
            "ccfleet_agent_sink_points_dropped_total",
            "counter",
            "Points the sink dropped by reason: queue_full (it fell behind the plugins), \
             retry_buffer_full (the oldest held for retrying), rejected (a 4xx answer other \
             than 429), write_failed (no retry left).",
        );
        for sink in &self.sinks {
            let c = &sink.counters;
            for (reason, n) in [
                ("queue_full", &c.dropped_queue_full),
                ("retry_buffer_full", &c.dropped_retry_buffer),
                ("rejected", &c.dropped_rejected),
                ("write_failed", &c.dropped_failed),
            ] {
                let _ = writeln!(
                    out,
                    "ccfleet_agent_sink_points_dropped_total{{sink=\"{}\",type=\"{}\",reason=\"{reason}\"}} {}",
                    label(&sink.name),
                    sink.kind.as_str(),
                    load(n)
                );
            }
        }
    }
}

async fn metrics(State(observed): State<Arc<Observed>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], observed.render())
}

async fn healthz(State(observed): State<Arc<Observed>>) -> impl IntoResponse {
    observed.liveness()
}

async fn readyz(State(observed): State<Arc<Observed>>) -> impl IntoResponse {
    observed.readiness()
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is aborted.
pub(crate) fn serve(listener: TcpListener, observed: Arc<Observed>) -> JoinHandle<()> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(observed);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the metrics listener failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_with_quotes_backslashes_and_newlines_stays_one_label() {
        let revision = "r\"7\\\nx";
        let line = format!(
            "ccfleet_agent_config_info{{revision=\"{}\",source=\"fleet\"}} 1",
            label(revision)
        );
        assert_eq!(line.lines().count(), 1);
        let scrape = prometheus_parse::Scrape::parse(std::iter::once(Ok(line))).unwrap();
        assert_eq!(scrape.samples.len(), 1);
        assert_eq!(scrape.samples[0].labels.get("source"), Some("fleet"));
    }

    #[test]
    fn a_long_revision_is_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let cut = cap(&long, MAX_REVISION);
        assert!(cut.len() <= MAX_REVISION && cut.chars().all(|c| c == 'é'));
        assert_eq!(cap("7", MAX_REVISION), "7");
    }
}
