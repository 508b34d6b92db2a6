//! The JetStream [`RegistryStore`]: compare-and-set writes to the bucket, and the cache of
//! what this server last saw of each key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use super::super::{
    Registration, RegistryError, RegistryErrorKind, RegistryStore, State, StoredService, Upserted,
};
use super::bucket::{bucket, count, retry_unavailable, unavailable};
use super::record::{Op, Record, kv_key, parse_kv_key};
use super::replication::{Replica, Replication, digest_subject, encode_digest};
use super::*;
#[cfg(doc)]
use crate::server::registry::Registry;

/// The JetStream key-value [`RegistryStore`]: writes go to the bucket with
/// compare-and-set; a watch feeds changes of other servers into the index.
pub struct JetStreamStore {
    rt: tokio::runtime::Handle,
    client: async_nats::Client,
    kv: kv::Store,
    settings: JetStreamSettings,
    /// Each known key's latest revision and record (this server's view of the bucket).
    cache: HashMap<i64, (u64, Record)>,
    /// Revisions of delete markers met in lost races (a write over one names it).
    tombstones: HashMap<i64, u64>,
    /// Keys whose record was re-read after a lost race (or written by a call that failed
    /// part-way): the index takes over their cached record with the watch's next changes.
    corrections: std::collections::HashSet<i64>,
    replica: Arc<Replica>,
    /// Identifies this server's digests (its own are skipped).
    sender: u64,
}

impl std::fmt::Debug for JetStreamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamStore")
            .field("bucket", &self.settings.bucket)
            .finish_non_exhaustive()
    }
}

impl JetStreamStore {
    /// Opens the store on the bucket named in `settings`, creating the bucket if it is
    /// missing; waits up to [`OPEN_WAIT`] for JetStream to answer (a cluster that restarts
    /// with its fleet servers needs a moment to elect its leaders). Must be called on a
    /// tokio runtime; the store's blocking methods (called by the [`Registry`] on the
    /// blocking pool) run their requests on it.
    pub async fn open(
        client: async_nats::Client,
        settings: JetStreamSettings,
    ) -> Result<JetStreamStore, RegistryError> {
        let kv = retry_unavailable("opening the bucket", OPEN_WAIT, || {
            bucket(&client, &settings, true)
        })
        .await?;
        Ok(JetStreamStore::with_bucket(client, kv, settings))
    }

    /// A store on an existing bucket handle.
    pub fn with_bucket(
        client: async_nats::Client,
        kv: kv::Store,
        settings: JetStreamSettings,
    ) -> JetStreamStore {
        JetStreamStore {
            rt: tokio::runtime::Handle::current(),
            client,
            kv,
            settings,
            cache: HashMap::new(),
            tombstones: HashMap::new(),
            corrections: std::collections::HashSet::new(),
            replica: Arc::new(Replica {
                inbox: Mutex::new(Vec::new()),
                watch: Mutex::new(None),
                applied: watch::channel(0).0,
                received: watch::channel(0).0,
            }),
            sender: u64::from_be_bytes(rand::random()),
        }
    }

    /// The replication side of this store: start it with [`Replication::spawn`] once the
    /// [`Registry`] exists.
    pub fn replication(&self) -> Replication {
        Replication {
            client: self.client.clone(),
            kv: self.kv.clone(),
            replica: self.replica.clone(),
            subject: digest_subject(&self.settings.bucket),
            sender: self.sender,
        }
    }

    /// The bucket handle (for the leader lease and tools).
    pub fn bucket(&self) -> &kv::Store {
        &self.kv
    }

