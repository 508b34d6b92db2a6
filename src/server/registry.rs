//! The service registry: cc-backend's `service` table in SQLite, fronted by an in-memory
//! index.
//!
//! SQLite is the durable store; every change is written there first and mirrored into the
//! index after the commit, so reads (config pulls, rosters, metrics) never wait for the
//! database and heartbeats that would not change a row cost no write. All SQLite work runs
//! on tokio's blocking pool under one connection lock, which also serialises index updates.
//!
//! A change is acknowledged only after its transaction committed: every write runs in an
//! explicit transaction whose statements are stepped to completion, and every error,
//! including the commit's (a full disk shows up there), reaches the caller. The first
//! failure of a burst is logged; the ones after it are counted until a write succeeds
//! again. Stepping to completion also lets SQLite's automatic WAL checkpoint run, which
//! together with `journal_size_limit` keeps the `-wal` file small.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use super::error::RegistryError;
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

#[derive(Debug, Clone)]
struct Entry {
    instance: u128,
    service: Service,
}

#[derive(Default)]
struct Index {
    by_instance: HashMap<u128, i64>,
    rows: HashMap<i64, Entry>,
}

struct Shared {
    conn: Mutex<Connection>,
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

/// Frames after which a commit checkpoints the WAL into the database (SQLite's default,
/// stated so the bound below can be derived from it): about 4 MiB with 4 KiB pages.
const WAL_AUTOCHECKPOINT: i64 = 1000;
/// The size the WAL file is truncated back to after a checkpoint. The file grows past
/// [`WAL_AUTOCHECKPOINT`] frames only by the last transaction, which for a large heartbeat
/// batch can be tens of MiB; this gives that space back once it is checkpointed.
pub const JOURNAL_SIZE_LIMIT: i64 = 16 << 20;
/// How long the outcome of a write speaks for the database in health checks; after that
/// they probe it with a write of their own.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS "service" (
    id INTEGER PRIMARY KEY,
    cluster VARCHAR(255) NOT NULL,
    hostname VARCHAR(255) NOT NULL,
    service_type VARCHAR(255) NOT NULL,
    instance_id VARCHAR(64) NOT NULL,
    scope VARCHAR(32) NOT NULL DEFAULT 'cluster' CHECK (scope IN ('cluster', 'infra')),
    state VARCHAR(32) NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'active', 'stale', 'deregistered')),
    registered_at INTEGER NOT NULL,
    last_heartbeat INTEGER,
    config_revision INTEGER NOT NULL DEFAULT 0,
    meta_data TEXT,
    UNIQUE (cluster, hostname, service_type),
    UNIQUE (instance_id)
);
CREATE INDEX IF NOT EXISTS services_cluster ON service (cluster);
CREATE INDEX IF NOT EXISTS services_scope ON service (scope);
CREATE INDEX IF NOT EXISTS services_state_heartbeat ON service (state, last_heartbeat);
CREATE TABLE IF NOT EXISTS ccfleet_health (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at INTEGER NOT NULL
);
"#;

