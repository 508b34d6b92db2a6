//! What a status request asks for: which members (filters), in which order and which page.
//!
//! The same query parameters serve `GET /api/fleet/instances`, `GET /api/fleet/summary`
//! and the page's data routes, so a view of the page, a tool's request and
//! `ccfleet fleet status` name members the same way:
//!
//! - `cluster`, `type`, `state`, `hostname` (exact): the original filters;
//! - `host`: a host list or pattern (`f[0101-0188,0201]`, `login*`, see
//!   [`crate::hostlist`]);
//! - `version`: the first hex digits of a plugin's SHA-256 that a member reports running or
//!   failing;
//! - `failing=true`: members reporting a failed plugin; `duplicate=true`: members whose
//!   identity another agent claims;
//! - `sort`: `name` (cluster, type, host: the default) or `state` (stale first, then
//!   duplicates, failing and pending members, the active last);
//! - `offset`, `limit`: the page of the sorted list.
//!
//! A key given twice matches either value, different keys must all match.

use std::sync::Arc;

use super::super::registry::{State, StoredService};
use crate::hostlist::HostList;
use crate::untrusted::Untrusted;
use crate::wire::{AgentReport, REPORTED_HASH_LEN, ServiceType};

/// The states the view lists, in lifecycle order.
pub const LISTED_STATES: [State; 3] = [State::Pending, State::Active, State::Stale];

/// The query keys the status routes take.
pub const QUERY_KEYS: [&str; 11] = [
    "cluster",
    "type",
    "state",
    "hostname",
    "host",
    "version",
    "failing",
    "duplicate",
    "sort",
    "offset",
    "limit",
];

/// The most rows one page may ask for.
pub const MAX_LIMIT: usize = 100_000;

/// What the server knows of a member beyond its registration.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Whether another agent claims the same identity now.
    pub duplicate: bool,
    /// What the member last reported running, if it reports.
    pub report: Option<Arc<AgentReport>>,
}

impl Facts {
    /// Whether the member reports a plugin that failed.
    pub fn failing(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|r| r.plugins.iter().any(|p| p.health.is_failure()))
    }
}

/// Which members a request names; an empty list matches everything.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Cluster names (`""` matches the infra members, which have no cluster).
    pub clusters: Vec<String>,
    /// Service types.
    pub types: Vec<ServiceType>,
    /// States.
    pub states: Vec<State>,
    /// Host names, matched exactly.
    pub hostnames: Vec<String>,
    /// Host lists or patterns.
    pub hosts: Vec<HostList>,
    /// Reported SHA-256 prefixes, lowercase, at most [`REPORTED_HASH_LEN`] digits.
    pub versions: Vec<String>,
    /// Only members reporting a failed plugin.
    pub failing: bool,
    /// Only members flagged as duplicates.
    pub duplicate: bool,
}

/// The order of the listed members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sort {
    /// Cluster, type, host name.
    #[default]
    Name,
    /// Stale, duplicate, failing, pending, active; then by name.
    State,
}

/// A whole request: filters, order and page.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Which members.
    pub filters: Filters,
    /// In which order.
    pub sort: Sort,
    /// How many of the sorted members to skip.
    pub offset: usize,
    /// How many to answer at most; `None`: all.
    pub limit: Option<usize>,
}

fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        other => Err(format!(
            "{key}={}: expected true or false",
            Untrusted(other).capped(32)
        )),
    }
}

fn number(key: &str, value: &str, max: usize) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!(
            "{key}={}: expected a number from 0 to {max}",
            Untrusted(value).capped(32)
        )),
    }
}

impl Query {
    /// Parses query pairs; an unknown key or a bad value is an error naming what is valid.
    pub fn parse(pairs: &[(String, String)]) -> Result<Query, String> {
        let mut query = Query::default();
        let filters = &mut query.filters;
        for (key, value) in pairs {
            match key.as_str() {
                "cluster" => filters.clusters.push(value.clone()),
                "hostname" => filters.hostnames.push(value.clone()),
                "host" => filters.hosts.push(
                    HostList::parse(value)
                        .map_err(|e| format!("host={}: {e}", Untrusted(value).capped(64)))?,
                ),
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
                "version" => {
                    if value.is_empty()
                        || value.len() > 64
                        || !value.bytes().all(|b| b.is_ascii_hexdigit())
                    {
                        return Err(format!(
                            "version={}: expected the first hex digits of a SHA-256",
                            Untrusted(value).capped(64)
                        ));
                    }
                    let prefix: String = value.chars().take(REPORTED_HASH_LEN).collect();
                    filters.versions.push(prefix.to_ascii_lowercase());
                }
                "failing" => filters.failing = flag(key, value)?,
                "duplicate" => filters.duplicate = flag(key, value)?,
                "sort" => {
                    query.sort = match value.as_str() {
                        "name" => Sort::Name,
                        "state" => Sort::State,
                        other => {
                            return Err(format!(
                                "sort={}: expected name or state",
                                Untrusted(other).capped(32)
                            ));
                        }
                    }
                }
                "offset" => query.offset = number(key, value, usize::MAX)?,
                "limit" => query.limit = Some(number(key, value, MAX_LIMIT)?),
                other => {
                    return Err(format!(
                        "unknown query parameter \"{}\": expected {}",
                        Untrusted(other).capped(64),
                        QUERY_KEYS.join(", ")
                    ));
                }
            }
        }
        Ok(query)
    }
}

