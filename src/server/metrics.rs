//! Counters of the server and their Prometheus text exposition (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::registry::{State, StateCounts};

/// Counters shared by the HTTP handlers, the heartbeat consumer and the roster publisher.
#[derive(Debug, Default)]
pub struct Metrics {
    /// NATS heartbeat messages received.
    pub heartbeat_messages: AtomicU64,
    /// Heartbeat lines accepted by the decoder.
    pub heartbeats_accepted: AtomicU64,
    /// Accepted heartbeats applied to a live instance.
    pub heartbeats_applied: AtomicU64,
    /// Heartbeat lines rejected (wrong function, bad payload, undecodable message).
    pub heartbeats_rejected: AtomicU64,
    /// Accepted heartbeats for unknown or deregistered instance ids.
    pub heartbeats_unknown: AtomicU64,
    /// Heartbeat messages dropped because the consumer was overloaded.
    pub heartbeats_dropped: AtomicU64,
    /// The episodes of those drops, for the log and `/healthz`.
    pub(crate) slow_consumer: super::slow_consumer::SlowConsumer,
    /// Whether the configuration tree's rescans work (reported by `/healthz`).
    pub(crate) rescan: super::rescan::RescanStatus,
    /// Lines skipped as not meant for the fleet (other measurements, non-events).
    pub heartbeats_ignored: AtomicU64,
    /// Nanoseconds spent decoding heartbeat messages.
    pub decode_nanos: AtomicU64,
    /// Heartbeats applied through `POST /api/fleet/heartbeat/{id}`.
    pub rest_heartbeats: AtomicU64,
    /// Rosters published.
    pub roster_publishes: AtomicU64,
    /// Rosters that could not be published.
    pub roster_errors: AtomicU64,
    /// Rosters that could not be published, by subject (only subjects the publisher built,
    /// so bounded by the valid buckets).
    roster_subject_errors: Mutex<BTreeMap<String, u64>>,
    /// Active services the last roster round left out because their cluster cannot name a
    /// subject token (a gauge).
    pub roster_skipped_services: AtomicU64,
    /// Members the last roster round left out of a roster that would otherwise exceed
    /// what consumers accept (a gauge).
    pub roster_members_left_out: AtomicU64,
    /// NATS heartbeat messages whose handling panicked; the pipeline went on with the next.
    pub nats_message_panics: AtomicU64,
    /// Config tree generations loaded.
    pub config_reloads: AtomicU64,
    /// Config tree reloads that failed and kept the previous generation.
    pub config_reload_errors: AtomicU64,
    /// HTTP requests whose handling panicked (answered 500).
    pub http_panics: AtomicU64,
    /// HTTP connections closed because a request's headers did not arrive in time.
    pub http_header_timeouts: AtomicU64,
    /// HTTP connections open now (a gauge).
    pub http_connections: AtomicU64,
    /// API requests refused because the client is outside `api-allowed-ips`.
    pub refused_allowlist: AtomicU64,
    /// API requests refused for a missing or invalid token (401).
    pub refused_token: AtomicU64,
    /// API requests refused for a valid token without the `api` role (403).
    pub refused_role: AtomicU64,
    /// State-changing API requests refused as cross-site (403).
    pub refused_cross_site: AtomicU64,
    /// Heartbeat stream messages delivered again (an earlier delivery was not acknowledged).
    pub stream_redelivered: AtomicU64,
    /// Heartbeat stream batches whose apply failed; their messages were handed back for
    /// redelivery.
    pub stream_failed_batches: AtomicU64,
    /// Heartbeat stream messages terminated (never redelivered) because decoding panicked.
    pub stream_terminated: AtomicU64,
    /// Messages waiting in the heartbeat stream for the shared consumer, as of the latest
    /// delivery (a gauge).
    pub stream_pending: AtomicU64,
    /// Duplicate episodes begun: members registered in turn from different peers (see
    /// [`super::duplicates`]).
    pub duplicate_episodes: AtomicU64,
    /// Members in a duplicate episode now (a gauge, set before each rendering).
    pub duplicate_members: AtomicU64,
}

