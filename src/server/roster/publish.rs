//! Roster publishing: the task that publishes every roster periodically and after
//! registry changes, paced by the debounce window, and reports what it could not send.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::build::{Buckets, Skipped, consumers, members_of};
use super::encode::{
    Encoded, HEADER_ROOM, LINE_OVERHEAD, ROSTER_LIMIT, encode_members, escaped_len, hash_of,
};
use crate::server::auth::Keypair;
use crate::server::metrics::Metrics;
use crate::server::registry::Registry;
use crate::server::stopped;
use crate::untrusted::Untrusted;
use crate::wire::{
    INFRA_BUCKET, ROSTER_SIGNATURE_HEADER, ServiceType, discovery_subject, encode_roster_line,
    roster_signing_input, subject_token_problem,
};

/// A publish round that NATS does not confirm within this time is counted as failed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How many skipped rows a log line names.
const SKIPPED_EXAMPLES: usize = 5;

/// Asks the publisher for an early re-publish; cheap, and calls coalesce.
#[derive(Debug, Clone, Default)]
pub struct RosterNotify {
    wake: Arc<Notify>,
    /// Set when consumers may have missed earlier rosters (a NATS reconnect, a new lease):
    /// the next round publishes every roster, changed or not.
    everything: Arc<AtomicBool>,
}

impl RosterNotify {
    /// Requests a re-publish of the rosters whose content changed (at once, or when the
    /// debounce window after the previous publish ends).
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// Requests a re-publish of every roster: consumers may have missed what was sent before
    /// (core NATS kept nothing for them while the connection was away).
    pub fn notify_all(&self) {
        self.everything.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// When the next change-driven publish is due: at once when the previous publish lies at
/// least `debounce` back, else at the end of that window. cc-backend paces the same way.
#[derive(Debug)]
pub(super) struct Pacer {
    pub(super) debounce: Duration,
    pub(super) last: Option<Instant>,
    pub(super) due: Option<Instant>,
}

impl Pacer {
    pub(super) fn new(debounce: Duration) -> Pacer {
        Pacer {
            debounce,
            last: None,
            due: None,
        }
    }

    pub(super) fn changed(&mut self, now: Instant) {
        let at = self
            .last
            .map_or(now, |last| (last + self.debounce).max(now));
        self.due = Some(self.due.map_or(at, |due| due.min(at)));
    }

    /// A round starts at `now`; it covers every change notified before. Returns the
    /// previous round's start, for [`Pacer::restore`].
    pub(super) fn publishing(&mut self, now: Instant) -> Option<Instant> {
        self.due = None;
        self.last.replace(now)
    }

    /// The round that started last published nothing: the window runs from the round before.
    pub(super) fn restore(&mut self, previous: Option<Instant>) {
        self.last = previous;
    }
}

pub(crate) struct PublisherConfig {
    pub prefix: String,
    pub interval: Duration,
    pub debounce: Duration,
    /// Signs every roster when set.
    pub signer: Option<Arc<Keypair>>,
    /// Rounds run only while this server holds the roster lease (servers sharing a
    /// registry publish one at a time).
    pub gate: crate::server::leader::Gate,
}

/// Spawns the publisher: once at start, every `interval`, and after changes as the
/// [`Pacer`] decides.
pub(crate) fn spawn(
    client: async_nats::Client,
    registry: Registry,
    metrics: Arc<Metrics>,
    notify: RosterNotify,
    config: PublisherConfig,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // NATS drops the connection of a protocol line beyond its limit (4 KiB by default).
    let prefix_problem = if config.prefix.len() > 1024 {
        Some((String::new(), "makes the prefix longer than 1024 bytes"))
    } else {
        config
            .prefix
            .split('.')
            .find_map(|token| subject_token_problem(token).map(|p| (token.to_owned(), p)))
    };
    match (&prefix_problem, &config.signer) {
        (Some((token, problem)), _) => tracing::error!(
            "fleet: discovery-subject-prefix {:?}: token {:?} {problem}; no rosters will be published",
            Untrusted(&config.prefix),
            Untrusted(token)
        ),
        (None, Some(signer)) => tracing::info!(
            "fleet: publishing discovery rosters under {:?}, signed (header {ROSTER_SIGNATURE_HEADER}) \
             with the key pair of public key {}; never put secrets into metaData",
            config.prefix,
            signer.public_key_base64()
        ),
        (None, None) => tracing::warn!(
            "fleet: publishing discovery rosters under {:?} UNSIGNED (no jwt-private-key / JWT_PRIVATE_KEY): \
             anyone who may publish on these subjects can inject providers; never put secrets into metaData",
            config.prefix
        ),
    }
    tokio::spawn(async move {
        if prefix_problem.is_some() {
            stopped(&mut shutdown).await;
            return;
        }
        let mut publisher = Publisher {
            client,
            registry,
            metrics,
            config,
            failing: HashSet::new(),
            skipped: 0,
            round_failing: false,
            published: HashMap::new(),
            oversized: HashSet::new(),
        };
        let mut ticker = tokio::time::interval(publisher.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pacer = Pacer::new(publisher.config.debounce);
        loop {
            let due = pacer.due;
            let kind = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = ticker.tick() => RoundKind::Everything,
                _ = notify.wake.notified() => {
                    pacer.changed(Instant::now());
                    continue;
                }
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    if notify.everything.load(Ordering::Acquire) {
                        RoundKind::Everything
                    } else {
                        RoundKind::Changed
                    }
                }
            };
            if kind == RoundKind::Everything {
                notify.everything.store(false, Ordering::Release);
            }
            let previous = pacer.publishing(Instant::now());
            // A round of a large fleet may wait on NATS for long (a full outgoing buffer
            // while NATS is away): shutdown does not wait for it.
            let sent = tokio::select! {
                sent = publisher.round(kind) => sent,
                _ = stopped(&mut shutdown) => return,
            };
            if sent == 0 && kind == RoundKind::Changed {
                // Nothing changed for any consumer (a member whose type no roster lists, a
                // heartbeat turning a pending member active again): no publish happened, so
                // no debounce window starts and the next real change goes out at once.
                pacer.restore(previous);
            }
        }
    })
}

/// What a round publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundKind {
    /// Every roster: the periodic refresh, and after consumers may have missed rosters.
    Everything,
    /// Only rosters whose content differs from what NATS last confirmed for their subject.
    Changed,
}

