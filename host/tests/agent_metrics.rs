//! The agent's monitoring listener (`metrics-addr`): `/metrics` is valid Prometheus text (read
//! back with a real parser) counting plugin states, restarts, quarantines, calls and their
//! latency, points emitted and dropped, the metric output and the connections; `/readyz`
//! names what is down while `/healthz` says the agent is alive; none shows a secret. Real peers: the project's fleet server, a real
//! nats-server and the guest plugins built from source.

#[path = "support/fleet_server.rs"]
mod fleet_server;
#[path = "support/guests.rs"]
mod guests;
#[path = "../../tests/support/nats.rs"]
mod nats;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use prometheus_parse::{LineInfo, Scrape, Value};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "fleet-token-s3cr3t";

fn agent_config(url: &str, dir: &Path, plugins: Json) -> Json {
    json!({
        "service-type": "ccmc",
        "fleet": {
            "url": url,
            "token": TOKEN,
            "cluster": "fritz",
            "hostname": "node01",
            "heartbeat-interval": "200ms",
            "config-poll-interval": "200ms"
        },
        "plugin-cache-dir": dir.join("compiled"),
        "metrics-addr": "127.0.0.1:0",
        "plugins": plugins
    })
}

fn loadavg() -> Json {
    json!({
        "path": guests::component("loadavg"),
        "config": {"cluster": "fritz", "hostname": "node01"},
        "collect-interval": "100ms",
        "capabilities": {"read-files": ["/proc/loadavg"]}
    })
}

async fn start(config: &Json, dir: &Path) -> RunningAgent {
    let config = AgentConfig::from_json(&config.to_string(), dir).unwrap();
    Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts")
}

/// One HTTP/1.1 GET over a real socket: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a full response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// Parses an exposition strictly: every line must be a comment the parser understands or a
/// sample, every sample's family must be declared (HELP and TYPE) and no series may repeat.
fn parse(text: &str) -> Scrape {
    let mut declared = BTreeSet::new();
    let mut series = BTreeSet::new();
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Doc { metric_name, .. } => {
                declared.insert(metric_name.to_owned());
            }
            LineInfo::Type {
                metric_alias,
                metric_name,
                ..
            } => {
                let family = metric_alias.unwrap_or(metric_name);
                assert!(declared.contains(&family), "TYPE before HELP: {line}");
            }
            LineInfo::Sample {
                metric_name,
                labels,
                value,
                ..
            } => {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        metric_name
                            .strip_suffix(suffix)
                            .filter(|f| declared.contains(*f))
                    })
                    .unwrap_or(metric_name);
                assert!(declared.contains(family), "undeclared family: {line}");
                assert!(value.parse::<f64>().is_ok(), "bad value: {line}");
                assert!(
                    series.insert((metric_name.to_owned(), labels.map(str::to_owned))),
                    "repeated series: {line}"
                );
            }
            LineInfo::Empty => panic!("empty line in the exposition"),
            LineInfo::Ignored => panic!("a line the parser does not understand: {line:?}"),
        }
    }
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses")
}

/// The value of the sample of `metric` whose labels include `labels`.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            other => panic!("{metric} is not a plain value: {other:?}"),
        })
}

fn counter(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    value(scrape, metric, labels).unwrap_or_else(|| panic!("no {metric} {labels:?}"))
}

