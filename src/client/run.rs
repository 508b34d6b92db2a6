//! Bootstrap, the run loop and shutdown.
//!
//! The loop heartbeats and polls on their intervals, re-registers at once when cc-backend
//! forgets the instance, backs registration off exponentially so a rejected token does not
//! hammer cc-backend, and keeps a discovery subscription on the application's current NATS
//! client. Failures are logged once as a warning, repeats at debug level, and the recovery at
//! info level.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::error::{BootstrapError, Error, Op};
use super::latest::Slot;
use super::rosters::RosterGate;
use super::{Client, Inner, Source, Update};
use crate::wire::Provider;

/// First registration retry delay.
pub const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// Longest registration retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// Registration retry state: after `n` consecutive failures the next attempt waits
/// `MIN_BACKOFF * 2^n`, capped at [`MAX_BACKOFF`].
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
    next: Option<Instant>,
}

impl Backoff {
    /// Records a failure at `now` and returns the delay until the next attempt.
    pub(crate) fn fail(&mut self, now: Instant) -> Duration {
        let delay = (MIN_BACKOFF * (1u32 << self.failures.min(16))).min(MAX_BACKOFF);
        self.failures = self.failures.saturating_add(1);
        self.next = Some(now + delay);
        delay
    }

    /// Whether an attempt is allowed at `now`.
    pub(crate) fn ready(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    pub(crate) fn reset(&mut self) {
        *self = Backoff::default();
    }
}

/// Whether `run` is active and whether the client is closed, changed together so `run` and
/// `close` cannot miss each other.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Lifecycle {
    running: bool,
    closed: bool,
}

impl Client {
    /// Gets the initial configuration within `timeout`: registers if needed and pulls.
    ///
    /// With a cache configured, its ETag is sent, so an unchanged server answers 304 and the
    /// cached configuration is returned as [`Source::Fleet`]. On failure the error carries the
    /// update to start with: the cached configuration ([`Source::Cache`]) or none.
    pub async fn bootstrap(&self, timeout: Duration) -> Result<Update, BootstrapError> {
        let inner = &self.inner;
        let fallback = match inner.load_cache().await {
            Some(entry) => {
                let mut state = inner.state();
                // Adopt the cache only when nothing newer has been received.
                if state.blob.is_none() {
                    state.etag = entry.etag;
                    state.revision.clone_from(&entry.revision);
                    state.blob = Some(entry.config.clone());
                }
                Update {
                    config: Some(entry.config),
                    revision: entry.revision,
                    source: Source::Cache,
                }
            }
            None => Update::none(),
        };
        let attempt = async {
            if !self.registered() {
                match inner.register().await {
                    Ok(_) => inner.backoff().reset(),
                    Err(e) => {
                        inner.backoff().fail(Instant::now());
                        return Err(e);
                    }
                }
            }
            inner.pull_config().await.map(|(update, _)| update)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(update)) => Ok(update),
            Ok(Err(e)) => Err(BootstrapError::classify(fallback, e)),
            Err(_) => Err(BootstrapError::classify(
                fallback,
                Error::Timeout {
                    op: Op::Bootstrap,
                    after: timeout,
                },
            )),
        }
    }

    /// Runs the member loop until [`Client::close`] is called: heartbeats, config polls (changed
    /// configurations go to [`Client::configs`]), discovery subscription (rosters go to
    /// [`Client::rosters`]) and re-registration. Dropping the future stops the loop too.
    pub async fn run(&self) -> Result<(), Error> {
        let mut refused = None;
        self.inner.lifecycle.send_if_modified(|l| {
            if l.closed {
                refused = Some(Error::Closed);
                false
            } else if l.running {
                refused = Some(Error::AlreadyRunning);
                false
            } else {
                l.running = true;
                true
            }
        });
        if let Some(err) = refused {
            return Err(err);
        }
        let mut runner = Runner {
            inner: self.inner.clone(),
            reporter: Reporter {
                failing: Vec::new(),
                shared: self.inner.failing_ops.clone(),
            },
            subscription: None,
        };
        let mut lifecycle = self.inner.lifecycle.subscribe();
        let closed = async move {
            // The sender lives as long as the client, so this only returns once closed.
            let _ = lifecycle.wait_for(|l| l.closed).await;
        };
        tokio::pin!(closed);
        let work = runner.run_loop();
        tokio::select! {
            biased;
            _ = &mut closed => {}
            () = work => {}
        }
        Ok(())
    }

    /// Stops [`Client::run`], waits for it to return, then deregisters; all within `timeout`.
    /// Afterwards [`Client::configs`] and [`Client::rosters`] receivers end and `run` refuses
    /// to start. Calling it again only retries the deregistration.
    pub async fn close(&self, timeout: Duration) -> Result<(), Error> {
        let inner = &self.inner;
        let deadline = Instant::now() + timeout;
        inner.lifecycle.send_modify(|l| l.closed = true);
        let mut lifecycle = inner.lifecycle.subscribe();
        // `is_ok` drops the borrowed value at once; holding it would block the channel.
        let stopped = tokio::time::timeout_at(deadline, lifecycle.wait_for(|l| !l.running))
            .await
            .is_ok();
        inner.configs.close();
        inner.rosters.close();
        if !stopped {
            return Err(Error::Timeout {
                op: Op::Close,
                after: timeout,
            });
        }
        match tokio::time::timeout_at(deadline, inner.deregister()).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                op: Op::Deregister,
                after: timeout,
            }),
        }
    }
}

