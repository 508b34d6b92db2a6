//! Tests of the registry handle, its group commit and its write health.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group_commit::gather;
use super::index::Index;
use super::shared::Waiting;
use super::write_health::WriteHealth;
use super::*;
use crate::wire::{Scope, ServiceType};

fn reg(host: &str) -> Registration {
    Registration {
        scope: Scope::Cluster,
        cluster: "fritz".to_owned(),
        hostname: host.to_owned(),
        service_type: ServiceType::MetricCollector,
        meta: BTreeMap::new(),
    }
}

/// Counts the error and warning events sent to it.
#[derive(Default)]
struct LogCount {
    errors: AtomicUsize,
    warnings: AtomicUsize,
}

struct Counting(Arc<LogCount>);

impl tracing::Subscriber for Counting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        match *event.metadata().level() {
            tracing::Level::ERROR => self.0.errors.fetch_add(1, Relaxed),
            tracing::Level::WARN => self.0.warnings.fetch_add(1, Relaxed),
            _ => 0,
        };
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_burst_of_failed_writes_is_logged_once_and_its_end_once() {
    let health = WriteHealth::default();
    let counts = Arc::new(LogCount::default());
    let full = || {
        Err::<(), _>(RegistryError::new(
            RegistryErrorKind::Unavailable,
            "database or disk is full",
        ))
    };
    tracing::subscriber::with_default(Counting(counts.clone()), || {
        for _ in 0..100 {
            assert!(health.record(full()).is_err());
        }
        assert_eq!(
            health.fresh(Duration::from_secs(60)),
            Some(Err("fleet registry: database or disk is full".into()))
        );
        for _ in 0..10 {
            health.record(Ok(())).unwrap();
        }
        assert!(health.record(full()).is_err());
    });
    // One error for each burst, one warning for the end of the first.
    assert_eq!(counts.errors.load(Relaxed), 2);
    assert_eq!(counts.warnings.load(Relaxed), 1);
    assert_eq!(health.fresh(Duration::ZERO), None);
}

/// SQLite that refuses writes (`query_only`) while `broken` is set.
struct Breakable {
    inner: SqliteStore,
    broken: Arc<AtomicBool>,
}

impl Breakable {
    fn sync(&mut self) -> &mut SqliteStore {
        let broken = self.broken.load(Relaxed);
        self.inner
            .connection()
            .pragma_update(None, "query_only", broken)
            .unwrap();
        &mut self.inner
    }
}

impl RegistryStore for Breakable {
    fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
        self.sync().load()
    }
    fn register_batch(
        &mut self,
        batch: &[(Registration, String)],
        now: i64,
    ) -> Result<Vec<Upserted>, RegistryError> {
        self.sync().register_batch(batch, now)
    }
    fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.sync().last_seen(writes)
    }
    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.sync().heartbeats(writes)
    }
    fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
        self.sync().deregister(key)
    }
    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
        self.sync().acknowledge(key, revision)
    }
    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
        self.sync().mark_stale(keys)
    }
    fn probe(&mut self) -> Result<(), RegistryError> {
        self.sync().probe()
    }
}

#[tokio::test]
async fn an_instance_unknown_while_the_shared_store_cannot_be_caught_up_with_is_undecided() {
    let r = Registry::open(None).unwrap();
    let caught_up = Arc::new(AtomicBool::new(false));
    let flag = caught_up.clone();
    r.set_catch_up(Arc::new(move || {
        let answer = flag.load(Relaxed);
        Box::pin(async move { answer })
    }));
    let known = r.register(reg("f0101")).await.unwrap().instance_id;
    // Registered through another server a moment ago, as far as this one can tell.
    let elsewhere = format_instance_id(42);

    let e = r.heartbeat(&elsewhere).await.unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Behind);
    let e = r.lookup_fresh(&elsewhere).await.unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Behind);
    let e = r.deregister(&elsewhere).await.unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Behind);
    let id = parse_instance_id(&elsewhere).unwrap();
    let known_id = parse_instance_id(&known).unwrap();
    let outcome = r
        .heartbeat_batch(vec![(known_id, 5), (id, 5), (known_id + 1, 5)])
        .await
        .unwrap();
    assert_eq!(outcome.applied, [true, false, false]);
    assert_eq!(outcome.undecided, [1, 2]);

    // What this server knows is answered as before.
    assert_eq!(r.heartbeat(&known).await.unwrap(), Some(false));
    assert!(r.lookup_fresh(&known).await.unwrap().is_some());
    assert!(r.deregister(&known).await.unwrap());
    assert!(!r.deregister(&known).await.unwrap());
    assert_eq!(r.heartbeat(&known).await.unwrap(), None);

    // Once caught up, an id it still does not know is unknown.
    caught_up.store(true, Relaxed);
    assert_eq!(r.heartbeat(&elsewhere).await.unwrap(), None);
    assert_eq!(r.lookup_fresh(&elsewhere).await.unwrap(), None);
    assert!(!r.deregister(&elsewhere).await.unwrap());
    let outcome = r.heartbeat_batch(vec![(id, 5)]).await.unwrap();
    assert_eq!((outcome.applied, outcome.undecided), (vec![false], vec![]));
}

