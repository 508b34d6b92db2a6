//! Bootstrap, the run loop and shutdown.
//!
//! The loop heartbeats and polls on their intervals, re-registers at once when cc-backend
//! forgets the instance, backs registration off exponentially so a rejected token does not
//! hammer cc-backend, and keeps a discovery subscription on the application's current NATS
//! client. Failures are logged once as a warning, repeats at debug level, and the recovery at
//! info level.

use std::sync::{Arc, Mutex};
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
                shared: self.inner.failures.clone(),
            },
            subscription: None,
            replaced: Replacements::default(),
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
    replaced: Replacements,
}

/// Replacements of this member's instance that came soon after its registration, in a row:
/// the mark of another service registering with the same cluster, host name and type (each
/// registration replaces the other's instance id, at every heartbeat, for ever).
#[derive(Debug, Default)]
struct Replacements {
    in_a_row: u32,
    /// Whether this run of replacements was warned about already.
    warned: bool,
}

/// Replacements in a row after which the client warns of a duplicate identity.
pub const REPLACED_WARN_AFTER: u32 = 3;

impl Replacements {
    /// Counts the replacement of an instance that lived `lived` (since its registration,
    /// when known); `quick` is how short a life counts as a replacement in a row. Returns
    /// whether to warn now: once per run of quick replacements.
    fn replaced(&mut self, lived: Option<Duration>, quick: Duration) -> bool {
        if lived.is_some_and(|lived| lived <= quick) {
            self.in_a_row = self.in_a_row.saturating_add(1);
        } else {
            // The instance lived long: a server restart or a one-off, not a duplicate.
            self.in_a_row = 1;
            self.warned = false;
        }
        if self.in_a_row >= REPLACED_WARN_AFTER && !self.warned {
            self.warned = true;
            return true;
        }
        false
    }
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
                self.report(Op::Register, &Ok(()));
                true
            }
            Err(e) => {
                let delay = self.inner.backoff().fail(Instant::now());
                tracing::debug!(
                    retry_in = %crate::duration::GoDuration(delay),
                    server = %self.inner.http.last_used_shown(),
                    "fleet: registration failed, backing off"
                );
                self.report(Op::Register, &Err(e));
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
            result => self.report(Op::Heartbeat, &result),
        }
    }

    async fn poll_tick(&mut self) {
        if !self.ensure_registered().await {
            return;
        }
        match self.pull_and_deliver().await {
            Err(e) if e.is_unknown_instance() => self.reregister().await,
            result => self.report(Op::Config, &result),
        }
    }

    /// cc-backend forgot the instance: register now, heartbeat once and pull once. A second
    /// 404 is only reported; the next tick deals with it, so there is no recursion.
    async fn reregister(&mut self) {
        let server = self.inner.http.last_used_shown().to_owned();
        tracing::info!(%server, "fleet: cc-backend does not know this instance any more, registering again");
        let lived = self.inner.state().registered_at.map(|at| at.elapsed());
        self.inner
            .replacements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A duplicate replaces this instance at its next request, at the latest at its
        // next heartbeat or config poll; a few of those intervals is still "at once".
        let quick = self
            .inner
            .heartbeat_interval
            .max(self.inner.poll_interval)
            .saturating_mul(3);
        if self.replaced.replaced(lived, quick) {
            let identity = &self.inner.identity;
            tracing::warn!(
                times = self.replaced.in_a_row,
                cluster = %crate::untrusted::Untrusted(&identity.cluster),
                hostname = %crate::untrusted::Untrusted(&identity.hostname),
                service_type = %identity.service_type,
                %server,
                "fleet: this instance was replaced {} times in a row, each soon after it registered: \
                 another service is likely registered with the same cluster, host name and type \
                 (each registration takes over the other's instance); give each its own hostname",
                self.replaced.in_a_row
            );
        }
        if !self.ensure_registered().await {
            return;
        }
        let result = self.inner.heartbeat().await;
        self.report(Op::Heartbeat, &result);
        let result = self.pull_and_deliver().await;
        self.report(Op::Config, &result);
    }

    /// Hands an operation's outcome to the reporter, naming the server it came from.
    fn report(&mut self, op: Op, result: &Result<(), Error>) {
        let server = self.inner.http.last_used_shown().to_owned();
        self.reporter.report(op, result, &server);
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
                "NATS",
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

/// An operation of the run loop that fails now (see [`Client::failures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `register`, `heartbeat`, `config` or `subscribe`.
    pub op: &'static str,
    /// The fleet server the latest failure came from, without user information (`NATS`
    /// for the roster subscription).
    pub server: String,
    /// The latest failure; it never holds the token or the instance id.
    pub error: String,
}

