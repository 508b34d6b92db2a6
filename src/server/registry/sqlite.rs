//! The SQLite backend: cc-backend's `service` table, and last-seen times written behind in
//! a compact table of their own ([`sqlite_last_seen`]).
//!
//! Every method is one explicit transaction that takes the write lock at once; its
//! statements are stepped to completion and the commit is checked, so an error, including
//! the commit's (a full disk shows up there), always reaches the caller and nothing of a
//! failed call is kept. Stepping to completion also lets SQLite's automatic WAL checkpoint
//! run (its hook fires only when a statement finishes), which together with
//! `journal_size_limit` keeps the `-wal` file small.
//!
//! Opening a file writes nothing when its schema is current ([`sqlite_open`]); a schema
//! change that could not be written when the file was opened (a full disk) is tried again
//! before every write, and until it is written the store reports itself degraded.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior, params};

#[cfg(test)]
use super::sqlite_open::{PAGE_SIZE, SCHEMA};
use super::{
    Registration, RegistryStore, Service, State, StoredService, Upserted, parse_instance_id,
    sqlite_last_seen, sqlite_open, unix_seconds,
};
use crate::server::error::{RegistryError, RegistryErrorKind};
use crate::wire::{Scope, ServiceType};

/// Rows per multi-row heartbeat `UPDATE`.
const UPDATE_CHUNK: usize = 256;

impl From<rusqlite::Error> for RegistryError {
    fn from(e: rusqlite::Error) -> RegistryError {
        let kind = match e.sqlite_error_code() {
            Some(ErrorCode::ConstraintViolation) => RegistryErrorKind::Conflict,
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                RegistryErrorKind::Corrupt
            }
            Some(_) => RegistryErrorKind::Unavailable,
            // Not an SQLite failure: a value of the wrong type or shape came back.
            None => RegistryErrorKind::Corrupt,
        };
        RegistryError::with_source(kind, e.to_string(), e)
    }
}

/// The registry in a SQLite database (a file, or memory for tests and file-less servers).
pub struct SqliteStore {
    conn: Connection,
    /// A file, not memory.
    file: bool,
    /// Why the schema change the file needs is not written yet (it is tried again before
    /// every write).
    pending: Option<String>,
    /// The `-shm` file could not be created: the connection holds the file exclusively.
    exclusive: bool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file `path`, or one in memory when `path` is
    /// `None`. Blocking. A file that can be read opens even on a full disk: see
    /// [`degraded`](RegistryStore::degraded) for what it then lacks.
    pub fn open(path: Option<&Path>) -> Result<SqliteStore, RegistryError> {
        Ok(match path {
            Some(path) => {
                let opened = sqlite_open::open_file(path)?;
                SqliteStore {
                    conn: opened.conn,
                    file: true,
                    pending: opened.pending,
                    exclusive: opened.exclusive,
                }
            }
            None => SqliteStore {
                conn: sqlite_open::open_memory()?,
                file: false,
                pending: None,
                exclusive: false,
            },
        })
    }

