//! The fleet as the status view shows it: live instances (filtered), the rosters each
//! cluster is sent, and the plugin rollouts of the configuration tree.
//!
//! Deregistered instances are gone from the view; `pending`, `active` and `stale` ones are
//! listed with their registration time, last heartbeat and the configuration revision they
//! were served. Instance ids are credentials: only an abbreviation (first and last four
//! hex digits) leaves the server. Revisions are strings, so no JSON reader rounds them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::super::configtree::ConfigTree;
use super::super::registry::{State, StoredService};
use super::super::roster::build_rosters;
use super::plugins::{PluginRef, RevisionPlugins};
use super::query::{Facts, LISTED_STATES, Query, Sort};
use crate::wire::{AgentReport, PluginHealth, Provider, reported_hash};

/// The abbreviation of an instance id the view shows: its first and last four digits.
pub fn abbreviate_id(id: u128) -> String {
    let full = format!("{id:032x}");
    format!("{}…{}", &full[..4], &full[28..])
}

/// One instance as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    /// The cluster; empty for infra scope.
    pub cluster: String,
    /// `cluster` or `infra`.
    pub scope: &'static str,
    /// The host name.
    pub hostname: String,
    /// The service type's code.
    pub service_type: &'static str,
    /// `pending`, `active` or `stale`.
    pub state: &'static str,
    /// Unix seconds of the registration.
    pub registered_at: i64,
    /// Unix seconds of the last heartbeat; `null` before the first.
    pub last_heartbeat: Option<i64>,
    /// The configuration revision last served, as a string; `null` when none was.
    pub config_revision: Option<String>,
    /// The instance id abbreviated (never whole: it is a credential).
    pub instance: String,
    /// Whether another agent claims the same identity.
    pub duplicate: bool,
    /// What the member reports running, per plugin; absent when it sends no reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Vec<ReportedView>>,
}

/// One plugin as a member reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportedView {
    /// The plugin's name in the agent's configuration.
    pub name: String,
    /// The first hex digits of the SHA-256 it runs; `null` for a plugin configured by path.
    pub sha256: Option<String>,
    /// How it fares: `running`, `starting`, `restarting`, `quarantined`, ...
    pub health: &'static str,
    /// Why it is not run, when the agent says (`unsigned`,
    /// `beyond_ceiling/capabilities.run`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A page of the instances that pass a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// How many instances pass the filters (on every page).
    pub total: usize,
    /// The page.
    pub instances: Vec<InstanceView>,
}

/// Where [`Sort::State`] puts a member: what needs attention first.
fn urgency(s: &StoredService, facts: &Facts) -> u8 {
    match s.service.state {
        State::Stale => 0,
        _ if facts.duplicate => 1,
        _ if facts.failing() => 2,
        State::Pending => 3,
        _ => 4,
    }
}

/// The live instances among `stored` that pass `query`'s filters, in its order (by
/// cluster, type and host name unless it sorts by state), and of those its page.
pub fn instances(
    stored: &[StoredService],
    query: &Query,
    facts: impl Fn(&StoredService) -> Facts,
) -> Listed {
    let filters = &query.filters;
    let mut listed: Vec<(u8, &StoredService, Facts)> = stored
        .iter()
        .filter(|s| filters.matches_service(s))
        .map(|s| (s, facts(s)))
        .filter(|(_, f)| filters.matches_facts(f))
        .map(|(s, f)| (urgency(s, &f), s, f))
        .collect();
    let by_name = |s: &StoredService| {
        let service = &s.service;
        (
            service.cluster.clone(),
            service.service_type.code(),
            service.hostname.clone(),
        )
    };
    match query.sort {
        Sort::Name => listed.sort_by_cached_key(|(_, s, _)| by_name(s)),
        Sort::State => listed.sort_by_cached_key(|(rank, s, _)| (*rank, by_name(s))),
    }
    let total = listed.len();
    let instances = listed
        .into_iter()
        .skip(query.offset)
        .take(query.limit.unwrap_or(usize::MAX))
        .map(|(_, s, facts)| view(s, &facts))
        .collect();
    Listed { total, instances }
}

