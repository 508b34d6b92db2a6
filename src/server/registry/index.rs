//! The in-memory index every read is served from: services by store key and by instance id,
//! and the last-seen times not yet written to the store.

use std::collections::HashMap;

use super::{Service, State, StateCounts, StoredService};

/// What a heartbeat means for an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// No such instance id.
    Unknown,
    /// The instance is deregistered: the heartbeat is refused.
    Deregistered,
    /// The instance is `active`; its last-seen time is updated in memory.
    Seen,
    /// The instance (under this key) becomes `active`: a durable write.
    Revives(i64),
}

/// Services by store key, and store keys by instance id.
#[derive(Default)]
pub(super) struct Index {
    by_instance: HashMap<u128, i64>,
    rows: HashMap<i64, (u128, Service)>,
    /// Last heartbeat per key of `active` services, newer than the store's; written behind.
    dirty: HashMap<i64, i64>,
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

    /// Applies a heartbeat at `at` to an `active` service in memory only (its time is
    /// written behind); says what else it needs.
    pub(super) fn beat(&mut self, instance: u128, at: i64) -> Beat {
        let Some(&key) = self.by_instance.get(&instance) else {
            return Beat::Unknown;
        };
        let Some((_, service)) = self.rows.get_mut(&key) else {
            return Beat::Unknown;
        };
        match service.state {
            State::Deregistered => Beat::Deregistered,
            State::Active => {
                if service.last_heartbeat.is_none_or(|last| last < at) {
                    service.last_heartbeat = Some(at);
                    self.dirty.insert(key, at);
                }
                Beat::Seen
            }
            State::Pending | State::Stale => Beat::Revives(key),
        }
    }

    /// A durable write set `key`'s last heartbeat to `at`: an older pending one is obsolete.
    pub(super) fn written(&mut self, key: i64, at: i64) {
        if self.dirty.get(&key).is_some_and(|&pending| pending <= at) {
            self.dirty.remove(&key);
        }
    }

    /// Takes the last-seen times to write, sorted by time, then key.
    pub(super) fn take_dirty(&mut self) -> Vec<(i64, i64)> {
        let mut writes: Vec<(i64, i64)> = self.dirty.drain().collect();
        writes.sort_unstable_by_key(|&(key, at)| (at, key));
        writes
    }

    /// Puts back last-seen times whose write failed, unless a newer one arrived meanwhile.
    pub(super) fn restore_dirty(&mut self, writes: &[(i64, i64)]) {
        for &(key, at) in writes {
            let pending = self.dirty.entry(key).or_insert(at);
            *pending = (*pending).max(at);
        }
    }

    /// How many last-seen times wait to be written.
    pub(super) fn dirty_len(&self) -> usize {
        self.dirty.len()
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

    /// Takes over a service another writer stored; a last-seen time in memory that is newer
    /// than the stored one stays.
    pub(super) fn take_over(&mut self, stored: StoredService) {
        let mut service = stored.service;
        if let Some((_, known)) = self.rows.get(&stored.key) {
            service.last_heartbeat = service.last_heartbeat.max(known.last_heartbeat);
        }
        self.insert(stored.key, stored.instance, service);
    }

    /// Forgets a key (its record was deleted from the store).
    pub(super) fn remove(&mut self, key: i64) {
        if let Some((instance, _)) = self.rows.remove(&key) {
            self.by_instance.remove(&instance);
        }
        self.dirty.remove(&key);
    }

    /// A last-seen time another server observed: moves the time forward, never the state,
    /// and is not written behind (that server shares its own).
    pub(super) fn seen(&mut self, key: i64, at: i64) {
        if let Some((_, service)) = self.rows.get_mut(&key)
            && service.state != State::Deregistered
            && service.last_heartbeat.is_none_or(|last| last < at)
        {
            service.last_heartbeat = Some(at);
        }
    }

    /// Every service with its key and instance id.
    pub(super) fn stored(&self) -> Vec<StoredService> {
        self.rows
            .iter()
            .map(|(&key, (instance, service))| StoredService {
                key,
                instance: *instance,
                service: service.clone(),
            })
            .collect()
    }
}
