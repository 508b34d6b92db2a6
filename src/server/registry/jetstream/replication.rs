//! Keeping a server's index in step with the bucket and the other servers: the watch of
//! the bucket, and the last-seen digests servers publish to each other.

use std::sync::{Arc, Mutex};

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::super::{Registry, RegistryError};
use super::bucket::{count, unavailable};
use super::record::{Record, parse_kv_key};
use super::*;
use crate::server::stopped;

/// A change the watch delivered: the key, its revision and the record (`None`: deleted).
pub(super) struct Delivered {
    pub(super) key: i64,
    pub(super) revision: u64,
    pub(super) record: Option<Record>,
}

/// What the watch task and the store share.
pub(super) struct Replica {
    /// Changes delivered by the watch, not yet taken over by the index.
    pub(super) inbox: Mutex<Vec<Delivered>>,
    /// The watch, from the initial load until the watch task takes it.
    pub(super) watch: Mutex<Option<kv::Watch>>,
    /// The highest bucket revision the index has taken over.
    pub(super) applied: watch::Sender<u64>,
    /// The highest bucket revision the watch has put into the inbox.
    pub(super) received: watch::Sender<u64>,
}

/// The subject of the last-seen digests of a bucket's servers.
pub fn digest_subject(bucket: &str) -> String {
    format!("ccfleet.registry.{bucket}.seen")
}

/// Encodes `(key, at)` pairs into digests of at most `max_payload` bytes each.
pub(super) fn encode_digest(sender: u64, writes: &[(i64, i64)], max_payload: usize) -> Vec<Bytes> {
    let per_chunk = (max_payload.saturating_sub(DIGEST_HEADER + 64) / DIGEST_ENTRY).max(1);
    let mut chunks = Vec::new();
    for part in writes.chunks(per_chunk) {
        let base = part.iter().map(|w| w.1).min().unwrap_or(0);
        let mut buf = Vec::with_capacity(DIGEST_HEADER + part.len() * DIGEST_ENTRY);
        buf.extend_from_slice(DIGEST_MAGIC);
        buf.extend_from_slice(&sender.to_le_bytes());
        buf.extend_from_slice(&base.to_le_bytes());
        buf.extend_from_slice(&(part.len() as u32).to_le_bytes());
        for &(key, at) in part {
            buf.extend_from_slice(&(key as u64).to_le_bytes());
            let offset = u32::try_from(at.saturating_sub(base)).unwrap_or(u32::MAX);
            buf.extend_from_slice(&offset.to_le_bytes());
        }
        chunks.push(Bytes::from(buf));
    }
    chunks
}

/// Decodes a digest: its sender and `(key, at)` pairs; `None` if it is malformed.
pub(super) fn decode_digest(bytes: &[u8]) -> Option<(u64, Vec<(i64, i64)>)> {
    let header = bytes.get(..DIGEST_HEADER)?;
    if &header[..4] != DIGEST_MAGIC {
        return None;
    }
    let sender = u64::from_le_bytes(header[4..12].try_into().ok()?);
    let base = i64::from_le_bytes(header[12..20].try_into().ok()?);
    let n = u32::from_le_bytes(header[20..24].try_into().ok()?) as usize;
    let body = &bytes[DIGEST_HEADER..];
    if body.len() != n.checked_mul(DIGEST_ENTRY)? {
        return None;
    }
    let entries = body
        .chunks_exact(DIGEST_ENTRY)
        .map(|e| {
            let key = u64::from_le_bytes(e[..8].try_into().expect("8 bytes")) as i64;
            let offset = u32::from_le_bytes(e[8..].try_into().expect("4 bytes"));
            (key, base.saturating_add(i64::from(offset)))
        })
        .collect();
    Some((sender, entries))
}

