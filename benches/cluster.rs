//! Scale-out on JetStream: 1, 2 and 3 fleet servers sharing one registry bucket on a
//! real nats-server (loopback, JetStream, R1).
//!
//! ```text
//! cargo bench -p ccfleet --bench cluster --features server,client
//! CLUSTER_STORM=100000 CLUSTER_ROUNDS=10 CLUSTER_SERVERS=1,2,3 cargo bench -p ccfleet --bench cluster --features server,client
//! ```
//!
//! For each number of servers (each on a runtime of its own, with named threads, so the
//! CPU time of each server is read from `/proc/self/task/*/stat`):
//! - a registration storm over the REST API, spread round-robin over the servers
//!   (`CLUSTER_STORM` registrations, `CLUSTER_CONCURRENCY` clients): registrations per
//!   second and latency percentiles; then the time until every server's index holds all of
//!   them (the watch);
//! - heartbeats of every registered instance over NATS in messages of
//!   `CLUSTER_BATCH`, which the `cc-backend-fleet` queue group spreads over the servers:
//!   round 1 activates every instance (one compare-and-set write each); once every server's
//!   index holds every instance as active, rounds 2 to `CLUSTER_ROUNDS` are the steady
//!   state. Reported per server: CPU seconds per million
//!   heartbeats it applied (read 1.5 s after the last one was applied, so the last-seen
//!   digests of the last second are counted); the nats-server's CPU seconds per million
//!   heartbeats (from `/proc/<pid>/stat`); and key-value operations per heartbeat.
//!
//! - the registry stage alone on server 0 (as in `benches/fan_in.rs` for SQLite): the
//!   realistic case (each round 10 s later, every heartbeat a new last-seen time, a digest
//!   after each round) and the repeat case (the same second again).
//!
//! Needs `nats-server` (NATS_SERVER_BIN or PATH). Every registration must answer 201 and
//! every heartbeat must be applied; the run fails otherwise.

#[path = "../tests/support/nats.rs"]
mod nats;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::registry::jetstream::kv_operations;
use ccfleet::server::registry::parse_instance_id;
use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet::wire::{encode_heartbeat_into, now_ns};

const SUBJECT: &str = "cc.fleet.event";

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a positive integer")),
        Err(_) => default,
    }
}

/// CPU seconds (user + system) in the text of a `/proc/.../stat` file.
fn stat_cpu(stat: &str) -> f64 {
    // After the parenthesised name: state is field 3, utime 14, stime 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // /proc reports in USER_HZ, 100 on Linux.
    (field(11) + field(12)) as f64 / 100.0
}

/// CPU seconds (user + system) of this process's threads whose name starts with `prefix`.
fn thread_cpu(prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut cpu = 0.0;
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.starts_with(prefix) {
            cpu += stat_cpu(&std::fs::read_to_string(path.join("stat")).unwrap_or_default());
        }
    }
    cpu
}

/// CPU seconds (user + system) of the process `pid` (the nats-server).
fn process_cpu(pid: Option<u32>) -> f64 {
    pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map_or(0.0, |stat| stat_cpu(&stat))
}

/// A fleet server on a runtime of its own, whose threads are named `ccs<i>`.
struct Node {
    runtime: tokio::runtime::Runtime,
    server: RunningServer,
    name: String,
}

impl Node {
    async fn start(i: usize, config: serde_json::Value) -> Node {
        let name = format!("ccs{i}-");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread_name = name.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(thread_name)
                .thread_keep_alive(Duration::from_secs(3600))
                .enable_all()
                .build()
                .expect("server runtime");
            let config = ServerConfig::from_json(&config.to_string()).expect("bench config");
            let server = runtime
                .block_on(ccfleet::server::start(config))
                .expect("server starts");
            let _ = tx.send((runtime, server));
        });
        let (runtime, server) = rx.await.expect("server thread");
        Node {
            runtime,
            server,
            name,
        }
    }

    async fn stop(self) {
        let server = self.server;
        self.runtime
            .spawn(async move { server.shutdown().await })
            .await
            .expect("shutdown task")
            .expect("server stops");
        self.runtime.shutdown_background();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[i - 1].as_secs_f64() * 1e3
}

