//! Issue 26, the agent's health: `/healthz` answered 200 while the agent was not
//! registered, while its HTTP sink could not connect and while a plugin named by the fleet
//! could not be downloaded, and `ccfleet_agent_fleet_server_down{url}` stayed 0 while the
//! only fleet server refused connections. Now `/healthz` says the agent is alive, `/readyz`
//! answers 503 with a JSON reason for each of these, the gauge follows the server, and the
//! failure is logged with the server's URL.
//!
//! Real peers: the `ccfleet agent` process (or the agent in-process), the project's fleet
//! server over HTTP, a closed port for the sink, the guest plugins built from source.

#[path = "support/agent_process.rs"]
mod agent_process;
#[path = "support/fleet_server.rs"]
mod fleet_server;
#[path = "support/guests.rs"]
mod guests;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use agent_process::AgentProcess;
use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A loopback port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 GET: the status and the body, or `None` when nothing answers.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
}

/// `/healthz` or `/readyz`: the status and the JSON body.
fn health(addr: SocketAddr, path: &str) -> Option<(u16, Value)> {
    let (status, body) = get(addr, path)?;
    let json =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path} is not JSON ({e}): {body}"));
    Some((status, json))
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(addr: SocketAddr, series: &str) -> Option<f64> {
    let (_, body) = get(addr, "/metrics")?;
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls `check` every 50 ms; panics naming `what` after [`WAIT`].
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `path` answers `status` and returns its body.
fn wait_for(addr: SocketAddr, path: &str, status: u16) -> Value {
    let mut last = None;
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((got, body)) = health(addr, path) {
            if got == status {
                return body;
            }
            last = Some((got, body));
        }
        assert!(
            Instant::now() < deadline,
            "{path} did not answer {status}; last: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reasons(body: &Value) -> Vec<String> {
    body["reasons"]
        .as_array()
        .expect("a reasons list")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

/// The agent process against a fleet server that is not running (connection refused):
/// alive but not ready, naming the server; the server's gauge says it is down and the
/// failure is logged with its URL. Once the server starts on that port, the agent
/// registers, the gauge goes to 0 and `/readyz` to 200.
#[test]
fn a_stopped_fleet_server_makes_the_agent_unready_and_down_until_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet_port, metrics_port) = (free_port(), free_port());
    let fleet_url = format!("http://127.0.0.1:{fleet_port}");
    let metrics: SocketAddr = ([127, 0, 0, 1], metrics_port).into();
    let mut agent = AgentProcess::start(
        dir.path(),
        &json!({
            "service-type": "ccmc",
            "fleet": {
                "url": fleet_url,
                "cluster": "fritz",
                "hostname": "node01",
                "heartbeat-interval": "100ms",
                "config-poll-interval": "100ms",
                "timeout": "1s"
            },
            "metrics": {"type": "stdout"},
            "metrics-addr": metrics.to_string(),
            "fleet-plugin-dir": dir.path().join("fleet-plugins"),
            "plugins": []
        }),
    );
    let down = format!("ccfleet_agent_fleet_server_down{{url=\"{fleet_url}\"}}");
    eventually("the agent's listener", || {
        get(metrics, "/metrics").is_some()
    });
    eventually("the server seen down", || {
        sample(metrics, &down) == Some(1.0)
    });

    let (status, alive) = health(metrics, "/healthz").unwrap();
    assert_eq!(status, 200, "{alive}");
    assert_eq!(alive["status"], "alive", "{alive}");
    assert_eq!(alive["loops"]["fleet client"], "running", "{alive}");
    let unready = wait_for(metrics, "/readyz", 503);
    assert_eq!(unready["status"], "not ready", "{unready}");
    assert_eq!(unready["fleet"]["registered"], false, "{unready}");
    let why = reasons(&unready);
    assert!(
        why.iter()
            .any(|r| r.contains("not registered") && r.contains(&fleet_url)),
        "{why:#?}"
    );
    agent.wait_for_log("operation failed", WAIT);
    let log = agent.log();
    let failure = log.iter().find(|l| l.contains("operation failed")).unwrap();
    assert!(failure.contains(&fleet_url), "{failure}");

    // The server starts on the port the agent is configured with.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(async {
        let config =
            json!({"addr": format!("127.0.0.1:{fleet_port}"), "disable-authentication": true});
        ccfleet::server::start(
            ccfleet::server::ServerConfig::from_json(&config.to_string()).unwrap(),
        )
        .await
        .expect("fleet server")
    });
    eventually("the server seen up", || sample(metrics, &down) == Some(0.0));
    let ready = wait_for(metrics, "/readyz", 200);
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["reasons"], json!([]), "{ready}");
    assert_eq!(ready["fleet"]["registered"], true, "{ready}");
    runtime.block_on(server.shutdown()).unwrap();
}

async fn start(config: &Value, dir: &Path) -> RunningAgent {
    let config = AgentConfig::from_json(&config.to_string(), dir).unwrap();
    Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts")
}