fn view(s: &StoredService, facts: &Facts) -> InstanceView {
    let service = &s.service;
    InstanceView {
        cluster: service.cluster.clone(),
        scope: service.scope.as_str(),
        hostname: service.hostname.clone(),
        service_type: service.service_type.code(),
        state: service.state.as_str(),
        registered_at: service.registered_at,
        last_heartbeat: service.last_heartbeat,
        config_revision: (service.config_revision != 0)
            .then(|| service.config_revision.to_string()),
        instance: abbreviate_id(s.instance),
        duplicate: facts.duplicate,
        plugins: facts.report.as_ref().map(|r| {
            r.plugins
                .iter()
                .map(|p| ReportedView {
                    name: p.name.clone(),
                    sha256: p.sha256.clone(),
                    health: p.health.as_str(),
                    why: p.why.clone(),
                })
                .collect()
        }),
    }
}

/// One roster a cluster (or the infra bucket) is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RosterView {
    /// The cluster, or `infra`.
    pub bucket: String,
    /// The consumer type it is meant for.
    pub consumer: &'static str,
    /// The NATS subject it is published on.
    pub subject: String,
    /// The providers it lists, as the roster carries them.
    pub providers: Vec<Provider>,
}

/// The rosters the publisher sends for `stored`'s active members.
pub fn rosters(stored: &[StoredService], prefix: &str) -> Vec<RosterView> {
    let active: Vec<_> = stored
        .iter()
        .filter(|s| s.service.state == State::Active)
        .map(|s| s.service.clone())
        .collect();
    build_rosters(&active, prefix)
        .0
        .into_iter()
        .map(|r| RosterView {
            bucket: r.bucket,
            consumer: r.consumer.code(),
            subject: r.subject,
            providers: r.providers,
        })
        .collect()
}

/// One component of a plugin rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionView {
    /// The component's SHA-256.
    pub sha256: String,
    /// Live instances whose last served configuration names it.
    pub served: u64,
    /// Live instances whose configuration in the current tree names it (they get it at
    /// their next pull if they were not served it yet).
    pub named: u64,
    /// Live instances that report running this component, in any health.
    pub reporting: u64,
    /// Of those, the ones that report it running.
    pub running: u64,
    /// Of those, the ones that report it failed (restarting, quarantined, not downloaded or
    /// not loaded).
    pub failed: u64,
}

/// One plugin of the configuration tree and its components.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    /// The plugin's name.
    pub plugin: String,
    /// Its components, by SHA-256: those the configuration tree names or served ones
    /// (whole), then those only reports name (the first hex digits an agent reports).
    pub versions: Vec<VersionView>,
}

/// Reports of one component: reporting, running, failed.
type Reported = (u64, u64, u64);