#[tokio::test]
async fn writes_that_fail_are_not_acknowledged_and_leave_the_index_alone() {
    let broken = Arc::new(AtomicBool::new(false));
    let r = Registry::new(Breakable {
        inner: SqliteStore::open(None).unwrap(),
        broken: broken.clone(),
    })
    .unwrap();
    let a = r.register(reg("f0101")).await.unwrap();
    let b = r.register(reg("f0102")).await.unwrap();
    r.heartbeat(&b.instance_id).await.unwrap();
    assert_eq!(r.writable().await, Ok(()));

    broken.store(true, Relaxed);
    let e = r.register(reg("f0103")).await.unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Unavailable);
    assert_eq!(r.counts().pending, 1);
    assert!(r.heartbeat(&a.instance_id).await.is_err());
    assert!(r.deregister(&a.instance_id).await.is_err());
    assert!(r.acknowledge(&a.instance_id, 7).await.is_err());
    assert!(r.mark_stale(unix_seconds() + 10).await.is_err());
    let svc = r.lookup(&a.instance_id).unwrap();
    assert_eq!((svc.state, svc.config_revision), (State::Pending, 0));
    assert_eq!(r.lookup(&b.instance_id).unwrap().state, State::Active);
    let failing = r.writable().await.unwrap_err();
    assert!(failing.contains("readonly"), "{failing}");

    broken.store(false, Relaxed);
    assert_eq!(r.heartbeat(&a.instance_id).await.unwrap(), Some(true));
    assert_eq!(r.writable().await, Ok(()));
}

/// SQLite that counts its registration writes and holds the first one back a while,
/// so that registrations arriving meanwhile queue up behind it.
struct Slow {
    inner: Breakable,
    batches: Arc<AtomicUsize>,
}

impl RegistryStore for Slow {
    fn load(&mut self) -> Result<Vec<StoredService>, RegistryError> {
        self.inner.load()
    }
    fn register_batch(
        &mut self,
        batch: &[(Registration, String)],
        now: i64,
    ) -> Result<Vec<Upserted>, RegistryError> {
        if self.batches.fetch_add(1, Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.inner.register_batch(batch, now)
    }
    fn heartbeats(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.inner.heartbeats(writes)
    }
    fn last_seen(&mut self, writes: &[(i64, i64)]) -> Result<(), RegistryError> {
        self.inner.last_seen(writes)
    }
    fn deregister(&mut self, key: i64) -> Result<(), RegistryError> {
        self.inner.deregister(key)
    }
    fn acknowledge(&mut self, key: i64, revision: i64) -> Result<(), RegistryError> {
        self.inner.acknowledge(key, revision)
    }
    fn mark_stale(&mut self, keys: &[i64]) -> Result<(), RegistryError> {
        self.inner.mark_stale(keys)
    }
    fn probe(&mut self) -> Result<(), RegistryError> {
        self.inner.probe()
    }
}

fn slow(broken: bool) -> (Registry, Arc<AtomicUsize>) {
    let batches = Arc::new(AtomicUsize::new(0));
    let store = Slow {
        inner: Breakable {
            inner: SqliteStore::open(None).unwrap(),
            broken: Arc::new(AtomicBool::new(broken)),
        },
        batches: batches.clone(),
    };
    (Registry::new(store).unwrap(), batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_share_store_writes_and_each_gets_its_own_id() {
    let (r, batches) = slow(false);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let r = r.clone();
        // Host 0 registers twice: both answers are acknowledged, the later id wins.
        let host = format!("f{:04}", if i == 199 { 0 } else { i });
        tasks.push(tokio::spawn(async move { r.register(reg(&host)).await }));
    }
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        ids.insert(task.await.unwrap().unwrap().instance_id);
    }
    assert_eq!(ids.len(), 200);
    assert_eq!(r.counts().pending, 199);
    let resolving = ids.iter().filter(|id| r.lookup(id).is_some()).count();
    assert_eq!(resolving, 199);
    let writes = batches.load(Relaxed);
    assert!(
        writes < 200 / 4,
        "{writes} store writes for 200 registrations"
    );
}

fn waiting(n: usize) -> Vec<Waiting> {
    (0..n)
        .map(|i| Waiting {
            reg: reg(&format!("f{i:04}")),
            reply: tokio::sync::oneshot::channel().0,
        })
        .collect()
}

#[test]
fn a_storm_group_does_not_wait_once_as_many_as_the_previous_group_are_queued() {
    let r = Registry::open(None).unwrap();
    let long = Duration::from_secs(30);
    let started = Instant::now();
    r.shared.registrations().waiting.extend(waiting(30));
    assert_eq!(gather(&r.shared, waiting(20), 50, long).len(), 50);
    // A lone registration outside a storm is never delayed.
    assert_eq!(gather(&r.shared, waiting(1), 0, long).len(), 1);
    assert_eq!(gather(&r.shared, waiting(3), 4, long).len(), 3);
    assert!(started.elapsed() < long);
}

#[test]
fn a_gathering_group_is_written_as_soon_as_the_registration_completing_it_queues() {
    let r = Registry::open(None).unwrap();
    // As while a committer runs: registering starts none.
    r.shared.registrations().committing = true;
    let long = Duration::from_secs(30);
    let started = Instant::now();
    let registering = {
        let r = r.clone();
        std::thread::spawn(move || {
            while r.shared.registrations().gather_until == 0 {
                std::thread::yield_now();
            }
            // Queues the registration; its answer is not awaited.
            assert!(futures::FutureExt::now_or_never(r.register(reg("late"))).is_none());
        })
    };
    let group = gather(&r.shared, waiting(10), 11, long);
    registering.join().unwrap();
    assert_eq!(group.len(), 11);
    assert_eq!(group[10].reg.hostname, "late");
    assert!(started.elapsed() < long);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_answers_every_registration_in_it_with_the_error() {
    let (r, _) = slow(true);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let r = r.clone();
        tasks.push(tokio::spawn(async move {
            r.register(reg(&format!("f{i:04}"))).await
        }));
    }
    for task in tasks {
        let e = task.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), RegistryErrorKind::Unavailable);
    }
    assert_eq!(r.counts(), StateCounts::default());
}

