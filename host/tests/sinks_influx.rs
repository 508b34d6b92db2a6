//! The `influxdb` and `influxasync` sinks against real receivers started from their Debian
//! packages: VictoriaMetrics (InfluxDB's v2 `/api/v2/write` and v1 `/write`) and InfluxDB
//! 1.x (`/write`; Debian's 1.6 has no v2 API). Every point written is read back through the
//! receiver's query API, with its tags, value and timestamp; a receiver restarted mid-run
//! loses nothing the sink's retry buffer holds.

#[path = "support/receivers.rs"]
mod receivers;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ccfleet_host::agent::sinks::{SinkConfig, Standalone, start_standalone};
use ccfleet_host::sink::Batch;
use receivers::{InfluxDb, VictoriaMetrics};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn sink(config: Value) -> Standalone {
    let config: SinkConfig = serde_json::from_value(config).expect("a sink configuration");
    start_standalone("influx", &config, "fritz").expect("the sink starts")
}

/// One point: host tag, value, timestamp in ms.
type Point = (String, i64, i64);

/// `count` points in batches of `per_batch`, one millisecond apart from `start_ms`, spread
/// over four hosts, values counting up from `first`.
fn points(first: i64, count: i64, start_ms: i64) -> Vec<Point> {
    (0..count)
        .map(|i| (format!("n{}", i % 4), first + i, start_ms + first + i))
        .collect()
}

fn batch(points: &[Point]) -> Batch {
    let mut lines = String::new();
    for (host, value, ms) in points {
        lines.push_str(&format!(
            "cpu_load,cluster=fritz,hostname={host},type=node value={value} {}\n",
            ms * 1_000_000
        ));
    }
    Batch {
        plugin: Arc::from("test"),
        lines: lines.into(),
        points: points.len(),
    }
}

async fn send_all(sink: &Standalone, points: &[Point], per_batch: usize) {
    for chunk in points.chunks(per_batch) {
        sink.tx.send(batch(chunk)).await.expect("the sink runs");
    }
}

/// Closes the sink and waits until it wrote (or dropped) everything.
async fn finish(sink: Standalone) -> Arc<ccfleet_host::agent::sinks::SinkCounters> {
    let Standalone { tx, counters, task } = sink;
    drop(tx);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the sink ends")
        .unwrap();
    counters
}

/// The points VictoriaMetrics holds for `cpu_load_value`, as (hostname, value, ms).
async fn stored_in_vm(vm: &VictoriaMetrics) -> BTreeSet<Point> {
    vm.export()
        .await
        .into_iter()
        .filter(|(series, _, _)| series.contains("__name__=cpu_load_value"))
        .map(|(series, ms, value)| {
            assert!(
                series.contains("cluster=fritz") && series.contains("type=node"),
                "{series}"
            );
            let host = series
                .split(',')
                .find_map(|l| l.strip_prefix("hostname="))
                .unwrap_or_else(|| panic!("no hostname in {series}"))
                .to_owned();
            (host, value as i64, ms)
        })
        .collect()
}