/// The run loop's own state. Dropping it (when `run` returns or its future is dropped) ends
/// the discovery subscription and marks the loop as stopped.
struct Runner {
    inner: Arc<Inner>,
    reporter: Reporter,
    subscription: Option<Subscription>,
}

struct Subscription {
    /// Identifies the NATS connection: clones of one `async_nats::Client` share it.
    connection: Arc<async_nats::Statistics>,
    task: JoinHandle<()>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(sub) = self.subscription.take() {
            sub.task.abort();
        }
        self.inner.lifecycle.send_modify(|l| l.running = false);
    }
}

impl Runner {
    async fn run_loop(&mut self) {
        let mut heartbeat = tokio::time::interval(self.inner.heartbeat_interval);
        let mut poll = tokio::time::interval(self.inner.poll_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick of an interval is immediate: poll, heartbeat and subscribe at once.
        poll.tick().await;
        heartbeat.tick().await;
        self.poll_tick().await;
        self.heartbeat_tick().await;
        self.subscribe().await;
        loop {
            tokio::select! {
                _ = heartbeat.tick() => {
                    self.heartbeat_tick().await;
                    self.subscribe().await;
                }
                _ = poll.tick() => self.poll_tick().await,
            }
        }
    }

    /// Registers unless registered or backing off; returns whether an id is held.
    async fn ensure_registered(&mut self) -> bool {
        if self.inner.state().instance_id.is_some() {
            return true;
        }
        if !self.inner.backoff().ready(Instant::now()) {
            return false;
        }
        match self.inner.register().await {
            Ok(_) => {
                self.inner.backoff().reset();
                self.reporter.report(Op::Register, &Ok(()));
                true
            }
            Err(e) => {
                let delay = self.inner.backoff().fail(Instant::now());
                tracing::debug!(
                    retry_in = %crate::duration::GoDuration(delay),
                    "fleet: registration failed, backing off"
                );
                self.reporter.report(Op::Register, &Err(e));
                false
            }
        }
    }

    async fn heartbeat_tick(&mut self) {
        if !self.ensure_registered().await {
            return;
        }
        match self.inner.heartbeat().await {
            Err(e) if e.is_unknown_instance() => self.reregister().await,
            result => self.reporter.report(Op::Heartbeat, &result),
        }
    }

    async fn poll_tick(&mut self) {
        if !self.ensure_registered().await {
            return;
        }
        match self.pull_and_deliver().await {
            Err(e) if e.is_unknown_instance() => self.reregister().await,
            result => self.reporter.report(Op::Config, &result),
        }
    }

    /// cc-backend forgot the instance: register now, heartbeat once and pull once. A second
    /// 404 is only reported; the next tick deals with it, so there is no recursion.
    async fn reregister(&mut self) {
        tracing::info!("fleet: cc-backend does not know this instance any more, registering again");
        if !self.ensure_registered().await {
            return;
        }
        let result = self.inner.heartbeat().await;
        self.reporter.report(Op::Heartbeat, &result);
        let result = self.pull_and_deliver().await;
        self.reporter.report(Op::Config, &result);
    }

    async fn pull_and_deliver(&self) -> Result<(), Error> {
        let (update, changed) = self.inner.pull_config().await?;
        if changed {
            self.inner.configs.offer(update);
        }
        Ok(())
    }

    /// Subscribes to this member's discovery subject on the application's current NATS client,
    /// unless already subscribed on that connection. (async-nats itself renews subscriptions
    /// after a reconnect of the same client.)
    async fn subscribe(&mut self) {
        let Some(nats) = self.inner.connected_nats() else {
            return;
        };
        let connection = nats.statistics();
        if let Some(sub) = &self.subscription
            && Arc::ptr_eq(&sub.connection, &connection)
            && !sub.task.is_finished()
        {
            return;
        }
        if let Some(old) = self.subscription.take() {
            old.task.abort();
        }
        let subject = self.inner.discovery_subject.clone();
        match nats.subscribe(subject.clone()).await {
            Ok(subscriber) => {
                let signed = self.inner.roster_gate.requires_signature();
                tracing::info!(%subject, signed, "fleet: subscribed to discovery rosters");
                let task = tokio::spawn(deliver_rosters(
                    subscriber,
                    self.inner.rosters.clone(),
                    self.inner.roster_gate.clone(),
                ));
                self.subscription = Some(Subscription { connection, task });
                self.reporter.recovered("subscribe");
            }
            Err(e) => self.reporter.failed(
                "subscribe",
                &format!("fleet subscribe {subject}: {}", crate::nats::scrub(&e, &[])),
            ),
        }
    }
}

/// Hands every roster the gate admits to the application; the gate counts and logs the
/// rest (too large, too many providers, unsigned or forged when a key is configured).
async fn deliver_rosters(
    mut subscriber: async_nats::Subscriber,
    rosters: Arc<Slot<Vec<Provider>>>,
    gate: Arc<RosterGate>,
) {
    while let Some(message) = subscriber.next().await {
        if let Some(providers) =
            gate.admit(&message.subject, message.headers.as_ref(), &message.payload)
        {
            rosters.offer(providers);
        }
    }
}

/// Warn-once logging per operation.
#[derive(Debug, Default)]
struct Reporter {
    failing: Vec<&'static str>,
    /// How many operations fail now, for [`Client::failing_operations`].
    shared: Arc<AtomicUsize>,
}

impl Reporter {
    fn report(&mut self, op: Op, result: &Result<(), Error>) {
        match result {
            Ok(()) => self.recovered(op.as_str()),
            // Not a failure of its own: registration reports why it is missing.
            Err(Error::NotRegistered) => {}
            Err(e) => self.failed(op.as_str(), &e.to_string()),
        }
    }