fn agent_config(url: &str, dir: &Path) -> Value {
    json!({
        "service-type": "ccmc",
        "fleet": {
            "url": url,
            "cluster": "fritz",
            "hostname": "node01",
            "heartbeat-interval": "200ms",
            "config-poll-interval": "200ms"
        },
        "plugin-cache-dir": dir.join("compiled"),
        "fleet-plugin-dir": dir.join("fleet-plugins"),
        "metrics-addr": "127.0.0.1:0",
        "plugins": []
    })
}

/// Answers every request on `listener` with 204 after reading it whole: a cc-metric-store
/// that takes every write.
fn accept_writes(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let stream = reader.get_mut();
                    if stream
                        .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
}

/// An HTTP sink whose cc-metric-store refuses connections: not ready, naming the sink and
/// its URL; ready once something takes the writes on that port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_sink_that_cannot_connect_makes_the_agent_unready() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let store_port = free_port();
    let store_url = format!("http://127.0.0.1:{store_port}/api/write");
    let mut config = agent_config(&server.base_url(), dir.path());
    config["sinks"] = json!({"store": {
        "type": "http",
        "url": store_url,
        "flush-delay": "100ms",
        "timeout": "1s",
        "retry-backoff": "100ms",
        "max-retry-backoff": "200ms"
    }});
    config["plugins"] = json!([{
        "path": guests::component("loadavg"),
        "config": {"cluster": "fritz", "hostname": "node01"},
        "collect-interval": "100ms",
        "capabilities": {"read-files": ["/proc/loadavg"]}
    }]);
    let agent = start(&config, dir.path()).await;
    let addr = agent.metrics_addr().unwrap();

    let sink_reason = |why: &[String]| {
        why.iter()
            .any(|r| r.contains("sink store (http) is not delivering") && r.contains(&store_url))
    };
    let body = tokio::task::spawn_blocking(move || {
        // Registered and running first: the sink fails at its first write.
        eventually("the sink's failure in /readyz", || {
            health(addr, "/readyz").is_some_and(|(status, body)| {
                status == 503
                    && reasons(&body)
                        .iter()
                        .any(|r| r.contains("sink store (http) is not delivering"))
            })
        });
        health(addr, "/readyz").unwrap()
    })
    .await
    .unwrap();
    let (status, body) = body;
    assert_eq!(status, 503);
    assert_eq!(body["sinks"][0]["delivering"], false, "{body}");
    assert!(sink_reason(&reasons(&body)), "{body}");
    assert_eq!(
        sample(
            addr,
            "ccfleet_agent_sink_delivering{sink=\"store\",type=\"http\"}"
        ),
        Some(0.0)
    );
    let (status, alive) = health(addr, "/healthz").unwrap();
    assert_eq!(status, 200, "alive all the same: {alive}");

    // Something takes the writes now: the sink delivers and the agent is ready.
    accept_writes(TcpListener::bind(("127.0.0.1", store_port)).unwrap());
    let ready = tokio::task::spawn_blocking(move || wait_for(addr, "/readyz", 200))
        .await
        .unwrap();
    assert_eq!(ready["sinks"][0]["delivering"], true, "{ready}");
    let _ = agent.shutdown().await;
    server.shutdown().await.unwrap();
}

/// The fleet names a plugin the server cannot deliver: not ready, naming the plugin, its
/// SHA-256 and the server's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_plugin_that_cannot_be_downloaded_makes_the_agent_unready() {
    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("ccmc")).unwrap();
    std::fs::write(
        tree.join("ccmc").join("defaults.json"),
        json!({"plugins": [{"name": "ghost", "sha256": SHA, "collect-interval": "1s"}]})
            .to_string(),
    )
    .unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let server_config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "fleet": {"config-dir": tree, "plugin-dir": plugins}
    });
    let server = ccfleet::server::start(
        ccfleet::server::ServerConfig::from_json(&server_config.to_string()).unwrap(),
    )
    .await
    .expect("fleet server");
    let agent = start(&agent_config(&server.base_url(), dir.path()), dir.path()).await;
    let addr = agent.metrics_addr().unwrap();
    let base = server.base_url();
    let body = tokio::task::spawn_blocking(move || {
        let mut seen = Value::Null;
        eventually("the failed download in /readyz", || {
            let Some((status, body)) = health(addr, "/readyz") else {
                return false;
            };
            seen = body.clone();
            status == 503
                && reasons(&body)
                    .iter()
                    .any(|r| r.contains("ghost") && r.contains("download failed"))
        });
        seen
    })
    .await
    .unwrap();
    let why = reasons(&body);
    let reason = why.iter().find(|r| r.contains("ghost")).unwrap();
    assert!(reason.contains(SHA), "{reason}");
    assert!(reason.contains(&base) && reason.contains("404"), "{reason}");
    assert_eq!(body["fleet"]["registered"], true, "{body}");
    assert_eq!(body["fleet_plugins"][0]["running"], false, "{body}");
    let (status, _) = health(addr, "/healthz").unwrap();
    assert_eq!(status, 200);
    let _ = agent.shutdown().await;
    server.shutdown().await.unwrap();
}
