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

mod bucket;
mod record;
mod replication;
mod store;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use bucket::{bucket, is_bucket_name, kv_operations};
pub use record::service_key;
pub use replication::{Replication, digest_subject};
pub use store::{CopyOutcome, JetStreamStore};

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
/// Keys of the server's own state documents (`state.<name>`, e.g. a rollout's progress).
const STATE_PREFIX: &str = "state.";
/// Key prefix of service records.
const SERVICE_PREFIX: &str = "svc.";
/// How often one write is re-decided after lost compare-and-set races before it fails.
const MAX_ATTEMPTS: usize = 16;
/// Digest wire format: magic, then sender, base time, count, entries.
const DIGEST_MAGIC: &[u8; 4] = b"CCD1";
const DIGEST_HEADER: usize = 4 + 8 + 8 + 4;
const DIGEST_ENTRY: usize = 12;

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
