//! The discovery roster publisher (cc-backend's `discovery.go`).
//!
//! Every consumer type that depends on others receives, per bucket (each cluster with an
//! active member, plus `infra`), the full list of its active providers on
//! `<prefix>.<bucket>.<consumer>`. Rosters are whole replacements over core NATS, so they
//! are re-published periodically, and after the registry changes: at once when the previous
//! publish lies more than the debounce delay back, else when that window ends (so a burst of
//! changes costs one publish per window). A reconnect to NATS counts as a change.
//!
//! A publish counts as done only once NATS has confirmed the round (a flush); a roster that
//! is larger than the NATS server's `max_payload`, or that NATS refuses, is an error counted
//! per subject and logged. Rows whose cluster cannot be a subject token (or is named `infra`,
//! the bucket of infrastructure services) are left out of every roster, counted and logged:
//! one such row must not cost every other roster its delivery.
//!
//! With a private key, every roster carries an Ed25519 signature in the
//! [`ROSTER_SIGNATURE_HEADER`] header over [`roster_signing_input`]; the roster bytes stay
//! exactly what cc-lib's Go client decodes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::auth::Keypair;
use super::metrics::Metrics;
use super::registry::{Registry, Service};
use super::stopped;
use crate::untrusted::Untrusted;
use crate::wire::{
    INFRA_BUCKET, Provider, ROSTER_SIGNATURE_HEADER, Scope, ServiceType, discovery_subject,
    encode_roster_line, roster_signing_input, subject_token_problem,
};

/// A publish round that NATS does not confirm within this time is counted as failed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How many skipped rows a log line names.
const SKIPPED_EXAMPLES: usize = 5;
/// The most bytes a roster may have: what agents accept unless configured otherwise
/// (`roster-max-bytes`, also cc-lib's limit). A roster that would be larger leaves out its
/// largest members, so that the rest of the cluster keeps its rosters.
pub const ROSTER_LIMIT: usize = 1 << 20;

/// The provider types a consumer type needs to know about (cc-backend's server policy).
pub fn relevant_providers(consumer: ServiceType) -> &'static [ServiceType] {
    match consumer {
        ServiceType::MetricStore
        | ServiceType::MetricCollector
        | ServiceType::EventStore
        | ServiceType::SlurmAdapter
        | ServiceType::NodeController
        | ServiceType::EnergyManager => &[ServiceType::Backend],
        ServiceType::Backend => &[],
    }
}

/// One roster to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roster {
    /// The NATS subject.
    pub subject: String,
    /// The bucket: a cluster name or `infra`.
    pub bucket: String,
    /// The consumer type it is meant for.
    pub consumer: ServiceType,
    /// The providers, sorted by type, then host name.
    pub providers: Vec<Provider>,
}

/// An active service left out of every roster because its cluster cannot name a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The offending cluster name.
    pub cluster: String,
    /// The service's host name.
    pub hostname: String,
    /// The service's type.
    pub service_type: ServiceType,
    /// Why the cluster cannot name a bucket.
    pub reason: &'static str,
}

fn provider_of(service: &Service) -> Provider {
    Provider {
        service_type: service.service_type.into(),
        hostname: service.hostname.clone(),
        state: service.state.as_str().to_owned(),
        meta: (*service.meta).clone(),
    }
}

/// Why a cluster-scope service's cluster cannot be a roster bucket, if it cannot.
fn bucket_problem(cluster: &str) -> Option<&'static str> {
    if cluster == INFRA_BUCKET {
        return Some("is named infra, the bucket of infrastructure services");
    }
    subject_token_problem(cluster)
}

