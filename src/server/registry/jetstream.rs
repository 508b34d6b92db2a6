//! The registry on a NATS JetStream key-value bucket, shared by several fleet servers.
//!
//! # Layout
//!
//! One bucket (`registry.bucket`, replicated `registry.replicas` times) holds:
//! - `svc.<16 hex digits>`: one JSON record per (scope, cluster, host name, type). The
//!   digits are the store key: the first 63 bits of a SHA-256 of the identity, so every
//!   server derives the same key for the same member and no name (which may hold
//!   characters a KV key cannot) ends up in a subject. The record repeats the identity; a
//!   record whose identity differs (a hash collision) refuses the registration.
//! - `lease.roster`: the roster publisher's lease (see [`crate::server::leader`]).
//! - `health.probe`: the target of the health check's write probe.
//!
//! # Writes
//!
//! Every state change (registration, `pending` -> `active`, `stale`, `deregistered`, an
//! acknowledged config revision) is one compare-and-set write: `create` for a new key,
//! else `update` at the revision this server last saw. A lost race (another server wrote
//! first) re-reads the key and re-decides: a revival of an instance that was deregistered
//! or re-registered meanwhile is dropped, so is a stale mark of an instance revived
//! meanwhile; a registration is re-applied on top of the newer record (it keeps its last
//! heartbeat and acknowledged revision). A write is acknowledged only after JetStream
//! stored it on a majority of the bucket's replicas.
//!
//! # The index: a watch
//!
//! Each server keeps the whole registry in memory. It is loaded from the latest value of
//! every key at start-up, and a watch of the bucket (an ordered consumer, resumed at the
//! next revision if it breaks) delivers every later write, including this server's own
//! (skipped by revision). A heartbeat, config pull or deregistration that names an instance
//! this server does not know yet (registered through another server a moment ago) waits
//! until the watch has applied everything the bucket held when it asked (at most
//! [`CATCH_UP_WAIT`]) and is tried once more: an acknowledged registration is never
//! answered "unknown" by another server.
//!
//! # Heartbeats: soft state and digests
//!
//! A heartbeat of an `active` instance writes nothing to the bucket. Every server keeps the
//! last-seen times in memory and, every [`DIGEST_INTERVAL`], publishes the ones its own
//! consumers applied since the previous digest on a core NATS subject
//! (`ccfleet.registry.<bucket>.seen`): 12 bytes per instance (store key, seconds after the
//! digest's base time), chunked below the connection's `max_payload`. Every server applies
//! every other server's digests to its index, so whichever server decides staleness sees
//! the heartbeats that landed on the other servers of the queue group, at most one digest
//! interval late. Only the lease holder runs the stale sweep, and only once it has been
//! listening to digests for `stale-after` (a server that just started does not know when
//! instances were last seen elsewhere).
//!
//! # Failure cases
//!
//! - **A digest is lost** (core NATS is at-most-once; a server dies before its next
//!   digest): the instance may be marked `stale` although it heartbeats; its next heartbeat
//!   revives it (a state change, written at once), so the error lasts one heartbeat interval
//!   at most. Choose `stale-after` well above the heartbeat interval plus the digest delay.
//! - **All servers restart**: last-seen times were never written, the bucket holds the time
//!   of each instance's latest state change; no server sweeps before it has listened for
//!   `stale-after`, so live instances are seen again before anyone could be marked stale.
//! - **A NATS node fails**: an R3 bucket keeps a majority; clients reconnect to another
//!   node, the watch consumer is recreated at the next revision, and writes that failed
//!   were answered with an error (HTTP 500) and acknowledged nothing.
//! - **JetStream is unreachable or the bucket is gone**: registrations, state changes and
//!   config acknowledgements fail with cc-backend's 500 body; reads keep being served from
//!   the index; nothing is acknowledged that was not stored.
//! - **A batch of registrations fails part-way** (the bucket cannot write several keys
//!   atomically): every registration of the batch is answered with the error; the ones that
//!   were stored carry instance ids nobody was given, and the member's retry replaces them.
//! - **A write is in flight when the connection breaks**: it is answered with an error,
//!   but JetStream may still have stored it (writes are refused at once while the client
//!   is disconnected, so this needs the break to fall between send and answer). Nothing
//!   acknowledged is lost; a registration stored that way is replaced by the member's retry.
//! - **Two servers register the same member at once**: both writes are compare-and-set on
//!   one key; the later one is applied on top of the earlier, so one identity results (the
//!   earlier answer's id stops resolving, as with two registrations through one server).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{
    Registration, Registry, RegistryError, RegistryErrorKind, RegistryStore, Scope, Service,
    ServiceType, State, StoredService, Upserted, format_instance_id, parse_instance_id,
};