/// Scrapes until `ready` holds.
async fn scrape_until(addr: SocketAddr, what: &str, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let scrape = parse(&body);
        if ready(&scrape) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Item 11.9: the agent had no way to be monitored. With `metrics-addr` it serves valid
/// Prometheus text that counts what its plugins do (a collector emitting points, a plugin that
/// traps until it is quarantined, one whose batches are refused) and its connections, and
/// `/readyz` names the quarantined plugin and the lost NATS connection; `/healthz` stays 200:
/// the agent is alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_calls_points_restarts_and_quarantines_and_readyz_names_what_is_down() {
    let mut nats = nats::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let plugins = json!([
        loadavg(),
        {
            "path": guests::component("hostile-trap"),
            "collect-interval": "50ms",
            "limits": {"restart-budget": 1, "restart-backoff": "10ms"}
        },
        {
            "path": guests::component("hostile-oversized-emit"),
            "config": {"points": 50},
            "collect-interval": "100ms",
            "limits": {"max-points": 10}
        }
    ]);
    let mut config = agent_config(&server.base_url(), dir.path(), plugins);
    config["nats"] =
        json!({"address": format!("nats://ccagent:hunter2@127.0.0.1:{}", nats.port())});
    let agent = start(&config, dir.path()).await;
    let addr = agent.metrics_addr().expect("a metrics listener");

    let scrape = scrape_until(addr, "a quarantine, emitted and refused points", |s| {
        value(
            s,
            "ccfleet_agent_plugin_state",
            &[("plugin", "hostile-trap"), ("state", "quarantined")],
        ) == Some(1.0)
            && value(s, "ccfleet_agent_sink_points_total", &[("sink", "nats")])
                .is_some_and(|n| n >= 3.0)
            && value(
                s,
                "ccfleet_agent_points_dropped_total",
                &[("plugin", "hostile-oversized-emit"), ("reason", "refused")],
            )
            .is_some_and(|n| n >= 50.0)
            && value(s, "ccfleet_agent_config_info", &[("source", "fleet")]).is_some()
    })
    .await;

    assert_eq!(
        counter(
            &scrape,
            "ccfleet_build_info",
            &[
                ("component", "agent"),
                ("version", env!("CARGO_PKG_VERSION"))
            ]
        ),
        1.0
    );
    // One state at a time per plugin.
    for plugin in ["loadavg", "hostile-trap", "hostile-oversized-emit"] {
        let states: f64 = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "ccfleet_agent_plugin_state" && s.labels.get("plugin") == Some(plugin)
            })
            .map(|s| match s.value {
                Value::Gauge(v) => v,
                _ => panic!("state is a gauge"),
            })
            .sum();
        assert_eq!(states, 1.0, "{plugin}");
    }
    // A budget of one restart: two failed collects, one restart, one quarantine.
    let trap = [("plugin", "hostile-trap")];
    assert_eq!(
        counter(&scrape, "ccfleet_agent_plugin_restarts_total", &trap),
        1.0
    );
    assert_eq!(
        counter(&scrape, "ccfleet_agent_plugin_quarantines_total", &trap),
        1.0
    );
    assert_eq!(
        counter(
            &scrape,
            "ccfleet_agent_plugin_calls_total",
            &[
                ("plugin", "hostile-trap"),
                ("call", "collect"),
                ("result", "failed")
            ]
        ),
        2.0
    );
    assert_eq!(
        counter(&scrape, "ccfleet_agent_plugin_generation", &trap),
        2.0
    );
    assert_eq!(
        counter(&scrape, "ccfleet_agent_points_emitted_total", &trap),
        0.0
    );

    // The collector's points reached NATS; every call it answered is in the histogram.
    let load = [("plugin", "loadavg")];
    assert!(counter(&scrape, "ccfleet_agent_points_emitted_total", &load) >= 3.0);
    assert_eq!(
        counter(
            &scrape,
            "ccfleet_agent_sink_errors_total",
            &[("sink", "nats")]
        ),
        0.0
    );
    for call in ["init", "collect"] {
        let calls: f64 = ["ok", "error", "failed"]
            .iter()
            .map(|result| {
                counter(
                    &scrape,
                    "ccfleet_agent_plugin_calls_total",
                    &[("plugin", "loadavg"), ("call", call), ("result", result)],
                )
            })
            .sum();
        assert!(calls >= 1.0, "{call}");
        let histogram = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "ccfleet_agent_plugin_call_duration_seconds"
                    && s.labels.get("plugin") == Some("loadavg")
                    && s.labels.get("call") == Some(call)
            })
            .expect("a latency histogram");
        let Value::Histogram(buckets) = &histogram.value else {
            panic!("not a histogram: {histogram:?}");
        };
        let inf = buckets
            .iter()
            .find(|b| b.less_than.is_infinite())
            .expect("+Inf bucket");
        // Scraped later than the calls counter, so at least as many.
        assert!(inf.count >= calls, "{call}: {inf:?} < {calls}");
        assert!(
            buckets.windows(2).all(|w| w[0].count <= w[1].count),
            "cumulative"
        );
    }
    // The oversized batches were refused whole, never handed to the output.
    let flood = [("plugin", "hostile-oversized-emit")];
    assert_eq!(
        counter(&scrape, "ccfleet_agent_points_emitted_total", &flood),
        0.0
    );

    assert_eq!(counter(&scrape, "ccfleet_agent_nats_connected", &[]), 1.0);
    assert_eq!(counter(&scrape, "ccfleet_agent_fleet_registered", &[]), 1.0);
    assert!(
        value(
            &scrape,
            "ccfleet_agent_config_info",
            &[("revision", &agent.initial().revision)]
        )
        .is_some()
    );

    let (status, health) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{health}");
    let ready: Json = serde_json::from_str(&health).unwrap();
    let reasons = ready["reasons"].to_string();
    assert!(
        reasons.contains("plugin hostile-trap is quarantined"),
        "{health}"
    );
    assert!(!reasons.contains("loadavg"), "{health}");
    assert_eq!(ready["nats"], "connected", "{health}");
    let plugin = |name: &str| {
        ready["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(plugin("loadavg")["state"], "running", "{health}");
    let (status, alive) = get(addr, "/healthz").await;
    assert_eq!(
        status, 200,
        "a quarantined plugin is no reason to restart: {alive}"
    );

    nats.kill();
    scrape_until(addr, "NATS to be seen down", |s| {
        value(s, "ccfleet_agent_nats_connected", &[]) == Some(0.0)
    })
    .await;
    let (status, health) = get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(health.contains("NATS is not connected"), "{health}");

    // No secret anywhere: not the token, not the NATS credentials or address (the instance id
    // is never read by the listener).
    let (_, body) = get(addr, "/metrics").await;
    for text in [&body, &health] {
        // The port with its colon: its bare digits may turn up inside a float or a count.
        let address = format!(":{}", nats.port());
        for secret in [TOKEN, "hunter2", "ccagent", &address] {
            assert!(!text.contains(secret), "{secret} shown:\n{text}");
        }
    }
    let _ = agent.shutdown().await;
}

/// With every part up, `/healthz` and `/readyz` answer 200; without NATS there is no NATS
/// gauge, and the output is counted as stdout. The listener goes away with the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_are_ok_while_every_part_is_up_and_the_listener_stops_with_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let config = agent_config(&server.base_url(), dir.path(), json!([loadavg()]));
    let agent = start(&config, dir.path()).await;
    let addr = agent.metrics_addr().expect("a metrics listener");
    let scrape = scrape_until(addr, "loadavg running and writing", |s| {
        value(
            s,
            "ccfleet_agent_plugin_state",
            &[("plugin", "loadavg"), ("state", "running")],
        ) == Some(1.0)
            && value(s, "ccfleet_agent_sink_batches_total", &[("sink", "stdout")])
                .is_some_and(|n| n >= 1.0)
    })
    .await;
    assert!(value(&scrape, "ccfleet_agent_nats_connected", &[]).is_none());
    let (status, health) = get(addr, "/healthz").await;
    assert_eq!(status, 200, "{health}");
    let alive: Json = serde_json::from_str(&health).unwrap();
    assert_eq!(alive["status"], "alive", "{health}");
    assert_eq!(alive["reasons"], json!([]), "{health}");
    let (status, health) = get(addr, "/readyz").await;
    assert_eq!(status, 200, "{health}");
    let ready: Json = serde_json::from_str(&health).unwrap();
    assert_eq!(ready["status"], "ready", "{health}");
    assert_eq!(ready["fleet"]["registered"], true, "{health}");

    agent.shutdown().await.expect("clean shutdown");
    // Another test of this binary may have been given the freed port since; what must not
    // answer there is this agent.
    if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
        let _ = stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            stream.read_to_end(&mut answer),
        )
        .await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(!answer.contains("\"registered\":true"), "still listening");
    }
}