/// The plugin rollouts over the live instances of `stored`, and how many live instances
/// were served a configuration this server does not know the plugins of (served by
/// another server, or before a restart from a tree that has changed since). `report`
/// gives what a member last reported running.
pub fn rollouts(
    stored: &[StoredService],
    tree: Option<&ConfigTree>,
    known: &RevisionPlugins,
    report: impl Fn(&StoredService) -> Option<Arc<AgentReport>>,
) -> (Vec<RolloutView>, u64) {
    let mut counts: BTreeMap<PluginRef, (u64, u64)> = BTreeMap::new();
    // (name, reported hash) → counts.
    let mut reported: BTreeMap<(String, String), Reported> = BTreeMap::new();
    let mut unknown = 0;
    for s in stored {
        let service = &s.service;
        if !LISTED_STATES.contains(&service.state) {
            continue;
        }
        for plugin in report(s).iter().flat_map(|r| r.plugins.iter()) {
            let Some(hash) = &plugin.sha256 else { continue };
            let entry = reported
                .entry((plugin.name.clone(), hash.clone()))
                .or_default();
            entry.0 += 1;
            entry.1 += u64::from(plugin.health == PluginHealth::Running);
            entry.2 += u64::from(plugin.health.is_failure());
        }
        let current = tree.and_then(|tree| {
            tree.resolve(
                service.scope,
                &service.cluster,
                service.service_type,
                &service.hostname,
            )
        });
        let named = current.as_ref().map(|resolved| known.record(resolved));
        for plugin in named.iter().flat_map(|list| list.iter()) {
            counts.entry(plugin.clone()).or_default().1 += 1;
        }
        if service.config_revision == 0 {
            continue;
        }
        let served = known.get(service.config_revision);
        match served {
            Some(list) => {
                for plugin in list.iter() {
                    counts.entry(plugin.clone()).or_default().0 += 1;
                }
            }
            None => unknown += 1,
        }
    }
    let mut rollouts: Vec<RolloutView> = Vec::new();
    let mut push = |name: String, version: VersionView| match rollouts.last_mut() {
        Some(last) if last.plugin == name => last.versions.push(version),
        _ => rollouts.push(RolloutView {
            plugin: name,
            versions: vec![version],
        }),
    };
    let mut only_reported = reported.clone();
    for (plugin, (served, named)) in counts {
        let key = (plugin.name.clone(), reported_hash(&plugin.sha256));
        let (reporting, running, failed) = reported.get(&key).copied().unwrap_or_default();
        only_reported.remove(&key);
        let version = VersionView {
            sha256: plugin.sha256,
            served,
            named,
            reporting,
            running,
            failed,
        };
        push(plugin.name, version);
    }
    for ((name, hash), (reporting, running, failed)) in only_reported {
        let version = VersionView {
            sha256: hash,
            served: 0,
            named: 0,
            reporting,
            running,
            failed,
        };
        match rollouts.iter_mut().find(|r| r.plugin == name) {
            Some(r) => r.versions.push(version),
            None => rollouts.push(RolloutView {
                plugin: name,
                versions: vec![version],
            }),
        }
    }
    rollouts.sort_by(|a, b| a.plugin.cmp(&b.plugin));
    (rollouts, unknown)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::server::registry::Service;
    use crate::wire::{Scope, ServiceType};

    fn stored(
        instance: u128,
        cluster: &str,
        host: &str,
        ty: ServiceType,
        state: State,
    ) -> StoredService {
        StoredService {
            key: instance as i64,
            instance,
            service: Service {
                scope: Scope::of_cluster(cluster),
                cluster: cluster.into(),
                hostname: host.into(),
                service_type: ty,
                state,
                registered_at: 100,
                last_heartbeat: (state != State::Pending).then_some(150),
                config_revision: 0,
                meta: Arc::default(),
            },
        }
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ids_are_abbreviated() {
        let id = 0x0123_4567_89ab_cdef_0011_2233_4455_6677u128;
        assert_eq!(abbreviate_id(id), "0123…6677");
        assert_eq!(abbreviate_id(0), "0000…0000");
    }

    #[test]
    fn deregistered_instances_are_gone_and_the_rest_is_ordered_and_filtered() {
        let all = vec![
            stored(
                3,
                "fritz",
                "f2",
                ServiceType::MetricCollector,
                State::Active,
            ),
            stored(1, "alex", "a1", ServiceType::MetricCollector, State::Stale),
            stored(
                2,
                "fritz",
                "f1",
                ServiceType::MetricCollector,
                State::Pending,
            ),
            stored(4, "fritz", "f0", ServiceType::Backend, State::Active),
            stored(
                5,
                "fritz",
                "gone",
                ServiceType::MetricCollector,
                State::Deregistered,
            ),
        ];
        let flags = |_: &StoredService| Facts::default();
        let listed = instances(&all, &Query::default(), flags);
        assert_eq!(listed.total, 4);
        let names: Vec<&str> = listed
            .instances
            .iter()
            .map(|v| v.hostname.as_str())
            .collect();
        assert_eq!(names, ["a1", "f0", "f1", "f2"]);
        assert_eq!(listed.instances[2].last_heartbeat, None);
        assert_eq!(listed.instances[2].config_revision, None);

        let names = |q: &[(&str, &str)]| -> Vec<String> {
            let q = Query::parse(&pairs(q)).unwrap();
            instances(&all, &q, flags)
                .instances
                .into_iter()
                .map(|v| v.hostname)
                .collect()
        };
        assert_eq!(
            names(&[("cluster", "fritz"), ("type", "ccmc")]),
            ["f1", "f2"]
        );
        assert_eq!(
            names(&[("hostname", "f1"), ("hostname", "a1")]),
            ["a1", "f1"]
        );
        assert_eq!(names(&[("host", "f[1-2]")]), ["f1", "f2"]);
        assert_eq!(names(&[("host", "?0"), ("host", "a*")]), ["a1", "f0"]);
        // Attention first: stale, then pending, then active; a page of it.
        assert_eq!(names(&[("sort", "state")]), ["a1", "f1", "f0", "f2"]);
        assert_eq!(
            names(&[("sort", "state"), ("offset", "1"), ("limit", "2")]),
            ["f1", "f0"]
        );
        let q = Query::parse(&pairs(&[("offset", "3"), ("limit", "5")])).unwrap();
        let page = instances(&all, &q, flags);
        assert_eq!((page.total, page.instances.len()), (4, 1));
    }

    #[test]
    fn a_flagged_identity_marks_its_instances_duplicate() {
        let all = vec![
            stored(
                1,
                "fritz",
                "f1",
                ServiceType::MetricCollector,
                State::Active,
            ),
            stored(
                2,
                "fritz",
                "f2",
                ServiceType::MetricCollector,
                State::Active,
            ),
        ];
        let facts = |s: &StoredService| Facts {
            duplicate: s.service.hostname == "f2",
            report: None,
        };
        let listed = instances(&all, &Query::default(), facts).instances;
        assert_eq!(
            listed.iter().map(|v| v.duplicate).collect::<Vec<_>>(),
            [false, true]
        );
        let q = Query::parse(&pairs(&[("duplicate", "true")])).unwrap();
        let listed = instances(&all, &q, facts).instances;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].hostname, "f2");
    }

    #[test]
    fn the_json_names_every_field_and_never_the_whole_id() {
        let mut s = stored(
            u128::MAX - 1,
            "fritz",
            "f1",
            ServiceType::MetricCollector,
            State::Active,
        );
        s.service.config_revision = i64::MAX;
        let view = &instances(&[s], &Query::default(), |_| Facts::default()).instances[0];
        let json = serde_json::to_value(view).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "cluster": "fritz", "scope": "cluster", "hostname": "f1", "serviceType": "ccmc",
                "state": "active", "registeredAt": 100, "lastHeartbeat": 150,
                "configRevision": i64::MAX.to_string(), "instance": "ffff…fffe",
                "duplicate": false
            })
        );
    }

    #[test]
    fn reports_are_shown_filtered_and_counted_per_component() {
        let all = vec![
            stored(
                1,
                "fritz",
                "f1",
                ServiceType::MetricCollector,
                State::Active,
            ),
            stored(
                2,
                "fritz",
                "f2",
                ServiceType::MetricCollector,
                State::Active,
            ),
            stored(
                3,
                "fritz",
                "f3",
                ServiceType::MetricCollector,
                State::Active,
            ),
        ];
        let report = |s: &StoredService| -> Option<Arc<AgentReport>> {
            let text = match s.service.hostname.as_str() {
                "f1" => "applied=1; plugins=load@aaaaaaaaaaaaaaaa:running",
                "f2" => "applied=1; plugins=load@bbbbbbbbbbbbbbbb:quarantined,own@-:running",
                _ => return None,
            };
            Some(Arc::new(AgentReport::parse(text).unwrap()))
        };
        let facts = |s: &StoredService| Facts {
            duplicate: false,
            report: report(s),
        };
        let listed = instances(&all, &Query::default(), facts).instances;
        let json = serde_json::to_value(&listed[1]).unwrap();
        assert_eq!(
            json["plugins"],
            serde_json::json!([
                {"name": "load", "sha256": "bbbbbbbbbbbbbbbb", "health": "quarantined"},
                {"name": "own", "sha256": null, "health": "running"}
            ])
        );
        assert!(
            serde_json::to_value(&listed[2])
                .unwrap()
                .get("plugins")
                .is_none()
        );
        let names = |q: &[(&str, &str)]| -> Vec<String> {
            let q = Query::parse(&pairs(q)).unwrap();
            instances(&all, &q, facts)
                .instances
                .into_iter()
                .map(|v| v.hostname)
                .collect()
        };
        assert_eq!(names(&[("failing", "true")]), ["f2"]);
        assert_eq!(names(&[("version", "AAAA")]), ["f1"]);
        assert_eq!(
            names(&[("version", "aaaa"), ("version", "bbb")]),
            ["f1", "f2"]
        );
        // The failing member sorts before the other active ones.
        assert_eq!(names(&[("sort", "state")]), ["f2", "f1", "f3"]);

        let (rollouts, _) = rollouts(&all, None, &RevisionPlugins::default(), report);
        assert_eq!(rollouts.len(), 1, "{rollouts:?}");
        let counts: Vec<(&str, u64, u64, u64)> = rollouts[0]
            .versions
            .iter()
            .map(|v| (v.sha256.as_str(), v.reporting, v.running, v.failed))
            .collect();
        assert_eq!(
            counts,
            [("aaaaaaaaaaaaaaaa", 1, 1, 0), ("bbbbbbbbbbbbbbbb", 1, 0, 1)]
        );
    }
}