/// How often a server publishes the last-seen times its consumers applied.
pub const DIGEST_INTERVAL: Duration = Duration::from_secs(1);
/// How long a request naming an instance this server does not know waits for the watch to
/// catch up with the bucket.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(2);
/// How long the bucket watch may deliver nothing before the bucket is asked whether it moved
/// on; a watch found behind at two such looks in a row is replaced (see `watch_task`).
pub const WATCH_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long start-up waits for JetStream to answer before it gives up, at each of its
/// steps (opening the bucket, loading it): a cluster that restarts with its fleet servers,
/// or loses a node while one starts, answers 503 or times out while it elects leaders.
pub const OPEN_WAIT: Duration = Duration::from_secs(30);
/// How long a JetStream request or write waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The key of the roster publisher's lease.
pub const LEASE_KEY: &str = "lease.roster";
/// The key the health check's probe writes.
const PROBE_KEY: &str = "health.probe";
/// Key prefix of service records.
const SERVICE_PREFIX: &str = "svc.";
/// How often one write is re-decided after lost compare-and-set races before it fails.
const MAX_ATTEMPTS: usize = 16;
/// Digest wire format: magic, then sender, base time, count, entries.
const DIGEST_MAGIC: &[u8; 4] = b"CCD1";
const DIGEST_HEADER: usize = 4 + 8 + 8 + 4;
const DIGEST_ENTRY: usize = 12;

/// Key-value operations (reads and writes) this process sent to JetStream; the bench's
/// "operations per heartbeat".
static KV_OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// Key-value operations this process has sent to JetStream so far (all buckets).
pub fn kv_operations() -> u64 {
    KV_OPERATIONS.load(Relaxed)
}

fn count(n: usize) {
    KV_OPERATIONS.fetch_add(n as u64, Relaxed);
}

/// Settings of the JetStream registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamSettings {
    /// The bucket name (`[A-Za-z0-9_-]+`).
    pub bucket: String,
    /// Replicas of the bucket (1 to 5; 3 needs a cluster of at least 3 nodes).
    pub replicas: usize,
    /// The roster publisher's lease: renewed every third of it, taken over when it was
    /// not renewed for this long.
    pub lease_ttl: Duration,
}

/// The store key of an identity: the first 63 bits of SHA-256 over its length-prefixed
/// parts, the same on every server.
pub fn service_key(scope: Scope, cluster: &str, hostname: &str, service_type: ServiceType) -> i64 {
    let mut hasher = sha2::Sha256::new();
    for part in [scope.as_str(), cluster, hostname, service_type.code()] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 1) as i64
}

fn kv_key(key: i64) -> String {
    format!("{SERVICE_PREFIX}{key:016x}")
}

fn parse_kv_key(key: &str) -> Option<i64> {
    let hex = key.strip_prefix(SERVICE_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    i64::from_str_radix(hex, 16).ok().filter(|k| *k >= 0)
}

/// One service as the bucket stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Record {
    scope: String,
    cluster: String,
    hostname: String,
    #[serde(rename = "type")]
    service_type: String,
    instance: String,
    state: String,
    registered_at: i64,
    last_heartbeat: Option<i64>,
    config_revision: i64,
    #[serde(default)]
    meta: BTreeMap<String, String>,
}

