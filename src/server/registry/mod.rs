//! The service registry: a durable store (a [`RegistryStore`] backend, such as cc-backend's
//! `service` table in [SQLite](SqliteStore)) fronted by an in-memory index.
//!
//! Every state change is written to the store first and mirrored into the index once the
//! store acknowledged it, so reads (config pulls, rosters, metrics) never wait for the store.
//! Store calls run on tokio's blocking pool under one lock, which also serialises the index
//! updates that follow them.
//!
//! Two things are cheaper than one write each:
//! - Registrations are group-committed: concurrent ones queue, one committer task writes
//!   up to 1 024 of them in one store call and answers each only after it.
//! - A heartbeat of an instance that is already `active` changes only the index (its
//!   last-seen time, which staleness is decided from) and marks the time unwritten;
//!   [`Registry::flush_last_seen`] writes all of them in one store call (the server does
//!   every [`LAST_SEEN_FLUSH_INTERVAL`] and when it stops). A crash loses at most those
//!   times, never a state change. A stale sweep racing such a heartbeat may still mark the
//!   instance `stale`; its next heartbeat revives it.
//!
//! A change is acknowledged only after the store made it durable; an error reaches the
//! caller and leaves the index alone. The first failure of a burst is logged; the ones
//! after it are counted until a write succeeds again, which is logged too.

mod index;
pub mod jetstream;
pub mod lock;
mod sqlite;
mod sqlite_last_seen;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use super::error::{RegistryError, RegistryErrorKind};
pub use lock::DatabaseLock;
pub use sqlite::{JOURNAL_SIZE_LIMIT, SqliteStore};

