//! The summary's compact form: what `GET /api/fleet/summary` and the page's
//! `/fleet/summary.json` answer unless asked for `v=1`.
//!
//! The full form ([`Summary`], `v=1`) writes every count and every host list of every group,
//! zero or empty as they may be, under nested keys: 14 kB for 40 clusters. Most of that is
//! zeros, empty strings and repeated keys, so the compact form (`"v": 2`) leaves out what is
//! zero or empty and writes a state that needs attention as an array:
//!
//! ```json
//! {"now": 1764600000, "staleAfterSeconds": 300, "v": 2,
//!  "total": {"active": 477, "pending": 3, "stale": 25},
//!  "groups": [
//!   {"cluster": "c01", "type": "ccmc", "active": 472,
//!    "stale": [25, "c01n[0101-0125]", 1764599100],
//!    "pending": [3, "c01n[0007,0026,0045]"]},
//!   {"type": "ccb", "active": 5}]}
//! ```
//!
//! - `total`: members by state (`active`, `pending`, `stale`) and by flag (`duplicate`,
//!   `failing`; a member so flagged is counted in its state as well); a zero is left out.
//! - `groups`: one per cluster and service type, by cluster then type; `cluster` is left
//!   out for the infra members. `active` is a count; `stale` is `[count, host list, Unix
//!   seconds of the oldest stale member's last sign of life]`; `pending`, `duplicate` and
//!   `failing` are `[count, host list]`. A state without members is left out.
//!
//! Nothing the full form says is lost: [`CompactSummary::expand`] gives it back. The full
//! form stays available as `v=1` for readers written against it.

use serde::{Deserialize, Serialize};

use super::summary::{Counts, Group, Hosts, Summary};

/// The `v` of the compact form's answers.
pub const COMPACT_VERSION: u8 = 2;

/// Which form of the summary a request asks for (its `v` query parameter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Form {
    /// `v=1`: every count and host list, under nested keys ([`Summary`]).
    Full,
    /// `v=2`, the default: zeros and empty lists left out ([`CompactSummary`]).
    #[default]
    Compact,
}

impl Form {
    /// The form a `v` value names; an error naming the valid values otherwise.
    pub fn parse(value: &str) -> Result<Form, String> {
        match value {
            "1" => Ok(Form::Full),
            "2" => Ok(Form::Compact),
            other => Err(format!(
                "v={}: expected 1 (the full form) or 2 (the compact form, the default)",
                crate::untrusted::Untrusted(other).capped(16)
            )),
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Members by state and flag, zeros left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactCounts {
    /// Heartbeating.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active: u64,
    /// Registered, no heartbeat yet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending: u64,
    /// Silent for the stale-after time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stale: u64,
    /// Whose identity another agent claims.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicate: u64,
    /// Reporting a failed plugin.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failing: u64,
}

/// Members of one state or flag: `[count, host list]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed(pub u64, pub String);

/// The stale members: `[count, host list, Unix seconds of the oldest one's last sign of
/// life]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleListed(pub u64, pub String, pub i64);

/// One cluster's members of one service type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactGroup {
    /// The cluster; left out (empty) for infra members.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The service type's code.
    #[serde(rename = "type")]
    pub service_type: String,
    /// How many are active.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active: u64,
    /// The stale ones, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<StaleListed>,
    /// The pending ones, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Listed>,
    /// Those reporting a failed plugin, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<Listed>,
    /// Those flagged as duplicates, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<Listed>,
}

/// The whole summary in its compact form (without the server's clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactSummary {
    /// Which form this is: [`COMPACT_VERSION`]. Required when read, so that an answer in
    /// the full form is never taken for an empty compact one.
    pub v: u8,
    /// The counts over every group.
    pub total: CompactCounts,
    /// The groups, by cluster and type.
    pub groups: Vec<CompactGroup>,
}

fn listed(count: u64, hosts: &str) -> Option<Listed> {
    (count > 0).then(|| Listed(count, hosts.to_owned()))
}

fn unlisted(listed: &Option<Listed>) -> (u64, String) {
    listed
        .as_ref()
        .map_or((0, String::new()), |l| (l.0, l.1.clone()))
}

impl From<&Counts> for CompactCounts {
    fn from(c: &Counts) -> CompactCounts {
        CompactCounts {
            active: c.active,
            pending: c.pending,
            stale: c.stale,
            duplicate: c.duplicate,
            failing: c.failing,
        }
    }
}

impl From<&CompactCounts> for Counts {
    fn from(c: &CompactCounts) -> Counts {
        Counts {
            pending: c.pending,
            active: c.active,
            stale: c.stale,
            duplicate: c.duplicate,
            failing: c.failing,
        }
    }
}

impl From<&Summary> for CompactSummary {
    fn from(summary: &Summary) -> CompactSummary {
        let groups = summary
            .groups
            .iter()
            .map(|g| {
                let c = &g.counts;
                CompactGroup {
                    cluster: g.cluster.clone(),
                    service_type: g.service_type.clone(),
                    active: c.active,
                    // A stale member always has a last sign of life (its registration at
                    // least), so the summary has an oldest one whenever it has stale ones.
                    stale: match (c.stale, g.oldest_stale_since) {
                        (0, _) | (_, None) => None,
                        (n, Some(since)) => Some(StaleListed(n, g.hosts.stale.clone(), since)),
                    },
                    pending: listed(c.pending, &g.hosts.pending),
                    failing: listed(c.failing, &g.hosts.failing),
                    duplicate: listed(c.duplicate, &g.hosts.duplicate),
                }
            })
            .collect();
        CompactSummary {
            v: COMPACT_VERSION,
            total: (&summary.total).into(),
            groups,
        }
    }
}

impl CompactSummary {
    /// The full form, with the zeros and empty lists written out again.
    pub fn expand(&self) -> Summary {
        let groups = self
            .groups
            .iter()
            .map(|g| {
                let (pending, pending_hosts) = unlisted(&g.pending);
                let (failing, failing_hosts) = unlisted(&g.failing);
                let (duplicate, duplicate_hosts) = unlisted(&g.duplicate);
                let (stale, stale_hosts, since) = g
                    .stale
                    .as_ref()
                    .map_or((0, String::new(), None), |s| (s.0, s.1.clone(), Some(s.2)));
                Group {
                    cluster: g.cluster.clone(),
                    service_type: g.service_type.clone(),
                    counts: Counts {
                        pending,
                        active: g.active,
                        stale,
                        duplicate,
                        failing,
                    },
                    hosts: Hosts {
                        pending: pending_hosts,
                        stale: stale_hosts,
                        duplicate: duplicate_hosts,
                        failing: failing_hosts,
                    },
                    oldest_stale_since: since,
                }
            })
            .collect();
        Summary {
            total: (&self.total).into(),
            groups,
        }
    }
}

/// A summary read in either form: what a reader of `GET /api/fleet/summary` takes when it
/// does not know which server answers (a server before the compact form answers the full
/// one and refuses `v`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum EitherForm {
    /// The compact form (it carries `v`).
    Compact(CompactSummary),
    /// The full form.
    Full(Summary),
}