/// The tasks that keep a server's index in step with the bucket and the other servers.
pub struct Replication {
    pub(super) client: async_nats::Client,
    pub(super) kv: kv::Store,
    pub(super) replica: Arc<Replica>,
    pub(super) subject: String,
    pub(super) sender: u64,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Replication {
    /// Starts the watch task and the digest receiver, and lets `registry` wait for the
    /// watch when a request names an instance it does not know. `changed` is called after
    /// changes from other servers reached the index.
    pub async fn spawn(
        self,
        registry: Registry,
        changed: impl Fn() + Send + Sync + 'static,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Vec<JoinHandle<()>>, RegistryError> {
        let kv = self.kv.clone();
        let applied = self.replica.applied.subscribe();
        registry.set_catch_up(Arc::new(move || {
            let kv = kv.clone();
            let mut applied = applied.clone();
            Box::pin(async move {
                count(1);
                let Ok(info) = kv.stream.get_info().await else {
                    return false;
                };
                let last = info.state.last_sequence;
                tokio::time::timeout(CATCH_UP_WAIT, applied.wait_for(|&seen| seen >= last))
                    .await
                    .is_ok_and(|r| r.is_ok())
            })
        }));
        let digests = self
            .client
            .subscribe(self.subject.clone())
            .await
            .map_err(|e| unavailable("subscribing to last-seen digests", e))?;
        let changed = Arc::new(changed);
        let applier = tokio::spawn(apply_task(
            self.replica.clone(),
            registry.clone(),
            changed,
            shutdown.clone(),
        ));
        let watcher = tokio::spawn(watch_task(self.kv, self.replica, shutdown.clone()));
        let receiver = tokio::spawn(digest_task(digests, self.sender, registry, shutdown));
        Ok(vec![watcher, applier, receiver])
    }
}

pub(super) async fn watch_task(
    kv: kv::Store,
    replica: Arc<Replica>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut watch = replica
        .watch
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let mut received = *replica.received.borrow();
    let mut failing = false;
    loop {
        let mut stream = match watch.take() {
            Some(w) => w,
            None => {
                count(1);
                match kv.watch_all_from_revision(received + 1).await {
                    Ok(w) => {
                        if failing {
                            tracing::warn!("fleet registry: the bucket watch works again");
                            failing = false;
                        }
                        w
                    }
                    Err(e) => {
                        if !failing {
                            tracing::error!(
                                "fleet registry: cannot watch the bucket, retrying: {e}"
                            );
                            failing = true;
                        }
                        tokio::select! {
                            _ = stopped(&mut shutdown) => return,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        }
                    }
                }
            }
        };
        // The bucket's last revision seen at the previous silent look, if the watch was
        // behind it then.
        let mut behind: Option<u64> = None;
        loop {
            let next = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                next = stream.next() => next,
                // A watch can fall silent without an error: the client library recreating
                // its consumer may wait forever for one placed on a NATS node that just
                // died, and heartbeats keep a stuck consumer looking alive.
                _ = tokio::time::sleep(WATCH_CHECK_INTERVAL) => {
                    count(1);
                    let last = tokio::time::timeout(REQUEST_TIMEOUT, kv.stream.get_info())
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|info| info.state.last_sequence);
                    match last {
                        Some(last) if last > received => {
                            if behind.is_some() {
                                tracing::warn!(
                                    "fleet registry: the bucket watch delivered nothing for {} \
                                     while the bucket moved on (revision {last}, the watch is at \
                                     {received}); watching anew",
                                    crate::duration::format(WATCH_CHECK_INTERVAL * 2),
                                );
                                break;
                            }
                            behind = Some(last);
                        }
                        // Up to date, or JetStream did not answer: nothing to tell yet.
                        _ => behind = None,
                    }
                    continue;
                }
            };
            behind = None;
            let first = match next {
                Some(Ok(entry)) => entry,
                Some(Err(e)) => {
                    tracing::warn!("fleet registry: bucket watch broke, resuming: {e}");
                    break;
                }
                None => break,
            };
            // Take everything already delivered in one go: one index update per burst.
            let mut batch = vec![first];
            while batch.len() < 4096 {
                match futures::FutureExt::now_or_never(stream.next()) {
                    Some(Some(Ok(entry))) => batch.push(entry),
                    _ => break,
                }
            }
            {
                let mut inbox = replica.inbox.lock().unwrap_or_else(|e| e.into_inner());
                for entry in batch {
                    received = received.max(entry.revision);
                    let Some(key) = parse_kv_key(&entry.key) else {
                        continue;
                    };
                    let record = match entry.operation {
                        Operation::Put => match Record::decode(&entry.value) {
                            Ok(r) => Some(r),
                            Err(e) => {
                                tracing::error!("fleet registry: ignoring a bucket change: {e}");
                                continue;
                            }
                        },
                        Operation::Delete | Operation::Purge => None,
                    };
                    inbox.push(Delivered {
                        key,
                        revision: entry.revision,
                        record,
                    });
                }
            }
            // The index is updated by the applier task: a store call waiting for the watch
            // (holding the store lock) must not keep the watch from reading on.
            replica.received.send_replace(received);
        }
    }
}

/// Takes what the watch delivered into the index, whenever it delivered something.
pub(super) async fn apply_task(
    replica: Arc<Replica>,
    registry: Registry,
    changed: Arc<dyn Fn() + Send + Sync>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut received = replica.received.subscribe();
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            r = received.changed() => if r.is_err() { return },
        }
        // Everything up to this revision is in the inbox (or already in the cache).
        let target = *received.borrow_and_update();
        match registry.apply_remote().await {
            Ok(0) => {}
            Ok(_) => changed(),
            Err(e) => tracing::error!("fleet registry: applying bucket changes: {e}"),
        }
        replica.applied.send_if_modified(|applied| {
            let moved = target > *applied;
            *applied = (*applied).max(target);
            moved
        });
    }
}

pub(super) async fn digest_task(
    mut digests: async_nats::Subscriber,
    own: u64,
    registry: Registry,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut malformed = false;
    loop {
        let message = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            m = digests.next() => match m { Some(m) => m, None => return },
        };
        match decode_digest(&message.payload) {
            Some((sender, _)) if sender == own => {}
            Some((_, entries)) => registry.apply_last_seen(&entries),
            None => {
                if !malformed {
                    tracing::warn!(
                        "fleet registry: ignoring a malformed last-seen digest on {} (further ones are not logged)",
                        crate::untrusted::Untrusted(message.subject.as_str())
                    );
                    malformed = true;
                }
            }
        }
    }
}
