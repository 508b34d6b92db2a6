//! The agent's `http` sink against a real local server implementing cc-metric-store's
//! `/api/write`: every point the plugin emitted arrives exactly (decoded with ccfleet's
//! decoder), with the JWT, the cluster parameter and gzip; 5xx and 429 are retried, other 4xx
//! dropped and counted; a replaced `jwt-file` is read again; a stalled store drops (and counts) its own points without slowing the
//! plugin or another sink.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/store.rs"]
mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use serde_json::{Value as Json, json};
use store::{Mode, Store, StoredPoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);
const JWT: &str = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudCJ9.s3cr3t-signature";
const LOADAVG: &str = "0.25 0.50 1.75 2/311 4242\n";

async fn fleet_server(dir: &Path) -> RunningServer {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("ccmc")).unwrap();
    std::fs::write(tree.join("ccmc").join("defaults.json"), "{}").unwrap();
    let config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "fleet": {"config-dir": tree, "config-reload-interval": "1h"}
    });
    ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server")
}

/// An agent running `loadavg` on a recorded `/proc/loadavg` every 20 ms, writing to `sinks`.
async fn agent(server: &RunningServer, dir: &Path, sinks: Json) -> RunningAgent {
    // The collector reads a recorded /proc/loadavg from a directory of fixtures.
    let fixtures = dir.join("fixtures");
    std::fs::create_dir_all(fixtures.join("proc")).unwrap();
    std::fs::write(fixtures.join("proc").join("loadavg"), LOADAVG).unwrap();
    let jwt = dir.join("ccms.jwt");
    std::fs::write(&jwt, format!("{JWT}\n")).unwrap();
    let config = json!({
        "service-type": "ccmc",
        "fleet": {"url": server.base_url(), "cluster": "fritz", "hostname": "node01",
                  "config-poll-interval": "1h"},
        "plugin-cache-dir": dir.join("compiled"),
        "metrics-addr": "127.0.0.1:0",
        "sinks": sinks,
        "plugins": [{
            "path": guests::component("loadavg"),
            // The three load averages only, so that every round is three points.
            "config": {"cluster": "fritz", "hostname": "node01",
                       "exclude_metrics": ["proc_run", "proc_total"]},
            "collect-interval": "20ms",
            "capabilities": {"read-files": ["/proc/loadavg"], "files-root": fixtures}
        }]
    });
    let config = AgentConfig::from_json(&config.to_string(), dir).unwrap();
    Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts")
}

async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// The value of the sample of `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name} is not a number"),
        })
        .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{text}"))
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// The three points one collect round makes of [`LOADAVG`], without their timestamp.
/// A point without its timestamp: measurement, tags, value.
type Bare = (String, Vec<(String, String)>, f64);

fn expected_round() -> Vec<Bare> {
    let tags = vec![
        ("hostname".to_owned(), "node01".to_owned()),
        ("type".to_owned(), "node".to_owned()),
        ("cluster".to_owned(), "fritz".to_owned()),
    ];
    [
        ("load_one", 0.25),
        ("load_five", 0.50),
        ("load_fifteen", 1.75),
    ]
    .into_iter()
    .map(|(m, v)| (m.to_owned(), tags.clone(), v))
    .collect()
}