#[tokio::test]
async fn heartbeats_of_active_instances_write_nothing_until_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.sqlite");
    let r = Registry::open(Some(&path)).unwrap();
    let a = r.register(reg("f0101")).await.unwrap();
    let b = r.register(reg("f0102")).await.unwrap();
    let (ia, ib) = (
        parse_instance_id(&a.instance_id).unwrap(),
        parse_instance_id(&b.instance_id).unwrap(),
    );
    // pending -> active is a state change: durable at once.
    let first = r.heartbeat_batch(vec![(ia, 100), (ib, 100)]).await.unwrap();
    assert_eq!(first.activated, 2);
    let stored = |id: &str| Registry::open(Some(&path)).unwrap().lookup(id).unwrap();
    assert_eq!(stored(&a.instance_id).last_heartbeat, Some(100));
    // Repeats change memory only; an older time does not move it back.
    let again = r
        .heartbeat_batch(vec![(ia, 130), (ib, 120), (ib, 110)])
        .await
        .unwrap();
    assert_eq!((again.applied, again.activated), (vec![true; 3], 0));
    assert_eq!(r.lookup(&b.instance_id).unwrap().last_heartbeat, Some(120));
    assert_eq!(r.unwritten_last_seen(), 2);
    assert_eq!(stored(&a.instance_id).last_heartbeat, Some(100));
    // Stale decisions use the times in memory.
    assert_eq!(r.mark_stale(125).await.unwrap(), 1);
    assert_eq!(r.flush_last_seen().await.unwrap(), 2);
    assert_eq!(r.unwritten_last_seen(), 0);
    let (sa, sb) = (stored(&a.instance_id), stored(&b.instance_id));
    assert_eq!((sa.state, sa.last_heartbeat), (State::Active, Some(130)));
    // Writing a last-seen time behind does not revive a stale instance.
    assert_eq!((sb.state, sb.last_heartbeat), (State::Stale, Some(120)));
    assert_eq!(r.flush_last_seen().await.unwrap(), 0);
}

#[tokio::test]
async fn last_seen_times_whose_write_failed_are_written_by_the_next_flush() {
    let broken = Arc::new(AtomicBool::new(false));
    let r = Registry::new(Breakable {
        inner: SqliteStore::open(None).unwrap(),
        broken: broken.clone(),
    })
    .unwrap();
    let a = r.register(reg("f0101")).await.unwrap();
    let ia = parse_instance_id(&a.instance_id).unwrap();
    r.heartbeat_batch(vec![(ia, 100)]).await.unwrap();
    r.heartbeat_batch(vec![(ia, 110)]).await.unwrap();
    broken.store(true, Relaxed);
    assert!(r.flush_last_seen().await.is_err());
    r.heartbeat_batch(vec![(ia, 105)]).await.unwrap();
    assert_eq!(r.unwritten_last_seen(), 1);
    broken.store(false, Relaxed);
    assert_eq!(r.flush_last_seen().await.unwrap(), 1);
    let reloaded = Index::from_stored(r.shared.store.lock().unwrap().load().unwrap());
    assert_eq!(reloaded.get(ia).unwrap().1.last_heartbeat, Some(110));
}