async fn storm(nodes: &[Node], total: usize, concurrency: usize) -> Vec<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("http client");
    let urls: Arc<Vec<String>> = Arc::new(
        nodes
            .iter()
            .map(|n| format!("{}/api/fleet/register/cluster/", n.server.base_url()))
            .collect(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, urls, next) = (client.clone(), urls.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= total {
                    return done;
                }
                let body = format!(
                    r#"{{"cluster":"storm{}","hostname":"n{i:07}","serviceType":"ccmc"}}"#,
                    i % 16
                );
                let sent = Instant::now();
                let response = client
                    .post(&urls[i % urls.len()])
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("register request");
                assert_eq!(response.status().as_u16(), 201, "registration {i}");
                let json: serde_json::Value = response.json().await.expect("register response");
                done.push((
                    sent.elapsed(),
                    json["instanceId"].as_str().expect("id").to_owned(),
                ));
            }
        }));
    }
    let mut latencies = Vec::with_capacity(total);
    let mut ids = Vec::with_capacity(total);
    for worker in workers {
        for (latency, id) in worker.await.expect("worker") {
            latencies.push(latency);
            ids.push(id);
        }
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    println!(
        "  storm: {total} registrations in {:.2} s = {:.0}/s; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while nodes
        .iter()
        .any(|n| n.server.registry().counts().pending < total as u64)
    {
        assert!(
            Instant::now() < deadline,
            "every server to hold every registration"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "  every server holds all {total} registrations {:.2} s after the storm started",
        started.elapsed().as_secs_f64()
    );
    ids
}

/// Publishes `rounds` rounds of `messages`; waits until the servers applied them all.
async fn heartbeats(
    nodes: &[Node],
    nats_pid: Option<u32>,
    publisher: &async_nats::Client,
    messages: &[Vec<u8>],
    per_round: u64,
    rounds: usize,
    label: &str,
) {
    let applied = |nodes: &[Node]| -> Vec<u64> {
        nodes
            .iter()
            .map(|n| n.server.heartbeat_stats().applied)
            .collect()
    };
    let before = applied(nodes);
    let cpu_before: Vec<f64> = nodes.iter().map(|n| thread_cpu(&n.name)).collect();
    let nats_before = process_cpu(nats_pid);
    let kv_before = kv_operations();
    let expected = per_round * rounds as u64;
    let started = Instant::now();
    for _ in 0..rounds {
        for message in messages {
            publisher
                .publish(SUBJECT, message.clone().into())
                .await
                .expect("publish");
        }
    }
    publisher.flush().await.expect("flush");
    let deadline = Instant::now() + Duration::from_secs(300);
    let counts = loop {
        let now = applied(nodes);
        let done: u64 = now.iter().zip(&before).map(|(a, b)| a - b).sum();
        if done >= expected {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: only {done} of {expected} heartbeats applied"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let elapsed = started.elapsed();
    // The digests of the last second go out (and are applied) up to a second later: their
    // CPU time belongs to these heartbeats too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let nats_cpu = process_cpu(nats_pid) - nats_before;
    let kv = kv_operations() - kv_before;
    println!(
        "  {label}: {expected} heartbeats applied in {:.2} s = {:.0}/s; {kv} key-value operations = {:.6} per heartbeat",
        elapsed.as_secs_f64(),
        expected as f64 / elapsed.as_secs_f64(),
        kv as f64 / expected as f64
    );
    println!(
        "    nats-server: {nats_cpu:.2} CPU s = {:.2} CPU s per million heartbeats",
        nats_cpu / expected as f64 * 1e6
    );
    for (i, node) in nodes.iter().enumerate() {
        let got = counts[i] - before[i];
        let cpu = thread_cpu(&node.name) - cpu_before[i];
        println!(
            "    server {i}: {got} heartbeats, {cpu:.2} CPU s = {:.2} CPU s per million",
            if got == 0 {
                0.0
            } else {
                cpu / got as f64 * 1e6
            }
        );
    }
}

/// The registry stage alone on server 0 (no NATS transport): `rounds` rounds of one
/// heartbeat per instance applied straight to its registry in batches of 4 096, the time
/// advancing by `step` seconds per round, each round followed by a flush of the last-seen
/// times (on JetStream: the digest the other servers apply). Reports heartbeats per
/// second, and CPU seconds per million heartbeats of every server (the others apply the
/// digests; read 1.5 s after the last round).
async fn registry_stage(nodes: &[Node], ids: &[u128], rounds: usize, step: i64, label: &str) {
    let cpu_before: Vec<f64> = nodes.iter().map(|n| thread_cpu(&n.name)).collect();
    let registry = nodes[0].server.registry().clone();
    let expected = (ids.len() * rounds) as u64;
    let ids = ids.to_vec();
    let (applied, applied_in, flushed, elapsed) = nodes[0]
        .runtime
        .spawn(async move {
            let base = ccfleet::server::registry::unix_seconds();
            let started = Instant::now();
            let (mut applied, mut applied_in, mut flushed) = (0u64, Duration::ZERO, 0usize);
            for round in 0..rounds {
                let at = base + step * (round as i64 + 1);
                let round_started = Instant::now();
                for chunk in ids.chunks(4096) {
                    let beats = chunk.iter().map(|id| (*id, at)).collect();
                    let outcome = registry.heartbeat_batch(beats).await.expect("apply");
                    applied += outcome.applied.iter().filter(|a| **a).count() as u64;
                }
                applied_in += round_started.elapsed();
                flushed += registry.flush_last_seen().await.expect("flush");
            }
            (applied, applied_in, flushed, started.elapsed())
        })
        .await
        .expect("registry stage");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(applied, expected, "{label}: every heartbeat applied");
    println!(
        "  registry stage, {label}: {applied} heartbeats applied in {:.3} s = {:.2} M/s; with the flush (digest) after each round ({flushed} last-seen times): {:.3} s = {:.2} M/s",
        applied_in.as_secs_f64(),
        applied as f64 / applied_in.as_secs_f64() / 1e6,
        elapsed.as_secs_f64(),
        applied as f64 / elapsed.as_secs_f64() / 1e6,
    );
    for (i, node) in nodes.iter().enumerate() {
        let cpu = thread_cpu(&node.name) - cpu_before[i];
        println!(
            "    server {i}: {cpu:.2} CPU s = {:.2} CPU s per million heartbeats",
            cpu / applied as f64 * 1e6
        );
    }
}

async fn run() {
    let total = env_usize("CLUSTER_STORM", 100_000);
    let concurrency = env_usize("CLUSTER_CONCURRENCY", 64).max(1);
    let rounds = env_usize("CLUSTER_ROUNDS", 10).max(2);
    let batch = env_usize("CLUSTER_BATCH", 1000).max(1);
    let servers: Vec<usize> = std::env::var("CLUSTER_SERVERS")
        .unwrap_or_else(|_| "1,2,3".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("CLUSTER_SERVERS: numbers"))
        .collect();
    let nats = nats::NatsServer::start_jetstream();
    let publisher = async_nats::connect(nats.url()).await.expect("connect");
    for &n in &servers {
        println!("{n} server(s), bucket bench{n} (R1):");
        let mut nodes = Vec::new();
        for i in 0..n {
            nodes.push(
                Node::start(
                    i,
                    serde_json::json!({
                        "addr": "127.0.0.1:0",
                        "disable-authentication": true,
                        "nats": {"address": nats.url()},
                        "registry": {"type": "jetstream-kv", "bucket": format!("bench{n}")},
                        "fleet": {"heartbeat-subject": SUBJECT, "discovery-interval": "1h"},
                    }),
                )
                .await,
            );
        }
        let ids = storm(&nodes, total, concurrency).await;
        let mut messages = Vec::with_capacity(ids.len().div_ceil(batch));
        for chunk in ids.chunks(batch) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let mut message = Vec::with_capacity(chunk.len() * 112);
            encode_heartbeat_into(&mut message, now_ns(), &refs).expect("encode");
            messages.push(message);
        }
        heartbeats(
            &nodes,
            nats.pid(),
            &publisher,
            &messages,
            ids.len() as u64,
            1,
            "round 1 (pending -> active)",
        )
        .await;
        // The steady state starts once every server learnt of every activation (through
        // its watch); a heartbeat reaching a server that still holds its instance as
        // pending would make it try the activation again (a key-value read and write).
        let started = Instant::now();
        let deadline = started + Duration::from_secs(300);
        while nodes
            .iter()
            .any(|n| n.server.registry().counts().active < ids.len() as u64)
        {
            assert!(
                Instant::now() < deadline,
                "every server to see every activation"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!(
            "  every server holds all {} instances as active {:.2} s after round 1 was applied",
            ids.len(),
            started.elapsed().as_secs_f64()
        );
        heartbeats(
            &nodes,
            nats.pid(),
            &publisher,
            &messages,
            ids.len() as u64,
            rounds - 1,
            &format!("rounds 2-{rounds} (steady state)"),
        )
        .await;
        let parsed: Vec<u128> = ids
            .iter()
            .map(|id| parse_instance_id(id).expect("instance id"))
            .collect();
        registry_stage(
            &nodes,
            &parsed,
            rounds,
            10,
            "realistic (every heartbeat 10 s after the previous one)",
        )
        .await;
        registry_stage(&nodes, &parsed, rounds, 0, "repeat (the same second again)").await;
        for node in nodes {
            node.stop().await;
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("driver")
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}
