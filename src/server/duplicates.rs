//! Duplicate identities: two services registering as the same member.
//!
//! A member is its (scope, cluster, host name, service type); a registration replaces the
//! member's instance id. Two services configured with the same identity therefore take
//! turns: each registration makes the other's id unknown, the other's next heartbeat or
//! config pull answers 404, it registers again and replaces the first one's id, and so on
//! at every heartbeat, for ever. Each registration looks legitimate on its own.
//!
//! What gives them away is where the registrations come from: they alternate between
//! peers. A registration is an *alternation* when it comes from another peer than the
//! member's previous registration and from a peer among the few before that. "The same
//! peer" means the same IP address when the two registrations in a row came from different
//! addresses (services on different hosts reconnect from new ports), and the same address
//! and port when they came from one address (services on one host, each on its kept-alive
//! connection). A service that restarts over and over on one host comes from a new port
//! each time and never alternates; a member that moved to another host does not either.
//!
//! [`ALTERNATIONS`] alternations in a row, each within [`WINDOW`] of the registration
//! before it, start a *duplicate episode*: one warning naming the member and both peers,
//! counted in `ccfleet_duplicate_episodes_total`. The episode lasts while alternations go
//! on and ends [`WINDOW`] after the last one; the next run of alternations is a new episode
//! with a new warning. [`Duplicates::is_duplicate`] and [`Duplicates::episodes`] answer
//! which members are in an episode now.
//!
//! The peer is the TCP peer's address, or the client address a trusted proxy names (see
//! [`super::allowlist::TrustedProxies::client_ip`], without a port).
//!
//! Memory: one small entry per member registered within the last [`WINDOW`] (keyed by a
//! keyed hash of its identity), and the names only of members whose peers changed.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use crate::untrusted::Untrusted;
use crate::wire::{Scope, ServiceType};

/// Alternations in a row that make a duplicate episode.
pub const ALTERNATIONS: u32 = 3;
/// The longest time between two registrations of a member that still counts as "in a row"
/// (agents re-register at their next heartbeat or config poll, by default within a
/// minute), and how long an episode outlives its last alternation.
pub const WINDOW: Duration = Duration::from_secs(10 * 60);
/// Earlier peers remembered per member whose peers changed: up to this many services
/// sharing one identity are recognised.
const EARLIER_PEERS: usize = 4;
/// How often entries older than [`WINDOW`] are dropped.
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// A member in a duplicate episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateEpisode {
    /// `cluster` or `infra`.
    pub scope: Scope,
    /// The cluster; empty for infra scope.
    pub cluster: String,
    /// The host name.
    pub hostname: String,
    /// The service type.
    pub service_type: ServiceType,
    /// The peers of the two latest registrations: the services taking turns.
    pub peers: [SocketAddr; 2],
    /// Unix seconds when the episode began.
    pub since: i64,
    /// Alternations counted in the episode so far.
    pub alternations: u64,
}

/// The identity of a member, as the tracker keeps it for members whose peers changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    scope: Scope,
    cluster: String,
    hostname: String,
    service_type: ServiceType,
}

impl Member {
    /// `fritz/ccmc/node01` or `infra ccmc/node01`, escaped and capped.
    fn label(&self) -> String {
        match self.scope {
            Scope::Cluster => format!(
                "{}/{}/{}",
                Untrusted(&self.cluster).capped(64),
                self.service_type.code(),
                Untrusted(&self.hostname).capped(128)
            ),
            Scope::Infra => format!(
                "infra {}/{}",
                self.service_type.code(),
                Untrusted(&self.hostname).capped(128)
            ),
        }
    }
}

#[derive(Debug)]
struct Episode {
    since: i64,
    last_alternation: Instant,
    peers: [SocketAddr; 2],
    alternations: u64,
}

/// What is known of a member whose peers changed.
#[derive(Debug)]
struct Track {
    member: Member,
    /// Peers of registrations before the latest one, newest last.
    earlier: VecDeque<SocketAddr>,
    /// Alternations in the current run.
    in_a_row: u32,
    episode: Option<Episode>,
}

