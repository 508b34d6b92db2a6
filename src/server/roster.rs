//! The discovery roster publisher (cc-backend's `discovery.go`).
//!
//! Every consumer type that depends on others receives, per bucket (each cluster with an
//! active member, plus `infra`), the full list of its active providers on
//! `<prefix>.<bucket>.<consumer>`. Rosters are whole replacements over core NATS, so they
//! are re-published periodically, and soon after the registry changes (coalesced by a
//! debounce delay). They are broadcast unauthenticated.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::metrics::Metrics;
use super::registry::{Registry, Service};
use super::stopped;
use crate::wire::{INFRA_BUCKET, Provider, Scope, ServiceType, discovery_subject, encode_roster};

/// A publish round that cannot reach NATS within this time is abandoned.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

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

fn provider_of(service: &Service) -> Provider {
    Provider {
        service_type: service.service_type,
        hostname: service.hostname.clone(),
        state: service.state.as_str().to_owned(),
        meta: (*service.meta).clone(),
    }
}

/// Builds every roster from the active services: cluster buckets in name order, then
/// `infra`. A cluster bucket offers that cluster's members plus all infra-scope ones; the
/// infra bucket offers everyone. Empty rosters are included: they tell consumers that their
/// providers are gone.
pub fn build_rosters(active: &[Service], prefix: &str) -> Vec<Roster> {
    let mut clusters: BTreeMap<&str, Vec<&Service>> = BTreeMap::new();
    let mut infra: Vec<&Service> = Vec::new();
    for service in active {
        match service.scope {
            Scope::Cluster => clusters.entry(&service.cluster).or_default().push(service),
            Scope::Infra => infra.push(service),
        }
    }
    let everyone: Vec<&Service> = active.iter().collect();
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
    rosters
}

/// Asks the publisher for an early re-publish; cheap, and calls coalesce.
#[derive(Debug, Clone, Default)]
pub struct RosterNotify(Arc<Notify>);

impl RosterNotify {
    /// Requests a debounced re-publish.
    pub fn notify(&self) {
        self.0.notify_one();
    }
}

pub(crate) struct PublisherConfig {
    pub prefix: String,
    pub interval: Duration,
    pub debounce: Duration,
}

/// Spawns the publisher: once at start, every `interval`, and `debounce` after the first
/// of a burst of notifications.
pub(crate) fn spawn(
    client: async_nats::Client,
    registry: Registry,
    metrics: Arc<Metrics>,
    notify: RosterNotify,
    config: PublisherConfig,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tracing::warn!(
        "fleet: publishing discovery rosters under {:?} — these are broadcast UNAUTHENTICATED: \
         never put secrets into metaData",
        config.prefix
    );
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut due: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = ticker.tick() => {
                    due = None;
                    publish(&client, &registry, &metrics, &config.prefix).await;
                }
                _ = notify.0.notified(), if due.is_none() => {
                    due = Some(Instant::now() + config.debounce);
                }
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    due = None;
                    publish(&client, &registry, &metrics, &config.prefix).await;
                }
            }
        }
    })
}

async fn publish(
    client: &async_nats::Client,
    registry: &Registry,
    metrics: &Metrics,
    prefix: &str,
) {
    let rosters = build_rosters(&registry.active(), prefix);
    let round = async {
        let now = crate::wire::now_ns();
        for roster in rosters {
            let data = match encode_roster(&roster.bucket, roster.consumer, &roster.providers, now)
            {
                Ok(data) => data,
                Err(e) => {
                    Metrics::add(&metrics.roster_errors, 1);
                    tracing::error!("fleet: encoding roster for {}: {e}", roster.subject);
                    continue;
                }
            };
            let max = client.server_info().max_payload;
            if max > 0 && data.len() > max {
                Metrics::add(&metrics.roster_errors, 1);
                tracing::error!(
                    "fleet: roster for {} is {} bytes with {} provider(s), more than the NATS maximum payload of {max} bytes; not published",
                    roster.subject,
                    data.len(),
                    roster.providers.len()
                );
                continue;
            }
            match client.publish(roster.subject.clone(), data.into()).await {
                Ok(()) => Metrics::add(&metrics.roster_publishes, 1),
                Err(e) => {
                    Metrics::add(&metrics.roster_errors, 1);
                    tracing::error!("fleet: publishing roster for {}: {e}", roster.subject);
                }
            }
        }
    };
    if tokio::time::timeout(PUBLISH_TIMEOUT, round).await.is_err() {
        Metrics::add(&metrics.roster_errors, 1);
        tracing::warn!("fleet: NATS is not accepting messages; roster publish round abandoned");
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
        let rosters = build_rosters(&active, "");
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

        let empty = build_rosters(&[], "site.disc");
        assert_eq!(empty.len(), 6);
        assert_eq!(empty[0].subject, "site.disc.infra.ccms");
        assert!(empty.iter().all(|r| r.providers.is_empty()));
    }
}
