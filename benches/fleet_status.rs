//! What the fleet status views cost for a fleet of 20,005 members: 40 clusters of 500
//! collectors (`c01n0001` …) and 5 infra backends; per cluster one rack of 25 hosts stale
//! (`c01n[0101-0125]`, as a failed switch leaves it) and 25 hosts pending scattered over the
//! cluster (every 19th of the others), the rest active: 18,005 active, 1,000 stale, 1,000
//! pending. Measured on the functions the routes call:
//!
//! - the unfiltered instance list (`GET /api/fleet/instances`), its JSON and its gzip size;
//! - one page of it as the status page asks (`sort=state`, 100 rows);
//! - the summary (`GET /api/fleet/summary`), its JSON and gzip size in the compact form
//!   the route answers by default and in the full form of `v=1`;
//! - the stale members of one cluster (`cluster=c07&state=stale`).
//!
//! ```text
//! cargo bench -p ccfleet --bench fleet_status --features server
//! ```

use std::io::Write as _;
use std::sync::Arc;

use ccfleet::server::registry::{Service, State, StoredService};
use ccfleet::server::status::compact::CompactSummary;
use ccfleet::server::status::query::{Facts, Query};
use ccfleet::server::status::{snapshot, summary};
use ccfleet::wire::{Scope, ServiceType};
use criterion::{Criterion, criterion_group, criterion_main};

const CLUSTERS: usize = 40;
const PER_CLUSTER: usize = 500;
const NOW: i64 = 1_764_600_000;

fn fleet() -> Vec<StoredService> {
    let mut all = Vec::new();
    let mut key = 0i64;
    let mut add = |cluster: &str, host: String, ty: ServiceType, state: State| {
        key += 1;
        all.push(StoredService {
            key,
            instance: (key as u128) << 64 | 0xfeed,
            service: Service {
                scope: Scope::of_cluster(cluster),
                cluster: cluster.to_owned(),
                hostname: host,
                service_type: ty,
                state,
                registered_at: NOW - 86_400,
                last_heartbeat: match state {
                    State::Pending => None,
                    State::Stale => Some(NOW - 900 - key % 300),
                    _ => Some(NOW - key % 30),
                },
                config_revision: 4_122_896_713_510_786_713,
                meta: Arc::default(),
            },
        });
    };
    for c in 1..=CLUSTERS {
        let cluster = format!("c{c:02}");
        let mut others = 0;
        for n in 1..=PER_CLUSTER {
            let state = if (101..=125).contains(&n) {
                State::Stale
            } else {
                others += 1;
                if others % 19 == 7 {
                    State::Pending
                } else {
                    State::Active
                }
            };
            add(
                &cluster,
                format!("{cluster}n{n:04}"),
                ServiceType::MetricCollector,
                state,
            );
        }
    }
    for n in 1..=5 {
        add(
            "",
            format!("backend{n}"),
            ServiceType::Backend,
            State::Active,
        );
    }
    all
}

fn query(pairs: &[(&str, &str)]) -> Query {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Query::parse(&pairs).expect("a valid query")
}

fn gzip(bytes: &[u8]) -> usize {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap().len()
}

fn bench(c: &mut Criterion) {
    let all = fleet();
    let facts = |_: &StoredService| Facts::default();
    let unfiltered = Query::default();
    let page = query(&[("sort", "state"), ("limit", "100")]);
    let stale_of_one = query(&[("cluster", "c07"), ("state", "stale")]);

    let list =
        serde_json::to_vec(&snapshot::instances(&all, &unfiltered, facts).instances).unwrap();
    let rows = serde_json::to_vec(&snapshot::instances(&all, &page, facts).instances).unwrap();
    let full = summary::summary(&all, &unfiltered.filters, facts);
    let sum = serde_json::to_vec(&CompactSummary::from(&full)).unwrap();
    let sum_v1 = serde_json::to_vec(&full).unwrap();
    let one = snapshot::instances(&all, &stale_of_one, facts);
    eprintln!(
        "fleet_status: {} members; unfiltered instances {} bytes JSON, {} gzip; a page of 100 \
         (sort=state) {} bytes, {} gzip; summary {} bytes, {} gzip (v=1: {} bytes, {} gzip); \
         stale of one cluster: {} members",
        all.len(),
        list.len(),
        gzip(&list),
        rows.len(),
        gzip(&rows),
        sum.len(),
        gzip(&sum),
        sum_v1.len(),
        gzip(&sum_v1),
        one.total,
    );

    let mut group = c.benchmark_group("fleet_status_20005");
    group.sample_size(10);
    group.bench_function("instances unfiltered, to JSON", |b| {
        b.iter(|| serde_json::to_vec(&snapshot::instances(&all, &unfiltered, facts).instances))
    });
    group.bench_function("instances unfiltered, to JSON and gzip", |b| {
        b.iter(|| {
            gzip(
                &serde_json::to_vec(&snapshot::instances(&all, &unfiltered, facts).instances)
                    .unwrap(),
            )
        })
    });
    group.bench_function("a page of 100, sort=state, to JSON", |b| {
        b.iter(|| serde_json::to_vec(&snapshot::instances(&all, &page, facts).instances))
    });
    group.bench_function("summary, to JSON", |b| {
        b.iter(|| {
            serde_json::to_vec(&CompactSummary::from(&summary::summary(
                &all,
                &unfiltered.filters,
                facts,
            )))
        })
    });
    group.bench_function("stale of one cluster, to JSON", |b| {
        b.iter(|| serde_json::to_vec(&snapshot::instances(&all, &stale_of_one, facts).instances))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