impl Record {
    fn decode(bytes: &[u8]) -> Result<Record, RegistryError> {
        serde_json::from_slice(bytes).map_err(|e| {
            RegistryError::with_source(
                RegistryErrorKind::Corrupt,
                "a service record in the bucket is not valid JSON",
                e,
            )
        })
    }

    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("records serialize"))
    }

    fn state(&self) -> Option<State> {
        State::parse(&self.state)
    }

    fn same_identity(&self, other: &Record) -> bool {
        (
            &self.scope,
            &self.cluster,
            &self.hostname,
            &self.service_type,
        ) == (
            &other.scope,
            &other.cluster,
            &other.hostname,
            &other.service_type,
        )
    }

    fn to_stored(&self, key: i64) -> Result<StoredService, RegistryError> {
        let corrupt = |what: &str| {
            RegistryError::new(
                RegistryErrorKind::Corrupt,
                format!("a service record in the bucket has an invalid {what}"),
            )
        };
        Ok(StoredService {
            key,
            instance: parse_instance_id(&self.instance).ok_or_else(|| corrupt("instance id"))?,
            service: Service {
                scope: self.scope.parse().map_err(|_| corrupt("scope"))?,
                cluster: self.cluster.clone(),
                hostname: self.hostname.clone(),
                service_type: self.service_type.parse().map_err(|_| corrupt("type"))?,
                state: self.state().ok_or_else(|| corrupt("state"))?,
                registered_at: self.registered_at,
                last_heartbeat: self.last_heartbeat,
                config_revision: self.config_revision,
                meta: Arc::new(self.meta.clone()),
            },
        })
    }

    fn from_stored(stored: &StoredService) -> Record {
        let s = &stored.service;
        Record {
            scope: s.scope.as_str().to_owned(),
            cluster: s.cluster.clone(),
            hostname: s.hostname.clone(),
            service_type: s.service_type.code().to_owned(),
            instance: format_instance_id(stored.instance),
            state: s.state.as_str().to_owned(),
            registered_at: s.registered_at,
            last_heartbeat: s.last_heartbeat,
            config_revision: s.config_revision,
            meta: (*s.meta).clone(),
        }
    }
}

/// What a write does to a record; re-decided on the newest record after a lost race.
#[derive(Debug, Clone)]
enum Op {
    Register(Box<Record>),
    Revive { instance: String, at: i64 },
    Stale { instance: String, last: Option<i64> },
    Deregister { instance: String },
    Acknowledge { revision: i64 },
}