/// Builds every roster from the active services: cluster buckets in name order, then
/// `infra`. A cluster bucket offers that cluster's members plus all infra-scope ones; the
/// infra bucket offers everyone with a usable bucket. Empty rosters are included: they tell
/// consumers that their providers are gone. Cluster-scope services whose cluster cannot be a
/// subject token are returned as skipped instead.
pub fn build_rosters(active: &[Service], prefix: &str) -> (Vec<Roster>, Vec<Skipped>) {
    let mut clusters: BTreeMap<&str, Vec<&Service>> = BTreeMap::new();
    let mut infra: Vec<&Service> = Vec::new();
    let mut everyone: Vec<&Service> = Vec::with_capacity(active.len());
    let mut skipped = Vec::new();
    for service in active {
        match service.scope {
            Scope::Cluster => {
                if let Some(reason) = bucket_problem(&service.cluster) {
                    skipped.push(Skipped {
                        cluster: service.cluster.clone(),
                        hostname: service.hostname.clone(),
                        service_type: service.service_type,
                        reason,
                    });
                    continue;
                }
                clusters.entry(&service.cluster).or_default().push(service);
            }
            Scope::Infra => infra.push(service),
        }
        everyone.push(service);
    }
    let mut buckets: Vec<(&str, Vec<&Service>)> = clusters
        .into_iter()
        .map(|(cluster, mut members)| {
            members.extend(infra.iter().copied());
            (cluster, members)
        })
        .collect();
    buckets.push((INFRA_BUCKET, everyone));

    let mut rosters = Vec::new();
    for (bucket, candidates) in &buckets {
        for consumer in ServiceType::ALL {
            let wanted = relevant_providers(consumer);
            if wanted.is_empty() {
                continue;
            }
            let mut providers: Vec<Provider> = candidates
                .iter()
                .filter(|s| wanted.contains(&s.service_type))
                .map(|s| provider_of(s))
                .collect();
            providers.sort_by(|a, b| {
                (a.service_type.code(), &a.hostname).cmp(&(b.service_type.code(), &b.hostname))
            });
            rosters.push(Roster {
                subject: discovery_subject(prefix, bucket, consumer),
                bucket: (*bucket).to_owned(),
                consumer,
                providers,
            });
        }
    }
    (rosters, skipped)
}

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
struct Pacer {
    debounce: Duration,
    last: Option<Instant>,
    due: Option<Instant>,
}

impl Pacer {
    fn new(debounce: Duration) -> Pacer {
        Pacer {
            debounce,
            last: None,
            due: None,
        }
    }

    fn changed(&mut self, now: Instant) {
        let at = self
            .last
            .map_or(now, |last| (last + self.debounce).max(now));
        self.due = Some(self.due.map_or(at, |due| due.min(at)));
    }

    /// A round starts at `now`; it covers every change notified before. Returns the
    /// previous round's start, for [`Pacer::restore`].
    fn publishing(&mut self, now: Instant) -> Option<Instant> {
        self.due = None;
        self.last.replace(now)
    }

    /// The round that started last published nothing: the window runs from the round before.
    fn restore(&mut self, previous: Option<Instant>) {
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
    pub gate: super::leader::Gate,
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

/// A roster entry as it is encoded: borrowed from the registry's row, so a round builds no
/// owned copy of any member.
#[derive(serde::Serialize)]
struct ProviderView<'a> {
    #[serde(rename = "type")]
    service_type: &'static str,
    hostname: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "no_meta")]
    meta: &'a BTreeMap<String, String>,
}

fn no_meta(meta: &&BTreeMap<String, String>) -> bool {
    meta.is_empty()
}

/// A member left out of a roster because the roster would otherwise exceed what its
/// consumers accept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeftOut {
    cluster: String,
    hostname: String,
    service_type: ServiceType,
    /// Bytes of its metadata's keys and values.
    meta_bytes: usize,
}

/// The providers of one roster, encoded once for every subject that gets the same list.
#[derive(Debug)]
struct Encoded {
    /// The providers as Go's JSON.
    payload: Vec<u8>,
    /// A hash of `payload`, to tell whether a roster changed.
    hash: u64,
    /// How many providers it lists.
    providers: usize,
    /// Members left out for size.
    left_out: Vec<LeftOut>,
}

/// Bytes a roster line adds around its payload besides the bucket (measurement, tags, field
/// key, quotes, time, newline), with room to spare.
const LINE_OVERHEAD: usize = 96;
/// Room kept below NATS's `max_payload` for the signature header.
const HEADER_ROOM: usize = 256;

