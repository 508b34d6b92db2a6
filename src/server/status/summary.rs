//! The fleet in a few lines: per cluster and service type, how many members are in each
//! state, which hosts are not active (as host lists, `f[0101-0188,0201]`) and since when
//! the oldest stale one has been silent. What `GET /api/fleet/summary`, the top of the page
//! and `ccfleet fleet status --summary` show; its size grows with the clusters and the
//! ranges of unhealthy hosts, not with the fleet.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::super::registry::{State, StoredService};
use super::query::{Facts, Filters};
use crate::hostlist::compress;

/// Members by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Registered, no heartbeat yet.
    pub pending: u64,
    /// Heartbeating.
    pub active: u64,
    /// Silent for the stale-after time.
    pub stale: u64,
    /// Whose identity another agent claims.
    pub duplicate: u64,
    /// Reporting a failed plugin.
    pub failing: u64,
}

/// The hosts of one group that need attention, as host lists (empty: none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hosts {
    /// Pending members.
    pub pending: String,
    /// Stale members.
    pub stale: String,
    /// Members flagged as duplicates.
    pub duplicate: String,
    /// Members reporting a failed plugin.
    pub failing: String,
}

/// One cluster's members of one service type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// The cluster; empty for infra members.
    pub cluster: String,
    /// The service type's code.
    pub service_type: String,
    /// How many are in each state.
    pub counts: Counts,
    /// Which hosts are not well.
    pub hosts: Hosts,
    /// Unix seconds of the last sign of life (heartbeat, else registration) of the stale
    /// member silent longest; `null` when none is stale.
    pub oldest_stale_since: Option<i64>,
}

/// The whole summary (without the server's clock, which the answer adds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The counts over every group.
    pub total: Counts,
    /// The groups, by cluster and type.
    pub groups: Vec<Group>,
}

/// Summarises the members of `stored` that pass `filters`.
pub fn summary(
    stored: &[StoredService],
    filters: &Filters,
    facts: impl Fn(&StoredService) -> Facts,
) -> Summary {
    #[derive(Default)]
    struct Acc<'a> {
        counts: Counts,
        pending: Vec<&'a str>,
        stale: Vec<&'a str>,
        duplicate: Vec<&'a str>,
        failing: Vec<&'a str>,
        oldest: Option<i64>,
    }
    let mut groups: BTreeMap<(&str, &'static str), Acc> = BTreeMap::new();
    for s in stored.iter().filter(|s| filters.matches_service(s)) {
        let facts = facts(s);
        if !filters.matches_facts(&facts) {
            continue;
        }
        let service = &s.service;
        let acc = groups
            .entry((&service.cluster, service.service_type.code()))
            .or_default();
        let host = service.hostname.as_str();
        match service.state {
            State::Pending => {
                acc.counts.pending += 1;
                acc.pending.push(host);
            }
            State::Stale => {
                acc.counts.stale += 1;
                acc.stale.push(host);
                let since = service.last_heartbeat.unwrap_or(service.registered_at);
                acc.oldest = Some(acc.oldest.map_or(since, |o| o.min(since)));
            }
            _ => acc.counts.active += 1,
        }
        if facts.duplicate {
            acc.counts.duplicate += 1;
            acc.duplicate.push(host);
        }
        if facts.failing() {
            acc.counts.failing += 1;
            acc.failing.push(host);
        }
    }
    let mut total = Counts::default();
    let groups = groups
        .into_iter()
        .map(|((cluster, service_type), acc)| {
            let c = &acc.counts;
            total.pending += c.pending;
            total.active += c.active;
            total.stale += c.stale;
            total.duplicate += c.duplicate;
            total.failing += c.failing;
            Group {
                cluster: cluster.to_owned(),
                service_type: service_type.to_owned(),
                hosts: Hosts {
                    pending: compress(acc.pending),
                    stale: compress(acc.stale),
                    duplicate: compress(acc.duplicate),
                    failing: compress(acc.failing),
                },
                counts: acc.counts,
                oldest_stale_since: acc.oldest,
            }
        })
        .collect();
    Summary { total, groups }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hostlist::HostList;
    use crate::server::registry::Service;
    use crate::wire::{AgentReport, Scope, ServiceType};

    fn member(key: i64, cluster: &str, host: &str, state: State, heartbeat: i64) -> StoredService {
        StoredService {
            key,
            instance: key as u128,
            service: Service {
                scope: Scope::of_cluster(cluster),
                cluster: cluster.into(),
                hostname: host.into(),
                service_type: ServiceType::MetricCollector,
                state,
                registered_at: 10,
                last_heartbeat: (state != State::Pending).then_some(heartbeat),
                config_revision: 0,
                meta: Arc::default(),
            },
        }
    }

    #[test]
    fn states_are_counted_and_unwell_hosts_written_as_ranges() {
        let mut all = Vec::new();
        for n in 1..=20 {
            let state = match n {
                3..=5 | 9 => State::Stale,
                12 => State::Pending,
                _ => State::Active,
            };
            all.push(member(n, "fritz", &format!("f{n:04}"), state, 1000 + n));
        }
        all.push(member(99, "alex", "a1", State::Deregistered, 5));
        all.push(member(100, "alex", "a2", State::Active, 5));
        let facts = |s: &StoredService| Facts {
            duplicate: s.service.hostname == "f0007",
            report: (s.service.hostname == "f0008").then(|| {
                Arc::new(AgentReport::parse("applied=1; plugins=x@-:load-failed").unwrap())
            }),
        };
        let got = summary(&all, &Filters::default(), facts);
        assert_eq!(got.groups.len(), 2);
        assert_eq!(got.groups[0].cluster, "alex");
        assert_eq!(got.groups[0].counts.active, 1);
        let fritz = &got.groups[1];
        assert_eq!(
            (
                fritz.counts.active,
                fritz.counts.stale,
                fritz.counts.pending
            ),
            (15, 4, 1)
        );
        assert_eq!(fritz.hosts.stale, "f[0003-0005,0009]");
        assert_eq!(fritz.hosts.pending, "f0012");
        assert_eq!(fritz.hosts.duplicate, "f0007");
        assert_eq!(fritz.hosts.failing, "f0008");
        assert_eq!(fritz.oldest_stale_since, Some(1003));
        assert_eq!(
            (got.total.active, got.total.stale, got.total.failing),
            (16, 4, 1)
        );
        assert_eq!(got.groups[0].oldest_stale_since, None);

        let only = Filters {
            hosts: vec![HostList::parse("f[0001-0004]").unwrap()],
            ..Filters::default()
        };
        let got = summary(&all, &only, facts);
        assert_eq!(got.groups.len(), 1);
        assert_eq!(got.groups[0].hosts.stale, "f[0003-0004]");
        assert_eq!(got.total.active, 2);
    }
}
