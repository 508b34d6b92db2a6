//! The in-memory index every read is served from: services by store key and by instance id,
//! and which last-seen times are not yet written to the store.
//!
//! A fleet server holds every registered instance here, so its layout decides the memory a
//! large fleet costs. Services live in one dense vector of slots (80 bytes each); cluster
//! names are interned (a cluster has hundreds or thousands of members), and a service's
//! host name and meta data share one allocation of their bytes (a `BTreeMap` of one entry
//! alone would take over 500 bytes), decoded when a [`Service`] is built.
//! Instance ids map to slots in a hash table of 24-byte entries; store keys map to slots
//! through a plain vector while they are small dense integers (SQLite row ids), else through
//! a hash table. The public [`Service`] is built on demand from a slot.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::{Service, State, StateCounts};
use crate::wire::{Scope, ServiceType};

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

/// `last_heartbeat` of a slot that never had one (`None` in [`Service`]).
const NEVER: i64 = i64::MIN;
/// No slot, in the dense key map.
const NO_SLOT: u32 = u32::MAX;
/// How far past the end of the dense key map a key may be and still extend it; keys
/// beyond go to the sparse map, so a store with large or scattered keys costs no memory
/// for the gaps.
const DENSE_SLACK: usize = 1 << 16;

/// One service. `instance` is the id split into two words, so the slot (and the id map's
/// entries) need 8-byte alignment only.
struct Slot {
    instance: [u64; 2],
    key: i64,
    /// The host name's bytes, then each meta entry as its key and value, each preceded by
    /// its length (4 bytes, little-endian).
    text: Box<[u8]>,
    registered_at: i64,
    last_heartbeat: i64,
    config_revision: i64,
    cluster: u32,
    /// The length of the host name at the start of `text`.
    hostname_len: u32,
    scope: Scope,
    service_type: ServiceType,
    state: State,
    /// The last-seen time is newer than the store's: it waits for the write-behind flush.
    dirty: bool,
}

/// `text` of a slot: the host name and the meta data.
fn encode_text(hostname: &str, meta: &BTreeMap<String, String>) -> Box<[u8]> {
    let len = meta
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len())
        .sum::<usize>();
    let mut text = Vec::with_capacity(hostname.len() + len);
    text.extend_from_slice(hostname.as_bytes());
    for (key, value) in meta {
        for part in [key, value] {
            let len = u32::try_from(part.len()).expect("a meta string shorter than 4 GiB");
            text.extend_from_slice(&len.to_le_bytes());
            text.extend_from_slice(part.as_bytes());
        }
    }
    text.into_boxed_slice()
}

/// The meta entries encoded after the host name (as [`encode_text`] wrote them).
fn decode_meta(mut rest: &[u8]) -> BTreeMap<String, String> {
    let mut take = || {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let part = tail.get(..len)?;
        rest = &tail[len..];
        Some(String::from_utf8_lossy(part).into_owned())
    };
    let mut meta = BTreeMap::new();
    while let (Some(key), Some(value)) = (take(), take()) {
        meta.insert(key, value);
    }
    meta
}

fn split(instance: u128) -> [u64; 2] {
    [(instance >> 64) as u64, instance as u64]
}

/// Hashes an instance id by mixing its words. Ids are 128 random bits the server drew
/// itself, so they need no keyed hash against crafted collisions; an id sent by a client
/// that is not in the table only costs a lookup of its bucket.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(29) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap = HashMap<[u64; 2], u32, BuildHasherDefault<IdHasher>>;

/// Store keys to slots: a vector while keys are small and dense, a hash table for others.
#[derive(Default)]
struct KeyMap {
    dense: Vec<u32>,
    sparse: HashMap<i64, u32>,
}

impl KeyMap {
    fn get(&self, key: i64) -> Option<u32> {
        if let Ok(i) = usize::try_from(key)
            && let Some(&slot) = self.dense.get(i)
            && slot != NO_SLOT
        {
            return Some(slot);
        }
        if self.sparse.is_empty() {
            None
        } else {
            self.sparse.get(&key).copied()
        }
    }

