//! Group commit of registrations: concurrent registrations queue, and one committer task
//! writes them in one store call, waiting a little for more during a storm.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{Shared, Waiting};
use super::{
    Registered, RegistryError, RegistryErrorKind, RegistryStore, Service, State,
    format_instance_id, unix_seconds,
};

/// Registrations committed together in one store write at most: bounds the write's size
/// (and WAL growth) and the wait of the first registration in the group.
pub(super) const GROUP_COMMIT_MAX: usize = 1024;

/// A group of at least this many registrations means a storm is under way (a cluster
/// reboot): the committer then waits up to the store's [`RegistryStore::group_gather`]
/// (the SQLite store: [`GROUP_COMMIT_GATHER`]) for more before it writes, as
/// PostgreSQL's `commit_delay` does when `commit_siblings` transactions are active; within
/// a storm only until as many queued as its previous group held (see `gather`). Each
/// commit rewrites the last pages of the table and of every index it touches, so a few
/// large commits write far fewer bytes (and syncs) than many small ones; a lone
/// registration is never delayed.
pub(super) const GROUP_COMMIT_SIBLINGS: usize = 8;

/// How long a storm's group waits for more registrations before the SQLite store writes it.
pub(super) const GROUP_COMMIT_GATHER: Duration = Duration::from_millis(2);

/// Drains the registration queue in group commits until it is empty. Runs on the blocking
/// pool; at most one runs at a time (the queue's `committing` flag).
pub(super) fn commit_registrations(shared: &Shared) {
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
        shared.note_degraded(store.as_ref());
    }
}

/// Lets a storm's group wait for more: until as many registrations queued as the previous
/// group of the storm held (`previous`; the clients it answered are sending their next
/// ones), at most `delay`, then takes what queued. No wait when that many are there
/// already, so the committer never sleeps while a full group waits; none for a lone
/// registration either (fewer than [`GROUP_COMMIT_SIBLINGS`] queued and no storm under
/// way). `committing` stays set throughout, so the registrations queued meanwhile wait
/// for this committer.
pub(super) fn gather(
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
pub(super) fn commit_group(shared: &Shared, store: &mut dyn RegistryStore, group: Vec<Waiting>) {
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