impl Registry {
    /// Opens (creating if needed) the registry in the SQLite file `path`, or in memory
    /// when `path` is `None`. Blocking: call it before serving or from a blocking task.
    pub fn open(path: Option<&Path>) -> Result<Registry, RegistryError> {
        let conn = match path {
            Some(path) => {
                let conn = Connection::open(path)?;
                // WAL lets readers of other tools coexist with our writer; NORMAL keeps
                // commits durable across process crashes without an fsync per batch.
                conn.pragma_update(None, "journal_mode", "WAL")?;
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                // Heartbeats touch every row; keep the table and its indexes in memory
                // (the value is in KiB when negative).
                conn.pragma_update(None, "cache_size", -65_536)?;
                conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT)?;
                conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
                conn
            }
            None => Connection::open_in_memory()?,
        };
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        let index = load_index(&conn)?;
        Ok(Registry {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                index: RwLock::new(index),
                writes: WriteHealth::default(),
            }),
        })
    }

    async fn with_conn<R, F>(&self, f: F) -> Result<R, RegistryError>
    where
        R: Send + 'static,
        F: FnOnce(&Shared, &mut Connection) -> Result<R, RegistryError> + Send + 'static,
    {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = shared.conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&shared, &mut conn)
        })
        .await
        .map_err(|_| RegistryError::Interrupted)?
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.shared.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a member: upsert on (cluster, hostname, type) with a fresh instance id,
    /// state `pending`; last heartbeat and acknowledged revision survive re-registration.
    pub async fn register(&self, reg: Registration) -> Result<Registered, RegistryError> {
        self.with_conn(move |shared, conn| {
            let now = unix_seconds();
            let instance = loop {
                let candidate = u128::from_be_bytes(rand::random());
                let index = shared.index.read().unwrap_or_else(|e| e.into_inner());
                if !index.by_instance.contains_key(&candidate) {
                    break candidate;
                }
            };
            let instance_id = format_instance_id(instance);
            let meta_json = if reg.meta.is_empty() {
                None
            } else {
                Some(serde_json::to_string(&reg.meta).expect("string map serializes"))
            };
            let (rowid, last_heartbeat, config_revision) = write(shared, conn, |tx| {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO service (cluster, hostname, service_type, instance_id, scope, \
                     state, registered_at, meta_data, config_revision) \
                     VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, 0) \
                     ON CONFLICT (cluster, hostname, service_type) DO UPDATE SET \
                     instance_id = excluded.instance_id, scope = excluded.scope, \
                     state = 'pending', registered_at = excluded.registered_at, \
                     meta_data = excluded.meta_data \
                     RETURNING id, last_heartbeat, config_revision",
                )?;
                let mut rows = stmt.query(params![
                    reg.cluster,
                    reg.hostname,
                    reg.service_type.code(),
                    instance_id,
                    reg.scope.as_str(),
                    now,
                    meta_json
                ])?;
                let row = rows
                    .next()?
                    .ok_or(RegistryError::Corrupt("an upsert returned no row"))?;
                let returned: (i64, Option<i64>, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
                // Step to the end: an error SQLite reports after the returned row must not
                // be lost in the statement reset.
                while rows.next()?.is_some() {}
                Ok(returned)
            })?;
            let mut index = shared.index.write().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = index.rows.get(&rowid).map(|e| e.instance) {
                index.by_instance.remove(&old);
            }
            index.by_instance.insert(instance, rowid);
            index.rows.insert(
                rowid,
                Entry {
                    instance,
                    service: Service {
                        scope: reg.scope,
                        cluster: reg.cluster,
                        hostname: reg.hostname,
                        service_type: reg.service_type,
                        state: State::Pending,
                        registered_at: now,
                        last_heartbeat,
                        config_revision,
                        meta: Arc::new(reg.meta),
                    },
                },
            );
            Ok(Registered {
                instance_id,
                config_revision,
            })
        })
        .await
    }

    /// Applies heartbeats received at `at` (Unix seconds): live instances become `active`
    /// with `last_heartbeat = at`; unknown and deregistered ids are reported as not applied.
    /// All writes happen in one transaction.
    pub async fn heartbeat_batch(
        &self,
        beats: Vec<(u128, i64)>,
    ) -> Result<BatchOutcome, RegistryError> {
        if beats.is_empty() {
            return Ok(BatchOutcome::default());
        }
        self.with_conn(move |shared, conn| {
            let mut applied = Vec::with_capacity(beats.len());
            let mut writes: Vec<(i64, i64)> = Vec::new();
            {
                let index = shared.index.read().unwrap_or_else(|e| e.into_inner());
                for &(instance, at) in &beats {
                    let entry = index
                        .by_instance
                        .get(&instance)
                        .and_then(|rowid| index.rows.get(rowid).map(|e| (*rowid, e)));
                    match entry {
                        Some((_, e)) if e.service.state == State::Deregistered => {
                            applied.push(false)
                        }
                        Some((rowid, e)) => {
                            applied.push(true);
                            // A row that is already active with this second needs no write.
                            if e.service.state != State::Active
                                || e.service.last_heartbeat != Some(at)
                            {
                                writes.push((rowid, at));
                            }
                        }
                        None => applied.push(false),
                    }
                }
            }
            let mut activated = 0;
            if !writes.is_empty() {
                // Grouped by time and in row order: one statement updates a run of rows
                // that share a timestamp, walking the B-tree pages in order.
                writes.sort_unstable_by_key(|&(rowid, at)| (at, rowid));
                // A repeated heartbeat would make a multi-row UPDATE change fewer rows than
                // it names.
                writes.dedup();
                write(shared, conn, |tx| apply_heartbeats(tx, &writes))?;
                let mut index = shared.index.write().unwrap_or_else(|e| e.into_inner());
                for (rowid, at) in writes {
                    if let Some(entry) = index.rows.get_mut(&rowid) {
                        if entry.service.state != State::Active {
                            activated += 1;
                        }
                        entry.service.state = State::Active;
                        entry.service.last_heartbeat = Some(at);
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
        self.with_conn(move |shared, conn| {
            let rowid = {
                let index = shared.index.read().unwrap_or_else(|e| e.into_inner());
                match index.by_instance.get(&instance) {
                    Some(rowid)
                        if index
                            .rows
                            .get(rowid)
                            .is_some_and(|e| e.service.state != State::Deregistered) =>
                    {
                        *rowid
                    }
                    _ => return Ok(false),
                }
            };
            write(shared, conn, |tx| {
                let changed = tx
                    .prepare_cached("UPDATE service SET state = 'deregistered' WHERE id = ?1")?
                    .execute(params![rowid])?;
                expect_changed(changed, 1)
            })?;
            let mut index = shared.index.write().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = index.rows.get_mut(&rowid) {
                entry.service.state = State::Deregistered;
            }
            Ok(true)
        })
        .await
    }

    /// The service behind an instance id, from the index (no database access).
    pub fn lookup(&self, instance_id: &str) -> Option<Service> {
        let instance = parse_instance_id(instance_id)?;
        let index = self.index();
        let rowid = index.by_instance.get(&instance)?;
        index.rows.get(rowid).map(|e| e.service.clone())
    }

    /// Records the config revision an instance was served.
    pub async fn acknowledge(&self, instance_id: &str, revision: i64) -> Result<(), RegistryError> {
        let Some(instance) = parse_instance_id(instance_id) else {
            return Ok(());
        };
        self.with_conn(move |shared, conn| {
            let Some(rowid) = shared
                .index
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .by_instance
                .get(&instance)
                .copied()
            else {
                return Ok(());
            };
            write(shared, conn, |tx| {
                let changed = tx
                    .prepare_cached("UPDATE service SET config_revision = ?1 WHERE id = ?2")?
                    .execute(params![revision, rowid])?;
                expect_changed(changed, 1)
            })?;
            let mut index = shared.index.write().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = index.rows.get_mut(&rowid) {
                entry.service.config_revision = revision;
            }
            Ok(())
        })
        .await
    }

    /// Moves `active` instances whose last heartbeat is older than `cutoff` (Unix seconds)
    /// to `stale`; `pending` never goes stale. Returns how many changed.
    pub async fn mark_stale(&self, cutoff: i64) -> Result<usize, RegistryError> {
        self.with_conn(move |shared, conn| {
            let rowids: Vec<i64> = write(shared, conn, |tx| {
                let rowids = tx
                    .prepare_cached(
                        "UPDATE service SET state = 'stale' \
                         WHERE state = 'active' AND last_heartbeat < ?1 RETURNING id",
                    )?
                    .query_map(params![cutoff], |row| row.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok(rowids)
            })?;
            let mut index = shared.index.write().unwrap_or_else(|e| e.into_inner());
            for rowid in &rowids {
                if let Some(entry) = index.rows.get_mut(rowid) {
                    entry.service.state = State::Stale;
                }
            }
            Ok(rowids.len())
        })
        .await
    }

    /// Every `active` service, ordered by cluster, then host name.
    pub fn active(&self) -> Vec<Service> {
        let mut active: Vec<Service> = self
            .index()
            .rows
            .values()
            .filter(|e| e.service.state == State::Active)
            .map(|e| e.service.clone())
            .collect();
        active.sort_by(|a, b| {
            (&a.cluster, &a.hostname, a.service_type.code()).cmp(&(
                &b.cluster,
                &b.hostname,
                b.service_type.code(),
            ))
        });
        active
    }

    /// Whether the database takes writes: `Err` with the error of the latest write when
    /// it failed. A write in the last [`PROBE_INTERVAL`] answers; otherwise a tiny write
    /// (a timestamp in the `ccfleet_health` table) probes the database first, so one that
    /// went bad while idle is noticed, and one that recovered is too.
    pub async fn writable(&self) -> Result<(), String> {
        if let Some(outcome) = self.shared.writes.fresh(PROBE_INTERVAL) {
            return outcome;
        }
        self.with_conn(|shared, conn| {
            write(shared, conn, |tx| {
                tx.prepare_cached(
                    "INSERT INTO ccfleet_health (id, probed_at) VALUES (1, ?1) \
                     ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
                )?
                .execute(params![unix_seconds()])?;
                Ok(())
            })
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Instances per state.
    pub fn counts(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for entry in self.index().rows.values() {
            match entry.service.state {
                State::Pending => counts.pending += 1,
                State::Active => counts.active += 1,
                State::Stale => counts.stale += 1,
                State::Deregistered => counts.deregistered += 1,
            }
        }
        counts
    }
}

/// Runs `f` in a transaction and commits it, recording the outcome for health checks and
/// the error log. The transaction takes the write lock at once, so it cannot fail half-way
/// for want of it; if `f` or the commit fails, everything `f` wrote is rolled back.
fn write<R>(
    shared: &Shared,
    conn: &mut Connection,
    f: impl FnOnce(&Transaction<'_>) -> Result<R, RegistryError>,
) -> Result<R, RegistryError> {
    let result = (|| {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    })();
    shared.writes.record(result)
}

/// Every write targets rows the index says exist; a different count means the index and
/// the database disagree, and acknowledging the write would be a lie.
fn expect_changed(changed: usize, expected: usize) -> Result<(), RegistryError> {
    if changed == expected {
        Ok(())
    } else {
        Err(RegistryError::Corrupt(
            "a row the index knows is missing from the database",
        ))
    }
}

/// Rows per multi-row heartbeat `UPDATE`.
const UPDATE_CHUNK: usize = 256;

/// Writes `(rowid, at)` pairs sorted by `at`. The rows were checked to be live under the
/// connection lock, so no state condition is needed.
fn apply_heartbeats(tx: &Transaction<'_>, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
    let chunk_sql = format!(
        "UPDATE service SET last_heartbeat = ?1, state = 'active' WHERE id IN ({})",
        (2..UPDATE_CHUNK + 2)
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for same_time in writes.chunk_by(|a, b| a.1 == b.1) {
        let at = same_time[0].1;
        let mut chunks = same_time.chunks_exact(UPDATE_CHUNK);
        if chunks.len() > 0 {
            let mut stmt = tx.prepare_cached(&chunk_sql)?;
            for chunk in chunks.by_ref() {
                stmt.raw_bind_parameter(1, at)?;
                for (i, &(rowid, _)) in chunk.iter().enumerate() {
                    stmt.raw_bind_parameter(i + 2, rowid)?;
                }
                expect_changed(stmt.raw_execute()?, UPDATE_CHUNK)?;
            }
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut stmt = tx.prepare_cached(
                "UPDATE service SET last_heartbeat = ?1, state = 'active' WHERE id = ?2",
            )?;
            for &(rowid, _) in rest {
                expect_changed(stmt.execute(params![at, rowid])?, 1)?;
            }
        }
    }
    Ok(())
}

fn load_index(conn: &Connection) -> Result<Index, RegistryError> {
    let mut index = Index::default();
    let mut stmt = conn.prepare(
        "SELECT id, cluster, hostname, service_type, instance_id, scope, state, registered_at, \
         last_heartbeat, config_revision, meta_data FROM service",
    )?;
    let mut rows = stmt.query([])?;
    let mut bad_meta = 0usize;
    while let Some(row) = rows.next()? {
        let rowid: i64 = row.get(0)?;
        let instance_text: String = row.get(4)?;
        let instance =
            parse_instance_id(&instance_text).ok_or(RegistryError::Corrupt("instance_id"))?;
        let type_text: String = row.get(3)?;
        let service_type: ServiceType = type_text
            .parse()
            .map_err(|_| RegistryError::Corrupt("service_type"))?;
        let scope = match row.get_ref(5)?.as_str().unwrap_or_default() {
            "cluster" => Scope::Cluster,
            "infra" => Scope::Infra,
            _ => return Err(RegistryError::Corrupt("scope")),
        };
        let state = State::parse(row.get_ref(6)?.as_str().unwrap_or_default())
            .ok_or(RegistryError::Corrupt("state"))?;
        let meta_text: Option<String> = row.get(10)?;
        let meta = match meta_text.as_deref() {
            None | Some("") => BTreeMap::new(),
            Some(text) => serde_json::from_str(text).unwrap_or_else(|_| {
                bad_meta += 1;
                BTreeMap::new()
            }),
        };
        index.by_instance.insert(instance, rowid);
        index.rows.insert(
            rowid,
            Entry {
                instance,
                service: Service {
                    scope,
                    cluster: row.get(1)?,
                    hostname: row.get(2)?,
                    service_type,
                    state,
                    registered_at: row.get(7)?,
                    last_heartbeat: row.get(8)?,
                    config_revision: row.get(9)?,
                    meta: Arc::new(meta),
                },
            },
        );
    }
    if bad_meta > 0 {
        tracing::warn!("fleet: {bad_meta} service row(s) have unparseable meta_data; ignoring it");
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(cluster: &str, host: &str, ty: ServiceType) -> Registration {
        Registration {
            scope: if cluster.is_empty() {
                Scope::Infra
            } else {
                Scope::Cluster
            },
            cluster: cluster.to_owned(),
            hostname: host.to_owned(),
            service_type: ty,
            meta: BTreeMap::from([("port".to_owned(), "8080".to_owned())]),
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

    #[tokio::test]
    async fn lifecycle_and_persistence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let r = Registry::open(Some(&path)).unwrap();
        let a = r
            .register(reg("fritz", "f0101", ServiceType::MetricCollector))
            .await
            .unwrap();
        assert_eq!(a.config_revision, 0);
        assert_eq!(r.lookup(&a.instance_id).unwrap().state, State::Pending);
        assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
        assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(false));
        r.acknowledge(&a.instance_id, 42).await.unwrap();
        let b = r
            .register(reg("fritz", "f0101", ServiceType::MetricCollector))
            .await
            .unwrap();
        assert_ne!(a.instance_id, b.instance_id);
        assert_eq!(b.config_revision, 42);
        assert!(r.lookup(&a.instance_id).is_none());
        assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), None);
        let infra = r
            .register(reg("", "mgmt01", ServiceType::Backend))
            .await
            .unwrap();
        r.heartbeat(&infra.instance_id).await.unwrap();
        assert_eq!(r.mark_stale(unix_seconds() + 1).await.unwrap(), 1);
        assert_eq!(r.lookup(&infra.instance_id).unwrap().state, State::Stale);
        assert!(r.deregister(&b.instance_id).await.unwrap());
        assert!(!r.deregister(&b.instance_id).await.unwrap());
        assert_eq!(r.heartbeat(&b.instance_id).await.unwrap(), None);
        drop(r);

        let r = Registry::open(Some(&path)).unwrap();
        let svc = r.lookup(&infra.instance_id).unwrap();
        assert_eq!(
            (svc.scope, svc.cluster.as_str(), svc.state),
            (Scope::Infra, "", State::Stale)
        );
        assert_eq!(svc.meta.get("port").map(String::as_str), Some("8080"));
        assert_eq!(r.lookup(&b.instance_id).unwrap().state, State::Deregistered);
        assert_eq!(r.lookup(&b.instance_id).unwrap().config_revision, 42);
        let counts = r.counts();
        assert_eq!(
            (counts.stale, counts.deregistered, counts.active),
            (1, 1, 0)
        );
        let outcome = r
            .heartbeat_batch(vec![
                (parse_instance_id(&infra.instance_id).unwrap(), 7),
                (parse_instance_id(&b.instance_id).unwrap(), 7),
                (5, 7),
            ])
            .await
            .unwrap();
        assert_eq!(outcome.applied, [true, false, false]);
        assert_eq!(outcome.activated, 1);
        assert_eq!(r.active().len(), 1);
    }

    #[tokio::test]
    async fn large_batches_with_mixed_times() {
        let r = Registry::open(None).unwrap();
        let mut ids = Vec::new();
        for i in 0..700 {
            let reg = reg("c", &format!("h{i}"), ServiceType::MetricCollector);
            ids.push(parse_instance_id(&r.register(reg).await.unwrap().instance_id).unwrap());
        }
        // 600 share a second (two full multi-row chunks and a remainder), 100 another.
        let beats: Vec<(u128, i64)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, if i < 600 { 100 } else { 200 }))
            .collect();
        let outcome = r.heartbeat_batch(beats).await.unwrap();
        assert_eq!(outcome.activated, 700);
        assert!(outcome.applied.iter().all(|a| *a));
        assert_eq!(r.counts().active, 700);
        let conn = r.shared.conn.lock().unwrap();
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |row| row.get(0)).unwrap() };
        assert_eq!(
            count("SELECT count(*) FROM service WHERE state = 'active' AND last_heartbeat = 100"),
            600
        );
        assert_eq!(
            count("SELECT count(*) FROM service WHERE state = 'active' AND last_heartbeat = 200"),
            100
        );
    }

    /// Counts the error and warning events sent to it.
    #[derive(Default)]
    struct LogCount {
        errors: std::sync::atomic::AtomicUsize,
        warnings: std::sync::atomic::AtomicUsize,
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
            use std::sync::atomic::Ordering::Relaxed;
            match *event.metadata().level() {
                tracing::Level::ERROR => self.0.errors.fetch_add(1, Relaxed),
                tracing::Level::WARN => self.0.warnings.fetch_add(1, Relaxed),
                _ => 0,
            };
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn set_read_only(r: &Registry, read_only: bool) {
        let conn = r.shared.conn.lock().unwrap();
        conn.pragma_update(None, "query_only", read_only).unwrap();
    }

    #[test]
    fn a_burst_of_failed_writes_is_logged_once_and_its_end_once() {
        let r = Registry::open(None).unwrap();
        set_read_only(&r, true);
        let counts = Arc::new(LogCount::default());
        let probe = |r: &Registry| {
            let mut conn = r.shared.conn.lock().unwrap();
            write(&r.shared, &mut conn, |tx| {
                tx.execute(
                    "INSERT INTO ccfleet_health (id, probed_at) VALUES (1, 1) \
                            ON CONFLICT (id) DO UPDATE SET probed_at = probed_at + 1",
                    [],
                )?;
                Ok(())
            })
        };
        tracing::subscriber::with_default(Counting(counts.clone()), || {
            for _ in 0..100 {
                assert!(probe(&r).is_err());
            }
            set_read_only(&r, false);
            for _ in 0..10 {
                probe(&r).unwrap();
            }
        });
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(counts.errors.load(Relaxed), 1);
        assert_eq!(counts.warnings.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn writes_that_fail_are_not_acknowledged_and_leave_the_index_alone() {
        let r = Registry::open(None).unwrap();
        let a = r
            .register(reg("fritz", "f0101", ServiceType::MetricCollector))
            .await
            .unwrap();
        assert_eq!(r.writable().await, Ok(()));
        set_read_only(&r, true);
        assert!(
            r.register(reg("fritz", "f0102", ServiceType::MetricCollector))
                .await
                .is_err()
        );
        assert_eq!(r.counts().pending, 1);
        assert!(r.heartbeat(&a.instance_id).await.is_err());
        assert!(r.deregister(&a.instance_id).await.is_err());
        assert!(r.acknowledge(&a.instance_id, 7).await.is_err());
        let svc = r.lookup(&a.instance_id).unwrap();
        assert_eq!((svc.state, svc.config_revision), (State::Pending, 0));
        let failing = r.writable().await.unwrap_err();
        assert!(failing.contains("readonly"), "{failing}");
        set_read_only(&r, false);
        assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
        assert_eq!(r.writable().await, Ok(()));
    }

    #[tokio::test]
    async fn a_repeated_heartbeat_in_one_batch_is_applied_once() {
        let r = Registry::open(None).unwrap();
        let a = r
            .register(reg("fritz", "f0101", ServiceType::MetricCollector))
            .await
            .unwrap();
        let id = parse_instance_id(&a.instance_id).unwrap();
        let outcome = r
            .heartbeat_batch(vec![(id, 100), (id, 100), (id, 90)])
            .await
            .unwrap();
        assert_eq!((outcome.applied, outcome.activated), (vec![true; 3], 1));
        assert_eq!(r.lookup(&a.instance_id).unwrap().last_heartbeat, Some(100));
    }
}