    fn insert(&mut self, key: i64, slot: u32) {
        match usize::try_from(key) {
            Ok(i) if i < self.dense.len() + DENSE_SLACK => {
                if i >= self.dense.len() {
                    self.dense.resize(i + 1, NO_SLOT);
                }
                self.dense[i] = slot;
                if !self.sparse.is_empty() {
                    self.sparse.remove(&key);
                }
            }
            _ => {
                self.sparse.insert(key, slot);
            }
        }
    }
}

/// Services by store key and by instance id.
pub(super) struct Index {
    slots: Vec<Slot>,
    by_instance: IdMap,
    by_key: KeyMap,
    clusters: Vec<Box<str>>,
    cluster_ids: HashMap<Box<str>, u32>,
    /// Slots marked `dirty`, possibly with repeats and slots no longer dirty.
    dirty: Vec<u32>,
    dirty_count: usize,
    empty_meta: Arc<BTreeMap<String, String>>,
}

impl Default for Index {
    fn default() -> Index {
        Index {
            slots: Vec::new(),
            by_instance: IdMap::default(),
            by_key: KeyMap::default(),
            clusters: Vec::new(),
            cluster_ids: HashMap::new(),
            dirty: Vec::new(),
            dirty_count: 0,
            empty_meta: Arc::new(BTreeMap::new()),
        }
    }
}

impl Index {
    /// An index of what a store loaded.
    #[cfg(test)]
    pub(super) fn from_stored(stored: Vec<super::StoredService>) -> Index {
        let mut index = Index::default();
        index.slots.reserve_exact(stored.len());
        index.by_instance.reserve(stored.len());
        for s in stored {
            index.insert(s.key, s.instance, s.service);
        }
        index
    }

    /// Gives back the spare capacity left by growing while services were loaded.
    pub(super) fn loaded(&mut self) {
        self.slots.shrink_to_fit();
        self.by_key.dense.shrink_to_fit();
    }

    fn intern(&mut self, cluster: &str) -> u32 {
        if let Some(&id) = self.cluster_ids.get(cluster) {
            return id;
        }
        let id = u32::try_from(self.clusters.len()).expect("fewer than 2^32 clusters");
        self.clusters.push(cluster.into());
        self.cluster_ids.insert(cluster.into(), id);
        id
    }

    fn slot_of(&self, instance: u128) -> Option<u32> {
        self.by_instance.get(&split(instance)).copied()
    }

    fn slot_mut(&mut self, key: i64) -> Option<&mut Slot> {
        let slot = self.by_key.get(key)?;
        self.slots.get_mut(slot as usize)
    }

    fn service(&self, slot: &Slot) -> Service {
        let (hostname, meta) = slot.text.split_at(slot.hostname_len as usize);
        Service {
            scope: slot.scope,
            cluster: self.clusters[slot.cluster as usize].to_string(),
            hostname: String::from_utf8_lossy(hostname).into_owned(),
            service_type: slot.service_type,
            state: slot.state,
            registered_at: slot.registered_at,
            last_heartbeat: (slot.last_heartbeat != NEVER).then_some(slot.last_heartbeat),
            config_revision: slot.config_revision,
            meta: if meta.is_empty() {
                self.empty_meta.clone()
            } else {
                Arc::new(decode_meta(meta))
            },
        }
    }

    /// Puts a service under `key`; the instance id it had before stops resolving. A
    /// last-seen time waiting to be written stays marked.
    pub(super) fn insert(&mut self, key: i64, instance: u128, service: Service) {
        let cluster = self.intern(&service.cluster);
        let fresh = Slot {
            instance: split(instance),
            key,
            text: encode_text(&service.hostname, &service.meta),
            hostname_len: u32::try_from(service.hostname.len())
                .expect("a host name shorter than 4 GiB"),
            registered_at: service.registered_at,
            last_heartbeat: service.last_heartbeat.unwrap_or(NEVER),
            config_revision: service.config_revision,
            cluster,
            scope: service.scope,
            service_type: service.service_type,
            state: service.state,
            dirty: false,
        };
        let slot = match self.by_key.get(key) {
            Some(slot) => {
                let old = &mut self.slots[slot as usize];
                let dirty = old.dirty;
                let replaced = std::mem::replace(old, fresh);
                self.slots[slot as usize].dirty = dirty;
                if replaced.instance != split(instance) {
                    self.by_instance.remove(&replaced.instance);
                }
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 services");
                self.slots.push(fresh);
                self.by_key.insert(key, slot);
                slot
            }
        };
        self.by_instance.insert(split(instance), slot);
    }

