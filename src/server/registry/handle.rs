//! The registry handle: reads answered from the index, changes written to the store first
//! and mirrored into the index once it acknowledged them.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::group_commit::commit_registrations;
use super::index::{Beat, Index};
use super::shared::{RegistrationQueue, Shared, Waiting};
use super::write_health::{PROBE_INTERVAL, WriteHealth};
use super::*;

/// How often a server writes the last-seen times kept in memory to the store (and once
/// more when it stops). A crash loses at most this much of them, never a state change.
pub const LAST_SEEN_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// The registry; cheap to clone.
#[derive(Clone)]
pub struct Registry {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// Opens (creating if needed) the registry in the SQLite file `path`, or in memory
    /// when `path` is `None`. Blocking: call it before serving or from a blocking task.
    pub fn open(path: Option<&Path>) -> Result<Registry, RegistryError> {
        Registry::new(SqliteStore::open(path)?)
    }

    /// A registry over `store`, with the index loaded from it. Blocking.
    pub fn new(mut store: impl RegistryStore + 'static) -> Result<Registry, RegistryError> {
        let mut index = Index::default();
        store.load_each(&mut |s| index.insert(s.key, s.instance, s.service))?;
        index.loaded();
        let degraded = std::sync::Mutex::new(store.degraded());
        Ok(Registry {
            shared: Arc::new(Shared {
                store: Mutex::new(Box::new(store)),
                index: RwLock::new(index),
                writes: WriteHealth::default(),
                registrations: Mutex::new(RegistrationQueue::default()),
                gathered: std::sync::Condvar::new(),
                catch_up: std::sync::OnceLock::new(),
                degraded,
            }),
        })
    }

