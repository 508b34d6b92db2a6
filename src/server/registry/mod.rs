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

mod group_commit;
mod handle;
mod index;
pub mod jetstream;
pub mod lock;
mod shared;
mod sqlite;
#[cfg(test)]
mod sqlite_degraded_tests;
mod sqlite_last_seen;
mod sqlite_open;
mod store;
#[cfg(test)]
mod tests;
mod types;
mod write_health;

pub use super::error::{RegistryError, RegistryErrorKind};
pub use handle::{LAST_SEEN_FLUSH_INTERVAL, Registry};
pub use lock::DatabaseLock;
pub use sqlite::SqliteStore;
pub use sqlite_open::JOURNAL_SIZE_LIMIT;
pub use store::{CatchUp, RegistryStore};
pub use types::{
    BatchOutcome, Registered, Registration, Service, State, StateCounts, StoredService, Upserted,
    unix_seconds,
};
pub use write_health::PROBE_INTERVAL;
// Instance ids are checked, parsed and formatted by the wire module, the registry included.
pub use crate::wire::{format_instance_id, parse_instance_id};

use group_commit::GROUP_COMMIT_GATHER;
#[cfg(doc)]
use group_commit::GROUP_COMMIT_SIBLINGS;