use crate::wire::{Scope, ServiceType};
use index::{Beat, Index};

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

    fn parse(s: &str) -> Option<State> {
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

/// Parses an instance id (exactly 32 lowercase hex characters) into its 128-bit value.
pub fn parse_instance_id(s: &str) -> Option<u128> {
    let bytes = s.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut value: u128 = 0;
    for &b in bytes {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u128::from(digit);
    }
    Some(value)
}

/// Formats a 128-bit instance id as 32 lowercase hex characters.
pub fn format_instance_id(id: u128) -> String {
    format!("{id:032x}")
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

/// A durable backend of the [`Registry`]: it persists changes and reloads them; the
/// registry keeps the index, decides what to write and serialises the calls.
///
/// Every method is blocking and must be durable when it returns `Ok`; on `Err` nothing
/// of the call may remain. Methods that name keys are only called with keys the store
/// returned and the index holds.
pub trait RegistryStore: Send {
    /// Every stored service.
    fn load(&mut self) -> Result<Vec<StoredService>, RegistryError>;

    /// Hands every stored service to `each`, one at a time, and returns how many. The
    /// default collects [`load`](RegistryStore::load); a store with many services can
    /// stream them instead, so that starting a server never holds every row twice (once
    /// as loaded, once in the index) and the memory of the rows is reused row by row.
    fn load_each(&mut self, each: &mut dyn FnMut(StoredService)) -> Result<usize, RegistryError> {
        let stored = self.load()?;
        let count = stored.len();
        stored.into_iter().for_each(each);
        Ok(count)
    }

    /// How long a storm's group of registrations waits for more before it is written, at
    /// most (see [`GROUP_COMMIT_SIBLINGS`]): worth it where every commit rewrites pages and
    /// syncs; none by default, where writes are independent and a wait only adds latency.
    fn group_gather(&self) -> Duration {
        Duration::ZERO
    }

    /// Upserts each `(registration, instance id)` on (cluster, hostname, type) with state
    /// `pending` and `registered_at = now`; the last heartbeat and acknowledged revision
    /// survive. All or nothing: the batch is one durable write (a group commit), answered
    /// in order. A later entry for the same (cluster, hostname, type) wins.
    fn register_batch(
        &mut self,
        batch: &[(Registration, String)],
        now: i64,
    ) -> Result<Vec<Upserted>, RegistryError>;

    /// Sets `last_heartbeat = at` and state `active` for each `(key, at)`, sorted by `at`,
    /// then key, with each key once.
    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError>;

    /// Records the last-seen time `at` for each `(key, at)`, sorted by `at`, then key, with
    /// each key once; the state stays (last-seen times written behind). A later
    /// [`load`](RegistryStore::load) answers the later of it and the time of the latest
    /// state change as `last_heartbeat`.
    fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError>;

    /// Sets the state `deregistered`.
    fn deregister(&mut self, key: i64) -> Result<(), RegistryError>;

    /// Records the config revision a service was served.
    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError>;

    /// Sets the state `stale` on each key.
    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError>;

    /// A small write that shows whether the store takes writes at all.
    fn probe(&mut self) -> Result<(), RegistryError>;

    /// Changes other writers (other servers sharing the store) made since the previous
    /// call, for the index to take over: a key's newest service, or `None` when the key is
    /// gone. Stores with a single writer have none.
    fn remote_changes(&mut self) -> Vec<(i64, Option<StoredService>)> {
        Vec::new()
    }
}

/// Waits until the index holds every change the store had when it was called; `false`
/// when that could not be established in time. Set by backends shared by several servers.
pub type CatchUp =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync + 'static>;

/// How long the outcome of a write speaks for the store in health checks; after that
/// they probe it with a write of their own.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// How often a server writes the last-seen times kept in memory to the store (and once
/// more when it stops). A crash loses at most this much of them, never a state change.
pub const LAST_SEEN_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// Registrations committed together in one store write at most: bounds the write's size
/// (and WAL growth) and the wait of the first registration in the group.
const GROUP_COMMIT_MAX: usize = 1024;

/// A group of at least this many registrations means a storm is under way (a cluster
/// reboot): the committer then waits up to the store's [`RegistryStore::group_gather`]
/// (the SQLite store: [`GROUP_COMMIT_GATHER`]) for more before it writes, as
/// PostgreSQL's `commit_delay` does when `commit_siblings` transactions are active; within
/// a storm only until as many queued as its previous group held (see `gather`). Each
/// commit rewrites the last pages of the table and of every index it touches, so a few
/// large commits write far fewer bytes (and syncs) than many small ones; a lone
/// registration is never delayed.
const GROUP_COMMIT_SIBLINGS: usize = 8;

/// How long a storm's group waits for more registrations before the SQLite store writes it.
pub(super) const GROUP_COMMIT_GATHER: Duration = Duration::from_millis(2);

struct Shared {
    store: Mutex<Box<dyn RegistryStore>>,
    index: RwLock<Index>,
    writes: WriteHealth,
    registrations: Mutex<RegistrationQueue>,
    /// Signalled when the queue reaches a gathering committer's `gather_until`.
    gathered: std::sync::Condvar,
    catch_up: std::sync::OnceLock<CatchUp>,
}

/// A registration waiting for its group commit, and where its answer goes.
struct Waiting {
    reg: Registration,
    reply: tokio::sync::oneshot::Sender<Result<Registered, RegistryError>>,
}

/// Registrations not yet committed; `committing` while a committer task drains them.
#[derive(Default)]
struct RegistrationQueue {
    waiting: Vec<Waiting>,
    committing: bool,
    /// While a committer gathers: how many waiting registrations end its wait (0: none
    /// gathers).
    gather_until: usize,
}

/// A run of failed writes: logged when it starts and when it ends, counted in between.
struct Failure {
    message: String,
    since: Instant,
    failed: u64,
}

/// The outcome of the latest write, for health checks and the once-per-burst error log.
#[derive(Default)]
struct WriteHealth {
    latest: Mutex<LatestWrite>,
}

#[derive(Default)]
struct LatestWrite {
    at: Option<Instant>,
    failure: Option<Failure>,
}

impl WriteHealth {
    fn record<R>(&self, result: Result<R, RegistryError>) -> Result<R, RegistryError> {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.at = Some(Instant::now());
        let failure = &mut latest.failure;
        match (&result, failure.as_mut()) {
            (Ok(_), None) => {}
            (Ok(_), Some(burst)) => {
                tracing::warn!(
                    "fleet registry: writes succeed again after {} failed write(s) in {}",
                    burst.failed,
                    crate::duration::format(Duration::from_secs(burst.since.elapsed().as_secs()))
                );
                *failure = None;
            }
            (Err(e), None) => {
                tracing::error!(
                    "fleet registry: a write failed, nothing of it was acknowledged: {e} \
                     (further failures are counted until a write succeeds)"
                );
                *failure = Some(Failure {
                    message: e.to_string(),
                    since: Instant::now(),
                    failed: 1,
                });
            }
            (Err(e), Some(burst)) => {
                burst.failed += 1;
                burst.message = e.to_string();
            }
        }
        result
    }

    /// The latest outcome, unless it is older than `max_age` (or there is none).
    fn fresh(&self, max_age: Duration) -> Option<Result<(), String>> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.at.filter(|at| at.elapsed() < max_age)?;
        Some(match &latest.failure {
            None => Ok(()),
            Some(burst) => Err(burst.message.clone()),
        })
    }
}

/// The registry; cheap to clone.
#[derive(Clone)]
pub struct Registry {
    shared: Arc<Shared>,
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
        Ok(Registry {
            shared: Arc::new(Shared {
                store: Mutex::new(Box::new(store)),
                index: RwLock::new(index),
                writes: WriteHealth::default(),
                registrations: Mutex::new(RegistrationQueue::default()),
                gathered: std::sync::Condvar::new(),
                catch_up: std::sync::OnceLock::new(),
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
            f(&shared, store.as_mut())
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

/// Drains the registration queue in group commits until it is empty. Runs on the blocking
/// pool; at most one runs at a time (the queue's `committing` flag).
fn commit_registrations(shared: &Shared) {
    /// Clears `committing` if the committer panics, so the next registration starts one.
    struct OnPanic<'a>(&'a Shared);
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.registrations().committing = false;
            }
        }
    }
    let _guard = OnPanic(shared);
    // The size of the previous group of this storm (registrations kept arriving since).
    let mut previous = 0;
    loop {
        // The store lock is taken before the queue is drained: registrations that arrive
        // while another write holds it join this group.
        let mut store = shared.store.lock().unwrap_or_else(|e| e.into_inner());
        let group: Vec<Waiting> = {
            let mut queue = shared.registrations();
            if queue.waiting.is_empty() {
                queue.committing = false;
                return;
            }
            let n = queue.waiting.len().min(GROUP_COMMIT_MAX);
            queue.waiting.drain(..n).collect()
        };
        let group = gather(shared, group, previous, store.group_gather());
        previous = group.len();
        commit_group(shared, store.as_mut(), group);
    }
}

/// Lets a storm's group wait for more: until as many registrations queued as the previous
/// group of the storm held (`previous`; the clients it answered are sending their next
/// ones), at most `delay`, then takes what queued. No wait when that many are there
/// already, so the committer never sleeps while a full group waits; none for a lone
/// registration either (fewer than [`GROUP_COMMIT_SIBLINGS`] queued and no storm under
/// way). `committing` stays set throughout, so the registrations queued meanwhile wait
/// for this committer.
fn gather(
    shared: &Shared,
    mut group: Vec<Waiting>,
    previous: usize,
    delay: Duration,
) -> Vec<Waiting> {
    let siblings = group.len().max(previous);
    if delay.is_zero() || siblings < GROUP_COMMIT_SIBLINGS || group.len() >= GROUP_COMMIT_MAX {
        return group;
    }
    // The first group of a storm waits the whole delay (nothing tells how large it gets).
    let target = if previous == 0 {
        GROUP_COMMIT_MAX
    } else {
        previous.min(GROUP_COMMIT_MAX)
    };
    let deadline = Instant::now() + delay;
    let mut queue = shared.registrations();
    while group.len() + queue.waiting.len() < target {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break;
        };
        queue.gather_until = target - group.len();
        queue = shared
            .gathered
            .wait_timeout(queue, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    queue.gather_until = 0;
    let more = queue.waiting.len().min(GROUP_COMMIT_MAX - group.len());
    group.extend(queue.waiting.drain(..more));
    group
}

/// One group commit: fresh instance ids, one store write, then the index and the answers.
fn commit_group(shared: &Shared, store: &mut dyn RegistryStore, group: Vec<Waiting>) {
    let now = unix_seconds();
    let mut batch = Vec::with_capacity(group.len());
    let mut replies = Vec::with_capacity(group.len());
    {
        let index = shared.index();
        let mut fresh = std::collections::HashSet::with_capacity(group.len());
        for Waiting { reg, reply } in group {
            let instance = loop {
                let candidate = u128::from_be_bytes(rand::random());
                if !index.knows(candidate) && fresh.insert(candidate) {
                    break candidate;
                }
            };
            batch.push((reg, format_instance_id(instance)));
            replies.push((instance, reply));
        }
    }
    let result = store.register_batch(&batch, now).and_then(|upserted| {
        if upserted.len() == batch.len() {
            Ok(upserted)
        } else {
            Err(RegistryError::new(
                RegistryErrorKind::Corrupt,
                "the store answered a different number of registrations than it was given",
            ))
        }
    });
    match shared.writes.record(result) {
        Ok(upserted) => {
            let mut index = shared.index_mut();
            for (((reg, instance_id), (instance, reply)), upserted) in
                batch.into_iter().zip(replies).zip(upserted)
            {
                // A last-seen time not yet written behind is newer than the store's.
                let last_heartbeat = index
                    .last_heartbeat(upserted.key)
                    .max(upserted.last_heartbeat);
                index.insert(
                    upserted.key,
                    instance,
                    Service {
                        scope: reg.scope,
                        cluster: reg.cluster,
                        hostname: reg.hostname,
                        service_type: reg.service_type,
                        state: State::Pending,
                        registered_at: now,
                        last_heartbeat,
                        config_revision: upserted.config_revision,
                        meta: Arc::new(reg.meta),
                    },
                );
                // The caller may have given up waiting; its registration stands anyway.
                let _ = reply.send(Ok(Registered {
                    instance_id,
                    config_revision: upserted.config_revision,
                }));
            }
        }
        Err(e) => {
            let mut replies = replies.into_iter();
            let first = replies.next();
            for (_, reply) in replies {
                let _ = reply.send(Err(e.without_source()));
            }
            if let Some((_, reply)) = first {
                let _ = reply.send(Err(e));
            }
        }
    }
}

impl Shared {
    fn registrations(&self) -> std::sync::MutexGuard<'_, RegistrationQueue> {
        self.registrations.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    use super::*;

    fn reg(host: &str) -> Registration {
        Registration {
            scope: Scope::Cluster,
            cluster: "fritz".to_owned(),
            hostname: host.to_owned(),
            service_type: ServiceType::MetricCollector,
            meta: BTreeMap::new(),
        }
    }

    #[test]
    fn instance_ids() {
        let id = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
        assert_eq!(format_instance_id(parse_instance_id(id).unwrap()), id);
        assert_eq!(format_instance_id(1), "00000000000000000000000000000001");
        assert!(parse_instance_id("3F1C9A2B7D4E6F8A0B1C2D3E4F5A6B7C").is_none());
        assert!(parse_instance_id("+f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c").is_none());
        assert!(parse_instance_id("abc").is_none());
    }

    /// Counts the error and warning events sent to it.
    #[derive(Default)]
    struct LogCount {
        errors: AtomicUsize,
        warnings: AtomicUsize,
    }

    struct Counting(Arc<LogCount>);

    impl tracing::Subscriber for Counting {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            match *event.metadata().level() {
                tracing::Level::ERROR => self.0.errors.fetch_add(1, Relaxed),
                tracing::Level::WARN => self.0.warnings.fetch_add(1, Relaxed),
                _ => 0,
            };
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn a_burst_of_failed_writes_is_logged_once_and_its_end_once() {
        let health = WriteHealth::default();
        let counts = Arc::new(LogCount::default());
        let full = || {
            Err::<(), _>(RegistryError::new(
                RegistryErrorKind::Unavailable,
                "database or disk is full",
            ))
        };
        tracing::subscriber::with_default(Counting(counts.clone()), || {
            for _ in 0..100 {
                assert!(health.record(full()).is_err());
            }
            assert_eq!(
                health.fresh(Duration::from_secs(60)),
                Some(Err("fleet registry: database or disk is full".into()))
            );
            for _ in 0..10 {
                health.record(Ok(())).unwrap();
            }
            assert!(health.record(full()).is_err());
        });
        // One error for each burst, one warning for the end of the first.
        assert_eq!(counts.errors.load(Relaxed), 2);
        assert_eq!(counts.warnings.load(Relaxed), 1);
        assert_eq!(health.fresh(Duration::ZERO), None);
    }

    /// SQLite that refuses writes (`query_only`) while `broken` is set.
    struct Breakable {
        inner: SqliteStore,
        broken: Arc<AtomicBool>,
    }

    impl Breakable {
        fn sync(&mut self) -> &mut SqliteStore {
            let broken = self.broken.load(Relaxed);
            self.inner
                .connection()
                .pragma_update(None, "query_only", broken)
                .unwrap();
            &mut self.inner
        }
    }

    impl RegistryStore for Breakable {
        fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
            self.sync().load()
        }
        fn register_batch(
            &mut self,
            batch: &[(Registration, String)],
            now: i64,
        ) -> Result<Vec<Upserted>, RegistryError> {
            self.sync().register_batch(batch, now)
        }
        fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
            self.sync().last_seen(writes)
        }
        fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
            self.sync().heartbeats(writes)
        }
        fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
            self.sync().deregister(key)
        }
        fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
            self.sync().acknowledge(key, revision)
        }
        fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
            self.sync().mark_stale(keys)
        }
        fn probe(&mut self) -> Result<(), RegistryError> {
            self.sync().probe()
        }
    }

    #[tokio::test]
    async fn an_instance_unknown_while_the_shared_store_cannot_be_caught_up_with_is_undecided() {
        let r = Registry::open(None).unwrap();
        let caught_up = Arc::new(AtomicBool::new(false));
        let flag = caught_up.clone();
        r.set_catch_up(Arc::new(move || {
            let answer = flag.load(Relaxed);
            Box::pin(async move { answer })
        }));
        let known = r.register(reg("f0101")).await.unwrap().instance_id;
        // Registered through another server a moment ago, as far as this one can tell.
        let elsewhere = format_instance_id(42);

        let e = r.heartbeat(&elsewhere).await.unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Behind);
        let e = r.lookup_fresh(&elsewhere).await.unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Behind);
        let e = r.deregister(&elsewhere).await.unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Behind);
        let id = parse_instance_id(&elsewhere).unwrap();
        let known_id = parse_instance_id(&known).unwrap();
        let outcome = r
            .heartbeat_batch(vec![(known_id, 5), (id, 5), (known_id + 1, 5)])
            .await
            .unwrap();
        assert_eq!(outcome.applied, [true, false, false]);
        assert_eq!(outcome.undecided, [1, 2]);

        // What this server knows is answered as before.
        assert_eq!(r.heartbeat(&known).await.unwrap(), Some(false));
        assert!(r.lookup_fresh(&known).await.unwrap().is_some());
        assert!(r.deregister(&known).await.unwrap());
        assert!(!r.deregister(&known).await.unwrap());
        assert_eq!(r.heartbeat(&known).await.unwrap(), None);

        // Once caught up, an id it still does not know is unknown.
        caught_up.store(true, Relaxed);
        assert_eq!(r.heartbeat(&elsewhere).await.unwrap(), None);
        assert_eq!(r.lookup_fresh(&elsewhere).await.unwrap(), None);
        assert!(!r.deregister(&elsewhere).await.unwrap());
        let outcome = r.heartbeat_batch(vec![(id, 5)]).await.unwrap();
        assert_eq!((outcome.applied, outcome.undecided), (vec![false], vec![]));
    }

    #[tokio::test]
    async fn writes_that_fail_are_not_acknowledged_and_leave_the_index_alone() {
        let broken = Arc::new(AtomicBool::new(false));
        let r = Registry::new(Breakable {
            inner: SqliteStore::open(None).unwrap(),
            broken: broken.clone(),
        })
        .unwrap();
        let a = r.register(reg("f0101")).await.unwrap();
        let b = r.register(reg("f0102")).await.unwrap();
        r.heartbeat(&b.instance_id).await.unwrap();
        assert_eq!(r.writable().await, Ok(()));

        broken.store(true, Relaxed);
        let e = r.register(reg("f0103")).await.unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Unavailable);
        assert_eq!(r.counts().pending, 1);
        assert!(r.heartbeat(&a.instance_id).await.is_err());
        assert!(r.deregister(&a.instance_id).await.is_err());
        assert!(r.acknowledge(&a.instance_id, 7).await.is_err());
        assert!(r.mark_stale(unix_seconds() + 10).await.is_err());
        let svc = r.lookup(&a.instance_id).unwrap();
        assert_eq!((svc.state, svc.config_revision), (State::Pending, 0));
        assert_eq!(r.lookup(&b.instance_id).unwrap().state, State::Active);
        let failing = r.writable().await.unwrap_err();
        assert!(failing.contains("readonly"), "{failing}");

        broken.store(false, Relaxed);
        assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
        assert_eq!(r.writable().await, Ok(()));
    }

    /// SQLite that counts its registration writes and holds the first one back a while,
    /// so that registrations arriving meanwhile queue up behind it.
    struct Slow {
        inner: Breakable,
        batches: Arc<AtomicUsize>,
    }

    impl RegistryStore for Slow {
        fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
            self.inner.load()
        }
        fn register_batch(
            &mut self,
            batch: &[(Registration, String)],
            now: i64,
        ) -> Result<Vec<Upserted>, RegistryError> {
            if self.batches.fetch_add(1, Relaxed) == 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            self.inner.register_batch(batch, now)
        }
        fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
            self.inner.heartbeats(writes)
        }
        fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
            self.inner.last_seen(writes)
        }
        fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
            self.inner.deregister(key)
        }
        fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
            self.inner.acknowledge(key, revision)
        }
        fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
            self.inner.mark_stale(keys)
        }
        fn probe(&mut self) -> Result<(), RegistryError> {
            self.inner.probe()
        }
    }

    fn slow(broken: bool) -> (Registry, Arc<AtomicUsize>) {
        let batches = Arc::new(AtomicUsize::new(0));
        let store = Slow {
            inner: Breakable {
                inner: SqliteStore::open(None).unwrap(),
                broken: Arc::new(AtomicBool::new(broken)),
            },
            batches: batches.clone(),
        };
        (Registry::new(store).unwrap(), batches)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_registrations_share_store_writes_and_each_gets_its_own_id() {
        let (r, batches) = slow(false);
        let mut tasks = Vec::new();
        for i in 0..200 {
            let r = r.clone();
            // Host 0 registers twice: both answers are acknowledged, the later id wins.
            let host = format!("f{:04}", if i == 199 { 0 } else { i });
            tasks.push(tokio::spawn(async move { r.register(reg(&host)).await }));
        }
        let mut ids = std::collections::HashSet::new();
        for task in tasks {
            ids.insert(task.await.unwrap().unwrap().instance_id);
        }
        assert_eq!(ids.len(), 200);
        assert_eq!(r.counts().pending, 199);
        let resolving = ids.iter().filter(|id| r.lookup(id).is_some()).count();
        assert_eq!(resolving, 199);
        let writes = batches.load(Relaxed);
        assert!(
            writes < 200 / 4,
            "{writes} store writes for 200 registrations"
        );
    }

    fn waiting(n: usize) -> Vec<Waiting> {
        (0..n)
            .map(|i| Waiting {
                reg: reg(&format!("f{i:04}")),
                reply: tokio::sync::oneshot::channel().0,
            })
            .collect()
    }

    #[test]
    fn a_storm_group_does_not_wait_once_as_many_as_the_previous_group_are_queued() {
        let r = Registry::open(None).unwrap();
        let long = Duration::from_secs(30);
        let started = Instant::now();
        r.shared.registrations().waiting.extend(waiting(30));
        assert_eq!(gather(&r.shared, waiting(20), 50, long).len(), 50);
        // A lone registration outside a storm is never delayed.
        assert_eq!(gather(&r.shared, waiting(1), 0, long).len(), 1);
        assert_eq!(gather(&r.shared, waiting(3), 4, long).len(), 3);
        assert!(started.elapsed() < long);
    }

    #[test]
    fn a_gathering_group_is_written_as_soon_as_the_registration_completing_it_queues() {
        let r = Registry::open(None).unwrap();
        // As while a committer runs: registering starts none.
        r.shared.registrations().committing = true;
        let long = Duration::from_secs(30);
        let started = Instant::now();
        let registering = {
            let r = r.clone();
            std::thread::spawn(move || {
                while r.shared.registrations().gather_until == 0 {
                    std::thread::yield_now();
                }
                // Queues the registration; its answer is not awaited.
                assert!(futures::FutureExt::now_or_never(r.register(reg("late"))).is_none());
            })
        };
        let group = gather(&r.shared, waiting(10), 11, long);
        registering.join().unwrap();
        assert_eq!(group.len(), 11);
        assert_eq!(group[10].reg.hostname, "late");
        assert!(started.elapsed() < long);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_group_commit_answers_every_registration_in_it_with_the_error() {
        let (r, _) = slow(true);
        let mut tasks = Vec::new();
        for i in 0..50 {
            let r = r.clone();
            tasks.push(tokio::spawn(async move {
                r.register(reg(&format!("f{i:04}"))).await
            }));
        }
        for task in tasks {
            let e = task.await.unwrap().unwrap_err();
            assert_eq!(e.kind(), RegistryErrorKind::Unavailable);
        }
        assert_eq!(r.counts(), StateCounts::default());
    }

    #[tokio::test]
    async fn heartbeats_of_active_instances_write_nothing_until_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let r = Registry::open(Some(&path)).unwrap();
        let a = r.register(reg("f0101")).await.unwrap();
        let b = r.register(reg("f0102")).await.unwrap();
        let (ia, ib) = (
            parse_instance_id(&a.instance_id).unwrap(),
            parse_instance_id(&b.instance_id).unwrap(),
        );
        // pending -> active is a state change: durable at once.
        let first = r.heartbeat_batch(vec![(ia, 100), (ib, 100)]).await.unwrap();
        assert_eq!(first.activated, 2);
        let stored = |id: &str| Registry::open(Some(&path)).unwrap().lookup(id).unwrap();
        assert_eq!(stored(&a.instance_id).last_heartbeat, Some(100));
        // Repeats change memory only; an older time does not move it back.
        let again = r
            .heartbeat_batch(vec![(ia, 130), (ib, 120), (ib, 110)])
            .await
            .unwrap();
        assert_eq!((again.applied, again.activated), (vec![true; 3], 0));
        assert_eq!(r.lookup(&b.instance_id).unwrap().last_heartbeat, Some(120));
        assert_eq!(r.unwritten_last_seen(), 2);
        assert_eq!(stored(&a.instance_id).last_heartbeat, Some(100));
        // Stale decisions use the times in memory.
        assert_eq!(r.mark_stale(125).await.unwrap(), 1);
        assert_eq!(r.flush_last_seen().await.unwrap(), 2);
        assert_eq!(r.unwritten_last_seen(), 0);
        let (sa, sb) = (stored(&a.instance_id), stored(&b.instance_id));
        assert_eq!((sa.state, sa.last_heartbeat), (State::Active, Some(130)));
        // Writing a last-seen time behind does not revive a stale instance.
        assert_eq!((sb.state, sb.last_heartbeat), (State::Stale, Some(120)));
        assert_eq!(r.flush_last_seen().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn last_seen_times_whose_write_failed_are_written_by_the_next_flush() {
        let broken = Arc::new(AtomicBool::new(false));
        let r = Registry::new(Breakable {
            inner: SqliteStore::open(None).unwrap(),
            broken: broken.clone(),
        })
        .unwrap();
        let a = r.register(reg("f0101")).await.unwrap();
        let ia = parse_instance_id(&a.instance_id).unwrap();
        r.heartbeat_batch(vec![(ia, 100)]).await.unwrap();
        r.heartbeat_batch(vec![(ia, 110)]).await.unwrap();
        broken.store(true, Relaxed);
        assert!(r.flush_last_seen().await.is_err());
        r.heartbeat_batch(vec![(ia, 105)]).await.unwrap();
        assert_eq!(r.unwritten_last_seen(), 1);
        broken.store(false, Relaxed);
        assert_eq!(r.flush_last_seen().await.unwrap(), 1);
        let reloaded = Index::from_stored(r.shared.store.lock().unwrap().load().unwrap());
        assert_eq!(reloaded.get(ia).unwrap().1.last_heartbeat, Some(110));
    }
}
