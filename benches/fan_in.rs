//! Heartbeat fan-in, end to end: N registered instances heartbeat through a real
//! nats-server on loopback in multi-line messages; the fleet server decodes, coalesces and
//! applies them to its SQLite registry.
//!
//! ```text
//! cargo bench -p ccfleet --bench fan_in --features server
//! FANIN_INSTANCES=100000 FANIN_ROUNDS=5 FANIN_BATCH=1000 cargo bench -p ccfleet --bench fan_in --features server
//! ```
//!
//! `FANIN_PENDING` sets the server's `fleet.heartbeat-pending-messages` (default 1 024).
//! `FANIN_HEARTBEAT_STREAM=1` runs nats-server with JetStream and the server with
//! `fleet.heartbeat-stream` (heartbeats captured by a stream, read by a durable consumer).
//! `FANIN_JS_BUFFERED=N` (stream mode) sets nats-server's `jetstream { max_buffered_msgs }`
//! to N (and `max_buffered_size` to 4 GiB): plain publishes that arrive faster than
//! JetStream stores them wait in that buffer, and beyond it nats-server discards them.
//! The rounds after the first are published as one burst, as fast as the publisher can, so
//! `FANIN_INSTANCES` x (`FANIN_ROUNDS` - 1) is the burst size that the "lost" figure is for.
//! `FANIN_LOAD=N` keeps N threads of this process busy while heartbeats are published and
//! applied, standing in for the other work of a loaded machine: run it once without and
//! once with `FANIN_HEARTBEAT_STREAM=1` to compare core NATS and the stream under the same
//! load. After the burst the bench prints the server's `/healthz` (`degraded` while NATS
//! drops heartbeat messages) and its slow-consumer episodes.
//!
//! Reports registration time, the decode stage alone (classify every line and parse the
//! id, one core), and heartbeats per second applied end to end for the first round (every
//! instance goes pending -> active: one row write each) and for the following rounds
//! (instances already active: a row is written once per instance per second), with the
//! number of heartbeats lost. Needs `nats-server` (NATS_SERVER_BIN or PATH).
//!
//! Then the registry stage alone (no NATS), with the bytes this process wrote to storage
//! (`write_bytes` of `/proc/self/io`, including the write-behind flush of last-seen times
//! after every round, a round being one flush interval):
//! the realistic case, where every instance heartbeats once per simulated 10 s so every
//! heartbeat carries a new time, and the repeat case, where the time does not change.

#[path = "../tests/support/nats.rs"]
mod nats;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::registry::{Registration, Registry, parse_instance_id};
use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet::wire::{
    HeartbeatLine, Scope, ServiceType, encode_heartbeat_into, now_ns, scan_heartbeats,
};

const SUBJECT: &str = "cc.fleet.event";

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a positive integer")),
        Err(_) => default,
    }
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

/// Bytes this process caused to be written to storage so far (Linux; 0 elsewhere).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("write_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Applies `rounds` rounds of one heartbeat per instance straight to the registry, in
/// batches of `batch`, the time advancing by `step` seconds per round; each round is one
/// flush interval, so the last-seen times are flushed after each.
async fn registry_stage(
    registry: &Registry,
    db: &std::path::Path,
    ids: &[u128],
    rounds: usize,
    batch: usize,
    step: i64,
    label: &str,
) {
    let base = ccfleet::server::registry::unix_seconds();
    let written_before = written_bytes();
    let started = Instant::now();
    let mut applied = 0u64;
    let mut applied_in = Duration::ZERO;
    let mut flushed = 0;
    for round in 0..rounds {
        let at = base + step * (round as i64 + 1);
        let round_started = Instant::now();
        for chunk in ids.chunks(batch) {
            let beats = chunk.iter().map(|id| (*id, at)).collect();
            let outcome = registry.heartbeat_batch(beats).await.expect("apply");
            applied += outcome.applied.iter().filter(|a| **a).count() as u64;
        }
        applied_in += round_started.elapsed();
        flushed += registry
            .flush_last_seen()
            .await
            .expect("flush last-seen times");
    }
    let elapsed = started.elapsed();
    let written = written_bytes().saturating_sub(written_before);
    let wal = std::fs::metadata(db.with_extension("sqlite-wal")).map_or(0, |m| m.len());
    let expected = (ids.len() * rounds) as u64;
    println!(
        "registry stage, {label}: {applied} of {expected} heartbeats applied in {:.3} s = {:.2} M heartbeats/s (lost {}); with a flush of the last-seen times after each round ({flushed} in all): {:.3} s = {:.2} M heartbeats/s; {:.1} bytes written per heartbeat; WAL file {:.1} MiB",
        applied_in.as_secs_f64(),
        per_second(applied, applied_in) / 1e6,
        expected - applied,
        elapsed.as_secs_f64(),
        per_second(applied, elapsed) / 1e6,
        written as f64 / expected as f64,
        wal as f64 / f64::from(1 << 20),
    );
}

