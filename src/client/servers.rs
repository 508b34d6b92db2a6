//! Several fleet servers: which one requests go to, failing over and returning.
//!
//! The servers are listed in order of preference (`url` as an array). Requests go to the
//! *current* server, at first the preferred one. A request that fails with a connection
//! error, a timeout, a server error (5xx) or 429 marks its server as down and is sent again
//! to the next server (each server at most once per request), which becomes the current
//! one. Only the connection moves: the client's identity (instance id, acknowledged
//! revision, ETag) is kept, so a server sharing the registry and the configuration tree
//! answers the next poll with 304.
//!
//! A server that is down is probed through its `GET /healthz` in the background, with
//! exponential backoff from [`MIN_PROBE_INTERVAL`] doubling to [`MAX_PROBE_INTERVAL`] and
//! jitter (each delay is drawn from its upper half, so many agents do not probe in step).
//! A probe counts as healthy when the server answers with anything but a server error or
//! 429 (a server without `/healthz` answers 404: it is there). When a server *preferred over
//! the current one* is healthy again, requests return to it: an operator lists the nearest
//! or primary server first and expects the fleet back on it once it recovers, rather than
//! staying on a backup for good. Probes are started by requests (every heartbeat and config
//! poll), so a recovery is noticed within a heartbeat interval once its probe is due.
//!
//! Every change of the current server is logged once: a warning when the client fails over
//! (which server, to which, why), info when it returns. URLs in logs and metrics never show
//! their user information (`user:password@`); reasons never show the token or the instance id.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// First delay before a failed server is probed.
pub const MIN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest delay between two probes of a server that stays down.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(60);

/// One configured server.
#[derive(Debug)]
pub(crate) struct Server {
    /// The base URL requests are built from (as configured, trailing slashes removed).
    pub base: String,
    /// The URL as logs and metrics show it: without user information.
    pub shown: String,
}

/// What the client knows about each server's health.
#[derive(Debug, Clone, Copy, Default)]
struct Health {
    down: bool,
    /// Failed probes since the server went down.
    failures: u32,
    /// When the next probe is due (only while down).
    probe_at: Option<Instant>,
    /// Whether a probe is in flight.
    probing: bool,
}

#[derive(Debug)]
struct Table {
    current: usize,
    health: Vec<Health>,
}

/// The servers and which one is current; shared by all clones of a client.
#[derive(Debug)]
pub(crate) struct Servers {
    list: Vec<Server>,
    table: Mutex<Table>,
    failovers: AtomicU64,
    /// The server whose answer (or failure) the latest request returned.
    last_used: std::sync::atomic::AtomicUsize,
}