    /// Whether an instance id is in use (live or deregistered).
    pub(super) fn knows(&self, instance: u128) -> bool {
        self.by_instance.contains_key(&split(instance))
    }

    /// The key and state of an instance id.
    pub(super) fn state_of(&self, instance: u128) -> Option<(i64, State)> {
        let slot = &self.slots[self.slot_of(instance)? as usize];
        Some((slot.key, slot.state))
    }

    /// The key and service of an instance id.
    pub(super) fn get(&self, instance: u128) -> Option<(i64, Service)> {
        let slot = &self.slots[self.slot_of(instance)? as usize];
        Some((slot.key, self.service(slot)))
    }

    /// The last heartbeat under a key, as the index knows it.
    pub(super) fn last_heartbeat(&self, key: i64) -> Option<i64> {
        let slot = &self.slots[self.by_key.get(key)? as usize];
        (slot.last_heartbeat != NEVER).then_some(slot.last_heartbeat)
    }

    /// Sets the state under a key after its write committed; returns the previous one.
    pub(super) fn set_state(&mut self, key: i64, state: State) -> Option<State> {
        self.slot_mut(key)
            .map(|slot| std::mem::replace(&mut slot.state, state))
    }

    /// Records an acknowledged config revision after its write committed.
    pub(super) fn set_config_revision(&mut self, key: i64, revision: i64) {
        if let Some(slot) = self.slot_mut(key) {
            slot.config_revision = revision;
        }
    }

    /// A durable write made `key` `active` with its last heartbeat at `at` (or later);
    /// returns whether it was not `active` before.
    pub(super) fn activated(&mut self, key: i64, at: i64) -> bool {
        let Some(slot) = self.slot_mut(key) else {
            return false;
        };
        let was = std::mem::replace(&mut slot.state, State::Active);
        slot.last_heartbeat = slot.last_heartbeat.max(at);
        was != State::Active
    }

    /// Applies a heartbeat at `at` to an `active` service in memory only (its time is
    /// written behind); says what else it needs.
    pub(super) fn beat(&mut self, instance: u128, at: i64) -> Beat {
        let Some(index) = self.slot_of(instance) else {
            return Beat::Unknown;
        };
        let slot = &mut self.slots[index as usize];
        match slot.state {
            State::Deregistered => Beat::Deregistered,
            State::Active => {
                if slot.last_heartbeat < at {
                    slot.last_heartbeat = at;
                    if !slot.dirty {
                        slot.dirty = true;
                        self.dirty_count += 1;
                        self.dirty.push(index);
                    }
                }
                Beat::Seen
            }
            State::Pending | State::Stale => Beat::Revives(slot.key),
        }
    }

    /// A durable write set `key`'s last heartbeat to `at`: an older pending one is obsolete.
    pub(super) fn written(&mut self, key: i64, at: i64) {
        let Some(slot) = self.by_key.get(key) else {
            return;
        };
        let slot = &mut self.slots[slot as usize];
        if slot.dirty && slot.last_heartbeat <= at {
            slot.dirty = false;
            self.dirty_count -= 1;
        }
    }

    /// Takes the last-seen times to write, sorted by time, then key.
    pub(super) fn take_dirty(&mut self) -> Vec<(i64, i64)> {
        let mut writes = Vec::with_capacity(self.dirty_count);
        for index in std::mem::take(&mut self.dirty) {
            let slot = &mut self.slots[index as usize];
            if std::mem::take(&mut slot.dirty) {
                writes.push((slot.key, slot.last_heartbeat));
            }
        }
        self.dirty_count = 0;
        writes.sort_unstable_by_key(|&(key, at)| (at, key));
        writes
    }

    /// Marks last-seen times whose write failed for the next flush (which writes the
    /// newest time in memory, never an older one).
    pub(super) fn restore_dirty(&mut self, writes: &[(i64, i64)]) {
        for &(key, _) in writes {
            let Some(index) = self.by_key.get(key) else {
                continue;
            };
            let slot = &mut self.slots[index as usize];
            if !slot.dirty {
                slot.dirty = true;
                self.dirty_count += 1;
                self.dirty.push(index);
            }
        }
    }

    /// How many last-seen times wait to be written.
    pub(super) fn dirty_len(&self) -> usize {
        self.dirty_count
    }