impl Op {
    /// The record to write, `Ok(None)` when the change no longer applies.
    fn apply(&self, current: Option<&Record>) -> Result<Option<Record>, RegistryError> {
        match (self, current) {
            (Op::Register(new), None) => Ok(Some((**new).clone())),
            (Op::Register(new), Some(old)) => {
                if !old.same_identity(new) {
                    return Err(RegistryError::new(
                        RegistryErrorKind::Conflict,
                        "two services share one bucket key (hash collision); registration refused",
                    ));
                }
                let mut record = (**new).clone();
                record.last_heartbeat = old.last_heartbeat;
                record.config_revision = old.config_revision;
                Ok(Some(record))
            }
            (_, None) => Ok(None),
            (Op::Revive { instance, at }, Some(old)) => {
                // Already active (another server revived it): the time is soft state.
                if old.instance != *instance
                    || matches!(old.state(), Some(State::Deregistered | State::Active))
                {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Active.as_str().to_owned();
                record.last_heartbeat = record.last_heartbeat.max(Some(*at));
                Ok(Some(record))
            }
            (Op::Stale { instance, last }, Some(old)) => {
                if old.instance != *instance
                    || old.state() != Some(State::Active)
                    || old.last_heartbeat > *last
                {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Stale.as_str().to_owned();
                Ok(Some(record))
            }
            (Op::Deregister { instance }, Some(old)) => {
                if old.instance != *instance || old.state() == Some(State::Deregistered) {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Deregistered.as_str().to_owned();
                Ok(Some(record))
            }
            (Op::Acknowledge { revision }, Some(old)) => {
                let mut record = old.clone();
                record.config_revision = *revision;
                Ok(Some(record))
            }
        }
    }
}

/// A change the watch delivered: the key, its revision and the record (`None`: deleted).
struct Delivered {
    key: i64,
    revision: u64,
    record: Option<Record>,
}

/// What the watch task and the store share.
struct Replica {
    /// Changes delivered by the watch, not yet taken over by the index.
    inbox: Mutex<Vec<Delivered>>,
    /// The watch, from the initial load until the watch task takes it.
    watch: Mutex<Option<kv::Watch>>,
    /// The highest bucket revision the index has taken over.
    applied: watch::Sender<u64>,
    /// The highest bucket revision the watch has put into the inbox.
    received: watch::Sender<u64>,
}

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

fn unavailable(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> RegistryError {
    RegistryError::with_source(
        RegistryErrorKind::Unavailable,
        format!("JetStream: {what}: {e}"),
        e,
    )
}

/// Whether a bucket name is valid (`[A-Za-z0-9_-]+`).
pub fn is_bucket_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The bucket (created with `settings` if it does not exist).
pub async fn bucket(
    client: &async_nats::Client,
    settings: &JetStreamSettings,
    create: bool,
) -> Result<kv::Store, RegistryError> {
    let mut js = async_nats::jetstream::new(client.clone());
    // A write that JetStream does not confirm within this time is answered with an error
    // (it acknowledges nothing) instead of holding the request for the default 5 s.
    js.set_timeout(REQUEST_TIMEOUT);
    count(1);
    match js.get_key_value(&settings.bucket).await {
        Ok(kv) => return Ok(kv),
        Err(e) if !create => {
            return Err(unavailable(
                &format!("opening bucket {:?}", settings.bucket),
                e,
            ));
        }
        Err(_) => {}
    }
    count(1);
    js.create_key_value(kv::Config {
        bucket: settings.bucket.clone(),
        description: "ccfleet service registry".to_owned(),
        history: 1,
        num_replicas: settings.replicas,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| unavailable(&format!("creating bucket {:?}", settings.bucket), e))
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
    async fn fetch(kv: &kv::Store, key: i64) -> Result<Fetched, RegistryError> {
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
    fn write(&mut self, ops: Vec<(i64, Op)>) -> Result<Vec<bool>, RegistryError> {
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

    fn connected(&self) -> Result<(), RegistryError> {
        if self.client.connection_state() == async_nats::connection::State::Connected {
            Ok(())
        } else {
            Err(RegistryError::new(
                RegistryErrorKind::Unavailable,
                "JetStream: not connected to NATS",
            ))
        }
    }

    fn instance_of(&self, key: i64) -> Option<String> {
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
fn lost_race(e: &kv::UpdateError) -> bool {
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
type Fetched = Option<(u64, Option<Record>)>;

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
    fn fold_inbox(&mut self) {
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
    fn catch_up_cache(&mut self) {
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
async fn load_entries(kv: kv::Store) -> Result<(Vec<kv::Entry>, kv::Watch), RegistryError> {
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

/// Runs `attempt` until it succeeds, for at most `wait`: a failure of kind
/// [`Unavailable`](RegistryErrorKind::Unavailable) (JetStream answering 503 while it elects
/// leaders, a request timing out while a node restarts) is retried with a growing pause
/// (0.25 s doubling up to 4 s), logged once when the waiting starts and once when it ends.
/// Other failures, and the last one after `wait`, are returned.
async fn retry_unavailable<T, F, Fut>(
    what: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RegistryError>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(250);
    let mut failed = 0u32;
    loop {
        match attempt().await {
            Ok(value) => {
                if failed > 0 {
                    tracing::info!(
                        "fleet registry: {what} succeeded after {failed} failed attempt(s)"
                    );
                }
                return Ok(value);
            }
            Err(e)
                if e.kind() == RegistryErrorKind::Unavailable
                    && tokio::time::Instant::now() + pause < deadline =>
            {
                failed += 1;
                if failed == 1 {
                    tracing::warn!(
                        "fleet registry: {what} failed, retrying for up to {}: {e}",
                        crate::duration::format(wait)
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(4));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The subject of the last-seen digests of a bucket's servers.
pub fn digest_subject(bucket: &str) -> String {
    format!("ccfleet.registry.{bucket}.seen")
}

/// Encodes `(key, at)` pairs into digests of at most `max_payload` bytes each.
fn encode_digest(sender: u64, writes: &[(i64, i64)], max_payload: usize) -> Vec<Bytes> {
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
fn decode_digest(bytes: &[u8]) -> Option<(u64, Vec<(i64, i64)>)> {
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
    client: async_nats::Client,
    kv: kv::Store,
    replica: Arc<Replica>,
    subject: String,
    sender: u64,
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

async fn watch_task(kv: kv::Store, replica: Arc<Replica>, mut shutdown: watch::Receiver<bool>) {
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
                            _ = super::super::stopped(&mut shutdown) => return,
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
                _ = super::super::stopped(&mut shutdown) => return,
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
async fn apply_task(
    replica: Arc<Replica>,
    registry: Registry,
    changed: Arc<dyn Fn() + Send + Sync>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut received = replica.received.subscribe();
    loop {
        tokio::select! {
            _ = super::super::stopped(&mut shutdown) => return,
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

async fn digest_task(
    mut digests: async_nats::Subscriber,
    own: u64,
    registry: Registry,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut malformed = false;
    loop {
        let message = tokio::select! {
            _ = super::super::stopped(&mut shutdown) => return,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_stay_under_the_payload_limit() {
        let writes: Vec<(i64, i64)> = (0..1000)
            .map(|k| (k * 7919, 1_700_000_000 + k % 13))
            .collect();
        let chunks = encode_digest(42, &writes, 4096);
        assert!(chunks.len() > 1);
        let mut back = Vec::new();
        for chunk in &chunks {
            assert!(chunk.len() <= 4096);
            let (sender, entries) = decode_digest(chunk).unwrap();
            assert_eq!(sender, 42);
            back.extend(entries);
        }
        assert_eq!(back, writes);
    }

    #[test]
    fn a_truncated_or_foreign_digest_is_refused() {
        let chunk = encode_digest(1, &[(5, 100), (6, 101)], 1 << 20).remove(0);
        assert!(decode_digest(&chunk[..chunk.len() - 1]).is_none());
        assert!(decode_digest(b"CCD1").is_none());
        assert!(decode_digest(&[b'x'; 64]).is_none());
    }

    #[test]
    fn keys_are_stable_valid_kv_keys_and_names_do_not_leak_into_them() {
        let a = service_key(
            Scope::Cluster,
            "fritz",
            "f0101",
            ServiceType::MetricCollector,
        );
        assert_eq!(
            a,
            service_key(
                Scope::Cluster,
                "fritz",
                "f0101",
                ServiceType::MetricCollector
            )
        );
        assert!(a >= 0);
        let odd = service_key(Scope::Cluster, "a b.c*>", "h\u{e9}", ServiceType::Backend);
        let key = kv_key(odd);
        assert!(
            key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
            "{key}"
        );
        assert_eq!(parse_kv_key(&key), Some(odd));
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            service_key(Scope::Cluster, "ab", "c", ServiceType::Backend),
            service_key(Scope::Cluster, "a", "bc", ServiceType::Backend)
        );
        assert_eq!(parse_kv_key("lease.roster"), None);
    }

    fn record(instance: &str, state: State) -> Record {
        Record {
            scope: "cluster".into(),
            cluster: "fritz".into(),
            hostname: "f0101".into(),
            service_type: "ccmc".into(),
            instance: instance.into(),
            state: state.as_str().into(),
            registered_at: 1,
            last_heartbeat: Some(10),
            config_revision: 3,
            meta: BTreeMap::new(),
        }
    }

    #[test]
    fn a_lost_race_is_re_decided_on_the_newer_record() {
        let old = "00000000000000000000000000000001".to_owned();
        let new = "00000000000000000000000000000002".to_owned();
        // A revival of a re-registered or deregistered instance is dropped.
        let revive = Op::Revive {
            instance: old.clone(),
            at: 20,
        };
        assert!(
            revive
                .apply(Some(&record(&new, State::Pending)))
                .unwrap()
                .is_none()
        );
        assert!(
            revive
                .apply(Some(&record(&old, State::Deregistered)))
                .unwrap()
                .is_none()
        );
        // One that another server revived already needs no write.
        assert!(
            revive
                .apply(Some(&record(&old, State::Active)))
                .unwrap()
                .is_none()
        );
        let revived = revive
            .apply(Some(&record(&old, State::Stale)))
            .unwrap()
            .unwrap();
        assert_eq!(
            (revived.state.as_str(), revived.last_heartbeat),
            ("active", Some(20))
        );
        // A stale mark of an instance revived meanwhile is dropped.
        let stale = Op::Stale {
            instance: old.clone(),
            last: Some(5),
        };
        assert!(
            stale
                .apply(Some(&record(&old, State::Active)))
                .unwrap()
                .is_none()
        );
        // A registration keeps the heartbeat and revision of the record it replaces.
        let mut fresh = record(&new, State::Pending);
        fresh.last_heartbeat = None;
        fresh.config_revision = 0;
        let reg = Op::Register(Box::new(fresh));
        let merged = reg
            .apply(Some(&record(&old, State::Active)))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                merged.instance.as_str(),
                merged.last_heartbeat,
                merged.config_revision
            ),
            (new.as_str(), Some(10), 3)
        );
        // A different identity under the same key is a conflict, not an overwrite.
        let mut other = record(&old, State::Active);
        other.hostname = "f0102".into();
        let e = reg.apply(Some(&other)).unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Conflict);
    }
}
