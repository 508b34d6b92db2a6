//! The registry's data: instance states, registrations and services, as the registry
//! hands them out and as a store keeps them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(doc)]
use super::Registry;
use crate::wire::{Scope, ServiceType};

/// The lifecycle state of a registered instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Registered, no heartbeat yet.
    Pending,
    /// Heartbeats arrive.
    Active,
    /// No heartbeat for `stale-after`; the next heartbeat revives it.
    Stale,
    /// Terminal: the id is dead.
    Deregistered,
}

impl State {
    /// Every state, in lifecycle order.
    pub const ALL: [State; 4] = [
        State::Pending,
        State::Active,
        State::Stale,
        State::Deregistered,
    ];

    /// The database and metrics spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Active => "active",
            State::Stale => "stale",
            State::Deregistered => "deregistered",
        }
    }

    pub(super) fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// A registration request that passed validation.
#[derive(Debug, Clone)]
pub struct Registration {
    /// `cluster` or `infra`.
    pub scope: Scope,
    /// The cluster; empty for infra scope.
    pub cluster: String,
    /// The member's host name.
    pub hostname: String,
    /// The member's service type.
    pub service_type: ServiceType,
    /// Free-form metadata published in rosters.
    pub meta: BTreeMap<String, String>,
}

/// The answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The fresh instance id (32 lowercase hex characters).
    pub instance_id: String,
    /// The last revision this (cluster, hostname, type) acknowledged; 0 if never.
    pub config_revision: i64,
}

/// One registered service, without its instance id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// `cluster` or `infra`.
    pub scope: Scope,
    /// The cluster; empty for infra scope.
    pub cluster: String,
    /// The host name.
    pub hostname: String,
    /// The service type.
    pub service_type: ServiceType,
    /// The lifecycle state.
    pub state: State,
    /// Unix seconds of the last registration.
    pub registered_at: i64,
    /// Unix seconds of the last applied heartbeat.
    pub last_heartbeat: Option<i64>,
    /// The last acknowledged config revision.
    pub config_revision: i64,
    /// Metadata from the registration.
    pub meta: Arc<BTreeMap<String, String>>,
}

/// Instances per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Instances in `pending`.
    pub pending: u64,
    /// Instances in `active`.
    pub active: u64,
    /// Instances in `stale`.
    pub stale: u64,
    /// Instances in `deregistered`.
    pub deregistered: u64,
}

impl StateCounts {
    /// The count of one state.
    pub fn get(&self, state: State) -> u64 {
        match state {
            State::Pending => self.pending,
            State::Active => self.active,
            State::Stale => self.stale,
            State::Deregistered => self.deregistered,
        }
    }
}

/// The result of applying a batch of heartbeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Per input heartbeat: whether it belonged to a live instance.
    pub applied: Vec<bool>,
    /// How many instances became `active` from `pending` or `stale`.
    pub activated: usize,
    /// Positions of heartbeats (not applied) whose instance this server does not know and
    /// could not look up: it has not caught up with a store shared with other servers (see
    /// [`Registry::set_catch_up`]). They are neither applied nor unknown; their sender should
    /// try again.
    pub undecided: Vec<usize>,
}

/// Current wall-clock time in Unix seconds, the registry's time unit.
pub fn unix_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A service as a store keeps it: its store key, instance id and data.
#[derive(Debug, Clone)]
pub struct StoredService {
    /// The store's key of the service (SQLite: the row id); stable across re-registration.
    pub key: i64,
    /// The current instance id.
    pub instance: u128,
    /// The service.
    pub service: Service,
}

/// What a store answers to a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upserted {
    /// The key of the (new or re-registered) service.
    pub key: i64,
    /// The last heartbeat, kept across re-registration.
    pub last_heartbeat: Option<i64>,
    /// The last acknowledged config revision, kept across re-registration.
    pub config_revision: i64,
}
