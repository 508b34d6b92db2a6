//! One roster publisher (and one stale sweeper) among the servers sharing a JetStream
//! registry: a lease on one key of the bucket.
//!
//! The holder renews the lease (a compare-and-set write of its id) every third of the
//! TTL. The others read the key as often; one that sees the same revision for a whole TTL,
//! measured on its own clock, takes the lease over with a compare-and-set write at that
//! revision (of several trying, one wins). Only monotonic clocks are compared, each with
//! itself, so clock skew between machines does not matter:
//! - the holder leads until the TTL has passed since it *sent* its last successful renewal;
//! - a follower takes over no earlier than a TTL after it *saw* that renewal, which is
//!   after it was written: the old holder has stopped by then.
//!
//! A holder that dies stops renewing: a follower sees the last revision at most a third of
//! a TTL after it was written and takes over a TTL later, at most another third of a TTL
//! late, so failover takes at most five thirds of a TTL (within two lease periods). A
//! holder that stops cleanly deletes the lease, and a follower takes over at its next read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::registry::jetstream::LEASE_KEY;
use super::stopped;

/// Whether this server holds the lease; cheap to clone and to ask.
#[derive(Debug, Clone)]
pub struct Gate(Arc<Mutex<GateState>>);

#[derive(Debug)]
struct GateState {
    /// The holder leads until this instant (`None`: not the holder).
    until: Option<Instant>,
}

impl Gate {
    /// A gate that always leads (a server with a registry of its own).
    pub fn always() -> Gate {
        Gate(Arc::new(Mutex::new(GateState {
            until: Some(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)),
        })))
    }

    fn none() -> Gate {
        Gate(Arc::new(Mutex::new(GateState { until: None })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this server leads now.
    pub fn is_leader(&self) -> bool {
        self.state()
            .until
            .is_some_and(|until| Instant::now() < until)
    }

    fn lead_until(&self, until: Instant) -> bool {
        let mut state = self.state();
        let gained = state.until.is_none_or(|u| Instant::now() >= u);
        state.until = Some(until);
        gained
    }

    fn step_down(&self) {
        self.state().until = None;
    }
}

/// What the lease task needs.
pub(crate) struct Lease {
    pub kv: kv::Store,
    pub ttl: Duration,
    /// Called when this server becomes the holder (publish rosters now).
    pub on_gain: Box<dyn Fn() + Send + Sync>,
}

/// Starts competing for the lease; the gate tells whether this server holds it.
pub(crate) fn spawn(lease: Lease, mut shutdown: watch::Receiver<bool>) -> (Gate, JoinHandle<()>) {
    let gate = Gate::none();
    let task_gate = gate.clone();
    let task = tokio::spawn(async move {
        let me = format!("{:032x}", u128::from_be_bytes(rand::random()));
        let period = lease.ttl / 3;
        // The revision this server holds, or the one it saw last and since when.
        let mut held: Option<u64> = None;
        let mut seen: Option<(u64, Instant)> = None;
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => {
                    if let Some(revision) = held {
                        task_gate.step_down();
                        let _ = tokio::time::timeout(
                            Duration::from_secs(2),
                            lease.kv.delete_expect_revision(LEASE_KEY, Some(revision)),
                        ).await;
                    }
                    return;
                }
                _ = ticker.tick() => {}
            }
            let sent = Instant::now();
            let value = Bytes::from(me.clone());
            let outcome = match held {
                Some(revision) => lease
                    .kv
                    .update(LEASE_KEY, value, revision)
                    .await
                    .map_err(Some),
                None => match lease.kv.entry(LEASE_KEY).await {
                    Err(_) => Err(None),
                    Ok(entry) => match entry {
                        None => lease.kv.create(LEASE_KEY, value).await.map_err(|_| None),
                        Some(e) if e.operation != Operation::Put => lease
                            .kv
                            .update(LEASE_KEY, value, e.revision)
                            .await
                            .map_err(Some),
                        Some(e) => match seen {
                            Some((revision, at)) if revision == e.revision => {
                                if at.elapsed() >= lease.ttl {
                                    lease
                                        .kv
                                        .update(LEASE_KEY, value, e.revision)
                                        .await
                                        .map_err(Some)
                                } else {
                                    continue;
                                }
                            }
                            _ => {
                                seen = Some((e.revision, Instant::now()));
                                continue;
                            }
                        },
                    },
                },
            };
            match outcome {
                Ok(revision) => {
                    held = Some(revision);
                    seen = None;
                    if failing {
                        tracing::warn!("fleet: the roster lease can be renewed again");
                        failing = false;
                    }
                    if task_gate.lead_until(sent + lease.ttl) {
                        tracing::info!(
                            "fleet: this server now publishes rosters and sweeps stale services"
                        );
                        (lease.on_gain)();
                    }
                }
                Err(Some(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // Another server holds it (or took it over): follow.
                    if held.take().is_some() {
                        tracing::warn!("fleet: another server took over the roster lease");
                    }
                    task_gate.step_down();
                    seen = None;
                }
                Err(e) => {
                    // JetStream unreachable: keep the revision and retry; the gate closes
                    // by itself when the TTL since the last renewal has passed.
                    if !failing {
                        tracing::warn!(
                            "fleet: the roster lease cannot be read or renewed{}",
                            e.map(|e| format!(": {e}")).unwrap_or_default()
                        );
                        failing = true;
                    }
                }
            }
        }
    });
    (gate, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_leads_only_until_its_deadline() {
        let gate = Gate::none();
        assert!(!gate.is_leader());
        assert!(gate.lead_until(Instant::now() + Duration::from_secs(60)));
        assert!(gate.is_leader());
        assert!(!gate.lead_until(Instant::now() + Duration::from_secs(60)));
        gate.lead_until(Instant::now() - Duration::from_millis(1));
        assert!(!gate.is_leader());
        assert!(Gate::always().is_leader());
    }
}