    /// Keys of `active` services whose last heartbeat is older than `cutoff`, in key order.
    pub(super) fn stale_candidates(&self, cutoff: i64) -> Vec<i64> {
        let mut keys: Vec<i64> = self
            .slots
            .iter()
            .filter(|s| {
                s.state == State::Active && s.last_heartbeat != NEVER && s.last_heartbeat < cutoff
            })
            .map(|s| s.key)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Every service with the given state.
    pub(super) fn with_state(&self, state: State) -> impl Iterator<Item = Service> + '_ {
        self.slots
            .iter()
            .filter(move |s| s.state == state)
            .map(|s| self.service(s))
    }

    /// Services per state.
    pub(super) fn counts(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for slot in &self.slots {
            match slot.state {
                State::Pending => counts.pending += 1,
                State::Active => counts.active += 1,
                State::Stale => counts.stale += 1,
                State::Deregistered => counts.deregistered += 1,
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(host: &str, cluster: &str, meta: &[(&str, &str)]) -> Service {
        Service {
            scope: Scope::Cluster,
            cluster: cluster.into(),
            hostname: host.into(),
            service_type: ServiceType::MetricCollector,
            state: State::Pending,
            registered_at: 7,
            last_heartbeat: None,
            config_revision: 3,
            meta: Arc::new(
                meta.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        }
    }

    #[test]
    fn a_slot_stays_small() {
        assert!(
            std::mem::size_of::<Slot>() <= 80,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }

    #[test]
    fn services_come_back_as_they_went_in_under_dense_and_sparse_keys() {
        let mut index = Index::default();
        let keys = [1, 2, i64::MAX, -5, 1 << 40];
        for (i, &key) in keys.iter().enumerate() {
            let meta: &[(&str, &str)] = if i % 2 == 0 {
                &[("rack", "r1"), ("", ""), ("é", "\0x")]
            } else {
                &[]
            };
            index.insert(key, 100 + i as u128, service(&format!("h{i}"), "c", meta));
        }
        for (i, &key) in keys.iter().enumerate() {
            let (got_key, got) = index.get(100 + i as u128).unwrap();
            assert_eq!(got_key, key);
            let meta: &[(&str, &str)] = if i % 2 == 0 {
                &[("rack", "r1"), ("", ""), ("é", "\0x")]
            } else {
                &[]
            };
            assert_eq!(got, service(&format!("h{i}"), "c", meta));
        }
        assert!(index.get(99).is_none());
        assert_eq!(index.clusters.len(), 1);
    }

    #[test]
    fn re_registration_under_the_same_key_retires_the_old_id_and_keeps_its_unwritten_time() {
        let mut index = Index::default();
        index.insert(1, 10, service("h", "c", &[]));
        assert!(index.activated(1, 100));
        assert_eq!(index.beat(10, 110), Beat::Seen);
        assert_eq!(index.dirty_len(), 1);
        let mut again = service("h", "c", &[]);
        again.last_heartbeat = Some(110);
        index.insert(1, 11, again);
        assert!(!index.knows(10));
        assert_eq!(index.get(11).unwrap().0, 1);
        assert_eq!(index.take_dirty(), vec![(1, 110)]);
        assert_eq!(index.counts().pending, 1);
    }

    #[test]
    fn dirty_times_are_taken_once_each_and_restored_after_a_failure() {
        let mut index = Index::default();
        for key in 1..=3 {
            index.insert(key, key as u128, service(&format!("h{key}"), "c", &[]));
            index.activated(key, 100);
        }
        assert_eq!(index.beat(1, 120), Beat::Seen);
        assert_eq!(index.beat(2, 110), Beat::Seen);
        assert_eq!(index.beat(1, 130), Beat::Seen);
        index.written(2, 110);
        assert_eq!(index.beat(2, 115), Beat::Seen);
        let taken = index.take_dirty();
        assert_eq!(taken, vec![(2, 115), (1, 130)]);
        assert_eq!(index.dirty_len(), 0);
        index.restore_dirty(&taken);
        assert_eq!(index.beat(1, 140), Beat::Seen);
        assert_eq!(index.dirty_len(), 2);
        assert_eq!(index.take_dirty(), vec![(2, 115), (1, 140)]);
    }
}
