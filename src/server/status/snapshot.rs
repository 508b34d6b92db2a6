//! The fleet as the status view shows it: live instances (filtered), the rosters each
//! cluster is sent, and the plugin rollouts of the configuration tree.
//!
//! Deregistered instances are gone from the view; `pending`, `active` and `stale` ones are
//! listed with their registration time, last heartbeat and the configuration revision they
//! were served. Instance ids are credentials: only an abbreviation (first and last four
//! hex digits) leaves the server. Revisions are strings, so no JSON reader rounds them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::super::configtree::ConfigTree;
use super::super::registry::{State, StoredService};
use super::super::roster::build_rosters;
use super::plugins::{PluginRef, RevisionPlugins};
use crate::untrusted::Untrusted;
use crate::wire::{Provider, ServiceType};

/// The states the view lists, in lifecycle order.
pub const LISTED_STATES: [State; 3] = [State::Pending, State::Active, State::Stale];

/// The filter keys `GET /api/fleet/instances` takes.
pub const FILTER_KEYS: [&str; 4] = ["cluster", "type", "state", "hostname"];

/// The abbreviation of an instance id the view shows: its first and last four digits.
pub fn abbreviate_id(id: u128) -> String {
    let full = format!("{id:032x}");
    format!("{}…{}", &full[..4], &full[28..])
}

/// The filters of `GET /api/fleet/instances`; each holds the values any of which may match
/// (a key given twice matches either value), an empty one matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    /// Cluster names (`""` matches the infra members, which have no cluster).
    pub clusters: Vec<String>,
    /// Service types.
    pub types: Vec<ServiceType>,
    /// States.
    pub states: Vec<State>,
    /// Host names, matched exactly.
    pub hostnames: Vec<String>,
}

impl Filters {
    /// Parses query pairs; an unknown key, type or state is an error naming the valid ones.
    pub fn parse(pairs: &[(String, String)]) -> Result<Filters, String> {
        let mut filters = Filters::default();
        for (key, value) in pairs {
            match key.as_str() {
                "cluster" => filters.clusters.push(value.clone()),
                "hostname" => filters.hostnames.push(value.clone()),
                "type" => filters.types.push(value.parse().map_err(|_| {
                    let codes: Vec<&str> = ServiceType::ALL.iter().map(|t| t.code()).collect();
                    format!(
                        "unknown type \"{}\": expected one of {}",
                        Untrusted(value).capped(64),
                        codes.join(", ")
                    )
                })?),
                "state" => filters.states.push(
                    LISTED_STATES
                        .into_iter()
                        .find(|s| s.as_str() == value)
                        .ok_or_else(|| {
                            format!(
                                "unknown state \"{}\": expected pending, active or stale",
                                Untrusted(value).capped(64)
                            )
                        })?,
                ),
                other => {
                    return Err(format!(
                        "unknown filter \"{}\": expected {}",
                        Untrusted(other).capped(64),
                        FILTER_KEYS.join(", ")
                    ));
                }
            }
        }
        Ok(filters)
    }

    fn matches(&self, s: &StoredService) -> bool {
        let service = &s.service;
        (self.clusters.is_empty() || self.clusters.contains(&service.cluster))
            && (self.types.is_empty() || self.types.contains(&service.service_type))
            && (self.states.is_empty() || self.states.contains(&service.state))
            && (self.hostnames.is_empty() || self.hostnames.contains(&service.hostname))
    }
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
}


/// The live instances among `stored` that pass `filters`, ordered by cluster, type and
/// host name.
pub fn instances(
    stored: &[StoredService],
    filters: &Filters,
    is_duplicate: impl Fn(&StoredService) -> bool,
) -> Vec<InstanceView> {
    let mut views: Vec<InstanceView> = stored
        .iter()
        .filter(|s| LISTED_STATES.contains(&s.service.state) && filters.matches(s))
        .map(|s| {
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
                duplicate: is_duplicate(s),
            }
        })
        .collect();
    views.sort_by(|a, b| {
        (&a.cluster, a.service_type, &a.hostname).cmp(&(&b.cluster, b.service_type, &b.hostname))
    });
    views
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
}