/// A consistent-enough copy of the heartbeat counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeartbeatStats {
    /// NATS heartbeat messages received.
    pub messages: u64,
    /// Heartbeat lines accepted by the decoder.
    pub accepted: u64,
    /// Accepted heartbeats applied to a live instance.
    pub applied: u64,
    /// Lines rejected.
    pub rejected: u64,
    /// Accepted heartbeats for unknown or deregistered ids.
    pub unknown: u64,
    /// Messages dropped under overload.
    pub dropped: u64,
    /// Lines ignored as not fleet heartbeats.
    pub ignored: u64,
    /// Nanoseconds spent decoding.
    pub decode_nanos: u64,
    /// Messages (or batches) whose handling panicked and was skipped.
    pub panics: u64,
    /// Heartbeat stream messages delivered again.
    pub stream_redelivered: u64,
    /// Heartbeat stream batches whose apply failed and were handed back.
    pub stream_failed_batches: u64,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a roster for `subject` that was not published.
    pub fn roster_subject_error(&self, subject: &str) {
        Metrics::add(&self.roster_errors, 1);
        let mut map = self
            .roster_subject_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match map.get_mut(subject) {
            Some(n) => *n += 1,
            None => {
                map.insert(subject.to_owned(), 1);
            }
        }
    }

    /// Unpublished rosters of `subject` so far.
    pub fn roster_errors_of(&self, subject: &str) -> u64 {
        self.roster_subject_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(subject)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn set_duplicate_members(&self, n: u64) {
        self.duplicate_members.store(n, Ordering::Relaxed);
    }

    pub(crate) fn set_roster_members_left_out(&self, n: u64) {
        self.roster_members_left_out.store(n, Ordering::Relaxed);
    }

    pub(crate) fn set_roster_skipped(&self, n: u64) {
        self.roster_skipped_services.store(n, Ordering::Relaxed);
    }

    /// The heartbeat counters.
    pub fn heartbeat_stats(&self) -> HeartbeatStats {
        HeartbeatStats {
            messages: get(&self.heartbeat_messages),
            accepted: get(&self.heartbeats_accepted),
            applied: get(&self.heartbeats_applied),
            rejected: get(&self.heartbeats_rejected),
            unknown: get(&self.heartbeats_unknown),
            dropped: get(&self.heartbeats_dropped),
            ignored: get(&self.heartbeats_ignored),
            decode_nanos: get(&self.decode_nanos),
            panics: get(&self.nats_message_panics),
            stream_redelivered: get(&self.stream_redelivered),
            stream_failed_batches: get(&self.stream_failed_batches),
        }
    }

    /// Renders the Prometheus text format (version 0.0.4).
    pub fn render(&self, states: &StateCounts) -> String {
        let mut out = String::with_capacity(2048);
        let _ = writeln!(
            out,
            "# HELP ccfleet_build_info The running ccfleet build (always 1).\n\
             # TYPE ccfleet_build_info gauge\n\
             ccfleet_build_info{{component=\"server\",version=\"{}\"}} 1",
            label_value(env!("CARGO_PKG_VERSION"))
        );
        out.push_str(
            "# HELP ccfleet_instances Registered fleet instances by state.\n\
             # TYPE ccfleet_instances gauge\n",
        );
        for state in State::ALL {
            let _ = writeln!(
                out,
                "ccfleet_instances{{state=\"{}\"}} {}",
                state.as_str(),
                states.get(state)
            );
        }
        out.push_str(
            "# HELP ccfleet_heartbeats_total Heartbeats by outcome (nats: accepted, applied, \
             rejected, unknown, ignored; rest: applied over HTTP).\n\
             # TYPE ccfleet_heartbeats_total counter\n",
        );
        for (source, result, counter) in [
            ("nats", "accepted", &self.heartbeats_accepted),
            ("nats", "applied", &self.heartbeats_applied),
            ("nats", "rejected", &self.heartbeats_rejected),
            ("nats", "unknown", &self.heartbeats_unknown),
            ("nats", "ignored", &self.heartbeats_ignored),
            ("rest", "applied", &self.rest_heartbeats),
        ] {
            let _ = writeln!(
                out,
                "ccfleet_heartbeats_total{{source=\"{source}\",result=\"{result}\"}} {}",
                get(counter)
            );
        }
        let decode_seconds = get(&self.decode_nanos) as f64 / 1e9;
        let _ = write!(
            out,
            "# HELP ccfleet_heartbeat_messages_total NATS heartbeat messages received.\n\
             # TYPE ccfleet_heartbeat_messages_total counter\n\
             ccfleet_heartbeat_messages_total {}\n\
             # HELP ccfleet_heartbeat_messages_dropped_total NATS heartbeat messages dropped under overload (a lower bound: the NATS client sheds drop reports in large bursts).\n\
             # TYPE ccfleet_heartbeat_messages_dropped_total counter\n\
             ccfleet_heartbeat_messages_dropped_total {}\n\
             # HELP ccfleet_heartbeat_drop_episodes_total Episodes of NATS heartbeat messages dropped at the subscription (slow consumer); /healthz reports one while it lasts.\n\
             # TYPE ccfleet_heartbeat_drop_episodes_total counter\n\
             ccfleet_heartbeat_drop_episodes_total {}\n\
             # HELP ccfleet_heartbeat_decode_seconds_total Time spent decoding heartbeat messages.\n\
             # TYPE ccfleet_heartbeat_decode_seconds_total counter\n\
             ccfleet_heartbeat_decode_seconds_total {decode_seconds}\n\
             # HELP ccfleet_roster_publishes_total Discovery rosters published.\n\
             # TYPE ccfleet_roster_publishes_total counter\n\
             ccfleet_roster_publishes_total {}\n\
             # HELP ccfleet_roster_publish_errors_total Discovery rosters that could not be published.\n\
             # TYPE ccfleet_roster_publish_errors_total counter\n\
             ccfleet_roster_publish_errors_total {}\n\
             # HELP ccfleet_config_reloads_total Config tree generations loaded.\n\
             # TYPE ccfleet_config_reloads_total counter\n\
             ccfleet_config_reloads_total {}\n\
             # HELP ccfleet_config_reload_errors_total Config tree reloads that kept the previous generation.\n\
             # TYPE ccfleet_config_reload_errors_total counter\n\
             ccfleet_config_reload_errors_total {}\n",
            get(&self.heartbeat_messages),
            get(&self.heartbeats_dropped),
            self.slow_consumer.episodes(),
            get(&self.roster_publishes),
            get(&self.roster_errors),
            get(&self.config_reloads),
            get(&self.config_reload_errors),
        );
        let _ = write!(
            out,
            "# HELP ccfleet_api_refused_total API requests refused before reaching a handler, by reason.\n\
             # TYPE ccfleet_api_refused_total counter\n\
             ccfleet_api_refused_total{{reason=\"allowlist\"}} {}\n\
             ccfleet_api_refused_total{{reason=\"token\"}} {}\n\
             ccfleet_api_refused_total{{reason=\"role\"}} {}\n\
             ccfleet_api_refused_total{{reason=\"cross-site\"}} {}\n\
             # HELP ccfleet_http_header_timeouts_total HTTP connections closed because request headers did not arrive in time.\n\
             # TYPE ccfleet_http_header_timeouts_total counter\n\
             ccfleet_http_header_timeouts_total {}\n\
             # HELP ccfleet_http_connections HTTP connections open.\n\
             # TYPE ccfleet_http_connections gauge\n\
             ccfleet_http_connections {}\n",
            get(&self.refused_allowlist),
            get(&self.refused_token),
            get(&self.refused_role),
            get(&self.refused_cross_site),
            get(&self.http_header_timeouts),
            get(&self.http_connections),
        );
        out.push_str(
            "# HELP ccfleet_roster_subject_errors_total Discovery rosters not published, by subject.\n\
             # TYPE ccfleet_roster_subject_errors_total counter\n",
        );
        for (subject, n) in self
            .roster_subject_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "ccfleet_roster_subject_errors_total{{subject=\"{}\"}} {n}",
                label_value(subject)
            );
        }
        let _ = write!(
            out,
            "# HELP ccfleet_roster_skipped_services Active services left out of every roster: their cluster cannot name a NATS subject token.\n\
             # TYPE ccfleet_roster_skipped_services gauge\n\
             ccfleet_roster_skipped_services {}\n\
             # HELP ccfleet_roster_members_left_out Members left out of a roster that would otherwise exceed what its consumers accept.\n\
             # TYPE ccfleet_roster_members_left_out gauge\n\
             ccfleet_roster_members_left_out {}\n\
             # HELP ccfleet_message_panics_total Messages whose handling panicked; the pipeline went on with the next.\n\
             # TYPE ccfleet_message_panics_total counter\n\
             ccfleet_message_panics_total{{source=\"nats\"}} {}\n\
             ccfleet_message_panics_total{{source=\"http\"}} {}\n",
            get(&self.roster_skipped_services),
            get(&self.roster_members_left_out),
            get(&self.nats_message_panics),
            get(&self.http_panics),
        );
        let _ = write!(
            out,
            "# HELP ccfleet_heartbeat_stream_redelivered_total Heartbeat stream messages delivered again after an unacknowledged delivery.\n\
             # TYPE ccfleet_heartbeat_stream_redelivered_total counter\n\
             ccfleet_heartbeat_stream_redelivered_total {}\n\
             # HELP ccfleet_heartbeat_stream_failed_batches_total Heartbeat stream batches not applied and handed back for redelivery.\n\
             # TYPE ccfleet_heartbeat_stream_failed_batches_total counter\n\
             ccfleet_heartbeat_stream_failed_batches_total {}\n\
             # HELP ccfleet_heartbeat_stream_terminated_total Heartbeat stream messages dropped for good because their handling panicked.\n\
             # TYPE ccfleet_heartbeat_stream_terminated_total counter\n\
             ccfleet_heartbeat_stream_terminated_total {}\n\
             # HELP ccfleet_heartbeat_stream_pending Heartbeat stream messages waiting for the consumer at the latest delivery.\n\
             # TYPE ccfleet_heartbeat_stream_pending gauge\n\
             ccfleet_heartbeat_stream_pending {}\n",
            get(&self.stream_redelivered),
            get(&self.stream_failed_batches),
            get(&self.stream_terminated),
            get(&self.stream_pending),
        );
        let _ = write!(
            out,
            "# HELP ccfleet_duplicate_episodes_total Duplicate identities found: a member registered in turn from different peers, two services sharing its cluster, host name and type.\n\
             # TYPE ccfleet_duplicate_episodes_total counter\n\
             ccfleet_duplicate_episodes_total {}\n\
             # HELP ccfleet_duplicate_members Members whose registrations alternate between peers now.\n\
             # TYPE ccfleet_duplicate_members gauge\n\
             ccfleet_duplicate_members {}\n",
            get(&self.duplicate_episodes),
            get(&self.duplicate_members),
        );
        out
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters() {
        let m = Metrics::default();
        Metrics::add(&m.heartbeats_applied, 5);
        Metrics::add(&m.decode_nanos, 1_500_000_000);
        let text = m.render(&StateCounts {
            active: 3,
            ..StateCounts::default()
        });
        assert!(text.contains("ccfleet_instances{state=\"active\"} 3\n"));
        assert!(text.contains("ccfleet_instances{state=\"pending\"} 0\n"));
        assert!(text.contains("ccfleet_heartbeats_total{source=\"nats\",result=\"applied\"} 5\n"));
        assert!(text.contains("ccfleet_heartbeat_decode_seconds_total 1.5\n"));
        m.roster_subject_error("cc.fleet.discovery.fritz.ccmc");
        m.roster_subject_error("cc.fleet.discovery.fritz.ccmc");
        m.roster_subject_error("odd\"subject");
        let text = m.render(&StateCounts::default());
        assert!(text.contains(
            "ccfleet_roster_subject_errors_total{subject=\"cc.fleet.discovery.fritz.ccmc\"} 2\n"
        ));
        assert!(
            text.contains("ccfleet_roster_subject_errors_total{subject=\"odd\\\"subject\"} 1\n")
        );
        assert!(text.contains("ccfleet_roster_publish_errors_total 3\n"));
        assert!(text.contains("ccfleet_message_panics_total{source=\"nats\"} 0\n"));
        assert!(text.contains("ccfleet_heartbeat_stream_failed_batches_total 0\n"));
        assert!(text.contains("ccfleet_heartbeat_stream_pending 0\n"));
        assert!(text.contains("ccfleet_duplicate_episodes_total 0\n"));
        assert!(text.contains("ccfleet_duplicate_members 0\n"));
        assert!(text.starts_with(&format!(
            "# HELP ccfleet_build_info The running ccfleet build (always 1).\n\
             # TYPE ccfleet_build_info gauge\n\
             ccfleet_build_info{{component=\"server\",version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.split(' ').count() == 2)
        );
    }
}
