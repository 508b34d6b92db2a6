//! Opening a SQLite registry file without writing to it, so that a server on a full disk
//! starts again and serves what the file holds.
//!
//! A file whose schema is current is only read while it is opened: the `CREATE ... IF NOT
//! EXISTS` statements of the schema are not even run (on a full disk SQLite may fail some of
//! them although there is nothing to create). A file that needs a change (a new table, a
//! dropped index, WAL mode) gets it in one transaction; when that cannot be written for want
//! of space or a working disk, the store opens all the same, serves what the file holds (a
//! table that is missing counts as empty), reports itself degraded and tries the change
//! again before every write (see `SqliteStore`).
//!
//! A WAL database needs its shared-memory index, the `-shm` file (32 KiB), which SQLite
//! creates when it is missing (after a clean stop it is removed with the WAL). On a full
//! disk that fails and no read works. The connection then opens in exclusive locking mode,
//! where SQLite keeps the index in the process's memory instead: the server serves and
//! writes as usual once there is space, but no other program can read the file while it
//! runs.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::sqlite_last_seen;
use crate::server::error::{RegistryError, RegistryErrorKind};

/// The page size of new files, bytes.
pub(super) const PAGE_SIZE: i64 = 1024;
/// Frames after which a commit checkpoints the WAL into the database: 4 MiB with 1 KiB
/// pages, as SQLite's default of 1 000 frames gives with 4 KiB pages.
const WAL_AUTOCHECKPOINT: i64 = 4000;
/// The size the WAL file is truncated back to after a checkpoint. The file grows past
/// `WAL_AUTOCHECKPOINT` frames only by the last transaction, which for a large heartbeat
/// batch can be tens of MiB; this gives that space back once it is checkpointed.
pub const JOURNAL_SIZE_LIMIT: i64 = 16 << 20;

/// cc-backend's `service` table, without its unique index on `instance_id`: ids are random,
/// so every registration would insert at a random place of that index and rewrite a page
/// of it (most of the bytes a registration wrote). The server never asks the database for
/// an id: it loads every row at start and resolves ids in memory, where it also keeps them
/// unique. Files created with the index keep it (it is only slower). Rows are appended in
/// key order, and the (cluster, hostname, type) index grows at the end of each cluster
/// when host names are sequential, as after a cluster reboot.
///
/// cc-backend's indexes on `cluster` alone and on `scope` are dropped, in old files too:
/// the server never reads through them, the unique (cluster, hostname, type) index starts
/// with the cluster and serves every query the first could, and a scope has two values.
/// Keeping them cost every group commit a rewrite of one more page per cluster
/// registering, and each registration two more index entries: about a third of the bytes
/// a registration storm wrote.
pub(super) const SCHEMA: &str = r#"
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
    UNIQUE (cluster, hostname, service_type)
);
DROP INDEX IF EXISTS services_cluster;
DROP INDEX IF EXISTS services_scope;
CREATE INDEX IF NOT EXISTS services_state_heartbeat ON service (state, last_heartbeat);
CREATE TABLE IF NOT EXISTS ccfleet_health (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ccfleet_state (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
"#;

/// The objects [`SCHEMA`] creates, as `(type, name)` in `sqlite_master`.
const CREATED: &[(&str, &str)] = &[
    ("table", "service"),
    ("index", "services_state_heartbeat"),
    ("table", "ccfleet_health"),
    ("table", "ccfleet_state"),
];
/// The indexes [`SCHEMA`] drops.
const DROPPED: &[&str] = &["services_cluster", "services_scope"];

/// An opened registry file.
pub(super) struct Opened {
    pub(super) conn: Connection,
    /// Why the schema change the file needs is not written yet.
    pub(super) pending: Option<String>,
    /// The `-shm` file could not be created: the connection holds the file exclusively.
    pub(super) exclusive: bool,
}

/// Opens (creating if needed) the registry file `path`, writing nothing when its schema is
/// current.
pub(super) fn open_file(path: &Path) -> Result<Opened, RegistryError> {
    let (conn, exclusive) = match connect(path, false) {
        Ok(conn) => (conn, false),
        Err(e) if is_shared_memory_error(&e) => {
            tracing::warn!(
                "fleet registry: cannot create the shared-memory index of {} ({e}; the disk may \
                 be full); the server keeps it in its own memory and holds the database \
                 exclusively: other programs cannot read it until the server restarts with \
                 space free",
                path.display()
            );
            (connect(path, true)?, true)
        }
        Err(e) => return Err(e.into()),
    };
    let pending = bring_up_if_needed(&conn, true)?;
    if let Some(e) = &pending {
        tracing::warn!(
            "fleet registry: cannot write the schema change {} needs ({e}); serving what it \
             holds, the change is tried again before every write",
            path.display()
        );
    }
    Ok(Opened {
        conn,
        pending,
        exclusive,
    })
}

/// A registry in memory, for tests and file-less servers.
pub(super) fn open_memory() -> Result<Connection, RegistryError> {
    let conn = Connection::open_in_memory()?;
    configure(&conn)?;
    bring_up(&conn, false)?;
    Ok(conn)
}

/// A connection to `path` with the server's settings, after a first read (which maps the
/// shared-memory index of a WAL file). Nothing is written.
pub(super) fn connect(path: &Path, exclusive: bool) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    if exclusive {
        // Before the first read: only then does SQLite keep the WAL index in memory.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    }
    // A new file gets 1 KiB pages: a write touches rows and index entries scattered over
    // the file (16 clusters registering at once, last-seen times of every instance), and
    // each touched page goes to the WAL and again into the file. An existing file keeps
    // its page size.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
    // FULL syncs the WAL at every commit, so an acknowledged change survives a power loss
    // as well as a crash; group commits share that sync.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Heartbeats touch every row; keep the table and its indexes in memory (the value is
    // in KiB when negative).
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    configure(&conn)?;
    Ok(conn)
}

/// Settings of every connection, file or memory.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // cc-backend's `state IN (four values)` CHECK makes SQLite build and drop a temporary
    // table on every INSERT or UPDATE that sets a state, a tenth of the database's CPU time
    // in a registration storm. This connection writes only `State::as_str` and
    // `Scope::as_str` values into the checked columns, so it skips evaluating the
    // constraints; they stay in the schema for every other writer (tests check the rows
    // the server writes against them).
    conn.pragma_update(None, "ignore_check_constraints", true)
}

/// SQLite could not create or grow the `-shm` file.
fn is_shared_memory_error(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi;
    e.sqlite_error().is_some_and(|e| {
        [
            ffi::SQLITE_IOERR_SHMOPEN,
            ffi::SQLITE_IOERR_SHMSIZE,
            ffi::SQLITE_IOERR_SHMMAP,
        ]
        .contains(&e.extended_code)
    })
}

/// Brings the file's schema up to date unless it is; `Some(error)` when that could not be
/// written (a full disk, an I/O error), so that the store opens with what the file holds.
/// A damaged file fails.
pub(super) fn bring_up_if_needed(
    conn: &Connection,
    file: bool,
) -> Result<Option<String>, RegistryError> {
    if is_current(conn, file)? {
        return Ok(None);
    }
    match bring_up(conn, file) {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == RegistryErrorKind::Unavailable => Ok(Some(e.to_string())),
        Err(e) => Err(e),
    }
}

/// Whether the file has every object of the schema, none it drops, and (a file) WAL mode;
/// read only.
fn is_current(conn: &Connection, file: bool) -> Result<bool, RegistryError> {
    if file {
        let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Ok(false);
        }
    }
    let mut stmt = conn.prepare("SELECT type, name FROM sqlite_master")?;
    let present = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<HashSet<(String, String)>, _>>()?;
    let has = |kind: &str, name: &str| present.contains(&(kind.to_owned(), name.to_owned()));
    Ok(CREATED
        .iter()
        .chain(sqlite_last_seen::CREATED)
        .all(|(kind, name)| has(kind, name))
        && !DROPPED.iter().any(|name| has("index", name)))
}