struct Publisher {
    client: async_nats::Client,
    registry: Registry,
    metrics: Arc<Metrics>,
    config: PublisherConfig,
    /// Subjects whose last publish failed: their next failure is logged at debug level only.
    failing: HashSet<String>,
    /// How many rows the previous round skipped, so a change is logged once.
    skipped: usize,
    /// Whether a round failed as a whole (NATS down or not confirming) and was logged.
    round_failing: bool,
    /// The payload hash NATS last confirmed per subject (keyed by the subject's hash): a
    /// change-driven round publishes only rosters whose content differs. 16 bytes a subject,
    /// so 50,000 clusters cost a few MiB.
    published: HashMap<u64, u64>,
    /// Subjects whose roster leaves members out for size, so each episode is logged once.
    oversized: HashSet<String>,
}

impl Publisher {
    fn failed(&mut self, subject: &str, error: std::fmt::Arguments<'_>) {
        self.metrics.roster_subject_error(subject);
        if self.failing.insert(subject.to_owned()) {
            tracing::error!(
                "fleet: roster for {} not published: {error}",
                Untrusted(subject)
            );
        } else {
            tracing::debug!(
                "fleet: roster for {} still not published: {error}",
                Untrusted(subject)
            );
        }
    }

    /// Counts every roster of a round that failed as a whole; one log line per outage. Not
    /// counted per subject: an outage is not a property of any roster, and a large fleet
    /// would otherwise grow a `/metrics` line for every roster it has.
    fn round_failed(&mut self, rosters: usize, error: std::fmt::Arguments<'_>) {
        Metrics::add(&self.metrics.roster_errors, rosters as u64);
        // What the consumers hold is unknown now: the next round sends everything.
        self.published.clear();
        if self.round_failing {
            tracing::debug!("fleet: {rosters} roster(s) still not published: {error}");
        } else {
            self.round_failing = true;
            tracing::error!("fleet: {rosters} roster(s) not published: {error}");
        }
    }