/// One core: classify every line and parse every accepted id, as the consumer does.
fn decode_stage(messages: &[Vec<u8>], heartbeats: usize) {
    let mut ids = Vec::with_capacity(4096);
    let mut total = 0u64;
    let mut passes = 0u32;
    let started = Instant::now();
    while passes < 3 || started.elapsed() < Duration::from_secs(2) {
        for message in messages {
            ids.clear();
            scan_heartbeats(message, |line| {
                if let HeartbeatLine::Accepted(id) = line
                    && let Some(id) = parse_instance_id(id)
                {
                    ids.push(id);
                }
            })
            .expect("valid heartbeat message");
            total += ids.len() as u64;
        }
        passes += 1;
    }
    let elapsed = started.elapsed();
    assert_eq!(total, heartbeats as u64 * u64::from(passes));
    println!(
        "decode stage: {total} heartbeats in {:.3} s on one core = {:.2} M heartbeats/s",
        elapsed.as_secs_f64(),
        per_second(total, elapsed) / 1e6
    );
}

/// Publishes `rounds` rounds of `messages` and waits until the server has applied them.
async fn publish_and_wait(
    server: &RunningServer,
    publisher: &async_nats::Client,
    messages: &[Vec<u8>],
    heartbeats_per_round: u64,
    rounds: usize,
    label: &str,
    patience: Duration,
) {
    let before = server.heartbeat_stats();
    let expected = heartbeats_per_round * rounds as u64;
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
    let published_in = started.elapsed();
    let mut last_progress = (Instant::now(), 0);
    let done = loop {
        let now = server.heartbeat_stats();
        let settled = (now.applied - before.applied) + (now.unknown - before.unknown);
        if settled >= expected {
            break Instant::now();
        }
        if settled != last_progress.1 {
            last_progress = (Instant::now(), settled);
        } else if last_progress.0.elapsed() > patience {
            // No progress for that long: whatever has not arrived is lost.
            break last_progress.0;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let elapsed = done - started;
    let now = server.heartbeat_stats();
    let applied = now.applied - before.applied;
    let unknown = now.unknown - before.unknown;
    let lost = expected.saturating_sub(applied);
    println!(
        "{label}: {expected} heartbeats published in {:.3} s, applied {applied} in {:.3} s = {:.0} heartbeats/s end to end; lost {lost}, unknown {unknown}, dropped messages {}, redelivered messages {}",
        published_in.as_secs_f64(),
        elapsed.as_secs_f64(),
        per_second(applied, elapsed),
        now.dropped - before.dropped,
        now.stream_redelivered - before.stream_redelivered,
    );
}

/// Threads spinning until dropped: the other work of a loaded machine.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// `GET path` on the server, over a plain socket: the status line and the body.
async fn get(server: &RunningServer, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.base_url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    let status = answer.lines().next().unwrap_or("").to_owned();
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_owned();
    format!("{status}: {body}")
}

/// What the heartbeat stream and its consumer hold (stream mode): where missing heartbeats
/// went, if any.
async fn stream_report(url: &str) {
    let client = async_nats::connect(url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(ccfleet::server::config::DEFAULT_HEARTBEAT_STREAM)
        .await
        .expect("heartbeat stream");
    let state = stream.info().await.expect("stream info").state.clone();
    let consumer = stream
        .consumer_info(ccfleet::server::config::DEFAULT_HEARTBEAT_CONSUMER)
        .await
        .expect("consumer info");
    println!(
        "stream: {} messages stored (sequences {}-{}), consumer: {} pending, {} waiting for an ack, {} redelivered",
        state.messages,
        state.first_sequence,
        state.last_sequence,
        consumer.num_pending,
        consumer.num_ack_pending,
        consumer.num_redelivered,
    );
}

async fn run() {
    let instances = env_usize("FANIN_INSTANCES", 100_000);
    let rounds = env_usize("FANIN_ROUNDS", 5).max(2);
    let batch = env_usize("FANIN_BATCH", 1000).max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("fleet.sqlite");

    // Register straight into the registry file the server will open.
    let started = Instant::now();
    let registry = Registry::open(Some(&db)).expect("open registry");
    let mut ids = Vec::with_capacity(instances);
    for wave in (0..instances).collect::<Vec<_>>().chunks(1024) {
        let mut tasks = Vec::with_capacity(wave.len());
        for &i in wave {
            let registry = registry.clone();
            tasks.push(tokio::spawn(async move {
                registry
                    .register(Registration {
                        scope: Scope::Cluster,
                        cluster: format!("cluster{}", i / 1000),
                        hostname: format!("node{i:06}"),
                        service_type: ServiceType::MetricCollector,
                        meta: BTreeMap::new(),
                    })
                    .await
                    .expect("register")
            }));
        }
        for task in tasks {
            ids.push(task.await.expect("register task").instance_id);
        }
    }
    drop(registry);
    println!(
        "registered {instances} instances in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    let mut messages = Vec::with_capacity(instances.div_ceil(batch));
    for chunk in ids.chunks(batch) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let mut message = Vec::with_capacity(chunk.len() * 112);
        encode_heartbeat_into(&mut message, now_ns(), &refs).expect("encode");
        messages.push(message);
    }
    println!(
        "{} messages of up to {batch} heartbeats ({} bytes each)",
        messages.len(),
        messages[0].len()
    );
    decode_stage(&messages, instances);

    let stream = env_usize("FANIN_HEARTBEAT_STREAM", 0) != 0;
    let buffered = env_usize("FANIN_JS_BUFFERED", 0);
    let nats = if stream && buffered > 0 {
        println!("nats-server max_buffered_msgs: {buffered}");
        nats::NatsServer::start_jetstream_with_config(&format!(
            "jetstream {{\n  max_buffered_msgs: {buffered}\n  max_buffered_size: 4GB\n}}\n"
        ))
    } else if stream {
        nats::NatsServer::start_jetstream()
    } else {
        nats::NatsServer::start()
    };
    let pending = env_usize("FANIN_PENDING", 1024);
    println!("heartbeat-pending-messages: {pending}, heartbeat-stream: {stream}");
    // A stream redelivers what was not acknowledged after ack-wait (30 s by default): wait
    // longer than that before counting anything as lost.
    let patience = Duration::from_secs(if stream { 40 } else { 5 });
    let mut config = serde_json::json!({
        "addr": "127.0.0.1:0",
        "db": db,
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {
            "heartbeat-subject": SUBJECT,
            "discovery-interval": "1h",
            "heartbeat-pending-messages": pending,
        }
    });
    if stream {
        config["fleet"]["heartbeat-stream"] = serde_json::json!({"max-bytes": 8_i64 << 30});
    }
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("server starts");
    let publisher = async_nats::connect(nats.url()).await.expect("connect");
    let load_threads = env_usize("FANIN_LOAD", 0);
    let load = (load_threads > 0).then(|| {
        println!("load: {load_threads} busy thread(s) while heartbeats are published and applied");
        Load::start(load_threads)
    });

    publish_and_wait(
        &server,
        &publisher,
        &messages,
        instances as u64,
        1,
        "round 1 (pending -> active)",
        patience,
    )
    .await;
    publish_and_wait(
        &server,
        &publisher,
        &messages,
        instances as u64,
        rounds - 1,
        &format!("rounds 2-{rounds} (active)"),
        patience,
    )
    .await;
    drop(load);
    println!(
        "healthz after the burst: {}",
        get(&server, "/healthz").await
    );
    let metrics = get(&server, "/metrics").await;
    for name in [
        "ccfleet_heartbeat_messages_dropped_total ",
        "ccfleet_heartbeat_drop_episodes_total ",
    ] {
        if let Some(line) = metrics.lines().find(|l| l.starts_with(name)) {
            println!("metrics: {line}");
        }
    }
    if stream {
        stream_report(&nats.url()).await;
    }
    let active = server.registry().counts().active;
    server.shutdown().await.expect("shutdown");
    let stats_note = if active == instances as u64 {
        "all instances active"
    } else {
        "NOT all instances active"
    };
    println!("registry: {active} of {instances} active ({stats_note})");

    let registry = Registry::open(Some(&db)).expect("reopen registry");
    let ids: Vec<u128> = ids
        .iter()
        .map(|id| parse_instance_id(id).expect("instance id"))
        .collect();
    registry_stage(
        &registry,
        &db,
        &ids,
        rounds,
        batch.max(4096),
        10,
        "realistic (every heartbeat 10 s after the previous one)",
    )
    .await;
    registry_stage(
        &registry,
        &db,
        &ids,
        rounds,
        batch.max(4096),
        0,
        "repeat (the same second again)",
    )
    .await;
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}