impl Filters {
    /// Whether the filters leave anything out.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
            && self.types.is_empty()
            && self.states.is_empty()
            && self.hostnames.is_empty()
            && self.hosts.is_empty()
            && self.versions.is_empty()
            && !self.failing
            && !self.duplicate
    }

    /// Whether a listed member passes the filters that need nothing but its registration.
    pub fn matches_service(&self, s: &StoredService) -> bool {
        let service = &s.service;
        LISTED_STATES.contains(&service.state)
            && (self.clusters.is_empty() || self.clusters.contains(&service.cluster))
            && (self.types.is_empty() || self.types.contains(&service.service_type))
            && (self.states.is_empty() || self.states.contains(&service.state))
            && (self.hostnames.is_empty() || self.hostnames.contains(&service.hostname))
            && (self.hosts.is_empty() || self.hosts.iter().any(|h| h.matches(&service.hostname)))
    }

    /// Whether the filters look at [`Facts`] at all.
    pub fn needs_facts(&self) -> bool {
        !self.versions.is_empty() || self.failing || self.duplicate
    }

    /// Whether a member that passed [`Filters::matches_service`] passes the rest.
    pub fn matches_facts(&self, facts: &Facts) -> bool {
        (!self.duplicate || facts.duplicate)
            && (!self.failing || facts.failing())
            && (self.versions.is_empty()
                || facts.report.as_ref().is_some_and(|r| {
                    r.plugins.iter().any(|p| {
                        p.sha256.as_deref().is_some_and(|h| {
                            self.versions.iter().any(|v| h.starts_with(v.as_str()))
                        })
                    })
                }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn queries_parse_and_name_what_is_valid() {
        let q = Query::parse(&pairs(&[
            ("cluster", "fritz"),
            ("type", "ccmc"),
            ("state", "stale"),
            ("state", "active"),
            ("hostname", "f0101"),
            ("host", "f[0101-0110]"),
            ("version", "3F0C5B1E9D2A7C4B99"),
            ("failing", "true"),
            ("sort", "state"),
            ("offset", "20"),
            ("limit", "10"),
        ]))
        .unwrap();
        let f = &q.filters;
        assert_eq!(f.types, [ServiceType::MetricCollector]);
        assert_eq!(f.states, [State::Stale, State::Active]);
        assert_eq!(f.versions, ["3f0c5b1e9d2a7c4b"]);
        assert!(f.failing && !f.duplicate && f.hosts[0].matches("f0105"));
        assert_eq!((q.sort, q.offset, q.limit), (Sort::State, 20, Some(10)));
        for (p, why) in [
            (("type", "ccmx"), "ccmc, ccb"),
            (("state", "deregistered"), "pending, active or stale"),
            (("host", "f[1-"), "without its ']'"),
            (("version", "xyz"), "hex digits"),
            (("failing", "maybe"), "true or false"),
            (("sort", "age"), "name or state"),
            (("limit", "100001"), "0 to 100000"),
            (("offset", "-1"), "a number"),
            (("host2", "x"), "cluster, type, state, hostname, host"),
        ] {
            let e = Query::parse(&pairs(&[p])).unwrap_err();
            assert!(e.contains(why), "{p:?}: {e}");
        }
    }

    proptest::proptest! {
        /// Any query pairs are parsed or refused with a short message, never a panic.
        #[test]
        fn arbitrary_queries_never_panic(p in proptest::collection::vec(("\\PC{0,12}", "\\PC{0,300}"), 0..6)) {
            if let Err(e) = Query::parse(&p) {
                proptest::prop_assert!(e.len() < 600, "{}", e);
            }
        }
    }
}
