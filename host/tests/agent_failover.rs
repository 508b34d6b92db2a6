//! An agent configured with two fleet server URLs keeps working when the first server is
//! killed, and returns to it once it is back. Every peer is a real process: two `ccfleet
//! server`s and the `ccfleet agent`, on loopback; the dead server is SIGKILLed.
//!
//! The scenario runs twice: with the two servers on one SQLite registry file, and with
//! them on one JetStream key-value registry (a real nats-server with JetStream), the
//! scale-out setup. Only one server may run on a SQLite file at a time (it holds a lock on
//! it), so there the second server is a cold standby: it starts on the file once the first
//! was killed, loads the registry and takes over; the first cannot come back while it runs.
//! On JetStream both run from the start, the second learns of the registration from the
//! bucket, and the agent returns to the first once it is back. Both read the same
//! configuration tree, so they give the same revision and ETag.

#[path = "support/agent_process.rs"]
mod agent_process;
#[path = "../../tests/support/nats.rs"]
mod nats;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_process::AgentProcess;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
/// User information in the first server's URL: it must never reach a log line.
const USERINFO_PASSWORD: &str = "pw-s3cr3t";

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One HTTP/1.1 GET: the status and the body, or `None` when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value of the sample `series` (name and labels exactly as rendered) in `/metrics`.
fn sample(port: u16, series: &str) -> Option<f64> {
    let (_, body) = get(port, "/metrics")?;
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until `check` holds, polling every 50 ms; panics naming `what` after [`WAIT`].
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `ccfleet server` child process; SIGKILLed when dropped.
struct ServerProcess {
    child: Child,
    port: u16,
}

impl ServerProcess {
    /// Starts a server on `port` over the configuration tree `tree`, with `registry` (the
    /// keys that say where the registry lives) added to its configuration, and waits until
    /// its `/healthz` answers 200.
    fn start(name: &str, dir: &Path, port: u16, tree: &Path, registry: &Value) -> ServerProcess {
        let mut config = json!({
            "addr": format!("127.0.0.1:{port}"),
            "disable-authentication": true,
            "fleet": {"config-dir": tree, "config-reload-interval": "200ms"}
        });
        for (key, value) in registry.as_object().expect("registry keys") {
            config[key] = value.clone();
        }
        let path = dir.join(format!("server-{name}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
            .arg("server")
            .arg("--config")
            .arg(&path)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ccfleet server");
        let stderr = child.stderr.take().unwrap();
        let name = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("server {name} | {line}");
            }
        });
        let mut server = ServerProcess { child, port };
        let deadline = Instant::now() + WAIT;
        while get(port, "/healthz").map(|(status, _)| status) != Some(200) {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the server exited ({status}) before it was healthy");
            }
            assert!(Instant::now() < deadline, "server not healthy in time");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// SIGKILL, and wait until the process is gone.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }

    /// REST heartbeats this server applied.
    fn rest_heartbeats(&self) -> f64 {
        sample(
            self.port,
            "ccfleet_heartbeats_total{source=\"rest\",result=\"applied\"}",
        )
        .unwrap_or(0.0)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn write_tree(tree: &Path, interval: &str) {
    std::fs::create_dir_all(tree.join("ccmc")).unwrap();
    // Written to a temporary name and renamed, so a server never reads half a file.
    let tmp = tree.join("ccmc").join(".defaults.json.tmp");
    std::fs::write(&tmp, json!({ "interval": interval }).to_string()).unwrap();
    std::fs::rename(tmp, tree.join("ccmc").join("defaults.json")).unwrap();
}

fn count(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

/// The scenario: the agent registers with server A; A is SIGKILLed; the agent goes on with
/// server B (heartbeats, a configuration change) under the same identity; with a registry
/// both can share at once, A comes back and the agent returns to it. `registry` holds the
/// server configuration keys of the shared registry. With `hot`, B runs before the agent
/// registers and has to learn of the registration while it runs; without, B starts on the
/// registry only after A was killed (one server per SQLite file).
fn failover_scenario(dir: &Path, registry: &Value, hot: bool) {
    let tree: PathBuf = dir.join("tree");
    write_tree(&tree, "10s");
    let (port_a, port_b, metrics) = (free_port(), free_port(), free_port());
    let early_b = hot.then(|| ServerProcess::start("b", dir, port_b, &tree, registry));
    let server_a = ServerProcess::start("a", dir, port_a, &tree, registry);

    let agent_dir = dir.join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let first = format!("http://fleet:{USERINFO_PASSWORD}@127.0.0.1:{port_a}");
    let mut agent = AgentProcess::start(
        &agent_dir,
        &json!({
            "service-type": "ccmc",
            "fleet": {
                "url": [first, url(port_b)],
                "cluster": "fritz",
                "hostname": "node01",
                "heartbeat-interval": "200ms",
                "config-poll-interval": "200ms",
                "timeout": "2s"
            },
            "metrics": {"type": "stdout"},
            "metrics-addr": format!("127.0.0.1:{metrics}"),
            "plugins": []
        }),
    );
    agent.wait_for_log("joined the fleet", WAIT);
    let on = |port: u16| {
        sample(
            metrics,
            &format!("ccfleet_agent_fleet_server_info{{url=\"{}\"}}", url(port)),
        ) == Some(1.0)
    };
    eventually("the agent on the first server", || on(port_a));
    eventually("heartbeats on the first server", || {
        server_a.rest_heartbeats() >= 2.0
    });

    let killed_at = agent.log().len();
    server_a.kill();
    // Unless it runs already, the second server takes over the registry now.
    let server_b =
        early_b.unwrap_or_else(|| ServerProcess::start("b", dir, port_b, &tree, registry));

    agent.wait_for_log("failing over", WAIT);
    eventually("the agent on the second server", || on(port_b));
    eventually("heartbeats applied by the second server", || {
        server_b.rest_heartbeats() >= 5.0
    });
    assert_eq!(sample(metrics, "ccfleet_agent_fleet_registered"), Some(1.0));
    eventually("no fleet operation failing", || {
        sample(metrics, "ccfleet_agent_fleet_operations_failing") == Some(0.0)
    });
    assert_eq!(
        sample(
            metrics,
            &format!("ccfleet_agent_fleet_server_down{{url=\"{}\"}}", url(port_a))
        ),
        Some(1.0)
    );

    // Config pulls work on the second server: a change of the tree reaches the agent.
    write_tree(&tree, "5s");
    let changed =
        |agent: &AgentProcess| count(&agent.log_since(killed_at), "configuration changed");
    eventually("the changed configuration from the second server", || {
        changed(&agent) == 1
    });

    // The identity was kept: one registration, with the first server, and no 404.
    let log = agent.log();
    assert_eq!(count(&log, "registered with cc-backend"), 1, "{log:#?}");
    assert_eq!(count(&log, "does not know this instance"), 0, "{log:#?}");
    let failovers: Vec<_> = log.iter().filter(|l| l.contains("failing over")).collect();
    assert_eq!(failovers.len(), 1, "{log:#?}");
    assert!(failovers[0].contains(&url(port_a)), "{}", failovers[0]);
    assert!(failovers[0].contains(&url(port_b)), "{}", failovers[0]);
    if !hot {
        // The first server cannot come back while the second holds the SQLite file.
        for line in &log {
            assert!(!line.contains(USERINFO_PASSWORD), "password logged: {line}");
        }
        return;
    }

    // The first server comes back (same port, same registry): the agent returns to it.
    let server_a = ServerProcess::start("a", dir, port_a, &tree, registry);
    agent.wait_for_log("returning to it", WAIT);
    eventually("the agent back on the first server", || on(port_a));
    eventually("heartbeats on the restarted first server", || {
        server_a.rest_heartbeats() >= 2.0
    });
    assert_eq!(
        sample(metrics, "ccfleet_agent_fleet_server_changes_total"),
        Some(2.0)
    );
    drop(server_b);

    let log = agent.log();
    assert_eq!(count(&log, "registered with cc-backend"), 1, "{log:#?}");
    for line in &log {
        assert!(!line.contains(USERINFO_PASSWORD), "password logged: {line}");
    }
    let (_, body) = get(metrics, "/metrics").unwrap();
    assert!(!body.contains(USERINFO_PASSWORD), "{body}");
}

/// Both servers on one SQLite file, one at a time: the second starts on the file once the
/// first was killed (see the module docs).
#[test]
fn an_agent_with_two_server_urls_keeps_working_when_the_first_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.db");
    failover_scenario(dir.path(), &json!({ "db": db }), false);
}

/// Both servers on one JetStream key-value registry, both running before the agent
/// registers: the second learns of the registration from the bucket, so the agent's
/// identity survives the server it registered with.
#[test]
fn an_agent_with_two_server_urls_keeps_working_when_the_first_jetstream_server_is_killed() {
    let nats = nats::NatsServer::start_jetstream();
    let dir = tempfile::tempdir().unwrap();
    failover_scenario(
        dir.path(),
        &json!({
            "nats": {"address": nats.url()},
            "registry": {"type": "jetstream-kv", "bucket": "failover"}
        }),
        true,
    );
}