    /// Writes the schema change that could not be written so far, if one waits.
    fn bring_up_pending(&mut self) -> Result<(), RegistryError> {
        if self.pending.is_none() {
            return Ok(());
        }
        match sqlite_open::bring_up(&self.conn, self.file) {
            Ok(()) => {
                tracing::info!("fleet registry: the schema change the database needed is written");
                self.pending = None;
                Ok(())
            }
            Err(e) => {
                self.pending = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Whether the table `name` can be read: always, unless a schema change waits, which
    /// may be the one that creates it.
    fn has_table(&self, name: &str) -> Result<bool, RegistryError> {
        if self.pending.is_none() {
            return Ok(true);
        }
        sqlite_open::table_exists(&self.conn, name)
    }

    /// Runs `f` in a transaction and commits it. The transaction takes the write lock at
    /// once, so it cannot fail half-way for want of it; if `f` or the commit fails,
    /// everything `f` wrote is rolled back.
    fn write<R>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<R, RegistryError>,
    ) -> Result<R, RegistryError> {
        self.bring_up_pending()?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// A store over a file's connection opened by [`sqlite_open::connect`], with the
    /// schema change that could not be written (tests make the disk full for SQLite).
    #[cfg(test)]
    pub(super) fn opened(conn: Connection, pending: Option<String>) -> SqliteStore {
        SqliteStore {
            conn,
            file: true,
            pending,
            exclusive: false,
        }
    }

    /// Runs a statement on the connection (tests use it to break or inspect the database).
    #[cfg(test)]
    pub(super) fn connection(&self) -> &Connection {
        &self.conn
    }
}

impl SqliteStore {
    /// Runs `UPDATE service SET {set}` with `?1` bound to the time, for each `(key, time)`
    /// (sorted by time, each key once), in one transaction.
    fn set_times(&mut self, writes: &[(i64, i64)], set: &str) -> Result<(), RegistryError> {
        let chunk_sql = format!(
            "UPDATE service SET {set} WHERE id IN ({})",
            (2..UPDATE_CHUNK + 2)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let one_sql = format!("UPDATE service SET {set} WHERE id = ?2");
        self.write(|tx| {
            for same_time in writes.chunk_by(|a, b| a.1 == b.1) {
                let at = same_time[0].1;
                let mut chunks = same_time.chunks_exact(UPDATE_CHUNK);
                if chunks.len() > 0 {
                    let mut stmt = tx.prepare_cached(&chunk_sql)?;
                    for chunk in chunks.by_ref() {
                        stmt.raw_bind_parameter(1, at)?;
                        for (i, &(key, _)) in chunk.iter().enumerate() {
                            stmt.raw_bind_parameter(i + 2, key)?;
                        }
                        expect_changed(stmt.raw_execute()?, UPDATE_CHUNK)?;
                    }
                }
                let rest = chunks.remainder();
                if !rest.is_empty() {
                    let mut stmt = tx.prepare_cached(&one_sql)?;
                    for &(key, _) in rest {
                        expect_changed(stmt.execute(params![at, key])?, 1)?;
                    }
                }
            }
            Ok(())
        })
    }
}

/// Every write targets rows the index says exist; a different count means the index and
/// the database disagree, and acknowledging the write would be a lie.
fn expect_changed(changed: usize, expected: usize) -> Result<(), RegistryError> {
    if changed == expected {
        Ok(())
    } else {
        Err(RegistryError::new(
            RegistryErrorKind::Corrupt,
            "a row the index knows is missing from the database",
        ))
    }
}

fn corrupt(column: &str) -> RegistryError {
    RegistryError::new(RegistryErrorKind::Corrupt, format!("corrupt row: {column}"))
}

impl RegistryStore for SqliteStore {
    fn group_gather(&self) -> std::time::Duration {
        // Each commit rewrites the last pages of the table and its indexes and syncs.
        super::GROUP_COMMIT_GATHER
    }

    fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
        let mut stored = Vec::new();
        self.load_each(&mut |s| stored.push(s))?;
        Ok(stored)
    }

    fn load_each(&mut self, each: &mut dyn FnMut(StoredService)) -> Result<usize, RegistryError> {
        let mut count = 0;
        if !self.has_table("service")? {
            return Ok(0);
        }
        let last_seen = if self.has_table("ccfleet_last_seen")? {
            sqlite_last_seen::LastSeen::load(&self.conn)?
        } else {
            sqlite_last_seen::LastSeen::default()
        };
        let mut stmt = self.conn.prepare(
            "SELECT id, cluster, hostname, service_type, instance_id, scope, state, \
             registered_at, last_heartbeat, config_revision, meta_data FROM service",
        )?;
        let mut rows = stmt.query([])?;
        let mut bad_meta = 0usize;
        while let Some(row) = rows.next()? {
            let instance_text: String = row.get(4)?;
            let instance = parse_instance_id(&instance_text).ok_or(corrupt("instance_id"))?;
            let type_text: String = row.get(3)?;
            let service_type: ServiceType =
                type_text.parse().map_err(|_| corrupt("service_type"))?;
            let scope = match row.get_ref(5)?.as_str().unwrap_or_default() {
                "cluster" => Scope::Cluster,
                "infra" => Scope::Infra,
                _ => return Err(corrupt("scope")),
            };
            let state = State::parse(row.get_ref(6)?.as_str().unwrap_or_default())
                .ok_or(corrupt("state"))?;
            let meta_text: Option<String> = row.get(10)?;
            let meta = match meta_text.as_deref() {
                None | Some("") => BTreeMap::new(),
                Some(text) => serde_json::from_str(text).unwrap_or_else(|_| {
                    bad_meta += 1;
                    BTreeMap::new()
                }),
            };
            count += 1;
            let key = row.get(0)?;
            each(StoredService {
                key,
                instance,
                service: Service {
                    scope,
                    cluster: row.get(1)?,
                    hostname: row.get(2)?,
                    service_type,
                    state,
                    registered_at: row.get(7)?,
                    // The later of the state change's time and the written-behind one.
                    last_heartbeat: row.get::<_, Option<i64>>(8)?.max(last_seen.get(key)),
                    config_revision: row.get(9)?,
                    meta: Arc::new(meta),
                },
            });
        }
        if bad_meta > 0 {
            tracing::warn!(
                "fleet: {bad_meta} service row(s) have unparseable meta_data; ignoring it"
            );
        }
        Ok(count)
    }

    fn register_batch(
        &mut self,
        batch: &[(Registration, String)],
        now: i64,
    ) -> Result<Vec<Upserted>, RegistryError> {
        // A lookup on the unique index, then a plain INSERT or an UPDATE by row id: an
        // upsert with RETURNING would answer the same in one statement, but SQLite builds
        // and drops a temporary table for every RETURNING statement, which cost a fifth
        // of the database's share of a registration storm.
        self.write(|tx| {
            let mut find = tx.prepare_cached(
                "SELECT id, last_heartbeat, config_revision FROM service \
                 WHERE cluster = ?1 AND hostname = ?2 AND service_type = ?3",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO service (cluster, hostname, service_type, instance_id, scope, \
                 state, registered_at, meta_data, config_revision) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, 0)",
            )?;
            let mut update = tx.prepare_cached(
                "UPDATE service SET instance_id = ?2, scope = ?3, state = 'pending', \
                 registered_at = ?4, meta_data = ?5 WHERE id = ?1",
            )?;
            let mut answers = Vec::with_capacity(batch.len());
            for (reg, instance_id) in batch {
                let meta_json = if reg.meta.is_empty() {
                    None
                } else {
                    Some(serde_json::to_string(&reg.meta).expect("string map serializes"))
                };
                let service_type = reg.service_type.code();
                let found = {
                    let mut rows = find.query(params![reg.cluster, reg.hostname, service_type])?;
                    let found = match rows.next()? {
                        Some(row) => Some(Upserted {
                            key: row.get(0)?,
                            last_heartbeat: row.get(1)?,
                            config_revision: row.get(2)?,
                        }),
                        None => None,
                    };
                    // Step to the end: an error SQLite reports after the row must not be
                    // lost in the statement reset.
                    while rows.next()?.is_some() {}
                    found
                };
                let upserted = match found {
                    Some(existing) => {
                        let changed = update.execute(params![
                            existing.key,
                            instance_id,
                            reg.scope.as_str(),
                            now,
                            meta_json
                        ])?;
                        expect_changed(changed, 1)?;
                        existing
                    }
                    None => {
                        insert.execute(params![
                            reg.cluster,
                            reg.hostname,
                            service_type,
                            instance_id,
                            reg.scope.as_str(),
                            now,
                            meta_json
                        ])?;
                        Upserted {
                            key: tx.last_insert_rowid(),
                            last_heartbeat: None,
                            config_revision: 0,
                        }
                    }
                };
                answers.push(upserted);
            }
            Ok(answers)
        })
    }

    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.set_times(writes, "last_heartbeat = ?1, state = 'active'")
    }

    fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.write(|tx| sqlite_last_seen::write(tx, writes))
    }

    fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached("UPDATE service SET state = 'deregistered' WHERE id = ?1")?
                .execute(params![key])?;
            expect_changed(changed, 1)
        })
    }

    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached("UPDATE service SET config_revision = ?1 WHERE id = ?2")?
                .execute(params![revision, key])?;
            expect_changed(changed, 1)
        })
    }

    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
        self.write(|tx| {
            let mut stmt = tx.prepare_cached("UPDATE service SET state = 'stale' WHERE id = ?1")?;
            for &key in keys {
                expect_changed(stmt.execute(params![key])?, 1)?;
            }
            Ok(())
        })
    }

    fn put_state(&mut self, name: &str, value: &[u8]) -> Result<(), RegistryError> {
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO ccfleet_state (name, value) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![name, value])?;
            Ok(())
        })
    }

    fn get_state(&mut self, name: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        use rusqlite::OptionalExtension as _;
        if !self.has_table("ccfleet_state")? {
            return Ok(None);
        }
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM ccfleet_state WHERE name = ?1")?
            .query_row(params![name], |row| row.get(0))
            .optional()?)
    }

    fn degraded(&self) -> Option<String> {
        let mut reasons = Vec::new();
        if let Some(e) = &self.pending {
            reasons.push(format!(
                "a schema change waits for space (serving what the file holds; it is tried \
                 again before every write): {e}"
            ));
        }
        if self.exclusive {
            reasons.push(
                "the shared-memory index (-shm) could not be created at start: the server \
                 holds the database exclusively, other programs cannot read it until it \
                 restarts with space free"
                    .to_owned(),
            );
        }
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    fn probe(&mut self) -> Result<(), RegistryError> {
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO ccfleet_health (id, probed_at) VALUES (1, ?1) \
                 ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
            )?
            .execute(params![unix_seconds()])?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::registry::Registry;

    #[tokio::test]
    async fn large_batches_with_mixed_times_are_written_row_by_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let r = Registry::open(Some(&path)).unwrap();
        let mut ids = Vec::new();
        for i in 0..700 {
            let reg = Registration {
                scope: Scope::Cluster,
                cluster: "c".into(),
                hostname: format!("h{i}"),
                service_type: ServiceType::MetricCollector,
                meta: BTreeMap::new(),
            };
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
        let conn = Connection::open(&path).unwrap();
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

    #[test]
    fn a_registry_file_syncs_every_commit_and_does_not_index_instance_ids() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(Some(&dir.path().join("fleet.sqlite"))).unwrap();
        let conn = store.connection();
        // 2 = FULL: an acknowledged write survives a power loss, not only a crash.
        let synchronous: i64 = conn
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .unwrap();
        assert_eq!(synchronous, 2);
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap();
        assert_eq!(page_size, PAGE_SIZE);
        let mut stmt = conn.prepare("PRAGMA index_list(service)").unwrap();
        let indexes: Vec<String> = stmt
            .query_map([], |row| row.get::<_, String>(1))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for index in &indexes {
            let columns: Vec<String> = conn
                .prepare(&format!("PRAGMA index_info({index:?})"))
                .unwrap()
                .query_map([], |row| row.get::<_, String>(2))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(
                !columns.contains(&"instance_id".to_owned()),
                "{index} indexes instance ids"
            );
        }
    }

    #[tokio::test]
    async fn a_file_made_with_the_instance_id_index_still_opens_and_registers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let old = SCHEMA.replace(
            "UNIQUE (cluster, hostname, service_type)",
            "UNIQUE (cluster, hostname, service_type),\n    UNIQUE (instance_id)",
        );
        assert_ne!(old, SCHEMA);
        Connection::open(&path)
            .unwrap()
            .execute_batch(&old)
            .unwrap();
        let r = Registry::open(Some(&path)).unwrap();
        let reg = Registration {
            scope: Scope::Cluster,
            cluster: "c".into(),
            hostname: "h".into(),
            service_type: ServiceType::MetricCollector,
            meta: BTreeMap::new(),
        };
        let first = r.register(reg.clone()).await.unwrap();
        let second = r.register(reg).await.unwrap();
        assert_ne!(first.instance_id, second.instance_id);
        drop(r);
        let reopened = Registry::open(Some(&path)).unwrap();
        assert!(reopened.lookup(&first.instance_id).is_none());
        assert!(reopened.lookup(&second.instance_id).is_some());
    }

    #[tokio::test]
    async fn every_row_the_registry_writes_satisfies_the_check_constraints_it_skips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let r = Registry::open(Some(&path)).unwrap();
        let mut ids = Vec::new();
        for (scope, cluster) in [(Scope::Cluster, "c"), (Scope::Infra, "")] {
            for host in ["h1", "h2", "h3", "h4", "h1"] {
                let reg = Registration {
                    scope,
                    cluster: cluster.into(),
                    hostname: host.into(),
                    service_type: ServiceType::MetricCollector,
                    meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
                };
                ids.push(r.register(reg).await.unwrap().instance_id);
            }
        }
        // Every state: h1 re-registered (pending), h2 active, h3 stale, h4 deregistered.
        for (i, at) in [(1, 100), (2, 50), (6, 100), (7, 50)] {
            let id = parse_instance_id(&ids[i]).unwrap();
            r.heartbeat_batch(vec![(id, at)]).await.unwrap();
        }
        assert_eq!(r.mark_stale(60).await.unwrap(), 2);
        assert!(r.deregister(&ids[3]).await.unwrap());
        r.acknowledge(&ids[4], 7).await.unwrap();
        assert_eq!(r.writable().await, Ok(()));
        let counts = r.counts();
        assert_eq!(
            (
                counts.pending,
                counts.active,
                counts.stale,
                counts.deregistered
            ),
            (3, 2, 2, 1)
        );
        drop(r);
        // A connection that enforces them, as every other writer does.
        let conn = Connection::open(&path).unwrap();
        let check: Vec<String> = conn
            .prepare("PRAGMA integrity_check")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(check, ["ok"]);
        // The check does see a row that breaks them.
        conn.execute_batch(
            "PRAGMA ignore_check_constraints = ON; \
             UPDATE service SET state = 'gone' WHERE hostname = 'h2'; \
             PRAGMA ignore_check_constraints = OFF;",
        )
        .unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert!(check.contains("CHECK constraint failed"), "{check}");
    }

    #[test]
    fn a_later_registration_of_the_same_name_in_one_group_wins_and_keeps_the_row() {
        let mut store = SqliteStore::open(None).unwrap();
        let reg = registration(1);
        let first = store
            .register_batch(&[(reg.clone(), "1".repeat(32))], 10)
            .unwrap();
        store.acknowledge(first[0].key, 5).unwrap();
        store.heartbeats(&[(first[0].key, 12)]).unwrap();
        let other = registration(2);
        let group = store
            .register_batch(
                &[
                    (reg.clone(), "2".repeat(32)),
                    (other, "3".repeat(32)),
                    (reg, "4".repeat(32)),
                ],
                20,
            )
            .unwrap();
        let kept = Upserted {
            key: first[0].key,
            last_heartbeat: Some(12),
            config_revision: 5,
        };
        assert_eq!(group[0], kept);
        assert_eq!(group[2], kept);
        assert_ne!(group[1].key, kept.key);
        assert_eq!(
            (group[1].last_heartbeat, group[1].config_revision),
            (None, 0)
        );
        let stored = store.load().unwrap();
        assert_eq!(stored.len(), 2);
        let row = stored.iter().find(|s| s.key == kept.key).unwrap();
        assert_eq!(row.instance, parse_instance_id(&"4".repeat(32)).unwrap());
        assert_eq!(
            (row.service.state, row.service.registered_at),
            (State::Pending, 20)
        );
    }

    fn registration(n: usize) -> Registration {
        Registration {
            scope: Scope::Cluster,
            cluster: format!("c{}", n % 16),
            hostname: format!("h{n:05}"),
            service_type: ServiceType::MetricCollector,
            meta: BTreeMap::new(),
        }
    }

    #[test]
    fn a_flush_of_last_seen_times_writes_a_few_bytes_per_instance() {
        const N: usize = 4000;
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(Some(&dir.path().join("fleet.sqlite"))).unwrap();
        let mut keys = Vec::with_capacity(N);
        for wave in 0..N / 1000 {
            let batch: Vec<(Registration, String)> = (wave * 1000..(wave + 1) * 1000)
                .map(|n| {
                    (
                        registration(n),
                        super::super::format_instance_id(n as u128 + 1),
                    )
                })
                .collect();
            keys.extend(
                store
                    .register_batch(&batch, 50)
                    .unwrap()
                    .iter()
                    .map(|u| u.key),
            );
        }
        let at = |t: i64| keys.iter().map(|&k| (k, t)).collect::<Vec<_>>();
        store.heartbeats(&at(100)).unwrap();
        store.last_seen(&at(110)).unwrap();
        let frames = |store: &SqliteStore, mode: &str| -> i64 {
            store
                .connection()
                .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
                    row.get(1)
                })
                .unwrap()
        };
        frames(&store, "TRUNCATE");
        // The steady state: every instance's time moves on once per flush.
        store.last_seen(&at(120)).unwrap();
        let wal_bytes = frames(&store, "PASSIVE") * (PAGE_SIZE + 24);
        let per_instance = wal_bytes / N as i64;
        // About 8.5 bytes each (a 1 KiB page per 120 instances); rewriting the wide rows
        // and their (state, last_heartbeat) index entries took 100.
        assert!(per_instance <= 12, "{per_instance} WAL bytes per instance");
        let loaded = store.load().unwrap();
        assert_eq!(loaded.len(), N);
        assert!(loaded.iter().all(|s| s.service.last_heartbeat == Some(120)));

        // A flush of some times keeps the others of their chunks.
        store
            .last_seen(&[(keys[5], 130), (keys[250], 140)])
            .unwrap();
        let times: BTreeMap<i64, Option<i64>> = store
            .load()
            .unwrap()
            .iter()
            .map(|s| (s.key, s.service.last_heartbeat))
            .collect();
        assert_eq!(times[&keys[4]], Some(120));
        assert_eq!(times[&keys[5]], Some(130));
        assert_eq!(times[&keys[6]], Some(120));
        assert_eq!(times[&keys[250]], Some(140));
    }

    #[test]
    fn last_seen_times_of_any_row_id_are_kept_and_go_with_their_row() {
        let mut store = SqliteStore::open(None).unwrap();
        let insert = |store: &SqliteStore, id: i64| {
            store
                .connection()
                .execute(
                    "INSERT INTO service (id, cluster, hostname, service_type, instance_id, \
                     state, registered_at) VALUES (?1, 'c', ?2, ?3, ?4, 'active', 50)",
                    params![
                        id,
                        format!("h{id}"),
                        ServiceType::MetricCollector.code(),
                        super::super::format_instance_id(id.unsigned_abs().into())
                    ],
                )
                .unwrap();
        };
        let ids = [-121, -120, -1, 0, 1, 119, 120, 1 << 40];
        for id in ids {
            insert(&store, id);
        }
        let writes: Vec<(i64, i64)> = ids.iter().map(|&id| (id, 1000 + id % 1000)).collect();
        store.last_seen(&writes).unwrap();
        let times = |store: &mut SqliteStore| -> BTreeMap<i64, Option<i64>> {
            store
                .load()
                .unwrap()
                .iter()
                .map(|s| (s.key, s.service.last_heartbeat))
                .collect()
        };
        let expected: BTreeMap<i64, Option<i64>> =
            writes.iter().map(|&(id, at)| (id, Some(at))).collect();
        assert_eq!(times(&mut store), expected);

        // Deleted by another tool and inserted again under the same id: no inherited time.
        for id in [-1, 119] {
            store
                .connection()
                .execute("DELETE FROM service WHERE id = ?1", [id])
                .unwrap();
            insert(&store, id);
        }
        let now = times(&mut store);
        assert_eq!((now[&-1], now[&119]), (None, None));
        assert_eq!(
            (now[&-120], now[&0], now[&120]),
            (Some(880), Some(1000), Some(1120))
        );
    }

    #[tokio::test]
    async fn a_file_made_before_the_last_seen_table_opens_with_its_times_and_flushes_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        let id = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn.execute(
            "INSERT INTO service (cluster, hostname, service_type, instance_id, scope, state, \
             registered_at, last_heartbeat) VALUES ('c', 'h', ?1, ?2, 'cluster', 'active', 50, 100)",
            params![ServiceType::MetricCollector.code(), id],
        )
        .unwrap();
        let instance = parse_instance_id(id).unwrap();
        let column =
            |sql: &str| -> Option<i64> { conn.query_row(sql, [], |row| row.get(0)).unwrap() };

        let r = Registry::open(Some(&path)).unwrap();
        assert_eq!(r.lookup(id).unwrap().last_heartbeat, Some(100));
        assert_eq!(
            r.heartbeat_batch(vec![(instance, 200)])
                .await
                .unwrap()
                .activated,
            0
        );
        assert_eq!(r.flush_last_seen().await.unwrap(), 1);
        // The row keeps the time of its latest state change; the flush wrote its chunk.
        assert_eq!(column("SELECT last_heartbeat FROM service"), Some(100));
        assert_eq!(
            column("SELECT length(times) FROM ccfleet_last_seen"),
            Some(960)
        );
        let reopened = Registry::open(Some(&path)).unwrap();
        assert_eq!(reopened.lookup(id).unwrap().last_heartbeat, Some(200));
        drop(reopened);

        // A state change later than the written-behind time wins at the next start.
        assert_eq!(r.mark_stale(300).await.unwrap(), 1);
        assert_eq!(
            r.heartbeat_batch(vec![(instance, 310)])
                .await
                .unwrap()
                .activated,
            1
        );
        drop(r);
        let svc = Registry::open(Some(&path)).unwrap().lookup(id).unwrap();
        assert_eq!((svc.state, svc.last_heartbeat), (State::Active, Some(310)));
    }

    /// The names of the indexes on `service`.
    fn service_indexes(conn: &Connection) -> Vec<String> {
        conn.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'service'")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[tokio::test]
    async fn a_file_with_the_cluster_and_scope_indexes_loses_them_and_keeps_its_rows_and_unique_key()
     {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        // cc-backend's layout, as earlier versions created it: both dropped indexes present.
        let old = SCHEMA
            .replace(
                "DROP INDEX IF EXISTS services_cluster;",
                "CREATE INDEX IF NOT EXISTS services_cluster ON service (cluster);",
            )
            .replace(
                "DROP INDEX IF EXISTS services_scope;",
                "CREATE INDEX IF NOT EXISTS services_scope ON service (scope);",
            )
            .replace(
                "UNIQUE (cluster, hostname, service_type)",
                "UNIQUE (cluster, hostname, service_type),\n    UNIQUE (instance_id)",
            );
        assert!(old.contains("ON service (cluster)") && old.contains("ON service (scope)"));
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&old).unwrap();
            conn.execute_batch(
                "INSERT INTO service (cluster, hostname, service_type, instance_id, state, \
                 registered_at, last_heartbeat, config_revision, meta_data) VALUES \
                 ('c', 'h1', 'ccmc', '0123456789abcdef0123456789abcdef', 'active', 10, 20, 7, '{\"rack\":\"r1\"}'), \
                 ('c', 'h2', 'ccmc', 'fedcba9876543210fedcba9876543210', 'pending', 11, NULL, 0, NULL)",
            )
            .unwrap();
            let indexes = service_indexes(&conn);
            assert!(
                indexes.contains(&"services_cluster".to_owned()),
                "{indexes:?}"
            );
            assert!(
                indexes.contains(&"services_scope".to_owned()),
                "{indexes:?}"
            );
        }
        let r = Registry::open(Some(&path)).unwrap();
        let kept = r.lookup("0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!((kept.hostname.as_str(), kept.state), ("h1", State::Active));
        assert_eq!(kept.last_heartbeat, Some(20));
        assert_eq!(kept.meta.get("rack").map(String::as_str), Some("r1"));
        assert!(r.lookup("fedcba9876543210fedcba9876543210").is_some());
        // Re-registering a member of the old file keeps its one row and its revision.
        let reg = Registration {
            scope: Scope::Cluster,
            cluster: "c".into(),
            hostname: "h1".into(),
            service_type: ServiceType::MetricCollector,
            meta: BTreeMap::new(),
        };
        let again = r.register(reg.clone()).await.unwrap();
        assert_eq!(again.config_revision, 7);
        let twice = r.register(reg).await.unwrap();
        assert_ne!(again.instance_id, twice.instance_id);
        assert!(r.lookup("0123456789abcdef0123456789abcdef").is_none());
        drop(r);
        let conn = Connection::open(&path).unwrap();
        let indexes = service_indexes(&conn);
        assert!(
            !indexes.contains(&"services_cluster".to_owned()),
            "{indexes:?}"
        );
        assert!(
            !indexes.contains(&"services_scope".to_owned()),
            "{indexes:?}"
        );
        assert!(
            indexes.contains(&"services_state_heartbeat".to_owned()),
            "{indexes:?}"
        );
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM service", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 2, "one member, one row");
        // The unique key still holds in the file itself.
        let duplicate = conn.execute(
            "INSERT INTO service (cluster, hostname, service_type, instance_id, registered_at) \
             VALUES ('c', 'h1', 'ccmc', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 12)",
            [],
        );
        assert!(
            duplicate.is_err(),
            "a second row for one member was accepted"
        );
        drop(conn);
        let reopened = Registry::open(Some(&path)).unwrap();
        assert!(reopened.lookup(&twice.instance_id).is_some());
        assert_eq!(reopened.counts().active + reopened.counts().pending, 2);
    }

    #[test]
    fn a_new_file_has_no_index_on_the_cluster_alone_nor_on_the_scope() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(Some(&dir.path().join("fleet.sqlite"))).unwrap();
        let indexes = service_indexes(store.connection());
        assert!(
            !indexes.contains(&"services_cluster".to_owned()),
            "{indexes:?}"
        );
        assert!(
            !indexes.contains(&"services_scope".to_owned()),
            "{indexes:?}"
        );
        // The unique key (an automatic index) serves lookups by cluster instead.
        assert!(
            indexes
                .iter()
                .any(|name| name.starts_with("sqlite_autoindex_service")),
            "{indexes:?}"
        );
    }

    #[test]
    fn sqlite_errors_keep_their_kind_and_source() {
        let store = SqliteStore::open(None).unwrap();
        // A second row for the same (cluster, hostname, type).
        let insert = "INSERT INTO service (cluster, hostname, service_type, instance_id, \
                      registered_at) VALUES ('c', 'h', 'ccmc', 'i', 0)";
        store.connection().execute(insert, []).unwrap();
        let e: RegistryError = store.connection().execute(insert, []).unwrap_err().into();
        assert_eq!(e.kind(), RegistryErrorKind::Conflict);
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.to_string().starts_with("fleet registry: "), "{e}");
    }
}