async fn wait_for_vm(vm: &VictoriaMetrics, expected: &BTreeSet<Point>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stored = stored_in_vm(vm).await;
        if &stored == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "VictoriaMetrics holds {} points, expected {}; missing e.g. {:?}, extra e.g. {:?}",
            stored.len(),
            expected.len(),
            expected.difference(&stored).next(),
            stored.difference(expected).next()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_reaches_victoria_metrics_through_the_v2_and_the_v1_api() {
    let vm = VictoriaMetrics::start().await;
    let start = now_ms() - 60_000;
    // v2, as cc-lib writes: organization, bucket, token; gzip; the async sink's keys.
    let v2 = sink(json!({
        "type": "influxasync", "host": "127.0.0.1", "port": vm.port().to_string(),
        "organization": "cc", "database": "fritz", "password": "token",
        "batch_size": 250, "flush_interval": 50, "precision": "ms", "use_gzip": true
    }));
    let first = points(0, 1000, start);
    send_all(&v2, &first, 100).await;
    let counters = finish(v2).await;
    assert_eq!(counters.sent.load(Relaxed), 1000);
    assert_eq!(counters.dropped(), 0);
    // v1: database, user and password (basic authentication); the blocking sink's keys.
    let v1 = sink(json!({
        "type": "influxdb", "api": "v1", "host": "127.0.0.1", "port": vm.port(),
        "database": "fritz", "user": "u", "password": "p",
        "batch_size": 1000, "flush_delay": "50ms", "precision": "ms"
    }));
    let second = points(1000, 1000, start);
    send_all(&v1, &second, 100).await;
    let counters = finish(v1).await;
    assert_eq!(counters.sent.load(Relaxed), 1000);
    let expected: BTreeSet<Point> = first.into_iter().chain(second).collect();
    wait_for_vm(&vm, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_reaches_influxdb_1_through_the_v1_api_in_each_precision() {
    let db = InfluxDb::start().await;
    let answer = db.query("", "CREATE DATABASE fritz").await;
    assert!(answer["results"][0].get("error").is_none(), "{answer}");
    let start = now_ms() - 60_000;
    let sent = points(0, 600, start);
    let s = sink(json!({
        "type": "influxdb", "api": "v1", "host": "127.0.0.1", "port": db.port().to_string(),
        "database": "fritz", "batch_size": 200, "flush_delay": "50ms", "precision": "ms",
        "use_gzip": true
    }));
    send_all(&s, &sent, 50).await;
    let counters = finish(s).await;
    assert_eq!(counters.sent.load(Relaxed), 600);
    assert_eq!(counters.dropped(), 0);
    let expected: Vec<(String, i64)> = {
        let mut rows: Vec<(String, i64)> = sent
            .iter()
            .map(|(host, value, ms)| {
                (
                    format!("cluster=fritz,hostname={host},type=node,value={value}"),
                    ms * 1_000_000,
                )
            })
            .collect();
        rows.sort();
        rows
    };
    assert_eq!(db.rows("fritz", "cpu_load").await, expected);
    // Precision s: the timestamp is cut to the second it falls in.
    let second = sink(json!({
        "type": "influxdb", "api": "v1", "host": "127.0.0.1", "port": db.port(),
        "database": "fritz", "flush_delay": "50ms"
    }));
    let ms: i64 = 1_700_000_000_789;
    second
        .tx
        .send(Batch {
            plugin: Arc::from("test"),
            lines: format!("seconds,hostname=n9 value=7 {}\n", ms * 1_000_000).into(),
            points: 1,
        })
        .await
        .unwrap();
    finish(second).await;
    assert_eq!(
        db.rows("fritz", "seconds").await,
        [(
            "hostname=n9,value=7".to_owned(),
            1_700_000_000 * 1_000_000_000
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_restarted_mid_run_loses_nothing_the_retry_buffer_holds() {
    let mut vm = VictoriaMetrics::start().await;
    let start = now_ms() - 60_000;
    let s = sink(json!({
        "type": "influxdb", "host": "127.0.0.1", "port": vm.port().to_string(),
        "organization": "cc", "database": "fritz", "batch_size": 100, "flush_delay": "20ms",
        "precision": "ms", "retry_interval": "50ms", "max_retry_interval": "200ms",
        "retry_buffer": 100000
    }));
    let all = points(0, 6000, start);
    // A third while the receiver runs ...
    send_all(&s, &all[..2000], 100).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.counters.sent.load(Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing was sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... a third while it is down (the sink must notice) ...
    vm.kill();
    send_all(&s, &all[2000..4000], 100).await;
    while s.counters.retried.load(Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no write failed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        s.counters.sent.load(Relaxed) < 4000,
        "the sink holds points while the receiver is down"
    );
    // ... and a third after it came back.
    vm.restart().await;
    send_all(&s, &all[4000..], 100).await;
    let counters = finish(s).await;
    assert_eq!(counters.dropped(), 0);
    assert_eq!(counters.sent.load(Relaxed), 6000);
    assert!(counters.errors.load(Relaxed) > 0);
    wait_for_vm(&vm, &all.into_iter().collect()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_and_missing_settings_name_the_sink_and_the_key() {
    let parse = |sinks: Value| {
        let config = json!({"fleet": {"url": "http://127.0.0.1:1"}, "sinks": sinks});
        ccfleet_host::agent::AgentConfig::from_json(&config.to_string(), std::path::Path::new("/"))
            .unwrap_err()
            .to_string()
    };
    let err = parse(
        json!({"influx": {"type": "influxdb", "host": "h", "port": "1",
        "database": "d", "organization": "o", "jwt-file": "x"}}),
    );
    assert!(
        err.contains("sinks.influx: unknown field `jwt-file`"),
        "{err}"
    );
    let err = parse(
        json!({"influx": {"type": "influxdb", "host": "h", "port": "1",
        "database": "d"}}),
    );
    assert!(
        err.contains("sinks.influx") && err.contains("organization"),
        "{err}"
    );
    let err = parse(
        json!({"influx": {"type": "influxasync", "host": "h", "port": "1",
        "database": "d", "organization": "o", "precision": "h"}}),
    );
    assert!(err.contains("sinks.influx: precision \"h\""), "{err}");
}