/// Warn-once logging per operation; the operations failing now are shared with the client
/// ([`Client::failures`], [`Client::failing_operations`]).
#[derive(Debug, Default)]
struct Reporter {
    shared: Arc<Mutex<Vec<Failure>>>,
}

impl Reporter {
    fn failing(&self) -> std::sync::MutexGuard<'_, Vec<Failure>> {
        // Plain assignments under the lock: a poisoned list is consistent.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn report(&mut self, op: Op, result: &Result<(), Error>, server: &str) {
        match result {
            Ok(()) => self.recovered(op.as_str()),
            // Not a failure of its own: registration reports why it is missing.
            Err(Error::NotRegistered) => {}
            Err(e) => self.failed(op.as_str(), &e.to_string(), server),
        }
    }

    fn failed(&mut self, op: &'static str, error: &str, server: &str) {
        let mut failing = self.failing();
        if let Some(known) = failing.iter_mut().find(|f| f.op == op) {
            known.error = error.to_owned();
            known.server = server.to_owned();
            drop(failing);
            tracing::debug!(op, server, error, "fleet: still failing");
        } else {
            failing.push(Failure {
                op,
                server: server.to_owned(),
                error: error.to_owned(),
            });
            drop(failing);
            tracing::warn!(op, server, error, "fleet: operation failed");
        }
    }

    fn recovered(&mut self, op: &'static str) {
        let mut failing = self.failing();
        if let Some(i) = failing.iter().position(|f| f.op == op) {
            failing.swap_remove(i);
            drop(failing);
            tracing::info!(op, "fleet: {op} succeeded again");
        }
    }

    #[cfg(test)]
    fn is_failing(&self, op: &str) -> bool {
        self.failing().iter().any(|f| f.op == op)
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
        let count = || shared.lock().unwrap().len();
        let (a, b) = ("http://a:1", "http://b:2");
        r.report(Op::Heartbeat, &fail, a);
        assert!(r.is_failing("heartbeat"));
        assert_eq!(count(), 1);
        r.report(Op::Heartbeat, &fail, b);
        assert_eq!(
            shared.lock().unwrap()[0].server,
            b,
            "the latest failure's server"
        );
        r.report(Op::Config, &Err(Error::NotRegistered), a);
        assert!(!r.is_failing("config"));
        r.report(Op::Register, &fail, a);
        assert_eq!(count(), 2, "one per failing operation, not per failure");
        r.report(Op::Heartbeat, &Ok(()), a);
        r.report(Op::Register, &Ok(()), a);
        assert!(!r.is_failing("heartbeat"));
        assert_eq!(count(), 0);
    }

    #[test]
    fn quick_replacements_in_a_row_warn_once_per_run() {
        let quick = Duration::from_secs(30);
        let soon = Some(Duration::from_secs(5));
        let mut r = Replacements::default();
        // The first replacement may be a restart of the server: no warning yet.
        assert!(!r.replaced(soon, quick));
        assert!(!r.replaced(soon, quick));
        assert!(r.replaced(soon, quick), "the third in a row warns");
        assert!(!r.replaced(soon, quick), "once per run");
        // An instance that lived long ends the run; a new run warns again.
        assert!(!r.replaced(Some(Duration::from_secs(3600)), quick));
        assert_eq!(r.in_a_row, 1);
        assert!(!r.replaced(soon, quick));
        assert!(r.replaced(soon, quick));
        // Without a known registration time nothing counts as quick.
        let mut r = Replacements::default();
        for _ in 0..5 {
            assert!(!r.replaced(None, quick));
        }
    }
}