/// One plugin of the configuration tree and its components.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    /// The plugin's name.
    pub plugin: String,
    /// Its components, by SHA-256.
    pub versions: Vec<VersionView>,
}

/// The plugin rollouts over the live instances of `stored`, and how many live instances
/// were served a configuration this server does not know the plugins of (served by
/// another server, or before a restart from a tree that has changed since).
pub fn rollouts(
    stored: &[StoredService],
    tree: Option<&ConfigTree>,
    known: &RevisionPlugins,
) -> (Vec<RolloutView>, u64) {
    let mut counts: BTreeMap<PluginRef, (u64, u64)> = BTreeMap::new();
    let mut unknown = 0;
    for s in stored {
        let service = &s.service;
        if !LISTED_STATES.contains(&service.state) {
            continue;
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
    for (plugin, (served, named)) in counts {
        let version = VersionView {
            sha256: plugin.sha256,
            served,
            named,
        };
        match rollouts.last_mut() {
            Some(last) if last.plugin == plugin.name => last.versions.push(version),
            _ => rollouts.push(RolloutView {
                plugin: plugin.name,
                versions: vec![version],
            }),
        }
    }
    (rollouts, unknown)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::server::registry::Service;
    use crate::wire::Scope;

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
    fn filters_parse_and_name_what_is_valid() {
        let f = Filters::parse(&pairs(&[
            ("cluster", "fritz"),
            ("type", "ccmc"),
            ("state", "stale"),
            ("state", "active"),
            ("hostname", "f0101"),
        ]))
        .unwrap();
        assert_eq!(f.types, [ServiceType::MetricCollector]);
        assert_eq!(f.states, [State::Stale, State::Active]);
        let e = Filters::parse(&pairs(&[("type", "ccmx")])).unwrap_err();
        assert!(e.contains("\"ccmx\"") && e.contains("ccmc, ccb"), "{e}");
        let e = Filters::parse(&pairs(&[("state", "deregistered")])).unwrap_err();
        assert!(e.contains("pending, active or stale"), "{e}");
        let e = Filters::parse(&pairs(&[("host", "x")])).unwrap_err();
        assert!(
            e.contains("\"host\"") && e.contains("cluster, type, state, hostname"),
            "{e}"
        );
    }

    proptest::proptest! {
        /// Any query pairs are parsed or refused with a message, never a panic.
        #[test]
        fn arbitrary_filters_never_panic(p in proptest::collection::vec(("\\PC{0,12}", "\\PC{0,300}"), 0..6)) {
            match Filters::parse(&p) {
                Ok(f) => proptest::prop_assert!(
                    f.clusters.len() + f.types.len() + f.states.len() + f.hostnames.len() == p.len()
                ),
                Err(e) => proptest::prop_assert!(e.len() < 400, "{}", e),
            }
        }
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
        let flags = |_: &StoredService| false;
        let listed = instances(&all, &Filters::default(), flags);
        let names: Vec<&str> = listed.iter().map(|v| v.hostname.as_str()).collect();
        assert_eq!(names, ["a1", "f0", "f1", "f2"]);
        assert_eq!(listed[2].last_heartbeat, None);
        assert_eq!(listed[2].config_revision, None);

        let f = Filters::parse(&pairs(&[("cluster", "fritz"), ("type", "ccmc")])).unwrap();
        let names: Vec<String> = instances(&all, &f, flags)
            .into_iter()
            .map(|v| v.hostname)
            .collect();
        assert_eq!(names, ["f1", "f2"]);
        let f = Filters::parse(&pairs(&[("hostname", "f1"), ("hostname", "a1")])).unwrap();
        assert_eq!(instances(&all, &f, flags).len(), 2);
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
        let listed = instances(&all, &Filters::default(), |s| s.service.hostname == "f2");
        assert_eq!(
            listed.iter().map(|v| v.duplicate).collect::<Vec<_>>(),
            [false, true]
        );
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
        let view = &instances(&[s], &Filters::default(), |_| false)[0];
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
}
