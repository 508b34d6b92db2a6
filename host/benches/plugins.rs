//! Plugin host benchmarks: instantiation from the `InstancePre`, `on-config` calls with 1 KiB
//! and 64 KiB configurations, a `collect` emitting 100 points, and how many plugins fit in
//! 1 GiB of resident memory (printed before the timings).
//!
//! Run with `cargo bench -p ccfleet-host --bench plugins`; the plugins are built from guest/
//! first, as in the tests.

#[path = "../tests/support/guests.rs"]
mod guests;

use std::time::{Duration, Instant};

use ccfleet_host::plugin::Instance;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::types::{ConfigUpdate, Source};
use ccfleet_host::{LoadedPlugin, PluginSpec, Runtime, RuntimeOptions};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime as Tokio;

struct Fixture {
    tokio: Tokio,
    runtime: Runtime,
    spec: PluginSpec,
    loaded: LoadedPlugin,
}

fn fixture(component: &str, config: serde_json::Value) -> Fixture {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    let mut spec = PluginSpec::new(guests::component(component));
    spec.config = config;
    let loaded = runtime.load_blocking(&spec).expect("load");
    Fixture {
        tokio,
        runtime,
        spec,
        loaded,
    }
}

impl Fixture {
    fn instance(&self, sink: sink::SinkHandle) -> Instance {
        self.tokio
            .block_on(self.loaded.instantiate(&self.runtime, &self.spec, sink))
            .expect("instantiate")
    }
}

/// A JSON configuration of about `size` bytes.
fn config_of(size: usize) -> ConfigUpdate {
    let filler = "x".repeat(size.saturating_sub(16));
    ConfigUpdate {
        config: Some(format!(r#"{{"filler":"{filler}"}}"#)),
        revision: "1".to_owned(),
        source: Source::Fleet,
    }
}

fn drain(rx: &mut BatchReceiver) {
    while rx.try_recv().is_ok() {}
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Instantiates `count` roster-logger plugins (each initialised and configured) and reports
/// the resident memory each one costs.
fn plugins_per_gib() {
    const COUNT: usize = 200;
    let f = fixture("roster-logger", serde_json::json!({}));
    let (sink, _rx) = sink::channel(16);
    let update = config_of(1024);
    let before = resident_bytes();
    let mut instances = Vec::with_capacity(COUNT);
    for _ in 0..COUNT {
        let mut instance = f.instance(sink.clone());
        f.tokio
            .block_on(instance.on_config(&update))
            .expect("on-config")
            .expect("accepted");
        instances.push(instance);
    }
    match (before, resident_bytes()) {
        (Some(before), Some(after)) if after > before => {
            let per = (after - before) / COUNT as u64;
            println!(
                "plugins per 1 GiB: {} (resident memory per roster-logger instance: {} KiB, \
                 measured over {COUNT} instances)",
                (1u64 << 30) / per.max(1),
                per / 1024
            );
        }
        _ => println!("plugins per 1 GiB: not measurable here (no /proc/self/statm)"),
    }
    drop(instances);
}

fn benches(c: &mut Criterion) {
    plugins_per_gib();

    let f = fixture("roster-logger", serde_json::json!({}));
    let (sink, _rx) = sink::channel(16);
    c.bench_function("instantiate from InstancePre (+ init)", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let instance = f.instance(sink.clone());
                total += start.elapsed();
                // Dropping the store is not part of instantiation.
                drop(instance);
            }
            total
        })
    });

    let mut group = c.benchmark_group("on-config");
    for size in [1024usize, 64 * 1024] {
        let update = config_of(size);
        let mut instance = f.instance(sink.clone());
        // The first call logs the revision; later calls with the same revision measure the
        // call and the copy of the configuration only.
        f.tokio
            .block_on(instance.on_config(&update))
            .expect("on-config")
            .expect("accepted");
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("{} KiB", size / 1024), |b| {
            b.iter_custom(|iters| {
                f.tokio.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        instance
                            .on_config(&update)
                            .await
                            .expect("on-config")
                            .expect("accepted");
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();

    let f = fixture("hostile-oversized-emit", serde_json::json!({"points": 100}));
    let (sink, mut rx) = sink::channel(1024);
    let mut instance = f.instance(sink);
    let mut group = c.benchmark_group("collect");
    group.throughput(Throughput::Elements(100));
    group.bench_function("emit 100 points", |b| {
        b.iter_custom(|iters| {
            f.tokio.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    instance
                        .collect(1_700_000_000_000_000_000)
                        .await
                        .expect("collect")
                        .expect("accepted");
                    total += start.elapsed();
                    drain(&mut rx);
                }
                total
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = plugin_benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(plugin_benches);