    fn failed(&mut self, op: &'static str, error: &str) {
        if self.failing.contains(&op) {
            tracing::debug!(op, error, "fleet: still failing");
        } else {
            self.failing.push(op);
            self.shared.store(self.failing.len(), Ordering::Relaxed);
            tracing::warn!(op, error, "fleet: operation failed");
        }
    }

    fn recovered(&mut self, op: &'static str) {
        if let Some(i) = self.failing.iter().position(|o| *o == op) {
            self.failing.swap_remove(i);
            self.shared.store(self.failing.len(), Ordering::Relaxed);
            tracing::info!(op, "fleet: {op} succeeded again");
        }
    }

    #[cfg(test)]
    fn is_failing(&self, op: &str) -> bool {
        self.failing.contains(&op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_from_one_second_to_five_minutes() {
        let mut b = Backoff::default();
        let start = Instant::now();
        assert!(b.ready(start));
        let mut waits = Vec::new();
        for _ in 0..3 {
            let now = Instant::now();
            let delay = b.fail(now);
            assert!(!b.ready(now));
            tokio::time::advance(delay - Duration::from_millis(1)).await;
            assert!(!b.ready(Instant::now()));
            tokio::time::advance(Duration::from_millis(1)).await;
            assert!(b.ready(Instant::now()));
            waits.push(delay);
        }
        assert_eq!(
            waits,
            [
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(4)
            ]
        );
        for _ in 0..30 {
            b.fail(Instant::now());
        }
        assert_eq!(b.fail(Instant::now()), MAX_BACKOFF);
        b.reset();
        assert!(b.ready(Instant::now()));
        assert_eq!(b.fail(Instant::now()), MIN_BACKOFF);
    }

    #[test]
    fn reporter_warns_once_and_recovers() {
        let mut r = Reporter::default();
        let fail = Err(Error::Closed);
        let shared = r.shared.clone();
        let count = || shared.load(Ordering::Relaxed);
        r.report(Op::Heartbeat, &fail);
        assert!(r.is_failing("heartbeat"));
        assert_eq!(count(), 1);
        r.report(Op::Heartbeat, &fail);
        r.report(Op::Config, &Err(Error::NotRegistered));
        assert!(!r.is_failing("config"));
        r.report(Op::Register, &fail);
        assert_eq!(count(), 2, "one per failing operation, not per failure");
        r.report(Op::Heartbeat, &Ok(()));
        r.report(Op::Register, &Ok(()));
        assert!(!r.is_failing("heartbeat"));
        assert_eq!(count(), 0);
    }
}
