//! The registry's behaviour, written once against [`Registry`] and run on every store
//! backend: SQLite in memory, SQLite in a file (which is also reopened), and a JetStream
//! key-value bucket on a real `nats-server -js` (also reopened: a server restarting on the
//! bucket).
#![cfg(feature = "server")]

#[path = "support/nats.rs"]
mod nats;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ccfleet::server::registry::jetstream::{JetStreamSettings, JetStreamStore};
use ccfleet::server::registry::{
    Registration, Registry, SqliteStore, State, parse_instance_id, unix_seconds,
};
use ccfleet::wire::{Scope, ServiceType};

/// A way to open a registry; `reopen` gives one over the same data, when it persists.
trait Backend {
    async fn open(&self) -> Registry;
    async fn reopen(&self) -> Option<Registry>;
}

struct SqliteMemory;

impl Backend for SqliteMemory {
    async fn open(&self) -> Registry {
        Registry::new(SqliteStore::open(None).unwrap()).unwrap()
    }
    async fn reopen(&self) -> Option<Registry> {
        None
    }
}

struct SqliteFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SqliteFile {
    fn new() -> SqliteFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.sqlite");
        SqliteFile { _dir: dir, path }
    }
}

impl Backend for SqliteFile {
    async fn open(&self) -> Registry {
        Registry::open(Some(&self.path)).unwrap()
    }
    async fn reopen(&self) -> Option<Registry> {
        Some(self.open().await)
    }
}

/// A bucket on a single `nats-server -js` of its own (one replica: what the registry
/// promises does not depend on replication, which the cluster tests cover).
struct JetStream {
    server: nats::NatsServer,
}

impl JetStream {
    fn new() -> JetStream {
        JetStream {
            server: nats::NatsServer::start_jetstream(),
        }
    }
}

impl Backend for JetStream {
    async fn open(&self) -> Registry {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(self.server.url())
            .await
            .unwrap();
        let settings = JetStreamSettings {
            bucket: "battery".to_owned(),
            replicas: 1,
            lease_ttl: Duration::from_secs(10),
        };
        let store = JetStreamStore::open(client, settings).await.unwrap();
        // Loading the bucket blocks on requests to the runtime: off its worker threads.
        tokio::task::spawn_blocking(move || Registry::new(store).unwrap())
            .await
            .unwrap()
    }
    async fn reopen(&self) -> Option<Registry> {
        Some(self.open().await)
    }
}

fn reg(cluster: &str, host: &str, ty: ServiceType) -> Registration {
    Registration {
        scope: if cluster.is_empty() {
            Scope::Infra
        } else {
            Scope::Cluster
        },
        cluster: cluster.to_owned(),
        hostname: host.to_owned(),
        service_type: ty,
        meta: BTreeMap::from([("port".to_owned(), "8080".to_owned())]),
    }
}

fn id(instance_id: &str) -> u128 {
    parse_instance_id(instance_id).unwrap()
}

async fn a_member_goes_from_pending_to_active_to_deregistered(backend: impl Backend) {
    let r = backend.open().await;
    let a = r
        .register(reg("fritz", "f0101", ServiceType::MetricCollector))
        .await
        .unwrap();
    assert_eq!(a.config_revision, 0);
    assert_eq!(r.lookup(&a.instance_id).unwrap().state, State::Pending);
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(false));
    assert_eq!(r.lookup(&a.instance_id).unwrap().state, State::Active);
    assert_eq!(r.active().len(), 1);
    assert!(r.deregister(&a.instance_id).await.unwrap());
    assert!(!r.deregister(&a.instance_id).await.unwrap());
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), None);
    assert_eq!(r.lookup(&a.instance_id).unwrap().state, State::Deregistered);
    assert_eq!(r.counts().deregistered, 1);
    assert!(r.active().is_empty());
    // Unknown and malformed ids are no error.
    assert_eq!(
        r.heartbeat("0123456789abcdef0123456789abcdef")
            .await
            .unwrap(),
        None
    );
    assert!(!r.deregister("not an id").await.unwrap());
}

async fn re_registration_gives_a_new_id_and_keeps_heartbeat_and_revision(backend: impl Backend) {
    let r = backend.open().await;
    let a = r
        .register(reg("fritz", "f0101", ServiceType::MetricCollector))
        .await
        .unwrap();
    r.heartbeat(&a.instance_id).await.unwrap();
    r.acknowledge(&a.instance_id, 42).await.unwrap();
    let b = r
        .register(reg("fritz", "f0101", ServiceType::MetricCollector))
        .await
        .unwrap();
    assert_ne!(a.instance_id, b.instance_id);
    assert_eq!(b.config_revision, 42);
    assert!(r.lookup(&a.instance_id).is_none());
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), None);
    let svc = r.lookup(&b.instance_id).unwrap();
    assert_eq!(svc.state, State::Pending);
    assert!(svc.last_heartbeat.is_some());
    assert_eq!(r.counts().pending, 1);
    // Another type on the same host is another member.
    r.register(reg("fritz", "f0101", ServiceType::Backend))
        .await
        .unwrap();
    assert_eq!(r.counts().pending, 2);
}

