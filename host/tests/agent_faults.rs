//! The agent when its peers fail: NATS going away (shutdown stays bounded, the outage is
//! logged once, without credentials), cc-backend answering 503 at start (the agent runs from
//! its cache and joins once it recovers) or hanging (a second signal ends the shutdown at
//! once). Real processes and peers: the `ccfleet` binary, the project's fleet server, a real
//! nats-server and a TCP proxy injecting the HTTP faults.

#[path = "support/agent_process.rs"]
mod agent_process;
#[path = "support/fault_proxy.rs"]
mod fault_proxy;
#[path = "support/fleet_server.rs"]
mod fleet_server;
#[path = "support/guests.rs"]
mod guests;
#[path = "../../tests/support/nats.rs"]
mod nats;

use std::path::Path;
use std::time::{Duration, Instant};

use agent_process::AgentProcess;
use ccfleet::server::RunningServer;
use ccfleet::server::registry::State;
use ccfleet_host::agent::{Agent, AgentConfig};
use fault_proxy::{FaultProxy, Mode};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// An agent configuration for ccmc on fritz/node01 against `url`, heartbeating every 200 ms.
fn agent_config(url: &str, dir: &Path) -> Value {
    json!({
        "service-type": "ccmc",
        "fleet": {
            "url": url,
            "cluster": "fritz",
            "hostname": "node01",
            "heartbeat-interval": "200ms",
            "config-poll-interval": "200ms",
            "cache-path": dir.join("fleet-cache.json")
        },
        "plugin-cache-dir": dir.join("compiled"),
        "plugins": []
    })
}

fn live_instances(server: &RunningServer) -> u64 {
    let counts = server.registry().counts();
    counts.get(State::Pending) + counts.get(State::Active)
}

/// Item: the agent hung on SIGTERM while NATS was down (the metric flush waited for a
/// connection that never came) and ignored further signals. The shutdown must finish within
/// its bound, deregistered, whatever NATS does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_nats_is_down_ends_the_agent_within_the_shutdown_bound() {
    let mut nats = nats::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let mut config = agent_config(&server.base_url(), dir.path());
    config["nats"] = json!({"address": nats.url()});
    config["metrics"] = json!({"type": "nats", "subject": "cc.metric.fritz"});
    // A plugin keeps the metric sink open until shutdown, as in production.
    config["plugins"] = json!([{"path": guests::component("roster-logger")}]);
    let bound = Duration::from_secs(5);
    config["shutdown-timeout"] = json!("5s");

    let mut agent = AgentProcess::start(dir.path(), &config);
    agent.wait_for_log("joined the fleet", WAIT);
    agent.wait_for_log("NATS connected", WAIT);
    agent.wait_for_log("plugin started", WAIT);
    assert_eq!(live_instances(&server), 1);

    nats.kill();
    agent.wait_for_log("NATS disconnected", WAIT);
    agent.signal("TERM");
    let sent = Instant::now();
    let status = agent.wait_exit(bound);
    let took = sent.elapsed();
    let Some(status) = status else {
        agent.signal("KILL");
        panic!("the agent did not exit within the {bound:?} shutdown bound");
    };
    assert!(status.success(), "{status} after {took:?}");
    assert_eq!(live_instances(&server), 0, "the agent deregistered");
    server.shutdown().await.unwrap();
}

/// Item: a second SIGTERM was ignored. With cc-backend hanging on the deregistration, the
/// first signal's shutdown waits for it; the second ends the process at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_a_stalled_shutdown_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let proxy = FaultProxy::start(server.local_addr(), Mode::Forward).await;
    let config = agent_config(&proxy.url(), dir.path());

    let mut agent = AgentProcess::start(dir.path(), &config);
    agent.wait_for_log("joined the fleet", WAIT);
    // cc-backend hangs: heartbeats (every 200 ms) stall, and so will the deregistration.
    proxy.set(Mode::Stall);
    let deadline = Instant::now() + WAIT;
    while proxy.stalled() == 0 {
        assert!(
            Instant::now() < deadline,
            "no request reached the hung peer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.signal("TERM");
    agent.wait_for_log("shutting down", WAIT);
    // The deregistration now waits for the hung peer (up to 5 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        agent.wait_exit(Duration::ZERO).is_none(),
        "still shutting down"
    );
    agent.signal("TERM");
    let sent = Instant::now();
    let status = agent
        .wait_exit(Duration::from_secs(2))
        .unwrap_or_else(|| panic!("the second SIGTERM did not end the agent at once"));
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "forced exit after {:?}: {status}",
        sent.elapsed()
    );
    server.shutdown().await.unwrap();
}

