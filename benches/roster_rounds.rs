//! What discovery rosters cost a server with many clusters: a registry of `ROSTER_CLUSTERS`
//! clusters (default 50,000), each with one collector, plus `ROSTER_BACKENDS` infrastructure
//! backends (default 3) that every cluster's rosters list, published to a real nats-server.
//!
//! ```text
//! cargo bench -p ccfleet --bench roster_rounds --features server,client
//! ROSTER_CLUSTERS=20000 ROSTER_ROUNDS=5 ROSTER_INTERVAL_SECS=10 cargo bench -p ccfleet --bench roster_rounds --features server,client
//! ```
//!
//! Reported per full round (every roster of every cluster, as the periodic refresh sends
//! them every `ROSTER_INTERVAL_SECS`, default 15): the rosters sent, the round's wall time
//! from its tick until NATS confirmed it, and the heap the round needed above what
//! the server holds between rounds (the peak of bytes allocated while the round ran, less the
//! bytes allocated just before it; counted by this bench's global allocator, which wraps the
//! system's). Then one change-driven round (a backend's metadata changes, so every roster
//! changes) and one registration that changes no roster (a collector joins a cluster). The
//! process's peak resident memory (`VmHWM`) is printed at the end; it includes filling the
//! registry.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::ServerConfig;
use ccfleet::server::registry::{Registration, Registry};
use ccfleet::wire::{Scope, ServiceType};

#[path = "../tests/support/http.rs"]
mod http;
#[path = "../tests/support/nats.rs"]
mod nats;

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn note_alloc(size: usize) {
    let now = IN_USE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; the counters
// are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            note_alloc(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a positive integer")),
        Err(_) => default,
    }
}

fn vm_hwm_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

async fn publishes(client: &reqwest::Client, base: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ccfleet_roster_publishes_total "))
        .map_or(0, |v| v.parse().unwrap())
}

/// Waits until the server has confirmed `target` rosters in all; returns when that was.
async fn wait_for(client: &reqwest::Client, base: &str, target: u64) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if publishes(client, base).await >= target {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "rosters not confirmed in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn register(registry: &Registry, cluster: &str, host: &str, ty: ServiceType, port: &str) {
    let id = registry
        .register(Registration {
            scope: Scope::of_cluster(cluster),
            cluster: cluster.to_owned(),
            hostname: host.to_owned(),
            service_type: ty,
            meta: [("port".to_owned(), port.to_owned())].into(),
        })
        .await
        .unwrap()
        .instance_id;
    assert_eq!(registry.heartbeat(&id).await.unwrap(), Some(true));
}

fn main() {
    let clusters = env_usize("ROSTER_CLUSTERS", 50_000);
    let backends = env_usize("ROSTER_BACKENDS", 3);
    let rounds = env_usize("ROSTER_ROUNDS", 3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let nats = nats::NatsServer::start();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fleet.sqlite");
        let filled = Instant::now();
        {
            let registry = Registry::open(Some(&db)).unwrap();
            for i in 0..backends {
                register(&registry, "", &format!("ccb{i}"), ServiceType::Backend, "8080").await;
            }
            for i in 0..clusters {
                let cluster = format!("c{i:06}");
                register(&registry, &cluster, "n0001", ServiceType::MetricCollector, "").await;
            }
        }
        println!(
            "registry: {clusters} clusters with one collector each, {backends} infrastructure backends ({:.1} s to fill)",
            filled.elapsed().as_secs_f64()
        );
        let interval = env_usize("ROSTER_INTERVAL_SECS", 15);
        let config = ServerConfig::from_json(&serde_json::json!({
            "addr": "127.0.0.1:0",
            "disable-authentication": true,
            "db": db,
            "nats": {"address": nats.url()},
            "fleet": {"discovery-interval": format!("{interval}s"), "discovery-debounce": "10ms"}
        })
        .to_string())
        .unwrap();
        let interval = Duration::from_secs(interval as u64);
        let client = http::http();
        let per_round = ((clusters + 1) * 6) as u64;
        let before = IN_USE.load(Ordering::Relaxed);
        let start = Instant::now();
        let server = ccfleet::server::start(config).await.unwrap();
        let base = server.base_url();
        wait_for(&client, &base, per_round).await;
        println!(
            "start-up round: {per_round} rosters, {:.2} s from start, heap in use {:.1} MiB (registry included), peak {:.1} MiB",
            start.elapsed().as_secs_f64(),
            mib(IN_USE.load(Ordering::Relaxed) - before),
            mib(PEAK.load(Ordering::Relaxed) - before)
        );
        // Full rounds: the periodic refresh, every interval from the start.
        for round in 1..=rounds {
            let tick = start + interval * round as u32;
            tokio::time::sleep_until((tick - Duration::from_millis(300)).into()).await;
            let confirmed = publishes(&client, &base).await;
            let baseline = IN_USE.load(Ordering::Relaxed);
            PEAK.store(baseline, Ordering::Relaxed);
            let done = wait_for(&client, &base, confirmed + per_round).await;
            println!(
                "full round {round}: {per_round} rosters in {:.2} s, heap above the server's between rounds: peak {:.1} MiB",
                done.saturating_duration_since(tick).as_secs_f64(),
                mib(PEAK.load(Ordering::Relaxed).saturating_sub(baseline))
            );
        }
        let confirmed = publishes(&client, &base).await;
        // A change every roster sees: a backend's metadata.
        let server_registry_url = format!("{base}/api/fleet/register/infra/");
        let baseline = IN_USE.load(Ordering::Relaxed);
        PEAK.store(baseline, Ordering::Relaxed);
        let began = Instant::now();
        let answer = client
            .post(&server_registry_url)
            .body(r#"{"hostname":"ccb0","serviceType":"ccb","metaData":{"port":"9090"}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201);
        let body: serde_json::Value = answer.json().await.unwrap();
        let id = body["instanceId"].as_str().unwrap().to_owned();
        let answer = client
            .post(format!("{base}/api/fleet/heartbeat/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 204);
        let done = wait_for(&client, &base, confirmed + per_round).await;
        println!(
            "change round (a backend's metadata): {per_round} rosters in {:.2} s, heap above the baseline: peak {:.1} MiB",
            (done - began).as_secs_f64(),
            mib(PEAK.load(Ordering::Relaxed) - baseline)
        );
        // A collector joins: no roster changes, none is sent.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let confirmed = publishes(&client, &base).await;
        let answer = client
            .post(format!("{base}/api/fleet/register/cluster/"))
            .body(r#"{"cluster":"c000001","hostname":"n0002","serviceType":"ccmc"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201);
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "a collector joins: {} rosters sent",
            publishes(&client, &base).await - confirmed
        );
        server.shutdown().await.unwrap();
        println!("process peak resident memory (VmHWM): {:.0} MiB", vm_hwm_mib());
    });
}