impl EitherForm {
    /// The summary in its full form.
    pub fn into_full(self) -> Summary {
        match self {
            EitherForm::Compact(c) => c.expand(),
            EitherForm::Full(s) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::super::query::{Facts, Filters};
    use super::super::summary;
    use super::*;
    use crate::hostlist::HostList;
    use crate::server::registry::{Service, State, StoredService};
    use crate::wire::{Scope, ServiceType};

    fn group(cluster: &str, counts: Counts, hosts: Hosts, since: Option<i64>) -> Group {
        Group {
            cluster: cluster.into(),
            service_type: "ccmc".into(),
            counts,
            hosts,
            oldest_stale_since: since,
        }
    }

    #[test]
    fn zeros_and_empty_lists_are_left_out_and_come_back() {
        let summary = Summary {
            total: Counts {
                pending: 1,
                active: 7,
                stale: 2,
                duplicate: 1,
                failing: 0,
            },
            groups: vec![
                group(
                    "",
                    Counts {
                        active: 2,
                        ..Counts::default()
                    },
                    Hosts::default(),
                    None,
                ),
                group(
                    "fritz",
                    Counts {
                        pending: 1,
                        active: 5,
                        stale: 2,
                        duplicate: 1,
                        failing: 0,
                    },
                    Hosts {
                        pending: "f0012".into(),
                        stale: "f[0003-0004]".into(),
                        duplicate: "f0007".into(),
                        failing: String::new(),
                    },
                    Some(1003),
                ),
            ],
        };
        let compact = CompactSummary::from(&summary);
        assert_eq!(
            serde_json::to_value(&compact).unwrap(),
            serde_json::json!({
                "v": 2,
                "total": {"active": 7, "pending": 1, "stale": 2, "duplicate": 1},
                "groups": [
                    {"type": "ccmc", "active": 2},
                    {"cluster": "fritz", "type": "ccmc", "active": 5,
                     "stale": [2, "f[0003-0004]", 1003], "pending": [1, "f0012"],
                     "duplicate": [1, "f0007"]}
                ]
            })
        );
        assert_eq!(compact.expand(), summary);
        // Read back as either form, each is itself.
        let text = serde_json::to_string(&compact).unwrap();
        let read: EitherForm = serde_json::from_str(&text).unwrap();
        assert_eq!(read.into_full(), summary);
        let full = serde_json::to_string(&summary).unwrap();
        let read: EitherForm = serde_json::from_str(&full).unwrap();
        assert!(matches!(read, EitherForm::Full(_)));
        assert_eq!(read.into_full(), summary);
    }

    /// The issue's fleet: 40 clusters of 500 collectors (`c01n0001` ...) and 5 infra
    /// backends; per cluster a rack of 25 stale (`c01n[0101-0125]`) and 25 pending scattered
    /// over the rest (every 19th of the others), the rest active: 18,005 active, 1,000 stale,
    /// 1,000 pending.
    fn large_fleet() -> (Vec<StoredService>, BTreeMap<String, Vec<String>>) {
        let mut all = Vec::new();
        let mut pending_of = BTreeMap::new();
        let mut add = |cluster: &str, host: String, ty: ServiceType, state: State| {
            let key = all.len() as i64 + 1;
            all.push(StoredService {
                key,
                instance: key as u128,
                service: Service {
                    scope: Scope::of_cluster(cluster),
                    cluster: cluster.into(),
                    hostname: host,
                    service_type: ty,
                    state,
                    registered_at: 1_000,
                    last_heartbeat: match state {
                        State::Pending => None,
                        State::Stale => Some(5_000 + key % 300),
                        _ => Some(9_000 + key % 30),
                    },
                    config_revision: 0,
                    meta: Arc::default(),
                },
            });
        };
        for c in 1..=40 {
            let cluster = format!("c{c:02}");
            let mut others = 0;
            let mut pending = Vec::new();
            for n in 1..=500 {
                let host = format!("{cluster}n{n:04}");
                let state = if (101..=125).contains(&n) {
                    State::Stale
                } else {
                    others += 1;
                    if others % 19 == 7 {
                        pending.push(host.clone());
                        State::Pending
                    } else {
                        State::Active
                    }
                };
                add(&cluster, host, ServiceType::MetricCollector, state);
            }
            pending_of.insert(cluster, pending);
        }
        for n in 1..=5 {
            add(
                "",
                format!("backend{n}"),
                ServiceType::Backend,
                State::Active,
            );
        }
        (all, pending_of)
    }

    #[test]
    fn the_summary_of_a_large_fleet_is_right_and_under_10_kb() {
        let (all, pending_of) = large_fleet();
        let summary = summary::summary(&all, &Filters::default(), |_| Facts::default());
        assert_eq!(
            (
                summary.total.active,
                summary.total.stale,
                summary.total.pending
            ),
            (18_005, 1_000, 1_000)
        );
        assert_eq!(summary.groups.len(), 41);
        let infra = &summary.groups[0];
        assert_eq!(
            (infra.cluster.as_str(), infra.service_type.as_str()),
            ("", "ccb")
        );
        assert_eq!(infra.counts.active, 5);
        for g in &summary.groups[1..] {
            let pending = &pending_of[&g.cluster];
            assert_eq!(pending.len(), 25);
            assert_eq!(
                (g.counts.active, g.counts.stale, g.counts.pending),
                (450, 25, 25),
                "{}",
                g.cluster
            );
            assert_eq!(g.hosts.stale, format!("{}n[0101-0125]", g.cluster));
            // The pending host list names exactly the pending hosts.
            let listed = HostList::parse(&g.hosts.pending)
                .unwrap()
                .expand(1000)
                .unwrap();
            assert_eq!(&listed, pending, "{}", g.cluster);
            // The oldest stale member of the cluster: the smallest last heartbeat of its rack.
            let oldest = all
                .iter()
                .filter(|s| s.service.cluster == g.cluster && s.service.state == State::Stale)
                .filter_map(|s| s.service.last_heartbeat)
                .min();
            assert_eq!(g.oldest_stale_since, oldest);
        }
        let compact = CompactSummary::from(&summary);
        assert_eq!(compact.expand(), summary);
        let text = serde_json::to_string(&compact).unwrap();
        assert!(text.len() < 10_000, "{} bytes", text.len());
        let full = serde_json::to_string(&summary).unwrap();
        assert!(
            full.len() > text.len() * 4 / 3,
            "{} and {}",
            full.len(),
            text.len()
        );
    }

    #[test]
    fn the_form_is_named_by_v() {
        assert_eq!(Form::parse("1"), Ok(Form::Full));
        assert_eq!(Form::parse("2"), Ok(Form::Compact));
        assert_eq!(Form::default(), Form::Compact);
        let refused = Form::parse("3").unwrap_err();
        assert!(refused.contains("expected 1"), "{refused}");
    }
}