/// Checks every stored point against the rounds the plugin made: each timestamp carries
/// exactly one round's three points.
fn assert_whole_rounds(points: &[StoredPoint]) {
    let mut by_time = std::collections::BTreeMap::<i64, Vec<Bare>>::new();
    for p in points {
        let mut tags = p.tags.clone();
        tags.sort();
        by_time
            .entry(p.time.expect("a timestamp"))
            .or_default()
            .push((p.measurement.clone(), tags, p.value));
    }
    let mut expected = expected_round();
    for (_, tags, _) in &mut expected {
        tags.sort();
    }
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    for (time, mut round) in by_time {
        round.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(round, expected, "the points at {time}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_emitted_point_reaches_the_store_gzipped_with_the_jwt_and_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(Some(JWT)).await;
    let agent = agent(
        &server,
        dir.path(),
        json!({"store": {"type": "http", "url": store.url(), "jwt-file": "ccms.jwt",
                         "gzip": true, "batch-size": 6, "flush-delay": "50ms"}}),
    )
    .await;
    let emitted = agent.plugins()[0].stats();
    wait_until("the store holds 30 points", async || {
        store.points().len() >= 30
    })
    .await;
    agent.shutdown().await.expect("clean shutdown");

    // Shutdown writes what was pending: the store holds exactly what the plugin emitted.
    let points = store.points();
    assert_eq!(points.len() as u64, emitted.snapshot().points_emitted);
    assert_whole_rounds(&points);
    let requests = store.requests();
    assert!(requests.len() >= 5, "{} requests", requests.len());
    for request in &requests {
        assert_eq!(
            request.authorization.as_deref(),
            Some(&*format!("Bearer {JWT}"))
        );
        assert_eq!(request.cluster.as_deref(), Some("fritz"));
        assert!(request.gzip, "{request:?}");
        assert!(request.points <= 6 + 3, "batch-size exceeded: {request:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_and_client_errors_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(Some(JWT)).await;
    store.set(Mode::Fail(503));
    let agent = agent(
        &server,
        dir.path(),
        json!({"store": {"type": "http", "url": store.url(), "jwt-file": "ccms.jwt",
                         "batch-size": 3, "flush-delay": "10ms", "retry-backoff": "20ms",
                         "max-retry-backoff": "40ms", "retry-buffer": 30}}),
    )
    .await;
    let addr = agent.metrics_addr().unwrap();
    let emitted = agent.plugins()[0].stats();
    let store_sink = [("sink", "store"), ("type", "http")];

    // 503, then 429: retried, and with a 30-point buffer the oldest points go first.
    wait_until("a 503 is retried twice", async || {
        sample(
            &scrape(addr).await,
            "ccfleet_agent_sink_retries_total",
            &store_sink,
        ) >= 2.0
    })
    .await;
    store.set(Mode::Fail(429));
    let before = sample(
        &scrape(addr).await,
        "ccfleet_agent_sink_retries_total",
        &store_sink,
    );
    wait_until("a 429 is retried", async || {
        sample(
            &scrape(addr).await,
            "ccfleet_agent_sink_retries_total",
            &store_sink,
        ) > before
    })
    .await;
    wait_until("the retry buffer overflows", async || {
        let text = scrape(addr).await;
        sample(
            &text,
            "ccfleet_agent_sink_points_dropped_total",
            &[("sink", "store"), ("reason", "retry_buffer_full")],
        ) > 0.0
    })
    .await;
    assert!(store.points().is_empty());

    // The store recovers: what the buffer held arrives, newest kept.
    store.set(Mode::Accept);
    wait_until("points arrive after the outage", async || {
        store.points().len() >= 30
    })
    .await;

    // A 400 is dropped at once: no retry, counted as rejected.
    store.set(Mode::Fail(400));
    let text = scrape(addr).await;
    let retries = sample(&text, "ccfleet_agent_sink_retries_total", &store_sink);
    wait_until("a 400 drops points", async || {
        sample(
            &scrape(addr).await,
            "ccfleet_agent_sink_points_dropped_total",
            &[("sink", "store"), ("reason", "rejected")],
        ) >= 6.0
    })
    .await;
    let text = scrape(addr).await;
    assert_eq!(
        sample(&text, "ccfleet_agent_sink_retries_total", &store_sink),
        retries,
        "a 400 was retried"
    );
    store.set(Mode::Accept);
    let counters = agent.sinks()[0].counters.clone();
    agent.shutdown().await.expect("clean shutdown");

    // Nothing unaccounted for: stored + dropped (buffer overflow, rejected) = emitted.
    let points = store.points();
    assert_whole_rounds(&points);
    let rejected: usize = store
        .requests()
        .iter()
        .filter(|r| r.mode == Mode::Fail(400))
        .map(|r| r.points)
        .sum();
    assert_eq!(
        counters.dropped_rejected.load(Relaxed),
        rejected as u64,
        "every refused batch was sent once and counted"
    );
    assert_eq!(counters.sent.load(Relaxed), points.len() as u64);
    assert_eq!(
        points.len() as u64 + counters.dropped(),
        emitted.snapshot().points_emitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_file_replaced_while_the_store_refuses_the_old_token_takes_over_without_loss() {
    // JWTs expire: an operator replaces the file, and the batches the store refused with
    // 401 meanwhile must neither be dropped nor need an agent restart to go out.
    const NEW: &str = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudCIsIm4iOjJ9.rotated-signature";
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(Some(NEW)).await;
    let agent = agent(
        &server,
        dir.path(),
        json!({"store": {"type": "http", "url": store.url(), "jwt-file": "ccms.jwt",
                         "batch-size": 3, "flush-delay": "10ms", "retry-backoff": "20ms",
                         "max-retry-backoff": "40ms"}}),
    )
    .await;
    let addr = agent.metrics_addr().unwrap();
    let emitted = agent.plugins()[0].stats();
    let store_sink = [("sink", "store"), ("type", "http")];
    wait_until("the old token is refused twice", async || {
        sample(
            &scrape(addr).await,
            "ccfleet_agent_sink_retries_total",
            &store_sink,
        ) >= 2.0
    })
    .await;
    assert!(store.points().is_empty());
    // Replaced the way deployment tools do it: a new file renamed over the old one.
    let staged = dir.path().join("ccms.jwt.new");
    std::fs::write(&staged, format!("{NEW}\n")).unwrap();
    std::fs::rename(&staged, dir.path().join("ccms.jwt")).unwrap();
    wait_until("points arrive with the new token", async || {
        store.points().len() >= 30
    })
    .await;
    let counters = agent.sinks()[0].counters.clone();
    agent.shutdown().await.expect("clean shutdown");

    let points = store.points();
    assert_whole_rounds(&points);
    assert_eq!(
        counters.dropped(),
        0,
        "nothing refused with 401 was dropped"
    );
    assert_eq!(points.len() as u64, emitted.snapshot().points_emitted);
    let requests = store.requests();
    let stale = format!("Bearer {JWT}");
    assert!(
        requests
            .iter()
            .any(|r| r.authorization.as_deref() == Some(&*stale))
    );
    for request in requests.iter().filter(|r| r.points > 0) {
        assert_eq!(
            request.authorization.as_deref(),
            Some(&*format!("Bearer {NEW}"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_drops_counted_points_and_blocks_neither_the_plugin_nor_another_sink() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let stalled = Store::start(None).await;
    stalled.set(Mode::Stall);
    let healthy = Store::start(None).await;
    let agent = agent(
        &server,
        dir.path(),
        json!({
            "stalled": {"type": "http", "url": stalled.url(), "queue-size": 2,
                        "batch-size": 3, "flush-delay": "10ms", "timeout": "2s",
                        "retry-buffer": 6},
            "healthy": {"type": "http", "url": healthy.url(), "batch-size": 3,
                        "flush-delay": "10ms"}
        }),
    )
    .await;
    let addr = agent.metrics_addr().unwrap();
    let emitted = agent.plugins()[0].stats();
    let queue_full = [("sink", "stalled"), ("reason", "queue_full")];
    wait_until("the stalled sink's queue overflows", async || {
        sample(
            &scrape(addr).await,
            "ccfleet_agent_sink_points_dropped_total",
            &queue_full,
        ) > 0.0
    })
    .await;
    // While the store hangs, the plugin keeps emitting and the other sink keeps writing.
    let (before, stored_before) = (emitted.snapshot().points_emitted, healthy.points().len());
    wait_until("the plugin emits 30 more points", async || {
        emitted.snapshot().points_emitted >= before + 30
    })
    .await;
    wait_until("the healthy store gets them", async || {
        healthy.points().len() >= stored_before + 30
    })
    .await;
    let text = scrape(addr).await;
    for reason in ["sink_full", "sink_closed", "refused"] {
        assert_eq!(
            sample(
                &text,
                "ccfleet_agent_points_dropped_total",
                &[("plugin", "loadavg"), ("reason", reason)]
            ),
            0.0,
            "the plugin lost points ({reason})"
        );
    }
    assert!(stalled.points().is_empty());
    assert!(
        !stalled.requests().is_empty(),
        "the stalled store saw a request"
    );
    let counters = agent.sinks()[1].counters.clone();
    assert_eq!(agent.sinks()[1].name, "stalled");
    agent.shutdown().await.expect("clean shutdown");
    // Every point the stalled sink was handed is counted as dropped, none as sent.
    assert_eq!(counters.sent.load(Relaxed), 0);
    assert_eq!(counters.dropped(), emitted.snapshot().points_emitted);
    assert_whole_rounds(&healthy.points());
    assert_eq!(
        healthy.points().len() as u64,
        emitted.snapshot().points_emitted
    );
}