/// Item: a transient 503 from cc-backend (a proxy in front of it while it restarts) made the
/// agent exit at start although its cache held a valid configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_at_start_runs_the_agent_from_its_cache_until_the_fleet_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let proxy = FaultProxy::start(server.local_addr(), Mode::Forward).await;
    let config = AgentConfig::from_json(
        &agent_config(&proxy.url(), dir.path()).to_string(),
        dir.path(),
    )
    .unwrap();

    // A first run fills the cache.
    let first = Agent::new(config.clone()).unwrap().start().await.unwrap();
    assert_eq!(first.initial().source, ccfleet::client::Source::Fleet);
    let revision = first.initial().revision.clone();
    first.shutdown().await.unwrap();
    assert_eq!(live_instances(&server), 0);

    proxy.set(Mode::Answer(503));
    let agent = Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("the agent starts from its cache despite the 503");
    assert_eq!(agent.initial().source, ccfleet::client::Source::Cache);
    assert_eq!(agent.initial().revision, revision);
    assert!(proxy.answered() >= 1);
    assert!(!agent.client().registered());

    // cc-backend is back: the agent registers (its retries back off from 1 s) and heartbeats.
    proxy.set(Mode::Forward);
    let deadline = Instant::now() + WAIT;
    while !(agent.client().registered() && live_instances(&server) == 1) {
        assert!(
            Instant::now() < deadline,
            "the agent did not join the fleet"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.shutdown().await.unwrap();
    assert_eq!(live_instances(&server), 0);
    server.shutdown().await.unwrap();
}

/// Item: an unreachable NATS was logged on every reconnect attempt (28 lines in 15 s), and the
/// address is shown with its credentials. Now each outage is said once, with the address
/// (without user and password) and the reason; the recovery once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_nats_is_reported_once_per_outage_without_credentials() {
    let mut nats = nats::NatsServer::start();
    // Nothing listens on its port until the restart below.
    nats.kill();
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server::start(dir.path()).await;
    let mut config = agent_config(&server.base_url(), dir.path());
    let address = format!("127.0.0.1:{}", nats.port());
    config["nats"] = json!({"address": format!("nats://ccagent:hunter2@{address}")});
    let shown = format!("nats://{address}");

    let mut agent = AgentProcess::start(dir.path(), &config);
    agent.wait_for_log("joined the fleet", WAIT);
    // Reconnect attempts back off from 0 to 2 s: about eight of them in five seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first_outage = agent.log();

    nats.restart();
    agent.wait_for_log("NATS connected", WAIT);
    let from = agent.log().len();
    nats.kill();
    agent.wait_for_log("NATS disconnected", WAIT);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second_outage = agent.log_since(from);
    agent.signal("TERM");
    assert!(
        agent.wait_exit(WAIT).is_some_and(|s| s.success()),
        "clean exit"
    );
    let log = agent.log();

    assert!(
        log.iter().all(|l| !l.contains("hunter2")),
        "a NATS password reached the log"
    );
    for (outage, lines) in [("first", &first_outage), ("second", &second_outage)] {
        let nats_lines: Vec<&String> = lines
            .iter()
            .filter(|l| l.to_ascii_lowercase().contains("nats"))
            .collect();
        let said: Vec<&&String> = nats_lines
            .iter()
            .filter(|l| l.contains("NATS unreachable"))
            .collect();
        assert_eq!(said.len(), 1, "{outage} outage: {nats_lines:#?}");
        assert!(
            said[0].contains(&shown) && said[0].to_ascii_lowercase().contains("refused"),
            "{outage} outage: the line names the address and why: {}",
            said[0]
        );
        // Besides that line: at most the disconnection; nothing per reconnect attempt.
        assert!(nats_lines.len() <= 2, "{outage} outage: {nats_lines:#?}");
    }
}