    fn report_skipped(&mut self, skipped: &[Skipped]) {
        self.metrics.set_roster_skipped(skipped.len() as u64);
        if skipped.len() != self.skipped && !skipped.is_empty() {
            let examples: Vec<String> = skipped
                .iter()
                .take(SKIPPED_EXAMPLES)
                .map(|s| {
                    format!(
                        "{} {} in cluster \"{}\" ({})",
                        s.service_type,
                        Untrusted(&s.hostname),
                        Untrusted(&s.cluster).capped(64),
                        s.reason
                    )
                })
                .collect();
            tracing::error!(
                "fleet: {} active service(s) left out of every discovery roster because their cluster \
                 cannot name a NATS subject token (deregister them and register under a valid cluster): {}",
                skipped.len(),
                examples.join("; ")
            );
        }
        self.skipped = skipped.len();
    }

    /// Logs, once per subject and episode, the members a roster leaves out for size.
    fn report_left_out(&mut self, subject: &str, encoded: &Encoded, limit: usize) {
        if encoded.left_out.is_empty() {
            if self.oversized.remove(subject) {
                tracing::info!(
                    "fleet: roster for {} lists all its providers again",
                    Untrusted(subject)
                );
            }
            return;
        }
        if !self.oversized.insert(subject.to_owned()) {
            return;
        }
        let members: Vec<String> = encoded
            .left_out
            .iter()
            .take(SKIPPED_EXAMPLES)
            .map(|m| {
                format!(
                    "{} {} in cluster \"{}\" ({} bytes of metaData)",
                    m.service_type,
                    Untrusted(&m.hostname).capped(64),
                    Untrusted(&m.cluster).capped(64),
                    m.meta_bytes
                )
            })
            .collect();
        tracing::error!(
            "fleet: roster for {} would exceed {limit} bytes (what its consumers accept); {} member(s) \
             left out of it, the largest first (deregister them or register them with less metaData): {}",
            Untrusted(subject),
            encoded.left_out.len(),
            members.join("; ")
        );
    }

    /// The most bytes a roster may have: what agents accept by default
    /// (`roster-max-bytes`), and what NATS accepts less room for the signature header.
    fn limit(&self) -> usize {
        let nats = self.client.max_payload().saturating_sub(HEADER_ROOM);
        ROSTER_LIMIT.min(nats)
    }

