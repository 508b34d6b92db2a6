//! A SQLite registry file whose schema change cannot be written (a full disk, as SQLite
//! sees it when the file may not grow): the store serves what the file holds, says it is
//! degraded, and writes the change before the first write that finds space.

use rusqlite::Connection;

use super::sqlite_open;
use super::*;

/// A file from before the tables of ccfleet's own, with an index the schema drops, and one
/// active service; a connection to it that may not grow the file.
fn old_file_on_a_full_disk(path: &std::path::Path, id: &str) -> Connection {
    {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; \
             CREATE TABLE service (id INTEGER PRIMARY KEY, cluster TEXT NOT NULL, \
             hostname TEXT NOT NULL, service_type TEXT NOT NULL, instance_id TEXT NOT NULL, \
             scope TEXT NOT NULL DEFAULT 'cluster', state TEXT NOT NULL DEFAULT 'pending', \
             registered_at INTEGER NOT NULL, last_heartbeat INTEGER, \
             config_revision INTEGER NOT NULL DEFAULT 0, meta_data TEXT, \
             UNIQUE (cluster, hostname, service_type)); \
             CREATE INDEX services_cluster ON service (cluster);",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO service (cluster, hostname, service_type, instance_id, state, \
             registered_at, last_heartbeat) VALUES ('c', 'h', 'ccmc', ?1, 'active', 10, 20)",
            [id],
        )
        .unwrap();
    }
    let conn = sqlite_open::connect(path, false).unwrap();
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .unwrap();
    conn.pragma_update(None, "max_page_count", pages).unwrap();
    conn
}

#[tokio::test]
async fn a_registry_whose_schema_change_waits_serves_the_file_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.sqlite");
    let id = "0123456789abcdef0123456789abcdef";
    let conn = old_file_on_a_full_disk(&path, id);
    let pending = sqlite_open::bring_up_if_needed(&conn, true).unwrap();
    let registry = Registry::new(SqliteStore::opened(conn, pending)).unwrap();
    assert_eq!(registry.lookup(id).unwrap().state, State::Active);
    let degraded = registry.degraded().expect("degraded");
    assert!(degraded.contains("schema change waits"), "{degraded}");
    let error = registry.writable().await.unwrap_err();
    assert!(error.contains("full"), "{error}");
    assert!(registry.degraded().is_some());
}

#[test]
fn a_schema_change_that_cannot_be_written_leaves_the_file_served_and_is_written_with_space() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.sqlite");
    let id = "0123456789abcdef0123456789abcdef";
    let conn = old_file_on_a_full_disk(&path, id);
    let pending = sqlite_open::bring_up_if_needed(&conn, true).unwrap();
    assert!(
        pending.as_deref().is_some_and(|e| e.contains("full")),
        "{pending:?}"
    );
    let mut store = SqliteStore::opened(conn, pending);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].instance, parse_instance_id(id).unwrap());
    assert_eq!(loaded[0].service.last_heartbeat, Some(20));
    assert_eq!(store.get_state("rollout").unwrap(), None);
    let degraded = store.degraded().expect("a schema change waits");
    assert!(
        degraded.contains("schema change waits for space"),
        "{degraded}"
    );
    // Every write tries the change first, and fails while there is no space.
    let error = store.probe().unwrap_err();
    assert!(error.to_string().contains("full"), "{error}");
    assert!(store.degraded().is_some());

    store
        .connection()
        .pragma_update(None, "max_page_count", 1 << 30)
        .unwrap();
    store.probe().unwrap();
    assert_eq!(store.degraded(), None);
    store.put_state("rollout", b"{}").unwrap();
    assert_eq!(store.get_state("rollout").unwrap(), Some(b"{}".to_vec()));
    store.last_seen(&[(loaded[0].key, 30)]).unwrap();
    drop(store);
    let mut reopened = SqliteStore::open(Some(&path)).unwrap();
    assert_eq!(reopened.degraded(), None);
    assert_eq!(reopened.load().unwrap()[0].service.last_heartbeat, Some(30));
    let dropped: i64 = reopened
        .connection()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'services_cluster'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(dropped, 0);
}
