//! The interface of a durable registry backend, which the registry handle drives.

use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::{GROUP_COMMIT_SIBLINGS, Registry};
use super::{Registration, RegistryError, StoredService, Upserted};

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
    /// most (see `GROUP_COMMIT_SIBLINGS`): worth it where every commit rewrites pages and
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

    /// Why the store works with less than it should, if it does (health checks report it
    /// as degraded): a SQLite file opened on a full disk serves what it holds while a
    /// schema change waits for space.
    fn degraded(&self) -> Option<String> {
        None
    }

    /// A small write that shows whether the store takes writes at all.
    fn probe(&mut self) -> Result<(), RegistryError>;

    /// Saves a document of the server's own state under `name` (a staged rollout's
    /// progress), replacing what was saved under it.
    fn put_state(&mut self, name: &str, value: &[u8]) -> Result<(), RegistryError> {
        let _ = (name, value);
        Err(RegistryError::new(
            super::RegistryErrorKind::Unavailable,
            "this registry keeps no server state",
        ))
    }

    /// The document saved under `name` with [`put_state`](RegistryStore::put_state).
    fn get_state(&mut self, name: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let _ = name;
        Ok(None)
    }

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