    /// Reads one key's latest message from the stream leader (a replica may lag behind a
    /// write that just won a race): its revision and record (`None`: a delete marker), or
    /// `None` if the key never existed.
    pub(super) async fn fetch(kv: &kv::Store, key: i64) -> Result<Fetched, RegistryError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        count(1);
        let subject = format!("{}{}", kv.prefix, kv_key(key));
        match kv.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => {
                let deleted = message
                    .headers
                    .get("KV-Operation")
                    .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
                let record = if deleted {
                    None
                } else {
                    Some(Record::decode(&message.payload)?)
                };
                Ok(Some((message.sequence, record)))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("reading a service record", e)),
        }
    }

    /// Applies `ops` (each key once) with compare-and-set, re-deciding after lost races.
    /// Returns per op whether it was written. On error the ops written before it stay
    /// written (and reach the index as corrections).
    pub(super) fn write(&mut self, ops: Vec<(i64, Op)>) -> Result<Vec<bool>, RegistryError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        // The client would queue the write until it reconnects and send it then, after its
        // caller was told it failed: refuse at once instead.
        self.connected()?;
        let kv = self.kv.clone();
        let mut done = vec![false; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        let mut failure: Option<RegistryError> = None;
        for attempt in 0..MAX_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let mut writes = Vec::with_capacity(pending.len());
            for &i in &pending {
                let (key, op) = &ops[i];
                let current = self.cache.get(key);
                match op.apply(current.map(|(_, r)| r)) {
                    Ok(Some(record)) => {
                        let revision = current
                            .map(|(rev, _)| *rev)
                            .or_else(|| self.tombstones.get(key).copied())
                            .unwrap_or(0);
                        writes.push((i, *key, revision, record));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if failure.is_some() {
                break;
            }
            let results: Vec<Result<u64, kv::UpdateError>> = self.rt.block_on(async {
                count(writes.len());
                // Revision 0 creates: the write succeeds only if the key does not exist.
                futures::future::join_all(writes.iter().map(|(_, key, revision, record)| {
                    kv.update(kv_key(*key), record.encode(), *revision)
                }))
                .await
            });
            let mut lost = Vec::new();
            for ((i, key, _, record), result) in writes.into_iter().zip(results) {
                match result {
                    Ok(revision) => {
                        done[i] = true;
                        self.cache.insert(key, (revision, record));
                    }
                    Err(e) if lost_race(&e) => {
                        lost.push(key);
                    }
                    Err(e) => {
                        failure.get_or_insert_with(|| unavailable("writing a service record", e));
                    }
                }
            }
            if failure.is_some() {
                break;
            }
            // Lost races: the newest records replace the cache (and, via corrections, the
            // index) and the ops are decided again on them.
            let fresh: Vec<Result<Fetched, RegistryError>> = self.rt.block_on(
                futures::future::join_all(lost.iter().map(|&key| JetStreamStore::fetch(&kv, key))),
            );
            for (key, fresh) in lost.iter().zip(fresh) {
                match fresh {
                    Ok(Some((revision, Some(record)))) => {
                        self.tombstones.remove(key);
                        self.cache.insert(*key, (revision, record));
                        self.corrections.insert(*key);
                    }
                    Ok(Some((revision, None))) => {
                        self.tombstones.insert(*key, revision);
                        self.cache.remove(key);
                        self.corrections.insert(*key);
                    }
                    Ok(None) => {
                        self.cache.remove(key);
                        self.corrections.insert(*key);
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            pending.retain(|&i| lost.contains(&ops[i].0));
            if attempt + 1 == MAX_ATTEMPTS && !pending.is_empty() {
                failure.get_or_insert_with(|| {
                    RegistryError::new(
                        RegistryErrorKind::Conflict,
                        "a service record kept changing under concurrent writes",
                    )
                });
            }
            if failure.is_some() {
                break;
            }
        }
        match failure {
            None => Ok(done),
            Some(e) => {
                // What was written stays written: the index learns it with the watch.
                for (i, (key, _)) in ops.iter().enumerate() {
                    if done[i] {
                        self.corrections.insert(*key);
                    }
                }
                Err(e)
            }
        }
    }

    pub(super) fn connected(&self) -> Result<(), RegistryError> {
        if self.client.connection_state() == async_nats::connection::State::Connected {
            Ok(())
        } else {
            Err(RegistryError::new(
                RegistryErrorKind::Unavailable,
                "JetStream: not connected to NATS",
            ))
        }
    }

    pub(super) fn instance_of(&self, key: i64) -> Option<String> {
        self.cache.get(&key).map(|(_, r)| r.instance.clone())
    }

    /// Copies a service (e.g. from SQLite) into the bucket unless the bucket already has
    /// its member; says which.
    pub async fn copy_in(&self, stored: &StoredService) -> Result<CopyOutcome, RegistryError> {
        let s = &stored.service;
        let key = service_key(s.scope, &s.cluster, &s.hostname, s.service_type);
        let record = Record::from_stored(stored);
        count(1);
        // Revision 0: only if the key does not exist.
        match self.kv.update(kv_key(key), record.encode(), 0).await {
            Ok(_) => Ok(CopyOutcome::Copied),
            Err(e) if lost_race(&e) => match JetStreamStore::fetch(&self.kv, key).await? {
                Some((_, Some(existing))) if existing.instance == record.instance => {
                    Ok(CopyOutcome::AlreadyPresent)
                }
                _ => Ok(CopyOutcome::Differs),
            },
            Err(e) => Err(unavailable("copying a service record", e)),
        }
    }
}

/// Whether a compare-and-set write failed because the key moved on (another writer was
/// first). nats-server answers a mismatch of an expected revision with error 10071, and one
/// of an expected revision 0 (create) with 10164, which the client reports as "other".
pub(super) fn lost_race(e: &kv::UpdateError) -> bool {
    use async_nats::jetstream::ErrorCode;
    if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        if let Some(js) = inner.downcast_ref::<async_nats::jetstream::Error>() {
            return js.error_code() == ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                || js.error_code() == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT;
        }
        source = inner.source();
    }
    false
}

/// A key's latest message as [`JetStreamStore::fetch`] read it.
pub(super) type Fetched = Option<(u64, Option<Record>)>;

/// What [`JetStreamStore::copy_in`] did with one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyOutcome {
    /// The bucket did not have the member; it has it now.
    Copied,
    /// The bucket already holds this very registration (same instance id).
    AlreadyPresent,
    /// The bucket holds another registration of the member (it was registered through a
    /// server since); the bucket's stays.
    Differs,
}

impl RegistryStore for JetStreamStore {
    fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
        let kv = self.kv.clone();
        let (entries, watch) =
            self.rt
                .block_on(retry_unavailable("loading the bucket", OPEN_WAIT, || {
                    load_entries(kv.clone())
                }))?;
        let mut stored = Vec::new();
        let mut newest = 0;
        for entry in entries {
            newest = newest.max(entry.revision);
            let Some(key) = parse_kv_key(&entry.key) else {
                continue;
            };
            if entry.operation != Operation::Put {
                continue;
            }
            let record = Record::decode(&entry.value)?;
            stored.push(record.to_stored(key)?);
            self.cache.insert(key, (entry.revision, record));
        }
        *self.replica.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(watch);
        self.replica.applied.send_replace(newest);
        self.replica.received.send_replace(newest);
        Ok(stored)
    }

    fn register_batch(
        &mut self,
        batch: &[(Registration, String)],
        now: i64,
    ) -> Result<Vec<Upserted>, RegistryError> {
        // Each key is written once, with the batch's last registration of it (the later
        // one wins, as in one server).
        let keys: Vec<i64> = batch
            .iter()
            .map(|(r, _)| service_key(r.scope, &r.cluster, &r.hostname, r.service_type))
            .collect();
        let mut last_of: HashMap<i64, usize> = HashMap::with_capacity(batch.len());
        for (i, key) in keys.iter().enumerate() {
            last_of.insert(*key, i);
        }
        let mut ops: Vec<(i64, Op)> = Vec::with_capacity(last_of.len());
        for (i, (reg, instance)) in batch.iter().enumerate() {
            if last_of[&keys[i]] != i {
                continue;
            }
            ops.push((
                keys[i],
                Op::Register(Box::new(Record {
                    scope: reg.scope.as_str().to_owned(),
                    cluster: reg.cluster.clone(),
                    hostname: reg.hostname.clone(),
                    service_type: reg.service_type.code().to_owned(),
                    instance: instance.clone(),
                    state: State::Pending.as_str().to_owned(),
                    registered_at: now,
                    last_heartbeat: None,
                    config_revision: 0,
                    meta: reg.meta.clone(),
                })),
            ));
        }
        self.write(ops)?;
        Ok(keys
            .iter()
            .map(|key| {
                let (_, record) = &self.cache[key];
                Upserted {
                    key: *key,
                    last_heartbeat: record.last_heartbeat,
                    config_revision: record.config_revision,
                }
            })
            .collect())
    }

    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        // The instance may have been revived through another server a moment ago: one
        // look at the bucket's end spares a write (and a lost race) per such heartbeat.
        self.catch_up_cache();
        let ops = writes
            .iter()
            .filter_map(|&(key, at)| {
                let instance = self.instance_of(key)?;
                Some((key, Op::Revive { instance, at }))
            })
            .collect();
        self.write(ops).map(drop)
    }

    /// Last-seen times are soft state here: instead of a write they go to the other servers
    /// as a digest.
    fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        let max_payload = self.client.server_info().max_payload;
        let chunks = encode_digest(self.sender, writes, max_payload);
        let client = self.client.clone();
        let subject = digest_subject(&self.settings.bucket);
        self.rt.block_on(async move {
            for chunk in chunks {
                client
                    .publish(subject.clone(), chunk)
                    .await
                    .map_err(|e| unavailable("publishing a last-seen digest", e))?;
            }
            Ok(())
        })
    }

    fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
        let Some(instance) = self.instance_of(key) else {
            return Ok(());
        };
        self.write(vec![(key, Op::Deregister { instance })])
            .map(drop)
    }

    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
        self.write(vec![(key, Op::Acknowledge { revision })])
            .map(drop)
    }

    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
        let ops = keys
            .iter()
            .filter_map(|&key| {
                let (_, record) = self.cache.get(&key)?;
                Some((
                    key,
                    Op::Stale {
                        instance: record.instance.clone(),
                        last: record.last_heartbeat,
                    },
                ))
            })
            .collect();
        self.write(ops).map(drop)
    }

    fn probe(&mut self) -> Result<(), RegistryError> {
        self.connected()?;
        let kv = self.kv.clone();
        count(1);
        self.rt
            .block_on(async move { kv.put(PROBE_KEY, Bytes::from_static(b"ok")).await })
            .map(drop)
            .map_err(|e| unavailable("probe write", e))
    }

    fn put_state(&mut self, name: &str, value: &[u8]) -> Result<(), RegistryError> {
        self.connected()?;
        let kv = self.kv.clone();
        let key = format!("{STATE_PREFIX}{name}");
        let value = Bytes::copy_from_slice(value);
        count(1);
        self.rt
            .block_on(async move { kv.put(key, value).await })
            .map(drop)
            .map_err(|e| unavailable("saving server state", e))
    }

    fn get_state(&mut self, name: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        self.connected()?;
        let kv = self.kv.clone();
        let key = format!("{STATE_PREFIX}{name}");
        count(1);
        self.rt
            .block_on(async move { kv.get(key).await })
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(|e| unavailable("reading server state", e))
    }

    fn remote_changes(&mut self) -> Vec<(i64, Option<StoredService>)> {
        self.fold_inbox();
        // The index takes over the cached record of every key that changed: the cache holds
        // the newest revision this server knows, whichever way it learned it.
        std::mem::take(&mut self.corrections)
            .into_iter()
            .map(|key| {
                let stored = self
                    .cache
                    .get(&key)
                    .and_then(|(_, record)| record.to_stored(key).ok());
                (key, stored)
            })
            .collect()
    }
}