async fn the_sweep_marks_silent_active_members_stale_and_a_heartbeat_revives_them(
    backend: impl Backend,
) {
    let r = backend.open().await;
    let live = r
        .register(reg("", "mgmt01", ServiceType::Backend))
        .await
        .unwrap();
    let pending = r
        .register(reg("fritz", "f0102", ServiceType::MetricCollector))
        .await
        .unwrap();
    r.heartbeat_batch(vec![(id(&live.instance_id), 100)])
        .await
        .unwrap();
    assert_eq!(r.mark_stale(100).await.unwrap(), 0);
    assert_eq!(r.mark_stale(101).await.unwrap(), 1);
    assert_eq!(r.mark_stale(101).await.unwrap(), 0);
    assert_eq!(r.lookup(&live.instance_id).unwrap().state, State::Stale);
    assert_eq!(
        r.lookup(&pending.instance_id).unwrap().state,
        State::Pending
    );
    assert_eq!(r.heartbeat(&live.instance_id).await.unwrap(), Some(true));
    assert_eq!(r.lookup(&live.instance_id).unwrap().state, State::Active);
}

async fn a_batch_applies_live_ids_once_each_and_reports_the_rest(backend: impl Backend) {
    let r = backend.open().await;
    let mut ids = Vec::new();
    for i in 0..700 {
        let reg = reg("c", &format!("h{i}"), ServiceType::MetricCollector);
        ids.push(id(&r.register(reg).await.unwrap().instance_id));
    }
    let gone = r
        .register(reg("c", "gone", ServiceType::MetricCollector))
        .await
        .unwrap();
    r.deregister(&gone.instance_id).await.unwrap();
    // 600 share a second (two full multi-row chunks and a remainder), 100 another, one
    // repeats, one is deregistered and one unknown.
    let mut beats: Vec<(u128, i64)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, if i < 600 { 100 } else { 200 }))
        .collect();
    beats.push((ids[0], 100));
    beats.push((id(&gone.instance_id), 100));
    beats.push((5, 100));
    let outcome = r.heartbeat_batch(beats).await.unwrap();
    assert_eq!(outcome.activated, 700);
    assert_eq!(outcome.applied.iter().filter(|a| **a).count(), 701);
    assert_eq!(&outcome.applied[701..], [false, false]);
    assert_eq!(r.counts().active, 700);
    assert_eq!(r.counts().deregistered, 1);
    let at = |i: usize| {
        r.lookup(&ccfleet::server::registry::format_instance_id(ids[i]))
            .unwrap()
            .last_heartbeat
    };
    assert_eq!(
        (at(0), at(599), at(600), at(699)),
        (Some(100), Some(100), Some(200), Some(200))
    );
    // Heartbeats that change nothing are applied but activate nothing.
    let again = r.heartbeat_batch(vec![(ids[0], 100)]).await.unwrap();
    assert_eq!((again.applied, again.activated), (vec![true], 0));
}

async fn everything_acknowledged_survives_a_reopen(backend: impl Backend) {
    let r = backend.open().await;
    let a = r
        .register(reg("fritz", "f0101", ServiceType::MetricCollector))
        .await
        .unwrap();
    r.heartbeat(&a.instance_id).await.unwrap();
    r.acknowledge(&a.instance_id, 42).await.unwrap();
    let infra = r
        .register(reg("", "mgmt01", ServiceType::Backend))
        .await
        .unwrap();
    r.heartbeat(&infra.instance_id).await.unwrap();
    assert_eq!(r.mark_stale(unix_seconds() + 1).await.unwrap(), 2);
    let gone = r
        .register(reg("fritz", "f0102", ServiceType::MetricCollector))
        .await
        .unwrap();
    r.deregister(&gone.instance_id).await.unwrap();
    let before = r.counts();
    drop(r);

    let Some(r) = backend.reopen().await else {
        return;
    };
    assert_eq!(r.counts(), before);
    let svc = r.lookup(&infra.instance_id).unwrap();
    assert_eq!(
        (svc.scope, svc.cluster.as_str(), svc.state),
        (Scope::Infra, "", State::Stale)
    );
    assert_eq!(svc.meta.get("port").map(String::as_str), Some("8080"));
    let svc = r.lookup(&a.instance_id).unwrap();
    assert_eq!((svc.state, svc.config_revision), (State::Stale, 42));
    assert_eq!(
        r.lookup(&gone.instance_id).unwrap().state,
        State::Deregistered
    );
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
    assert_eq!(r.heartbeat(&gone.instance_id).await.unwrap(), None);
}

/// Runs every battery test on one backend, each on a fresh store.
macro_rules! battery {
    ($backend:ident, $new:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_member_goes_from_pending_to_active_to_deregistered() {
                super::a_member_goes_from_pending_to_active_to_deregistered($new).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn re_registration_gives_a_new_id_and_keeps_heartbeat_and_revision() {
                super::re_registration_gives_a_new_id_and_keeps_heartbeat_and_revision($new).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_sweep_marks_silent_active_members_stale_and_a_heartbeat_revives_them() {
                super::the_sweep_marks_silent_active_members_stale_and_a_heartbeat_revives_them(
                    $new,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_batch_applies_live_ids_once_each_and_reports_the_rest() {
                super::a_batch_applies_live_ids_once_each_and_reports_the_rest($new).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn everything_acknowledged_survives_a_reopen() {
                super::everything_acknowledged_survives_a_reopen($new).await;
            }
        }
    };
}

battery!(sqlite_memory, SqliteMemory);
battery!(sqlite_file, SqliteFile::new());
battery!(jetstream, JetStream::new());
