//! The in-memory index every read is served from: services by store key and by instance id.

use std::collections::HashMap;

use super::{Service, State, StateCounts, StoredService};

/// Services by store key, and store keys by instance id.
#[derive(Default)]
pub(super) struct Index {
    by_instance: HashMap<u128, i64>,
    rows: HashMap<i64, (u128, Service)>,
}

impl Index {
    /// An index of what a store loaded.
    pub(super) fn from_stored(stored: Vec<StoredService>) -> Index {
        let mut index = Index::default();
        for s in stored {
            index.insert(s.key, s.instance, s.service);
        }
        index
    }

    /// Puts a service under `key`; the instance id it had before stops resolving.
    pub(super) fn insert(&mut self, key: i64, instance: u128, service: Service) {
        if let Some((old, _)) = self.rows.insert(key, (instance, service))
            && old != instance
        {
            self.by_instance.remove(&old);
        }
        self.by_instance.insert(instance, key);
    }

    /// Whether an instance id is in use (live or deregistered).
    pub(super) fn knows(&self, instance: u128) -> bool {
        self.by_instance.contains_key(&instance)
    }

    /// The key and service of an instance id.
    pub(super) fn get(&self, instance: u128) -> Option<(i64, &Service)> {
        let key = *self.by_instance.get(&instance)?;
        self.rows.get(&key).map(|(_, service)| (key, service))
    }

    /// The service under a key, for changing it after its write committed.
    pub(super) fn get_mut(&mut self, key: i64) -> Option<&mut Service> {
        self.rows.get_mut(&key).map(|(_, service)| service)
    }

    /// Keys of `active` services whose last heartbeat is older than `cutoff`, in key order.
    pub(super) fn stale_candidates(&self, cutoff: i64) -> Vec<i64> {
        let mut keys: Vec<i64> = self
            .rows
            .iter()
            .filter(|(_, (_, s))| {
                s.state == State::Active && s.last_heartbeat.is_some_and(|at| at < cutoff)
            })
            .map(|(key, _)| *key)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Every service with the given state.
    pub(super) fn with_state(&self, state: State) -> impl Iterator<Item = &Service> {
        self.rows
            .values()
            .map(|(_, service)| service)
            .filter(move |s| s.state == state)
    }

    /// Services per state.
    pub(super) fn counts(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for (_, service) in self.rows.values() {
            match service.state {
                State::Pending => counts.pending += 1,
                State::Active => counts.active += 1,
                State::Stale => counts.stale += 1,
                State::Deregistered => counts.deregistered += 1,
            }
        }
        counts
    }
}