impl JetStreamStore {
    /// Takes what the watch delivered into the cache; the keys it changed wait in
    /// `corrections` for the index.
    pub(super) fn fold_inbox(&mut self) {
        let delivered =
            std::mem::take(&mut *self.replica.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        for d in delivered {
            let known = self
                .cache
                .get(&d.key)
                .map(|(revision, _)| *revision)
                .or_else(|| self.tombstones.get(&d.key).copied());
            if known.is_some_and(|revision| revision >= d.revision) {
                // This server's own write, or older than what it already has.
                continue;
            }
            match d.record {
                Some(record) => {
                    if let Err(e) = record.to_stored(d.key) {
                        tracing::error!("fleet registry: ignoring a bucket change: {e}");
                        continue;
                    }
                    self.tombstones.remove(&d.key);
                    self.cache.insert(d.key, (d.revision, record));
                }
                None => {
                    self.cache.remove(&d.key);
                    self.tombstones.insert(d.key, d.revision);
                }
            }
            self.corrections.insert(d.key);
        }
    }

    /// Waits (at most [`CATCH_UP_WAIT`]) until the watch has delivered everything the bucket
    /// holds now, and takes it into the cache. Best effort: without it, writes still decide
    /// on the newest record after a lost race.
    pub(super) fn catch_up_cache(&mut self) {
        if self.connected().is_err() {
            return;
        }
        let stream = self.kv.stream.clone();
        let mut received = self.replica.received.subscribe();
        count(1);
        self.rt.block_on(async move {
            let Ok(info) = stream.get_info().await else {
                return;
            };
            let last = info.state.last_sequence;
            let _ = tokio::time::timeout(CATCH_UP_WAIT, received.wait_for(|&r| r >= last)).await;
        });
        self.fold_inbox();
    }
}

/// The latest entry of every key and the watch that continues after them: one attempt.
pub(super) async fn load_entries(
    kv: kv::Store,
) -> Result<(Vec<kv::Entry>, kv::Watch), RegistryError> {
    count(1);
    let info = kv
        .stream
        .get_info()
        .await
        .map_err(|e| unavailable("reading the bucket's state", e))?;
    count(1);
    let mut watch = kv
        .watch_with_history(">")
        .await
        .map_err(|e| unavailable("watching the bucket", e))?;
    let mut entries = Vec::new();
    if info.state.messages > 0 {
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), watch.next())
                .await
                .map_err(|_| {
                    RegistryError::new(
                        RegistryErrorKind::Unavailable,
                        "JetStream: the bucket's contents did not arrive within 30 s",
                    )
                })?;
            let entry = match next {
                Some(Ok(entry)) => entry,
                Some(Err(e)) => return Err(unavailable("loading the bucket", e)),
                None => break,
            };
            let last = entry.delta == 0;
            entries.push(entry);
            if last {
                break;
            }
        }
    }
    Ok((entries, watch))
}
