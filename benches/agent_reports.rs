//! What staged rollouts cost a fleet server at 100,000 agents (`REPORT_MEMBERS`, default
//! 100,000): parsing the `X-CCFleet-Report` header one configuration poll carries, recording
//! it in the map of every member's latest report, and one look at a rollout's stage (its
//! gates judged over every covered member of the registry), which the leading server takes
//! once a second.
//!
//! ```text
//! cargo bench -p ccfleet --bench agent_reports --features server,client
//! ```

use std::hint::black_box;
use std::time::Duration;

use ccfleet::server::configtree::ConfigTree;
use ccfleet::server::registry::{Registration, Registry};
use ccfleet::server::rollout::{RolloutState, Rollouts, counts};
use ccfleet::wire::{AgentReport, Scope, ServiceType};
use criterion::{Criterion, criterion_group, criterion_main};

fn members() -> usize {
    std::env::var("REPORT_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// A report of an agent running the nine node collectors, one of them fleet-named.
fn header() -> String {
    let mut plugins = vec!["loadavg@3f0c5b1e9d2a7c4b:running".to_owned()];
    for name in [
        "cpustat",
        "memstat",
        "netstat",
        "iostat",
        "diskstat",
        "numastats",
        "cpufreq",
        "tempstat",
    ] {
        plugins.push(format!("{name}@-:running"));
    }
    format!("applied=8817256123; plugins={}", plugins.join(","))
}

fn bench(c: &mut Criterion) {
    let n = members();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tree_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tree_dir.path().join("ccmc/fritz")).unwrap();
    std::fs::create_dir_all(tree_dir.path().join("rollouts")).unwrap();
    std::fs::write(
        tree_dir.path().join("ccmc/fritz/defaults.json"),
        r#"{"plugins": [{"name": "loadavg", "sha256": "1111111111111111111111111111111111111111111111111111111111111111"}]}"#,
    )
    .unwrap();
    let sha = "3f0c5b1e9d2a7c4b8e6f1a0d5c9b2e7f4a8d1c6b3e0f9a2d7c5b8e1f4a0d3c6b";
    std::fs::write(
        tree_dir.path().join("rollouts/loadavg-v2.json"),
        format!(
            r#"{{"type": "ccmc", "cluster": "fritz", "change": {{"plugins": [{{"name": "loadavg", "sha256": "{sha}"}}]}},
                "stages": [{{"percent": 10}}, {{"percent": 100}}]}}"#
        ),
    )
    .unwrap();
    let tree = ConfigTree::load(tree_dir.path()).unwrap();
    let rollouts = Rollouts::new();
    assert!(rollouts.refresh(&tree, &|_| true).is_empty());
    let definition = rollouts.definitions()[0].clone();

    // The registry: `n` active collectors of the cluster, each with a report.
    let registry = Registry::open(None).unwrap();
    let report = AgentReport::parse(&header()).unwrap();
    runtime.block_on(async {
        let mut ids = Vec::with_capacity(n);
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let batch = chunk.iter().map(|i| {
                let registry = registry.clone();
                async move {
                    registry
                        .register(Registration {
                            scope: Scope::Cluster,
                            cluster: "fritz".to_owned(),
                            hostname: format!("f{i:06}"),
                            service_type: ServiceType::MetricCollector,
                            meta: Default::default(),
                        })
                        .await
                        .unwrap()
                        .instance_id
                }
            });
            ids.extend(futures::future::join_all(batch).await);
        }
        for id in &ids {
            registry.heartbeat(id).await.unwrap();
        }
    });
    for service in registry.active() {
        rollouts.record_report(&service, report.clone());
    }
    let state = RolloutState::start(definition.digest, 0);
    let last = RolloutState {
        stage: 1,
        ..state.clone()
    };
    let sample = registry.active().into_iter().next().unwrap();

    let mut group = c.benchmark_group("agent_reports");
    let text = header();
    group.bench_function("parse the header of one poll", |b| {
        b.iter(|| AgentReport::parse(black_box(&text)).unwrap())
    });
    group.bench_function(
        format!("parse and record one poll's report ({n} members)"),
        |b| {
            b.iter(|| {
                rollouts.record_report(&sample, AgentReport::parse(black_box(&text)).unwrap())
            })
        },
    );
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function(format!("judge a 10 % stage ({n} members)"), |b| {
        b.iter(|| counts(&rollouts, &registry, &tree, &definition, black_box(&state)))
    });
    group.bench_function(format!("judge a 100 % stage ({n} members)"), |b| {
        b.iter(|| counts(&rollouts, &registry, &tree, &definition, black_box(&last)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
