//! Last-seen times of the SQLite registry, written behind in compact chunks.
//!
//! `ccfleet_last_seen` holds one row per 120 consecutive service row ids: `chunk` is the
//! row id divided by 120 (rounded down), `times` the last-seen times of those 120 services,
//! 8 bytes each (little-endian Unix seconds; 0 for none), in row id order. A row of 960
//! bytes fills a 1 KiB page without an overflow page, so a flush in which every instance
//! heartbeated writes about 8.5 bytes per instance (to the WAL, and again into the file at
//! the checkpoint) and one statement per 120 instances. Updating `service.last_heartbeat`
//! instead rewrote each service's wide row and moved its entry in the
//! (state, last_heartbeat) index: about 100 bytes of WAL per instance and a statement each.
//!
//! `service.last_heartbeat` is still written by every state change (a heartbeat that
//! activates); the last-seen time of a service is the later of the two. A service row
//! deleted by another tool clears its time here, so a reused row id never inherits one.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::server::error::RegistryError;

/// Services per row.
const CHUNK: i64 = 120;
/// Bytes per time.
const TIME: usize = 8;
/// Bytes of a full row's `times`.
const CHUNK_BYTES: usize = CHUNK as usize * TIME;

/// The table, and the trigger that clears the time of a deleted service (the expressions
/// are [`chunk_of`] and [`offset_of`] in SQL, for negative row ids too).
const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS ccfleet_last_seen (
    chunk INTEGER PRIMARY KEY,
    times BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS ccfleet_last_seen_gone AFTER DELETE ON service
BEGIN
    UPDATE ccfleet_last_seen
    SET times = CAST(substr(times, 1, 8 * ((old.id % 120 + 120) % 120))
        || zeroblob(8) || substr(times, 8 * ((old.id % 120 + 120) % 120) + 9) AS BLOB)
    WHERE chunk = (old.id - (old.id % 120 + 120) % 120) / 120
        AND length(times) >= 8 * ((old.id % 120 + 120) % 120) + 8;
END;
"#;

/// The objects [`SCHEMA`] creates, as `(type, name)` in `sqlite_master`.
pub(super) const CREATED: &[(&str, &str)] = &[
    ("table", "ccfleet_last_seen"),
    ("trigger", "ccfleet_last_seen_gone"),
];

fn chunk_of(key: i64) -> i64 {
    key.div_euclid(CHUNK)
}

/// The byte offset of `key`'s time in its chunk.
fn offset_of(key: i64) -> usize {
    key.rem_euclid(CHUNK) as usize * TIME
}

/// Creates the table in a file that lacks it (every file made before it existed).
pub(super) fn create_table(conn: &Connection) -> Result<(), RegistryError> {
    conn.execute_batch(SCHEMA)?;
    Ok(())
}

/// Every chunk, read once when the registry is loaded (none of a file that lacks the table).
#[derive(Default)]
pub(super) struct LastSeen {
    chunks: HashMap<i64, Vec<u8>>,
}

impl LastSeen {
    /// Reads every chunk.
    pub(super) fn load(conn: &Connection) -> Result<LastSeen, RegistryError> {
        let mut stmt = conn.prepare("SELECT chunk, times FROM ccfleet_last_seen")?;
        let mut rows = stmt.query([])?;
        let mut chunks = HashMap::new();
        while let Some(row) = rows.next()? {
            // A blob, or text of the same bytes; anything else another tool wrote there
            // counts as no times (they are only the newest of two).
            if let Ok(times) = row.get_ref(1)?.as_bytes() {
                chunks.insert(row.get(0)?, times.to_vec());
            }
        }
        Ok(LastSeen { chunks })
    }

    /// The last-seen time written behind for `key`, if any.
    pub(super) fn get(&self, key: i64) -> Option<i64> {
        let offset = offset_of(key);
        let bytes = self
            .chunks
            .get(&chunk_of(key))?
            .get(offset..offset + TIME)?;
        let at = i64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        (at != 0).then_some(at)
    }
}

/// Writes the times `(key, at)` (each key once) into their chunks, in `tx`. A chunk that
/// gets all of its 120 times is written without reading it first.
pub(super) fn write(tx: &Transaction<'_>, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
    let mut writes = writes.to_vec();
    writes.sort_unstable();
    let mut read = tx.prepare_cached("SELECT times FROM ccfleet_last_seen WHERE chunk = ?1")?;
    let mut put = tx.prepare_cached(
        "INSERT INTO ccfleet_last_seen (chunk, times) VALUES (?1, ?2) \
         ON CONFLICT (chunk) DO UPDATE SET times = excluded.times",
    )?;
    let mut times = Vec::with_capacity(CHUNK_BYTES);
    for group in writes.chunk_by(|a, b| chunk_of(a.0) == chunk_of(b.0)) {
        let chunk = chunk_of(group[0].0);
        times.clear();
        if group.len() < CHUNK as usize {
            let old = read
                .query_row(params![chunk], |row| {
                    Ok(row.get_ref(0)?.as_bytes().unwrap_or_default().to_vec())
                })
                .optional()?;
            times.extend_from_slice(old.as_deref().unwrap_or_default());
        }
        times.resize(CHUNK_BYTES, 0);
        for &(key, at) in group {
            let offset = offset_of(key);
            times[offset..offset + TIME].copy_from_slice(&at.to_le_bytes());
        }
        put.execute(params![chunk, times])?;
    }
    Ok(())
}