impl Track {
    fn episode_now(&self, now: Instant) -> Option<&Episode> {
        self.episode
            .as_ref()
            .filter(|e| now.duration_since(e.last_alternation) <= WINDOW)
    }
}

/// The latest registration of a member.
#[derive(Debug)]
struct Entry {
    peer: SocketAddr,
    at: Instant,
    track: Option<Box<Track>>,
}

#[derive(Debug)]
struct Table {
    members: HashMap<u64, Entry>,
    pruned_at: Instant,
}

/// The tracker of duplicate identities; shared by the registration handlers.
#[derive(Debug)]
pub struct Duplicates {
    keys: RandomState,
    table: Mutex<Table>,
    metrics: Arc<Metrics>,
}

/// Whether the registration from `current`, after one from `previous`, comes from the same
/// service as the earlier one from `earlier` (see the module docs).
fn same_service(current: SocketAddr, previous: SocketAddr, earlier: SocketAddr) -> bool {
    let ip = |a: SocketAddr| a.ip().to_canonical();
    if ip(current) != ip(previous) {
        ip(current) == ip(earlier)
    } else {
        ip(current) == ip(earlier) && current.port() == earlier.port()
    }
}

/// Whether two registrations in a row came from different peers.
fn other_peer(current: SocketAddr, previous: SocketAddr) -> bool {
    current.ip().to_canonical() != previous.ip().to_canonical() || current.port() != previous.port()
}

impl Duplicates {
    /// A tracker counting episodes in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Duplicates {
        Duplicates {
            keys: RandomState::new(),
            table: Mutex::new(Table {
                members: HashMap::new(),
                pruned_at: Instant::now(),
            }),
            metrics,
        }
    }

    fn key(&self, scope: Scope, cluster: &str, hostname: &str, service_type: ServiceType) -> u64 {
        self.keys
            .hash_one((scope.as_str(), cluster, hostname, service_type.code()))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Only plain updates happen under the lock: a poisoned table is consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a registration of the member from `peer`; logs the warning when it starts a
    /// duplicate episode.
    pub fn registered(
        &self,
        scope: Scope,
        cluster: &str,
        hostname: &str,
        service_type: ServiceType,
        peer: SocketAddr,
    ) {
        self.registered_at(scope, cluster, hostname, service_type, peer, Instant::now());
    }

    fn registered_at(
        &self,
        scope: Scope,
        cluster: &str,
        hostname: &str,
        service_type: ServiceType,
        peer: SocketAddr,
        now: Instant,
    ) {
        let key = self.key(scope, cluster, hostname, service_type);
        let mut table = self.table();
        if now.duration_since(table.pruned_at) >= PRUNE_INTERVAL {
            table.pruned_at = now;
            table
                .members
                .retain(|_, e| now.duration_since(e.at) <= WINDOW);
        }
        let entry = match table.members.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Entry {
                    peer,
                    at: now,
                    track: None,
                });
                return;
            }
        };
        let previous = entry.peer;
        let in_a_row = now.duration_since(entry.at) <= WINDOW;
        entry.peer = peer;
        entry.at = now;
        if !in_a_row {
            // Whatever happened before is over: an episode ended a window after its last
            // alternation, and this registration came later still.
            entry.track = None;
            return;
        }
        if !other_peer(peer, previous) {
            return;
        }
        let track = entry.track.get_or_insert_with(|| {
            Box::new(Track {
                member: Member {
                    scope,
                    cluster: cluster.to_owned(),
                    hostname: hostname.to_owned(),
                    service_type,
                },
                earlier: VecDeque::with_capacity(EARLIER_PEERS),
                in_a_row: 0,
                episode: None,
            })
        });
        // A hash collision of two members must not merge them.
        if track.member.scope != scope
            || track.member.service_type != service_type
            || track.member.cluster != cluster
            || track.member.hostname != hostname
        {
            return;
        }
        let alternation = track
            .earlier
            .iter()
            .any(|&earlier| same_service(peer, previous, earlier));
        track.earlier.retain(|&p| p != previous);
        if track.earlier.len() == EARLIER_PEERS {
            track.earlier.pop_front();
        }
        track.earlier.push_back(previous);
        if !alternation {
            track.in_a_row = 0;
            return;
        }
        track.in_a_row = track.in_a_row.saturating_add(1);
        if track.episode_now(now).is_none() {
            track.episode = None;
        }
        let started = match &mut track.episode {
            Some(episode) => {
                episode.last_alternation = now;
                episode.peers = [previous, peer];
                episode.alternations += 1;
                None
            }
            None if track.in_a_row >= ALTERNATIONS => {
                track.episode = Some(Episode {
                    since: super::registry::unix_seconds(),
                    last_alternation: now,
                    peers: [previous, peer],
                    alternations: u64::from(track.in_a_row),
                });
                Some((track.member.label(), track.in_a_row))
            }
            None => None,
        };
        drop(table);
        if let Some((label, times)) = started {
            Metrics::add(&self.metrics.duplicate_episodes, 1);
            tracing::warn!(
                "fleet: duplicate member {label}: registered in turn from {previous} and {peer} \
                 ({times} times in a row, each registration replacing the other's instance); \
                 two services are configured with the same cluster, host name and type"
            );
        }
    }

    /// Whether the member is in a duplicate episode now.
    pub fn is_duplicate(
        &self,
        scope: Scope,
        cluster: &str,
        hostname: &str,
        service_type: ServiceType,
    ) -> bool {
        let key = self.key(scope, cluster, hostname, service_type);
        let now = Instant::now();
        let table = self.table();
        table
            .members
            .get(&key)
            .and_then(|e| e.track.as_ref())
            .is_some_and(|t| {
                t.member.cluster == cluster
                    && t.member.hostname == hostname
                    && t.episode_now(now).is_some()
            })
    }

    /// Every member in a duplicate episode now, ordered by cluster, host name and type.
    pub fn episodes(&self) -> Vec<DuplicateEpisode> {
        let now = Instant::now();
        let mut episodes: Vec<DuplicateEpisode> = self
            .table()
            .members
            .values()
            .filter_map(|e| {
                let track = e.track.as_ref()?;
                let episode = track.episode_now(now)?;
                Some(DuplicateEpisode {
                    scope: track.member.scope,
                    cluster: track.member.cluster.clone(),
                    hostname: track.member.hostname.clone(),
                    service_type: track.member.service_type,
                    peers: episode.peers,
                    since: episode.since,
                    alternations: episode.alternations,
                })
            })
            .collect();
        episodes.sort_by(|a, b| {
            (&a.cluster, &a.hostname, a.service_type.code()).cmp(&(
                &b.cluster,
                &b.hostname,
                b.service_type.code(),
            ))
        });
        episodes
    }

    /// How many members are in a duplicate episode now.
    pub fn active(&self) -> usize {
        let now = Instant::now();
        self.table()
            .members
            .values()
            .filter(|e| {
                e.track
                    .as_ref()
                    .is_some_and(|t| t.episode_now(now).is_some())
            })
            .count()
    }
}

