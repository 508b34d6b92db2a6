//! The state every clone of a registry handle shares: the store, the index, the outcome of
//! writes and the registrations waiting for their group commit.

use std::sync::{Mutex, RwLock};

use super::CatchUp;
use super::index::Index;
use super::write_health::WriteHealth;
use super::{Registered, Registration, RegistryError, RegistryStore};

/// What every clone of a [`Registry`](super::Registry) shares.
pub(super) struct Shared {
    pub(super) store: Mutex<Box<dyn RegistryStore>>,
    pub(super) index: RwLock<Index>,
    pub(super) writes: WriteHealth,
    pub(super) registrations: Mutex<RegistrationQueue>,
    /// Signalled when the queue reaches a gathering committer's `gather_until`.
    pub(super) gathered: std::sync::Condvar,
    pub(super) catch_up: std::sync::OnceLock<CatchUp>,
    /// The store's [`RegistryStore::degraded`] after its latest call, for health checks
    /// that must not wait for the store lock.
    pub(super) degraded: Mutex<Option<String>>,
}

/// A registration waiting for its group commit, and where its answer goes.
pub(super) struct Waiting {
    pub(super) reg: Registration,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Registered, RegistryError>>,
}

/// Registrations not yet committed; `committing` while a committer task drains them.
#[derive(Default)]
pub(super) struct RegistrationQueue {
    pub(super) waiting: Vec<Waiting>,
    pub(super) committing: bool,
    /// While a committer gathers: how many waiting registrations end its wait (0: none
    /// gathers).
    pub(super) gather_until: usize,
}

impl Shared {
    pub(super) fn registrations(&self) -> std::sync::MutexGuard<'_, RegistrationQueue> {
        self.registrations.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes over what the store says of itself after a call (it holds the store lock).
    pub(super) fn note_degraded(&self, store: &dyn RegistryStore) {
        *self.degraded.lock().unwrap_or_else(|e| e.into_inner()) = store.degraded();
    }

    pub(super) fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}