impl Servers {
    /// The servers, in order of preference; `bases` must not be empty.
    pub(crate) fn new(bases: Vec<String>) -> Servers {
        assert!(!bases.is_empty(), "at least one fleet server");
        let health = vec![Health::default(); bases.len()];
        let list = bases
            .into_iter()
            .map(|base| Server {
                shown: shown_url(&base),
                base,
            })
            .collect();
        Servers {
            list,
            table: Mutex::new(Table { current: 0, health }),
            failovers: AtomicU64::new(0),
            last_used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Only plain assignments happen under the lock: a poisoned table is consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many servers are configured.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Server `i`.
    pub(crate) fn get(&self, i: usize) -> &Server {
        &self.list[i]
    }

    /// The index of the server requests go to now.
    pub(crate) fn current(&self) -> usize {
        self.table().current
    }

    /// The server the latest request's outcome came from: the one a failure names.
    pub(crate) fn last_used(&self) -> usize {
        self.last_used.load(Ordering::Relaxed)
    }

    /// Records that a request's outcome came from server `i`.
    pub(crate) fn used(&self, i: usize) {
        self.last_used.store(i, Ordering::Relaxed);
    }

    /// How often the current server changed (failovers and returns).
    pub(crate) fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Server `i` answered a request: it is up.
    pub(crate) fn succeeded(&self, i: usize) {
        let mut table = self.table();
        table.health[i] = Health::default();
        // Every server was down and this one answered: stay with it.
        if table.current != i && table.health[table.current].down {
            table.current = i;
        }
    }

    /// A request to server `i` failed for `reason` (a connection error, a timeout, a server
    /// error or 429): the server is down until a probe finds it healthy, and if it was the
    /// current one the next server becomes current (the caller sends the request again, to
    /// each server at most once).
    pub(crate) fn failed(&self, i: usize, reason: &str, now: Instant) {
        let mut table = self.table();
        let health = &mut table.health[i];
        if !health.down {
            *health = Health {
                down: true,
                failures: 0,
                probe_at: Some(now + probe_delay(0)),
                probing: false,
            };
        }
        // A single server is down as well (its gauge must say so), but there is nowhere
        // else to go: its next request is the probe.
        if table.current != i || self.list.len() == 1 {
            return;
        }
        let n = self.list.len();
        let next = (1..n)
            .map(|step| (i + step) % n)
            .find(|&j| !table.health[j].down)
            .unwrap_or((i + 1) % n);
        table.current = next;
        let all_down = table.health[next].down;
        drop(table);
        self.failovers.fetch_add(1, Ordering::Relaxed);
        let (from, to) = (&self.list[i].shown, &self.list[next].shown);
        if all_down {
            // The run loop's reporter already warns that the operation fails; cycling through
            // servers that are all down is not news each time.
            tracing::debug!(from = %from, to = %to, reason, "fleet: every server is down; trying the next one");
        } else {
            tracing::warn!(from = %from, to = %to, reason, "fleet: server failed; failing over to the next one");
        }
    }

    /// The servers whose probe is due at `now`, marked as being probed.
    pub(crate) fn due_probes(&self, now: Instant) -> Vec<usize> {
        if self.list.len() == 1 {
            return Vec::new();
        }
        let mut table = self.table();
        let mut due = Vec::new();
        for (i, health) in table.health.iter_mut().enumerate() {
            if health.down && !health.probing && health.probe_at.is_none_or(|at| now >= at) {
                health.probing = true;
                due.push(i);
            }
        }
        due
    }

    /// The probe of server `i` ended: `healthy`, or failed for `reason`.
    pub(crate) fn probed(&self, i: usize, healthy: Result<(), String>, now: Instant) {
        let mut table = self.table();
        match healthy {
            Ok(()) => {
                table.health[i] = Health::default();
                let current = table.current;
                // Back to a preferred server; or to any healthy one when the current is down.
                if i < current || (i != current && table.health[current].down) {
                    table.current = i;
                    drop(table);
                    self.failovers.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        from = %self.list[current].shown,
                        to = %self.list[i].shown,
                        "fleet: server is healthy again; returning to it"
                    );
                }
            }
            Err(reason) => {
                let health = &mut table.health[i];
                health.probing = false;
                if !health.down {
                    // A request found it up meanwhile.
                    return;
                }
                health.failures = health.failures.saturating_add(1);
                let delay = probe_delay(health.failures);
                health.probe_at = Some(now + delay);
                tracing::debug!(
                    server = %self.list[i].shown,
                    reason = %reason,
                    retry_in = %crate::duration::GoDuration(delay),
                    "fleet: server still down"
                );
            }
        }
    }

    /// Which servers are down now (for tests and metrics): a server is down from a failed
    /// request until it answers a request or a probe, a single server as well.
    pub(crate) fn down(&self) -> Vec<bool> {
        self.table().health.iter().map(|h| h.down).collect()
    }
}

/// The delay before the probe after `failures` failed probes: [`MIN_PROBE_INTERVAL`] doubling
/// up to [`MAX_PROBE_INTERVAL`], drawn uniformly from the upper half of that.
fn probe_delay(failures: u32) -> Duration {
    let full = (MIN_PROBE_INTERVAL * (1u32 << failures.min(16))).min(MAX_PROBE_INTERVAL);
    full.mul_f64(0.5 + 0.5 * unit_random())
}

/// A random number in `[0, 1)`: std's per-process random hasher keys, good enough for jitter.
fn unit_random() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A URL as logs and metrics may show it: without `user:password@`, trailing slashes removed.
pub(crate) fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            // Both only fail for URLs that cannot have user information.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => "<an invalid URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Servers {
        Servers::new(vec![
            "http://a:1".into(),
            "http://b:2".into(),
            "http://c:3".into(),
        ])
    }

    #[test]
    fn shown_urls_carry_no_user_information() {
        assert_eq!(
            shown_url("https://cc:hunter2@fleet.example.org:8443/cc/"),
            "https://fleet.example.org:8443/cc"
        );
        assert_eq!(shown_url("http://token@h"), "http://h");
        assert_eq!(shown_url("http://h:8080"), "http://h:8080");
    }

    #[test]
    fn probe_delays_double_with_jitter_up_to_the_cap() {
        for failures in 0..40 {
            let full = (MIN_PROBE_INTERVAL * (1u32 << failures.min(16))).min(MAX_PROBE_INTERVAL);
            let delay = probe_delay(failures);
            assert!(delay >= full / 2 && delay <= full, "{failures}: {delay:?}");
        }
        // Drawn, not fixed: 20 draws of the capped delay are not all equal.
        let draws: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| probe_delay(10)).collect();
        assert!(draws.len() > 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_server_hands_over_to_the_next_healthy_one_and_the_preferred_returns() {
        let servers = three();
        let now = Instant::now();
        assert_eq!(servers.current(), 0);
        servers.failed(0, "connection refused", now);
        assert_eq!(servers.current(), 1);
        assert_eq!(servers.down(), [true, false, false]);
        assert_eq!(servers.failovers(), 1);
        // Not due before its (jittered) first delay, due after the full one.
        assert!(servers.due_probes(now).is_empty());
        assert_eq!(servers.due_probes(now + MIN_PROBE_INTERVAL), [0]);
        // In flight: not handed out twice.
        assert!(servers.due_probes(now + MIN_PROBE_INTERVAL).is_empty());
        let first = now + MIN_PROBE_INTERVAL;
        servers.probed(0, Err("refused".into()), first);
        assert_eq!(servers.current(), 1, "still down: stay");
        // The second delay is drawn from [1 s, 2 s].
        assert!(
            servers
                .due_probes(first + MIN_PROBE_INTERVAL - Duration::from_millis(1))
                .is_empty()
        );
        let later = first + MIN_PROBE_INTERVAL * 2;
        assert_eq!(servers.due_probes(later), [0]);
        servers.probed(0, Ok(()), later);
        assert_eq!(servers.current(), 0, "back to the preferred server");
        assert_eq!(servers.down(), [false, false, false]);
        assert_eq!(servers.failovers(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_server_behind_the_current_one_does_not_take_over() {
        let servers = three();
        let now = Instant::now();
        servers.failed(0, "refused", now);
        servers.failed(1, "refused", now);
        assert_eq!(servers.current(), 2);
        let due = servers.due_probes(now + MAX_PROBE_INTERVAL);
        assert_eq!(due, [0, 1]);
        // 1 comes back but 0 does not: 1 is preferred over 2.
        servers.probed(0, Err("refused".into()), now + MAX_PROBE_INTERVAL);
        servers.probed(1, Ok(()), now + MAX_PROBE_INTERVAL);
        assert_eq!(servers.current(), 1);
        // 2 failing now is no reason to leave 1.
        servers.failed(2, "503", now + MAX_PROBE_INTERVAL);
        assert_eq!(servers.current(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_server_down_requests_cycle_and_the_first_to_answer_stays() {
        let servers = three();
        let now = Instant::now();
        servers.failed(0, "refused", now);
        servers.failed(1, "refused", now);
        servers.failed(2, "refused", now);
        assert_eq!(servers.current(), 0, "all down: round robin");
        assert_eq!(servers.down(), [true, true, true]);
        servers.failed(0, "refused", now);
        assert_eq!(servers.current(), 1);
        servers.succeeded(1);
        assert_eq!(servers.current(), 1);
        assert_eq!(servers.down(), [true, false, true]);
    }

    /// Issue 26: `fleet_server_down` stayed 0 while the only server refused connections.
    #[test]
    fn a_single_server_is_down_after_a_failure_and_up_once_it_answers() {
        let servers = Servers::new(vec!["http://a:1".into()]);
        servers.failed(0, "refused", Instant::now());
        assert_eq!(servers.current(), 0);
        assert_eq!(servers.down(), [true]);
        // Requests go to it anyway; no probe of its own and no failover counted.
        assert!(
            servers
                .due_probes(Instant::now() + MAX_PROBE_INTERVAL)
                .is_empty()
        );
        assert_eq!(servers.failovers(), 0);
        servers.failed(0, "refused", Instant::now());
        assert_eq!(servers.down(), [true]);
        servers.succeeded(0);
        assert_eq!(servers.down(), [false]);
        assert_eq!(servers.failovers(), 0);
    }
}