/// WAL mode (a file), then the schema in one transaction: all of it or nothing.
pub(super) fn bring_up(conn: &Connection, file: bool) -> Result<(), RegistryError> {
    if file {
        // WAL lets readers of other tools coexist with our writer.
        conn.pragma_update(None, "journal_mode", "WAL")?;
    }
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    sqlite_last_seen::create_table(&tx)?;
    tx.commit()?;
    Ok(())
}

/// Whether the table `name` exists.
pub(super) fn table_exists(conn: &Connection, name: &str) -> Result<bool, RegistryError> {
    Ok(conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |row| row.get::<_, i64>(0),
    )? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every object a `CREATE ... IF NOT EXISTS` of the schema names, as `(type, name)`.
    fn created_by(schema: &str) -> Vec<(String, String)> {
        schema
            .split("CREATE ")
            .skip(1)
            .filter_map(|statement| {
                let mut words = statement.split_whitespace();
                let kind = words.next()?.to_lowercase();
                let rest: Vec<&str> = words.take(4).collect();
                let name = match rest.as_slice() {
                    ["IF", "NOT", "EXISTS", name, ..] => name.trim_matches('"'),
                    _ => return None,
                };
                Some((kind, name.to_owned()))
            })
            .collect()
    }

    #[test]
    fn the_check_for_a_current_schema_knows_every_object_the_schema_creates() {
        let created = created_by(SCHEMA);
        let known: Vec<(String, String)> = CREATED
            .iter()
            .map(|(kind, name)| (kind.to_string(), name.to_string()))
            .collect();
        assert_eq!(created, known);
        let conn = Connection::open_in_memory().unwrap();
        assert!(!is_current(&conn, false).unwrap());
        bring_up(&conn, false).unwrap();
        assert!(is_current(&conn, false).unwrap());
        for (kind, name) in sqlite_last_seen::CREATED {
            let found: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = ?1 AND name = ?2",
                    [kind, name],
                    |row| row.get(0),
                )
                .unwrap();
            assert_eq!(found, 1, "{kind} {name}");
        }
        conn.execute_batch("CREATE INDEX services_scope ON service (scope)")
            .unwrap();
        assert!(
            !is_current(&conn, false).unwrap(),
            "a dropped index is back"
        );
    }

    #[test]
    fn a_current_file_is_opened_without_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        drop(open_file(&path).unwrap());
        // A connection that may not write at all still opens the file, with nothing pending.
        let conn = connect(&path, false).unwrap();
        conn.pragma_update(None, "query_only", true).unwrap();
        assert_eq!(bring_up_if_needed(&conn, true).unwrap(), None);
        // It would have failed had it tried.
        assert!(bring_up(&conn, true).is_err());
    }
}
