//! The InfluxDB sinks' throughput into a real VictoriaMetrics (started from its Debian
//! package on a free loopback port): batches of 96 `cpustat`-like points (what one
//! collect round of a 16-thread node emits), 1,000 nodes, pushed through the sink as the
//! agent's fan-out pushes them, until the sink has written every point.
//!
//! Reported per configuration: points per second of wall time, and points per CPU-second of
//! this process (every thread: the sink's batching, encoding and HTTP client; the receiver
//! runs in its own process and its CPU time is shown beside). Run with
//! `cargo bench -p ccfleet-host --bench sinks` (`SINK_BENCH_POINTS`, default 2,000,000).

/// The allocator of the `ccfleet` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../tests/support/receivers.rs"]
mod receivers;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ccfleet_host::agent::sinks::{SinkConfig, start_standalone};
use ccfleet_host::sink::Batch;
use receivers::VictoriaMetrics;
use serde_json::{Value, json};

const PER_BATCH: usize = 96;
const NODES: usize = 1000;

/// CPU time (user and system) of this process so far.
fn own_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time of process `pid` so far, from `/proc/<pid>/stat`.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn batches(points: usize) -> Vec<Batch> {
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
        - 3_600_000_000_000;
    let metrics = [
        "cpu_user",
        "cpu_system",
        "cpu_idle",
        "cpu_iowait",
        "cpu_irq",
        "cpu_softirq",
    ];
    let plugin: Arc<str> = Arc::from("cpustat");
    (0..points.div_ceil(PER_BATCH))
        .map(|b| {
            let node = b % NODES;
            let stamp = start + (b / NODES) as i64 * 1_000_000_000;
            let mut lines = String::with_capacity(PER_BATCH * 110);
            for i in 0..PER_BATCH {
                let cpu = i / metrics.len();
                let metric = metrics[i % metrics.len()];
                lines.push_str(&format!(
                    "{metric},cluster=fritz,hostname=f{node:04},type=hwthread,type-id={cpu},unit=Percent value={}.{} {stamp}\n",
                    (b + i) % 100,
                    i % 10
                ));
            }
            Batch {
                plugin: plugin.clone(),
                lines: lines.into(),
                points: PER_BATCH,
            }
        })
        .collect()
}

async fn run(vm: &VictoriaMetrics, label: &str, extra: Value, points: usize) {
    let mut config = json!({
        "type": "influxdb", "host": "127.0.0.1", "port": vm.port(),
        "database": "bench", "organization": "fau",
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let config: SinkConfig = serde_json::from_value(config).unwrap();
    let batches = batches(points);
    let total = batches.len() * PER_BATCH;
    let sink = start_standalone("bench", &config, "fritz").unwrap();
    let counters = sink.counters.clone();
    let vm_pid = vm.pid().unwrap();
    let (wall, cpu, vm_cpu) = (Instant::now(), own_cpu(), cpu_of(vm_pid));
    for batch in batches {
        sink.tx.send(batch).await.unwrap();
    }
    drop(sink.tx);
    sink.task.await.unwrap();
    let (wall, cpu, vm_cpu) = (wall.elapsed(), own_cpu() - cpu, cpu_of(vm_pid) - vm_cpu);
    let sent = counters.sent.load(Relaxed) as usize;
    assert_eq!(sent, total, "{label}: every point written");
    assert_eq!(counters.dropped(), 0, "{label}: nothing dropped");
    println!(
        "{label:<40} {total} points in {:>6.2} s: {:>10.0} points/s wall, {:>10.0} points per CPU-second of the sink's process ({:.2} s CPU; receiver {:.2} s CPU)",
        wall.as_secs_f64(),
        total as f64 / wall.as_secs_f64(),
        total as f64 / cpu.as_secs_f64(),
        cpu.as_secs_f64(),
        vm_cpu.as_secs_f64(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once, small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let points: usize = std::env::var("SINK_BENCH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20_000 } else { 2_000_000 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let vm = VictoriaMetrics::start().await;
        run(&vm, "influxdb v2, precision s (default)", json!({}), points).await;
        run(
            &vm,
            "influxdb v2, precision ns",
            json!({"precision": "ns"}),
            points,
        )
        .await;
        run(
            &vm,
            "influxdb v1, precision s",
            json!({"api": "v1"}),
            points,
        )
        .await;
        run(
            &vm,
            "influxdb v2, batch_size 5000",
            json!({"batch_size": 5000}),
            points,
        )
        .await;
        run(
            &vm,
            "influxdb v2, use_gzip",
            json!({"use_gzip": true}),
            points,
        )
        .await;
    });
}
