//! Roster building: the active services grouped into buckets, and the providers each
//! consumer type of a bucket receives.

use std::collections::BTreeMap;

use crate::server::registry::Service;
use crate::wire::{
    INFRA_BUCKET, Provider, Scope, ServiceType, discovery_subject, subject_token_problem,
};

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

/// The active services grouped into roster buckets, borrowed from the registry's rows.
pub(super) struct Buckets<'a> {
    pub(super) clusters: BTreeMap<&'a str, Vec<&'a Service>>,
    pub(super) infra: Vec<&'a Service>,
    pub(super) everyone: Vec<&'a Service>,
    pub(super) skipped: Vec<Skipped>,
}

impl<'a> Buckets<'a> {
    pub(super) fn of(active: &'a [Service]) -> Buckets<'a> {
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
    pub(super) fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.clusters.keys().copied().chain([INFRA_BUCKET])
    }

    /// How many rosters these buckets make.
    pub(super) fn rosters(&self) -> usize {
        (self.clusters.len() + 1) * consumers().count()
    }
}

/// The consumer types that receive rosters, with the provider types each needs.
pub(super) fn consumers() -> impl Iterator<Item = (ServiceType, &'static [ServiceType])> {
    ServiceType::ALL
        .into_iter()
        .map(|consumer| (consumer, relevant_providers(consumer)))
        .filter(|(_, wanted)| !wanted.is_empty())
}

/// The members of `candidates` of the `wanted` types, sorted as rosters list them.
pub(super) fn members_of<'a>(
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