/// The peer a registration is attributed to: the TCP peer, or the client a trusted proxy
/// names (its address without a port).
pub(crate) fn peer_of(client_ip: &str, tcp_peer: SocketAddr) -> SocketAddr {
    match client_ip.parse::<IpAddr>() {
        Ok(ip) if ip.to_canonical() == tcp_peer.ip().to_canonical() => tcp_peer,
        Ok(ip) => SocketAddr::new(ip, 0),
        Err(_) => tcp_peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn tracker() -> (Duplicates, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        (Duplicates::new(metrics.clone()), metrics)
    }

    fn register(d: &Duplicates, host: &str, peer: &str, at: Instant) {
        d.registered_at(
            Scope::Cluster,
            "fritz",
            host,
            ServiceType::MetricCollector,
            addr(peer),
            at,
        );
    }

    fn episodes(m: &Metrics) -> u64 {
        m.duplicate_episodes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn two_hosts_taking_turns_make_one_episode() {
        let (d, m) = tracker();
        let t = Instant::now();
        let s = Duration::from_secs(10);
        // New ports at every registration: the services reconnect each time.
        for (i, peer) in [
            "10.0.0.1:4001",
            "10.0.0.2:5001",
            "10.0.0.1:4002",
            "10.0.0.2:5002",
        ]
        .iter()
        .enumerate()
        {
            register(&d, "n01", peer, t + s * i as u32);
        }
        assert_eq!(episodes(&m), 0, "two alternations are not yet an episode");
        register(&d, "n01", "10.0.0.1:4003", t + s * 4);
        assert_eq!(episodes(&m), 1);
        let now = d.episodes();
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].hostname, "n01");
        assert_eq!(now[0].peers, [addr("10.0.0.2:5002"), addr("10.0.0.1:4003")]);
        // More turns: the same episode, no second warning.
        for i in 5..20u32 {
            let peer = if i % 2 == 0 {
                "10.0.0.1:4100"
            } else {
                "10.0.0.2:5100"
            };
            register(&d, "n01", peer, t + s * i);
        }
        assert_eq!(episodes(&m), 1);
        assert!(d.is_duplicate(Scope::Cluster, "fritz", "n01", ServiceType::MetricCollector));
        assert!(!d.is_duplicate(Scope::Cluster, "fritz", "n02", ServiceType::MetricCollector));
        assert!(!d.is_duplicate(Scope::Cluster, "fritz", "n01", ServiceType::NodeController));
    }

    #[test]
    fn two_services_on_one_host_alternate_by_port() {
        let (d, m) = tracker();
        let t = Instant::now();
        for i in 0..6u32 {
            let peer = if i % 2 == 0 {
                "127.0.0.1:40000"
            } else {
                "127.0.0.1:40001"
            };
            register(&d, "n01", peer, t + Duration::from_secs(u64::from(i)));
        }
        assert_eq!(episodes(&m), 1);
        assert_eq!(d.active(), 1);
    }

    #[test]
    fn a_restarting_service_or_a_moved_host_is_no_duplicate() {
        let (d, m) = tracker();
        let t = Instant::now();
        // One host restarting again and again: a new port every time.
        for i in 0..20u16 {
            register(
                &d,
                "n01",
                &format!("127.0.0.1:{}", 40000 + i),
                t + Duration::from_secs(u64::from(i)),
            );
        }
        // A member that moved to another host and stays there.
        for (i, peer) in ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.2:3", "10.0.0.2:4"]
            .iter()
            .enumerate()
        {
            register(&d, "n02", peer, t + Duration::from_secs(i as u64));
        }
        assert_eq!(episodes(&m), 0);
        assert!(d.episodes().is_empty());
    }

    #[test]
    fn three_services_sharing_one_identity_are_recognised() {
        let (d, m) = tracker();
        let t = Instant::now();
        let peers = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"];
        for i in 0..9usize {
            register(&d, "n01", peers[i % 3], t + Duration::from_secs(i as u64));
        }
        assert_eq!(episodes(&m), 1);
    }

    #[test]
    fn an_episode_ends_a_window_after_its_last_turn_and_a_new_one_warns_again() {
        let (d, m) = tracker();
        let t = Instant::now();
        let turns = |from: Instant| {
            for i in 0..6u32 {
                let peer = if i % 2 == 0 {
                    "10.0.0.1:1"
                } else {
                    "10.0.0.2:1"
                };
                register(&d, "n01", peer, from + Duration::from_secs(u64::from(i)));
            }
        };
        turns(t);
        assert_eq!(episodes(&m), 1);
        let later = t + WINDOW + Duration::from_secs(60);
        turns(later);
        assert_eq!(episodes(&m), 2);
    }

    #[test]
    fn slow_turns_are_not_in_a_row() {
        let (d, m) = tracker();
        let t = Instant::now();
        for i in 0..10u32 {
            let peer = if i % 2 == 0 {
                "10.0.0.1:1"
            } else {
                "10.0.0.2:1"
            };
            register(&d, "n01", peer, t + (WINDOW + Duration::from_secs(1)) * i);
        }
        assert_eq!(episodes(&m), 0);
    }

    #[test]
    fn a_proxied_client_is_its_forwarded_address() {
        let tcp = addr("192.168.1.1:5000");
        assert_eq!(peer_of("192.168.1.1", tcp), tcp);
        assert_eq!(peer_of("10.1.1.1", tcp), addr("10.1.1.1:0"));
        assert_eq!(peer_of("not an address", tcp), tcp);
    }
}