    /// Publishes a round; returns how many rosters it sent.
    async fn round(&mut self, kind: RoundKind) -> usize {
        if !self.config.gate.is_leader() {
            // Another server publishes meanwhile: what it sent is unknown here.
            self.published.clear();
            return 0;
        }
        let active = self.registry.active();
        let buckets = Buckets::of(&active);
        self.report_skipped(&buckets.skipped);
        if self.client.connection_state() != async_nats::connection::State::Connected {
            // Queued rosters would go out stale after the reconnect, which triggers a fresh
            // round anyway.
            let rosters = buckets.rosters();
            self.round_failed(
                rosters,
                format_args!("NATS is disconnected; they go out again once it reconnects"),
            );
            return 0;
        }
        let limit = self.limit();
        let now = crate::wire::now_ns();
        // A cluster without members of the wanted types offers only the infrastructure's:
        // with many small clusters that payload is encoded once, not once per cluster.
        let mut infra_only: Vec<(&'static [ServiceType], Arc<Encoded>)> = Vec::new();
        let mut queued: Vec<(u64, u64)> = Vec::new();
        let mut queued_failing: Vec<String> = Vec::new();
        let mut left_out = HashSet::new();
        for bucket in buckets.names() {
            let mut shared: Vec<(&'static [ServiceType], Arc<Encoded>)> = Vec::new();
            for (consumer, wanted) in consumers() {
                let subject = discovery_subject(&self.config.prefix, bucket, consumer);
                let encoded = match shared.iter().find(|(w, _)| *w == wanted) {
                    Some((_, encoded)) => Ok(encoded.clone()),
                    None => {
                        let encoded =
                            self.encode_bucket(&buckets, bucket, wanted, limit, &mut infra_only);
                        if let Ok(encoded) = &encoded {
                            shared.push((wanted, encoded.clone()));
                        }
                        encoded
                    }
                };
                let encoded = match encoded {
                    Ok(encoded) => encoded,
                    Err(e) => {
                        self.failed(&subject, format_args!("encoding: {e}"));
                        continue;
                    }
                };
                self.report_left_out(&subject, &encoded, limit);
                for member in &encoded.left_out {
                    left_out.insert((
                        member.service_type,
                        member.cluster.clone(),
                        member.hostname.clone(),
                    ));
                }
                let subject_hash = hash_of(subject.as_bytes());
                if kind == RoundKind::Changed
                    && self.published.get(&subject_hash) == Some(&encoded.hash)
                {
                    continue;
                }
                let mut data = Vec::with_capacity(
                    escaped_len(&encoded.payload) + LINE_OVERHEAD + 2 * bucket.len(),
                );
                encode_roster_line(&mut data, bucket, consumer, &encoded.payload, now);
                let mut headers = async_nats::HeaderMap::new();
                if let Some(signer) = &self.config.signer {
                    let signature = signer.sign(&roster_signing_input(&subject, &data));
                    headers.insert(ROSTER_SIGNATURE_HEADER, STANDARD.encode(signature).as_str());
                }
                let size = data.len();
                // async-nats refuses (and does not queue) a message above the server's
                // max_payload, headers included; sending one would make NATS close the
                // connection.
                let result = if headers.is_empty() {
                    self.client.publish(subject.clone(), data.into()).await
                } else {
                    self.client
                        .publish_with_headers(subject.clone(), headers, data.into())
                        .await
                };
                match result {
                    Ok(()) => {
                        queued.push((subject_hash, encoded.hash));
                        if self.failing.contains(&subject) {
                            queued_failing.push(subject);
                        }
                    }
                    Err(e) => {
                        self.published.remove(&subject_hash);
                        self.failed(
                            &subject,
                            format_args!(
                                "{size} bytes with {} provider(s) (NATS max_payload {}): {e}",
                                encoded.providers,
                                self.client.max_payload()
                            ),
                        );
                    }
                }
            }
        }
        self.metrics
            .set_roster_members_left_out(left_out.len() as u64);
        if queued.is_empty() {
            return 0;
        }
        // Queued is not sent: only NATS's answer to the flush confirms the round.
        let confirmed = match tokio::time::timeout(PUBLISH_TIMEOUT, self.client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "NATS did not confirm within {}",
                crate::duration::format(PUBLISH_TIMEOUT)
            )),
        };
        match confirmed {
            Ok(()) => {
                Metrics::add(&self.metrics.roster_publishes, queued.len() as u64);
                if std::mem::take(&mut self.round_failing) {
                    tracing::info!("fleet: rosters are published again");
                }
                for subject in &queued_failing {
                    if self.failing.remove(subject) {
                        tracing::info!("fleet: roster for {} published again", Untrusted(subject));
                    }
                }
                let sent = queued.len();
                self.published.extend(queued);
                sent
            }
            Err(e) => {
                self.round_failed(queued.len(), format_args!("flush: {e}"));
                0
            }
        }
    }

    /// The encoded providers of `bucket` for a consumer that wants `wanted`.
    fn encode_bucket(
        &self,
        buckets: &Buckets<'_>,
        bucket: &str,
        wanted: &'static [ServiceType],
        limit: usize,
        infra_only: &mut Vec<(&'static [ServiceType], Arc<Encoded>)>,
    ) -> Result<Arc<Encoded>, String> {
        if bucket == INFRA_BUCKET {
            let members = members_of(buckets.everyone.iter().copied(), wanted);
            return encode_members(members, bucket, limit).map(Arc::new);
        }
        let own = buckets.clusters.get(bucket).map_or(&[][..], Vec::as_slice);
        if !own.iter().any(|s| wanted.contains(&s.service_type)) {
            if let Some((_, encoded)) = infra_only.iter().find(|(w, _)| *w == wanted) {
                return Ok(encoded.clone());
            }
            let members = members_of(buckets.infra.iter().copied(), wanted);
            // The bucket's name changes only the line's overhead, which the limit's
            // reserve covers for any valid bucket name.
            let encoded = Arc::new(encode_members(
                members,
                &"x".repeat(crate::wire::MAX_SUBJECT_TOKEN_LEN),
                limit,
            )?);
            infra_only.push((wanted, encoded.clone()));
            return Ok(encoded);
        }
        let members = members_of(own.iter().chain(&buckets.infra).copied(), wanted);
        encode_members(members, bucket, limit).map(Arc::new)
    }
}
