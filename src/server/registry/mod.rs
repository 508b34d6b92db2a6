//! The service registry: a durable store (a [`RegistryStore`] backend, such as cc-backend's
//! `service` table in [SQLite](SqliteStore)) fronted by an in-memory index.
//!
//! Every change is written to the store first and mirrored into the index once the store
//! acknowledged it, so reads (config pulls, rosters, metrics) never wait for the store and
//! heartbeats that would not change a row cost no write. Store calls run on tokio's
//! blocking pool under one lock, which also serialises index updates.
//!
//! A change is acknowledged only after the store made it durable; an error reaches the
//! caller and leaves the index alone. The first failure of a burst is logged; the ones
//! after it are counted until a write succeeds again, which is logged too.

mod index;
mod sqlite;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use super::error::{RegistryError, RegistryErrorKind};
pub use sqlite::{JOURNAL_SIZE_LIMIT, SqliteStore};

use crate::wire::{Scope, ServiceType};
use index::Index;

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

    /// Upserts on (cluster, hostname, type) with `instance_id`, state `pending` and
    /// `registered_at = now`; the last heartbeat and acknowledged revision survive.
    fn register(
        &mut self,
        reg: &Registration,
        instance_id: &str,
        now: i64,
    ) -> Result<Upserted, RegistryError>;

    /// Sets `last_heartbeat = at` and state `active` for each `(key, at)`, sorted by `at`,
    /// then key, without repeats.
    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError>;

    /// Sets the state `deregistered`.
    fn deregister(&mut self, key: i64) -> Result<(), RegistryError>;

    /// Records the config revision a service was served.
    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError>;

    /// Sets the state `stale` on each key.
    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError>;

    /// A small write that shows whether the store takes writes at all.
    fn probe(&mut self) -> Result<(), RegistryError>;
}

/// How long the outcome of a write speaks for the store in health checks; after that
/// they probe it with a write of their own.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

struct Shared {
    store: Mutex<Box<dyn RegistryStore>>,
    index: RwLock<Index>,
    writes: WriteHealth,
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
        let index = Index::from_stored(store.load()?);
        Ok(Registry {
            shared: Arc::new(Shared {
                store: Mutex::new(Box::new(store)),
                index: RwLock::new(index),
                writes: WriteHealth::default(),
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
    pub async fn register(&self, reg: Registration) -> Result<Registered, RegistryError> {
        self.with_store(move |shared, store| {
            let now = unix_seconds();
            let instance = loop {
                let candidate = u128::from_be_bytes(rand::random());
                if !shared.index().knows(candidate) {
                    break candidate;
                }
            };
            let instance_id = format_instance_id(instance);
            let upserted = shared
                .writes
                .record(store.register(&reg, &instance_id, now))?;
            shared.index_mut().insert(
                upserted.key,
                instance,
                Service {
                    scope: reg.scope,
                    cluster: reg.cluster,
                    hostname: reg.hostname,
                    service_type: reg.service_type,
                    state: State::Pending,
                    registered_at: now,
                    last_heartbeat: upserted.last_heartbeat,
                    config_revision: upserted.config_revision,
                    meta: Arc::new(reg.meta),
                },
            );
            Ok(Registered {
                instance_id,
                config_revision: upserted.config_revision,
            })
        })
        .await
    }

    /// Applies heartbeats received at `at` (Unix seconds): live instances become `active`
    /// with `last_heartbeat = at`; unknown and deregistered ids are reported as not applied.
    /// All writes happen in one store call.
    pub async fn heartbeat_batch(
        &self,
        beats: Vec<(u128, i64)>,
    ) -> Result<BatchOutcome, RegistryError> {
        if beats.is_empty() {
            return Ok(BatchOutcome::default());
        }
        self.with_store(move |shared, store| {
            let mut applied = Vec::with_capacity(beats.len());
            let mut writes: Vec<(i64, i64)> = Vec::new();
            {
                let index = shared.index();
                for &(instance, at) in &beats {
                    match index.get(instance) {
                        Some((_, s)) if s.state == State::Deregistered => applied.push(false),
                        Some((key, s)) => {
                            applied.push(true);
                            // A row that is already active with this second needs no write.
                            if s.state != State::Active || s.last_heartbeat != Some(at) {
                                writes.push((key, at));
                            }
                        }
                        None => applied.push(false),
                    }
                }
            }
            let mut activated = 0;
            if !writes.is_empty() {
                // Grouped by time and in key order: one statement updates a run of rows
                // that share a timestamp, walking the B-tree pages in order.
                writes.sort_unstable_by_key(|&(key, at)| (at, key));
                // A repeated heartbeat would make a multi-row update change fewer rows than
                // it names.
                writes.dedup();
                shared.writes.record(store.heartbeats(&writes))?;
                let mut index = shared.index_mut();
                for (key, at) in writes {
                    if let Some(service) = index.get_mut(key) {
                        if service.state != State::Active {
                            activated += 1;
                        }
                        service.state = State::Active;
                        service.last_heartbeat = Some(at);
                    }
                }
            }
            Ok(BatchOutcome { applied, activated })
        })
        .await
    }

    /// Applies one heartbeat; `Ok(None)` when the id is unknown or deregistered, else
    /// whether the instance just became `active`.
    pub async fn heartbeat(&self, instance_id: &str) -> Result<Option<bool>, RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(None);
        };
        let outcome = self
            .heartbeat_batch(vec![(instance, unix_seconds())])
            .await?;
        Ok(outcome.applied[0].then_some(outcome.activated > 0))
    }

    /// Marks an instance `deregistered`. Returns whether a live instance was terminated;
    /// unknown and already deregistered ids are not an error.
    pub async fn deregister(&self, instance_id: &str) -> Result<bool, RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(false);
        };
        self.with_store(move |shared, store| {
            let key = match shared.index().get(instance) {
                Some((key, s)) if s.state != State::Deregistered => key,
                _ => return Ok(false),
            };
            shared.writes.record(store.deregister(key))?;
            if let Some(service) = shared.index_mut().get_mut(key) {
                service.state = State::Deregistered;
            }
            Ok(true)
        })
        .await
    }

    /// The service behind an instance id, from the index (no store access).
    pub fn lookup(&self, instance_id: &str) -> Option<Service> {
        let instance = parse_instance_id(instance_id)?;
        self.index().get(instance).map(|(_, s)| s.clone())
    }

    /// Records the config revision an instance was served.
    pub async fn acknowledge(&self, instance_id: &str, revision: i64) -> Result<(), RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(());
        };
        self.with_store(move |shared, store| {
            let Some((key, _)) = shared.index().get(instance) else {
                return Ok(());
            };
            shared.writes.record(store.acknowledge(key, revision))?;
            if let Some(service) = shared.index_mut().get_mut(key) {
                service.config_revision = revision;
            }
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
                if let Some(service) = index.get_mut(key) {
                    service.state = State::Stale;
                }
            }
            Ok(keys.len())
        })
        .await
    }

    /// Every `active` service, ordered by cluster, then host name.
    pub fn active(&self) -> Vec<Service> {
        let mut active: Vec<Service> = self.index().with_state(State::Active).cloned().collect();
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
}

impl Shared {
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
        fn register(
            &mut self,
            reg: &Registration,
            instance_id: &str,
            now: i64,
        ) -> Result<Upserted, RegistryError> {
            self.sync().register(reg, instance_id, now)
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
}