    async fn with_store<R, F>(&self, f: F) -> Result<R, RegistryError>
    where
        R: Send + 'static,
        F: FnOnce(&Shared, &mut dyn RegistryStore) -> Result<R, RegistryError> + Send + 'static,
    {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let mut store = shared.store.lock().unwrap_or_else(|e| e.into_inner());
            let result = f(&shared, store.as_mut());
            shared.note_degraded(store.as_ref());
            result
        })
        .await
        .map_err(|_| RegistryError::interrupted())?
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.shared.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a member: upsert on (cluster, hostname, type) with a fresh instance id,
    /// state `pending`; last heartbeat and acknowledged revision survive re-registration.
    ///
    /// Concurrent registrations share one store write (group commit): each waits in a
    /// queue, one committer task drains it into a batch (at most 1 024),
    /// writes the batch and answers every registration in it only after the write is
    /// durable. If the write fails, every registration of the batch gets the error.
    pub async fn register(&self, reg: Registration) -> Result<Registered, RegistryError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let start_committer = {
            let mut queue = self.shared.registrations();
            queue.waiting.push(Waiting { reg, reply });
            if queue.gather_until != 0 && queue.waiting.len() >= queue.gather_until {
                queue.gather_until = 0;
                self.shared.gathered.notify_one();
            }
            !std::mem::replace(&mut queue.committing, true)
        };
        if start_committer {
            let shared = self.shared.clone();
            // Not awaited: the committer answers through the queued reply channels.
            drop(tokio::task::spawn_blocking(move || {
                commit_registrations(&shared)
            }));
        }
        answer.await.map_err(|_| RegistryError::interrupted())?
    }

    /// Applies heartbeats received at `at` (Unix seconds): live instances become `active`
    /// with `last_heartbeat = at`; unknown and deregistered ids are reported as not applied.
    ///
    /// Only state changes (`pending` or `stale` to `active`) are written at once, all in one
    /// store call, and acknowledged after it; the last-seen time of an instance that is
    /// already `active` changes in memory and is written behind by
    /// [`flush_last_seen`](Registry::flush_last_seen). A time never moves backwards.
    ///
    /// With a shared store, ids this server does not know yet get a second try once the
    /// index caught up with the store (see [`Registry::set_catch_up`]); when it could not
    /// catch up, those still unknown are reported as [`BatchOutcome::undecided`], never as
    /// unknown.
    pub async fn heartbeat_batch(
        &self,
        beats: Vec<(u128, i64)>,
    ) -> Result<BatchOutcome, RegistryError> {
        if self.shared.catch_up.get().is_none() {
            return self.heartbeat_batch_once(beats).await;
        }
        let copy = beats.clone();
        let mut outcome = self.heartbeat_batch_once(beats).await?;
        // Everything not applied and not known as deregistered gets a second try: an id
        // the index learned only after the first try is known by now, but was still
        // unknown when that try answered.
        let (retry, unknown): (Vec<usize>, bool) = {
            let index = self.index();
            let retry: Vec<usize> = (0..copy.len())
                .filter(|&i| {
                    !outcome.applied[i]
                        && index
                            .state_of(copy[i].0)
                            .is_none_or(|(_, state)| state != State::Deregistered)
                })
                .collect();
            let unknown = retry.iter().any(|&i| !index.knows(copy[i].0));
            (retry, unknown)
        };
        if retry.is_empty() {
            return Ok(outcome);
        }
        let caught_up = !unknown || self.catch_up().await;
        let again = self
            .heartbeat_batch_once(retry.iter().map(|&i| copy[i]).collect())
            .await?;
        for (&i, applied) in retry.iter().zip(again.applied) {
            outcome.applied[i] = applied;
        }
        outcome.activated += again.activated;
        if !caught_up {
            // Still unknown although another server may have registered it: the index
            // cannot tell, so neither can this answer.
            let index = self.index();
            outcome.undecided = retry
                .into_iter()
                .filter(|&i| !outcome.applied[i] && !index.knows(copy[i].0))
                .collect();
        }
        Ok(outcome)
    }

    async fn heartbeat_batch_once(
        &self,
        beats: Vec<(u128, i64)>,
    ) -> Result<BatchOutcome, RegistryError> {
        let mut applied = Vec::with_capacity(beats.len());
        let mut revivals: Vec<(u128, i64)> = Vec::new();
        {
            let mut index = self.shared.index_mut();
            for &(instance, at) in &beats {
                match index.beat(instance, at) {
                    Beat::Unknown | Beat::Deregistered => applied.push(false),
                    Beat::Seen => applied.push(true),
                    Beat::Revives(_) => {
                        applied.push(true);
                        revivals.push((instance, at));
                    }
                }
            }
        }
        if revivals.is_empty() {
            return Ok(BatchOutcome {
                applied,
                activated: 0,
                undecided: Vec::new(),
            });
        }
        let activated = self
            .with_store(move |shared, store| {
                let mut writes: Vec<(i64, i64)> = Vec::with_capacity(revivals.len());
                {
                    // Again under the store lock: another batch may have revived some.
                    let mut index = shared.index_mut();
                    for (instance, at) in revivals {
                        if let Beat::Revives(key) = index.beat(instance, at) {
                            writes.push((key, at));
                        }
                    }
                }
                // Each key once, with its latest time; then grouped by time and in key
                // order, so one statement updates a run of rows that share a timestamp.
                writes.sort_unstable_by_key(|&(key, at)| (key, std::cmp::Reverse(at)));
                writes.dedup_by_key(|w| w.0);
                writes.sort_unstable_by_key(|&(key, at)| (at, key));
                if writes.is_empty() {
                    return Ok(0);
                }
                shared.writes.record(store.heartbeats(&writes))?;
                let mut index = shared.index_mut();
                let mut activated = 0;
                for (key, at) in writes {
                    index.written(key, at);
                    if index.activated(key, at) {
                        activated += 1;
                    }
                }
                Ok(activated)
            })
            .await?;
        Ok(BatchOutcome {
            applied,
            activated,
            undecided: Vec::new(),
        })
    }

    /// Writes the last-seen times kept in memory since the previous flush in one store
    /// call; returns how many. On failure they stay in memory for the next flush.
    pub async fn flush_last_seen(&self) -> Result<usize, RegistryError> {
        self.with_store(|shared, store| {
            let writes = shared.index_mut().take_dirty();
            if writes.is_empty() {
                return Ok(0);
            }
            match shared.writes.record(store.last_seen(&writes)) {
                Ok(()) => Ok(writes.len()),
                Err(e) => {
                    shared.index_mut().restore_dirty(&writes);
                    Err(e)
                }
            }
        })
        .await
    }

    /// How many last-seen times are in memory only, waiting for
    /// [`flush_last_seen`](Registry::flush_last_seen).
    pub fn unwritten_last_seen(&self) -> usize {
        self.index().dirty_len()
    }

    /// Applies one heartbeat; `Ok(None)` when the id is unknown or deregistered, else
    /// whether the instance just became `active`. An id this server does not know while it
    /// cannot catch up with a shared store is an error of kind
    /// [`Behind`](RegistryErrorKind::Behind), not `None`.
    pub async fn heartbeat(&self, instance_id: &str) -> Result<Option<bool>, RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(None);
        };
        let outcome = self
            .heartbeat_batch(vec![(instance, unix_seconds())])
            .await?;
        if !outcome.undecided.is_empty() {
            return Err(RegistryError::behind());
        }
        Ok(outcome.applied[0].then_some(outcome.activated > 0))
    }

    /// Marks an instance `deregistered`. Returns whether a live instance was terminated;
    /// unknown and already deregistered ids are not an error. An id this server does not
    /// know while it cannot catch up with a shared store is an error of kind
    /// [`Behind`](RegistryErrorKind::Behind): it may be live, and was not deregistered.
    pub async fn deregister(&self, instance_id: &str) -> Result<bool, RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(false);
        };
        let caught_up = self.catch_up_with(instance).await;
        self.with_store(move |shared, store| {
            let key = match shared.index().state_of(instance) {
                Some((key, state)) if state != State::Deregistered => key,
                Some(_) => return Ok(false),
                None if caught_up => return Ok(false),
                None => return Err(RegistryError::behind()),
            };
            shared.writes.record(store.deregister(key))?;
            shared.index_mut().set_state(key, State::Deregistered);
            Ok(true)
        })
        .await
    }

    /// The service behind an instance id, from the index (no store access).
    pub fn lookup(&self, instance_id: &str) -> Option<Service> {
        let instance = parse_instance_id(instance_id)?;
        self.index().get(instance).map(|(_, s)| s)
    }

    /// Records the config revision an instance was served.
    pub async fn acknowledge(&self, instance_id: &str, revision: i64) -> Result<(), RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(());
        };
        self.catch_up_with(instance).await;
        self.with_store(move |shared, store| {
            let Some((key, _)) = shared.index().state_of(instance) else {
                return Ok(());
            };
            shared.writes.record(store.acknowledge(key, revision))?;
            shared.index_mut().set_config_revision(key, revision);
            Ok(())
        })
        .await
    }

    /// Moves `active` instances whose last heartbeat is older than `cutoff` (Unix seconds)
    /// to `stale`; `pending` never goes stale. Returns how many changed.
    pub async fn mark_stale(&self, cutoff: i64) -> Result<usize, RegistryError> {
        self.with_store(move |shared, store| {
            let keys = shared.index().stale_candidates(cutoff);
            if keys.is_empty() {
                return Ok(0);
            }
            shared.writes.record(store.mark_stale(&keys))?;
            let mut index = shared.index_mut();
            for &key in &keys {
                index.set_state(key, State::Stale);
            }
            Ok(keys.len())
        })
        .await
    }

    /// Every `active` service, ordered by cluster, then host name.
    pub fn active(&self) -> Vec<Service> {
        let mut active: Vec<Service> = self.index().with_state(State::Active).collect();
        active.sort_by(|a, b| {
            (&a.cluster, &a.hostname, a.service_type.code()).cmp(&(
                &b.cluster,
                &b.hostname,
                b.service_type.code(),
            ))
        });
        active
    }

    /// Saves a document of the server's own state (a staged rollout's progress) durably,
    /// replacing what was saved under `name`.
    pub async fn put_state(&self, name: &str, value: Vec<u8>) -> Result<(), RegistryError> {
        let name = name.to_owned();
        self.with_store(move |_, store| store.put_state(&name, &value))
            .await
    }

    /// The server state document saved under `name`, if any.
    pub async fn get_state(&self, name: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let name = name.to_owned();
        self.with_store(move |_, store| store.get_state(&name))
            .await
    }

    /// Whether the store takes writes: `Err` with the error of the latest write when it
    /// failed. A write in the last [`PROBE_INTERVAL`] answers; otherwise a tiny write (in
    /// SQLite a timestamp in the `ccfleet_health` table) probes the store first, so one that
    /// went bad while idle is noticed, and one that recovered is too.
    pub async fn writable(&self) -> Result<(), String> {
        if let Some(outcome) = self.shared.writes.fresh(PROBE_INTERVAL) {
            return outcome;
        }
        self.with_store(|shared, store| shared.writes.record(store.probe()))
            .await
            .map_err(|e| e.to_string())
    }

    /// Why the store works with less than it should ([`RegistryStore::degraded`]), as of
    /// its latest call; `None` when it lacks nothing. Does not wait for the store.
    pub fn degraded(&self) -> Option<String> {
        self.shared
            .degraded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Instances per state.
    pub fn counts(&self) -> StateCounts {
        self.index().counts()
    }

    /// Lets requests that name an instance this server does not know wait for `catch_up`
    /// and try once more (for stores shared by several servers). Set once; later calls
    /// are ignored.
    pub fn set_catch_up(&self, catch_up: CatchUp) {
        let _ = self.shared.catch_up.set(catch_up);
    }

    /// Waits for the index to catch up with the store, if a shared store asked for it.
    pub async fn catch_up(&self) -> bool {
        match self.shared.catch_up.get() {
            Some(catch_up) => catch_up().await,
            None => true,
        }
    }

    /// Waits for the index to catch up if it does not know `instance` and the store is
    /// shared; `false` when it does not know it and could not catch up.
    async fn catch_up_with(&self, instance: u128) -> bool {
        if self.shared.catch_up.get().is_some() && !self.index().knows(instance) {
            return self.catch_up().await;
        }
        true
    }

    /// [`lookup`](Registry::lookup) that, for an id this server does not know, first waits
    /// for the index to catch up with a shared store. `Ok(None)` only when the id is
    /// unknown to an index that caught up; an error of kind
    /// [`Behind`](RegistryErrorKind::Behind) when the index does not know it and could not
    /// catch up.
    pub async fn lookup_fresh(&self, instance_id: &str) -> Result<Option<Service>, RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(None);
        };
        let caught_up = self.catch_up_with(instance).await;
        match self.lookup(instance_id) {
            None if !caught_up => Err(RegistryError::behind()),
            found => Ok(found),
        }
    }

    /// Takes over the changes other servers made to a shared store
    /// ([`RegistryStore::remote_changes`]); returns how many services changed. Last-seen
    /// times in memory that are newer than the store's stay.
    pub async fn apply_remote(&self) -> Result<usize, RegistryError> {
        self.with_store(|shared, store| {
            let changes = store.remote_changes();
            let mut index = shared.index_mut();
            let n = changes.len();
            for (key, stored) in changes {
                match stored {
                    Some(s) => index.take_over(s),
                    None => index.remove(key),
                }
            }
            Ok(n)
        })
        .await
    }

    /// Applies last-seen times other servers observed (`(key, at)`): in memory only, never
    /// written, and without changing any state.
    pub fn apply_last_seen(&self, seen: &[(i64, i64)]) {
        let mut index = self.shared.index_mut();
        for &(key, at) in seen {
            index.seen(key, at);
        }
    }

    /// Every service with its store key and instance id, from the index (for tools such
    /// as the migration to another store).
    pub fn stored(&self) -> Vec<StoredService> {
        self.index().stored()
    }
}
