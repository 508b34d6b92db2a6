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

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
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
    encode_roster, roster_signing_input, subject_token_problem,
};

/// A publish round that NATS does not confirm within this time is counted as failed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How many skipped rows a log line names.
const SKIPPED_EXAMPLES: usize = 5;

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
pub struct RosterNotify(Arc<Notify>);

impl RosterNotify {
    /// Requests a re-publish (at once, or when the debounce window after the previous
    /// publish ends).
    pub fn notify(&self) {
        self.0.notify_one();
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

    /// A round starts at `now`; it covers every change notified before.
    fn publishing(&mut self, now: Instant) {
        self.last = Some(now);
        self.due = None;
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
        };
        let mut ticker = tokio::time::interval(publisher.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pacer = Pacer::new(publisher.config.debounce);
        loop {
            let due = pacer.due;
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = ticker.tick() => {
                    pacer.publishing(Instant::now());
                    publisher.round().await;
                }
                _ = notify.0.notified() => pacer.changed(Instant::now()),
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    pacer.publishing(Instant::now());
                    publisher.round().await;
                }
            }
        }
    })
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

    /// Counts every roster of a round that failed as a whole; one log line per outage.
    fn round_failed(&mut self, subjects: &[String], error: std::fmt::Arguments<'_>) {
        for subject in subjects {
            self.metrics.roster_subject_error(subject);
        }
        if self.round_failing {
            tracing::debug!(
                "fleet: {} roster(s) still not published: {error}",
                subjects.len()
            );
        } else {
            self.round_failing = true;
            tracing::error!("fleet: {} roster(s) not published: {error}", subjects.len());
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

    async fn round(&mut self) {
        if !self.config.gate.is_leader() {
            return;
        }
        let (rosters, skipped) = build_rosters(&self.registry.active(), &self.config.prefix);
        self.report_skipped(&skipped);
        if self.client.connection_state() != async_nats::connection::State::Connected {
            // Queued rosters would go out stale after the reconnect, which triggers a fresh
            // round anyway.
            let subjects: Vec<String> = rosters.into_iter().map(|r| r.subject).collect();
            self.round_failed(
                &subjects,
                format_args!("NATS is disconnected; they go out again once it reconnects"),
            );
            return;
        }
        let now = crate::wire::now_ns();
        let mut queued = Vec::with_capacity(rosters.len());
        for roster in rosters {
            let data = match encode_roster(&roster.bucket, roster.consumer, &roster.providers, now)
            {
                Ok(data) => data,
                Err(e) => {
                    self.failed(&roster.subject, format_args!("encoding: {e}"));
                    continue;
                }
            };
            let mut headers = async_nats::HeaderMap::new();
            if let Some(signer) = &self.config.signer {
                let signature = signer.sign(&roster_signing_input(&roster.subject, &data));
                headers.insert(ROSTER_SIGNATURE_HEADER, STANDARD.encode(signature).as_str());
            }
            let size = data.len();
            // async-nats refuses (and does not queue) a message above the server's
            // max_payload, headers included; sending one would make NATS close the connection.
            let result = if headers.is_empty() {
                self.client
                    .publish(roster.subject.clone(), data.into())
                    .await
            } else {
                self.client
                    .publish_with_headers(roster.subject.clone(), headers, data.into())
                    .await
            };
            match result {
                Ok(()) => queued.push(roster.subject),
                Err(e) => self.failed(
                    &roster.subject,
                    format_args!(
                        "{size} bytes with {} provider(s) (NATS max_payload {}): {e}",
                        roster.providers.len(),
                        self.client.max_payload()
                    ),
                ),
            }
        }
        if queued.is_empty() {
            return;
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
                for subject in &queued {
                    if self.failing.remove(subject) {
                        tracing::info!("fleet: roster for {} published again", Untrusted(subject));
                    }
                }
            }
            Err(e) => self.round_failed(&queued, format_args!("flush: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::registry::State;

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
