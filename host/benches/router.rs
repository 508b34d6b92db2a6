//! The router's cost per point: one batch of 96 points (what a `cpustat` round of a
//! 16-thread node looks like: six metrics per hardware thread, tagged `type=hwthread`,
//! `type-id=N`) routed under three rule sets:
//!
//! - `stamp-only`: `interval_timestamp` alone, so the cost is decoding the batch and encoding
//!   it again (what any active router pays);
//! - `readme`: the rules of cc-metric-collector's router README (wildcard and conditional
//!   tags, a tag deleted, a name dropped, a regex drop, a rename, units);
//! - `ten-conditions`: ten `add_tags_if`/`drop_messages_if` conditions of the documented
//!   forms (comparisons, `in` lists, `matches`, tag and field access) on every point.
//!
//! Throughput is in points, so criterion reports the time per point. Run with
//! `cargo bench -p ccfleet-host --bench router`.

/// The allocator of the `ccfleet` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;

use ccfleet_host::agent::router::topology::{HwThread, Topology};
use ccfleet_host::agent::router::{Router, RouterConfig};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

const NOW: i64 = 1_700_000_003_000_000_000;

fn batch() -> Vec<u8> {
    let mut out = String::new();
    for cpu in 0..16 {
        for (i, metric) in [
            "cpu_user",
            "cpu_system",
            "cpu_idle",
            "cpu_iowait",
            "cpu_irq",
            "cpu_softirq",
        ]
        .iter()
        .enumerate()
        {
            out.push_str(&format!(
                "{metric},cluster=fritz,hostname=node01,type=hwthread,type-id={cpu},unit=Percent value={}.{} 1700000001000000000\n",
                i * 7 + cpu,
                cpu % 10
            ));
        }
    }
    out.into_bytes()
}

fn router(config: Value) -> Router {
    let config: RouterConfig = serde_json::from_value(config).unwrap();
    let topology = Topology::new(
        (0..16)
            .map(|cpu| HwThread {
                cpu,
                core: cpu % 8,
                socket: cpu / 8,
                die: cpu / 8,
                numa: cpu / 8,
            })
            .collect(),
    );
    let r = Router::with_topology(&config, "node01", Arc::new(topology)).unwrap();
    assert!(r.is_active());
    r
}

fn bench(c: &mut Criterion) {
    let lines = batch();
    let points = lines.iter().filter(|&&b| b == b'\n').count() as u64;
    let configs = [
        ("stamp-only", json!({"interval_timestamp": true})),
        (
            "readme",
            json!({
                "interval_timestamp": true,
                "add_tags": [
                    {"key": "cluster", "value": "testcluster", "if": "*"},
                    {"key": "test", "value": "testing", "if": "name == 'temp_package_id_0'"}
                ],
                "delete_tags": [{"key": "unit", "if": "*"}],
                "drop_metrics": ["not_interesting_metric_at_all"],
                "drop_metrics_if": ["match('temp_core_%d+', metric.Name())"],
                "rename_metrics": {"cpu_irq": "cpu_interrupts"},
                "normalize_units": true,
                "change_unit_prefix": {"mem_used": "G"}
            }),
        ),
        (
            "ten-conditions",
            json!({"process_messages": {
                "drop_messages_if": [
                    "name == 'cpu_guest'",
                    "type == 'socket' && type-id == 3",
                    "value > 1000",
                    "name matches '^gpu_'",
                    "tag.cluster == 'other' || tags.hostname == 'node99'"
                ],
                "add_tags_if": [
                    {"if": "type-id in [0, 1, 2, 3]", "key": "first", "value": "yes"},
                    {"if": "name startsWith 'cpu_' && value < 50", "key": "low", "value": "yes"},
                    {"if": "msg.HasTag('unit')", "key": "has_unit", "value": "yes"},
                    {"if": "type-id in getCpuListOfType('socket', 1)", "key": "socket", "value": "1"},
                    {"if": "messagetype == 'metric' and not (name in ['cpu_idle'])", "key": "busy", "value": "yes"}
                ]
            }}),
        ),
    ];
    let mut group = c.benchmark_group("router");
    group.throughput(Throughput::Elements(points));
    for (name, config) in configs {
        let mut r = router(config);
        let out = r.route(&lines, NOW);
        assert!(out.points > 0 && out.failed == 0, "{name}: {out:?}");
        group.bench_function(name, |b| b.iter(|| r.route(&lines, NOW)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