/// While cc-backend cannot be reached the agent runs from its local configuration: the
/// metrics say it is not registered, which fleet operations fail and that the server is down,
/// and `/readyz` names that without `/healthz` calling the agent dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_fleet_shows_as_unregistered_with_failing_operations() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1.
    let mut config = agent_config("http://127.0.0.1:1", dir.path(), json!([]));
    config["fleet"]["heartbeat-interval"] = json!("100ms");
    let agent = start(&config, dir.path()).await;
    let addr = agent.metrics_addr().expect("a metrics listener");
    let scrape = scrape_until(addr, "a failing registration", |s| {
        value(s, "ccfleet_agent_fleet_operations_failing", &[]).is_some_and(|n| n >= 1.0)
    })
    .await;
    assert_eq!(counter(&scrape, "ccfleet_agent_fleet_registered", &[]), 0.0);
    assert!(value(&scrape, "ccfleet_agent_config_info", &[("source", "none")]).is_some());
    assert_eq!(
        counter(
            &scrape,
            "ccfleet_agent_fleet_server_down",
            &[("url", "http://127.0.0.1:1")]
        ),
        1.0,
        "the only server refuses connections"
    );
    let (status, health) = get(addr, "/healthz").await;
    assert_eq!(status, 200, "{health}");
    let (status, health) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{health}");
    assert!(
        health.contains("not registered with the fleet server http://127.0.0.1:1"),
        "{health}"
    );
    let _ = agent.shutdown().await;
}

/// An address that cannot be listened on fails the start with an error naming the key,
/// before the agent contacts anything.
#[tokio::test]
async fn a_metrics_addr_in_use_fails_the_start_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = agent_config("http://127.0.0.1:1", dir.path(), json!([]));
    config["metrics-addr"] = json!(addr.to_string());
    let config = AgentConfig::from_json(&config.to_string(), dir.path()).unwrap();
    let error = match Agent::new(config).unwrap().start().await {
        Ok(_) => panic!("started on an address in use"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains(&format!("metrics-addr {addr}")), "{error}");
    assert!(error.to_lowercase().contains("in use"), "{error}");
}