fn hash_of(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// What a member adds to a roster, about: its own bytes, before JSON's and the line's escapes.
fn member_size(service: &Service) -> usize {
    32 + service.hostname.len() + meta_bytes(service) + 6 * service.meta.len()
}

/// Bytes of a member's metadata keys and values.
fn meta_bytes(service: &Service) -> usize {
    service.meta.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The bytes `payload` takes inside a roster line, where `"` and `\` are escaped.
fn escaped_len(payload: &[u8]) -> usize {
    payload.len() + payload.iter().filter(|&&b| b == b'"' || b == b'\\').count()
}

/// Encodes `members` (sorted as rosters are) into a payload whose line, for a bucket named
/// `bucket`, stays within `limit` bytes. When it would not, the members with the most bytes
/// (their metadata, in practice) are left out until it fits: the roster is then an error of
/// those members, and every other member still reaches the roster's consumers.
fn encode_members(
    mut members: Vec<&Service>,
    bucket: &str,
    limit: usize,
) -> Result<Encoded, String> {
    let room = limit.saturating_sub(LINE_OVERHEAD + 2 * bucket.len());
    let mut left_out = Vec::new();
    loop {
        let views: Vec<ProviderView<'_>> = members
            .iter()
            .map(|s| ProviderView {
                service_type: s.service_type.code(),
                hostname: &s.hostname,
                state: s.state.as_str(),
                meta: &s.meta,
            })
            .collect();
        let payload = crate::wire::gojson::to_vec(&views).map_err(|e| e.to_string())?;
        let size = escaped_len(&payload);
        if size <= room || members.is_empty() {
            return Ok(Encoded {
                hash: hash_of(&payload),
                payload,
                providers: members.len(),
                left_out,
            });
        }
        let excess = size - room;
        let mut by_size: Vec<usize> = (0..members.len()).collect();
        by_size.sort_by_key(|&i| std::cmp::Reverse(member_size(members[i])));
        let mut dropped = vec![false; members.len()];
        let mut freed = 0;
        for i in by_size {
            if freed >= excess {
                break;
            }
            dropped[i] = true;
            freed += member_size(members[i]);
            left_out.push(LeftOut {
                cluster: members[i].cluster.clone(),
                hostname: members[i].hostname.clone(),
                service_type: members[i].service_type,
                meta_bytes: meta_bytes(members[i]),
            });
        }
        let mut i = 0;
        members.retain(|_| {
            i += 1;
            !dropped[i - 1]
        });
    }
}

/// The active services grouped into roster buckets, borrowed from the registry's rows.
struct Buckets<'a> {
    clusters: BTreeMap<&'a str, Vec<&'a Service>>,
    infra: Vec<&'a Service>,
    everyone: Vec<&'a Service>,
    skipped: Vec<Skipped>,
}

impl<'a> Buckets<'a> {
    fn of(active: &'a [Service]) -> Buckets<'a> {
        let mut buckets = Buckets {
            clusters: BTreeMap::new(),
            infra: Vec::new(),
            everyone: Vec::with_capacity(active.len()),
            skipped: Vec::new(),
        };
        for service in active {
            match service.scope {
                Scope::Cluster => {
                    if let Some(reason) = bucket_problem(&service.cluster) {
                        buckets.skipped.push(Skipped {
                            cluster: service.cluster.clone(),
                            hostname: service.hostname.clone(),
                            service_type: service.service_type,
                            reason,
                        });
                        continue;
                    }
                    buckets
                        .clusters
                        .entry(&service.cluster)
                        .or_default()
                        .push(service);
                }
                Scope::Infra => buckets.infra.push(service),
            }
            buckets.everyone.push(service);
        }
        buckets
    }

    /// The bucket names, in publishing order: clusters by name, then `infra`.
    fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.clusters.keys().copied().chain([INFRA_BUCKET])
    }

    /// How many rosters these buckets make.
    fn rosters(&self) -> usize {
        (self.clusters.len() + 1) * consumers().count()
    }
}

/// The consumer types that receive rosters, with the provider types each needs.
fn consumers() -> impl Iterator<Item = (ServiceType, &'static [ServiceType])> {
    ServiceType::ALL
        .into_iter()
        .map(|consumer| (consumer, relevant_providers(consumer)))
        .filter(|(_, wanted)| !wanted.is_empty())
}

/// The members of `candidates` of the `wanted` types, sorted as rosters list them.
fn members_of<'a>(
    candidates: impl Iterator<Item = &'a Service>,
    wanted: &[ServiceType],
) -> Vec<&'a Service> {
    let mut members: Vec<&Service> = candidates
        .filter(|s| wanted.contains(&s.service_type))
        .collect();
    members.sort_by(|a, b| {
        (a.service_type.code(), &a.hostname).cmp(&(b.service_type.code(), &b.hostname))
    });
    members
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::registry::State;
    use crate::wire::now_ns;

    fn svc(scope: Scope, cluster: &str, host: &str, ty: ServiceType) -> Service {
        Service {
            scope,
            cluster: cluster.to_owned(),
            hostname: host.to_owned(),
            service_type: ty,
            state: State::Active,
            registered_at: 0,
            last_heartbeat: Some(0),
            config_revision: 0,
            meta: Arc::new(BTreeMap::new()),
        }
    }

    #[test]
    fn buckets_policy_and_order() {
        let active = vec![
            svc(
                Scope::Cluster,
                "fritz",
                "f0101",
                ServiceType::MetricCollector,
            ),
            svc(Scope::Cluster, "alex", "a01", ServiceType::MetricCollector),
            svc(Scope::Cluster, "alex", "ccb-z", ServiceType::Backend),
            svc(Scope::Infra, "", "mgmt02", ServiceType::Backend),
            svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
            svc(Scope::Infra, "", "store", ServiceType::MetricStore),
        ];
        let (rosters, skipped) = build_rosters(&active, "");
        assert!(skipped.is_empty());
        // 3 buckets x 6 consumer types (ccb consumes nothing).
        assert_eq!(rosters.len(), 18);
        let subjects: Vec<&str> = rosters.iter().map(|r| r.subject.as_str()).collect();
        assert_eq!(subjects[0], "cc.fleet.discovery.alex.ccms");
        assert_eq!(subjects[1], "cc.fleet.discovery.alex.ccmc");
        assert_eq!(subjects[6], "cc.fleet.discovery.fritz.ccms");
        assert_eq!(subjects[12], "cc.fleet.discovery.infra.ccms");
        assert!(!subjects.iter().any(|s| s.ends_with(".ccb")));
        let hosts = |r: &Roster| {
            r.providers
                .iter()
                .map(|p| p.hostname.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(hosts(&rosters[1]), ["ccb-z", "mgmt01", "mgmt02"]);
        assert_eq!(hosts(&rosters[7]), ["mgmt01", "mgmt02"]);
        assert_eq!(hosts(&rosters[12]), ["ccb-z", "mgmt01", "mgmt02"]);
        assert!(
            rosters
                .iter()
                .all(|r| r.providers.iter().all(|p| p.state == "active"))
        );

        let (empty, _) = build_rosters(&[], "site.disc");
        assert_eq!(empty.len(), 6);
        assert_eq!(empty[0].subject, "site.disc.infra.ccms");
        assert!(empty.iter().all(|r| r.providers.is_empty()));
    }

    #[test]
    fn rows_whose_cluster_cannot_name_a_subject_are_skipped_and_the_rest_published() {
        let long = "x".repeat(5000);
        let active = vec![
            svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
            svc(Scope::Cluster, "fritz", "ccb-f", ServiceType::Backend),
            svc(Scope::Cluster, "my cluster", "b1", ServiceType::Backend),
            svc(Scope::Cluster, &long, "b2", ServiceType::Backend),
            svc(Scope::Cluster, "a.b", "b3", ServiceType::Backend),
            svc(Scope::Cluster, "infra", "b4", ServiceType::Backend),
        ];
        let (rosters, skipped) = build_rosters(&active, "");
        let hosts: Vec<&str> = skipped.iter().map(|s| s.hostname.as_str()).collect();
        assert_eq!(hosts, ["b1", "b2", "b3", "b4"]);
        assert!(skipped[3].reason.contains("infra"));
        let buckets: std::collections::BTreeSet<&str> =
            rosters.iter().map(|r| r.bucket.as_str()).collect();
        assert_eq!(buckets, ["fritz", "infra"].into());
        assert!(rosters.iter().all(|r| r.subject.len() < 100));
        let infra = rosters
            .iter()
            .find(|r| r.subject == "cc.fleet.discovery.infra.ccmc")
            .unwrap();
        let names: Vec<&str> = infra
            .providers
            .iter()
            .map(|p| p.hostname.as_str())
            .collect();
        assert_eq!(names, ["ccb-f", "mgmt01"], "skipped rows are in no roster");
    }

    fn with_meta(mut service: Service, meta: &[(&str, &str)]) -> Service {
        service.meta = Arc::new(
            meta.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        service
    }

    #[test]
    fn rosters_encoded_from_borrowed_rows_are_the_bytes_of_the_owned_encoding() {
        let active = vec![
            with_meta(
                svc(Scope::Cluster, "fritz", "ccb-<f>", ServiceType::Backend),
                &[("url", "http://a&b/\"quoted\""), ("note", "\u{2028}")],
            ),
            svc(Scope::Cluster, "fritz", "f01", ServiceType::MetricCollector),
            svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
        ];
        let (rosters, _) = build_rosters(&active, "");
        let buckets = Buckets::of(&active);
        for roster in rosters {
            let candidates: Vec<&Service> = if roster.bucket == INFRA_BUCKET {
                buckets.everyone.clone()
            } else {
                buckets.clusters[roster.bucket.as_str()]
                    .iter()
                    .chain(&buckets.infra)
                    .copied()
                    .collect()
            };
            let members = members_of(candidates.into_iter(), relevant_providers(roster.consumer));
            let encoded = encode_members(members, &roster.bucket, ROSTER_LIMIT).unwrap();
            let mut line = Vec::new();
            encode_roster_line(
                &mut line,
                &roster.bucket,
                roster.consumer,
                &encoded.payload,
                7,
            );
            let owned =
                crate::wire::encode_roster(&roster.bucket, roster.consumer, &roster.providers, 7)
                    .unwrap();
            assert_eq!(line, owned, "{}", roster.subject);
            assert!(encoded.left_out.is_empty());
        }
    }

    #[test]
    fn members_with_the_most_metadata_are_left_out_until_the_roster_fits() {
        let big = "m".repeat(4000);
        let bigger = "m".repeat(5000);
        let members = [
            with_meta(
                svc(Scope::Cluster, "c", "a", ServiceType::Backend),
                &[("n", &big)],
            ),
            svc(Scope::Cluster, "c", "b", ServiceType::Backend),
            with_meta(
                svc(Scope::Cluster, "c", "c", ServiceType::Backend),
                &[("n", &bigger)],
            ),
            svc(Scope::Cluster, "c", "d", ServiceType::Backend),
        ];
        let refs: Vec<&Service> = members.iter().collect();
        let limit = 4096;
        let encoded = encode_members(refs.clone(), "c", limit).unwrap();
        let left: Vec<&str> = encoded
            .left_out
            .iter()
            .map(|m| m.hostname.as_str())
            .collect();
        assert_eq!(
            left,
            ["c", "a"],
            "both would not fit together: the larger goes first"
        );
        assert_eq!(encoded.providers, 2);
        let mut line = Vec::new();
        encode_roster_line(
            &mut line,
            "c",
            ServiceType::MetricCollector,
            &encoded.payload,
            now_ns(),
        );
        assert!(line.len() <= limit, "{}", line.len());
        let listed = crate::wire::decode_roster(&line).unwrap();
        let hosts: Vec<&str> = listed.iter().map(|p| p.hostname.as_str()).collect();
        assert_eq!(hosts, ["b", "d"]);

        // With room for one large member, only the largest is left out.
        let encoded = encode_members(refs, "c", 8192).unwrap();
        let left: Vec<&str> = encoded
            .left_out
            .iter()
            .map(|m| m.hostname.as_str())
            .collect();
        assert_eq!(left, ["c"]);
        assert_eq!(encoded.left_out[0].meta_bytes, 5001);
    }

    #[test]
    fn a_round_that_published_nothing_opens_no_debounce_window() {
        let debounce = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut pacer = Pacer::new(debounce);
        pacer.publishing(t0);
        // Long after: a change, but its round finds nothing changed.
        let t1 = t0 + Duration::from_secs(10);
        pacer.changed(t1);
        let previous = pacer.publishing(t1);
        pacer.restore(previous);
        // A real change right after goes out at once.
        let t2 = t1 + Duration::from_millis(100);
        pacer.changed(t2);
        assert_eq!(pacer.due, Some(t2));
    }

    #[test]
    fn the_first_change_is_published_at_once_and_later_ones_within_the_window_wait() {
        let debounce = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut pacer = Pacer::new(debounce);
        // Nothing published yet: a change is due at once.
        pacer.changed(t0);
        assert_eq!(pacer.due, Some(t0));
        pacer.publishing(t0);
        assert_eq!(pacer.due, None);
        // Within the window after that publish: wait for its end, however many changes come.
        pacer.changed(t0 + Duration::from_millis(500));
        pacer.changed(t0 + Duration::from_millis(900));
        assert_eq!(pacer.due, Some(t0 + debounce));
        pacer.publishing(t0 + debounce);
        // Long after the previous publish: at once again.
        let later = t0 + Duration::from_secs(60);
        pacer.changed(later);
        assert_eq!(pacer.due, Some(later));
    }
}
