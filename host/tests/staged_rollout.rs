//! Staged rollouts with real agents: three in-process agents run a fleet plugin; a rollout
//! in the server's configuration tree takes a new version to one canary host first. A
//! healthy version completes every stage; after the operator folds it into the tree, a
//! version that traps on `collect` is taken back from the canary by the server itself and
//! never reaches the other two. Real peers: the project's fleet server, the agents and the
//! guest plugins built from source.

#[path = "support/guests.rs"]
mod guests;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ccfleet::server::plugins::sha256_hex;
use ccfleet::server::{RunningServer, ServerConfig, auth::Keypair};
use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(120);
const HOSTS: [&str; 3] = ["node01", "node02", "node03"];

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

/// The SHA-256 the agent's `/metrics` says its plugin `collector` runs.
async fn running_sha(agent: &RunningAgent) -> Option<String> {
    let text = scrape(agent.metrics_addr().unwrap()).await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap()
        .samples
        .into_iter()
        .find(|s| {
            s.metric == "ccfleet_agent_plugin_info" && s.labels.get("plugin") == Some("collector")
        })
        .and_then(|s| s.labels.get("sha256").map(str::to_owned))
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

fn collector(sha256: &str) -> Value {
    json!({"plugins": [{"name": "collector", "sha256": sha256, "collect-interval": "200ms"}]})
}

fn write(tree: &Path, rel: &str, value: &Value) {
    let path = tree.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, value.to_string()).unwrap();
}

fn rollout_file(name: &str, sha256: &str) -> Value {
    let _ = name;
    json!({"type": "ccmc", "cluster": "fritz", "change": collector(sha256),
           "stages": [{"hosts": ["node01"], "min-time": "1s"}, {"percent": 100, "min-time": "1s"}],
           "min-running": 100, "max-failed": 0, "rollback-failed": 0})
}

async fn rollout_status(server: &RunningServer, admin: &str, name: &str) -> Value {
    let answer: Value = reqwest::Client::new()
        .get(format!("{}/api/fleet/rollouts", server.base_url()))
        .header("X-Auth-Token", admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["rollouts"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_version_completes_and_a_trapping_one_is_taken_back_from_the_canary() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let keys = Keypair::generate();
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut sha = std::collections::BTreeMap::new();
    for name in ["hello", "roster-logger", "hostile-trap"] {
        let path = guests::component(name);
        std::fs::copy(&path, plugins.join(format!("{name}.wasm"))).unwrap();
        sha.insert(name, sha256_hex(&std::fs::read(&path).unwrap()));
    }
    let tree = root.join("tree");
    write(&tree, "ccmc/fritz/defaults.json", &collector(&sha["hello"]));
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "config-reload-interval": "200ms"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server");
    let token = keys.sign_token("agent", &["api"], None);
    let admin = keys.sign_token("operator", &["admin"], None);

    let mut agents = Vec::new();
    for host in HOSTS {
        let config = json!({
            "service-type": "ccmc",
            "fleet": {"url": server.base_url(), "token": token, "cluster": "fritz",
                      "hostname": host, "config-poll-interval": "300ms", "heartbeat-interval": "1s"},
            "plugin-cache-dir": root.join("compiled"),
            "fleet-plugin-dir": root.join(host).join("fleet-plugins"),
            "metrics-addr": "127.0.0.1:0",
            "metrics": {"type": "stdout"}
        });
        let config = AgentConfig::from_json(&config.to_string(), root).unwrap();
        agents.push(
            Agent::new(config)
                .unwrap()
                .start()
                .await
                .expect("agent starts"),
        );
    }
    for agent in &agents {
        wait_until("every agent runs hello", async || {
            running_sha(agent).await.as_deref() == Some(sha["hello"].as_str())
        })
        .await;
    }

    // A healthy version: the canary first, then everyone.
    write(
        &tree,
        "rollouts/collector-v2.json",
        &rollout_file("collector-v2", &sha["roster-logger"]),
    );
    wait_until("the healthy rollout completes", async || {
        rollout_status(&server, &admin, "collector-v2").await["status"] == "completed"
    })
    .await;
    for agent in &agents {
        wait_until("every agent runs the new version", async || {
            running_sha(agent).await.as_deref() == Some(sha["roster-logger"].as_str())
        })
        .await;
    }

    // The operator folds it into the tree and stages a version that traps on every collect.
    write(
        &tree,
        "ccmc/fritz/defaults.json",
        &collector(&sha["roster-logger"]),
    );
    write(
        &tree,
        "rollouts/collector-v2.json",
        &rollout_file("collector-v2", &sha["hostile-trap"]),
    );
    wait_until("the trapping rollout is rolled back", async || {
        rollout_status(&server, &admin, "collector-v2").await["status"] == "rolled-back"
    })
    .await;
    let status = rollout_status(&server, &admin, "collector-v2").await;
    assert_eq!(status["stage"], 0, "stopped at the canary: {status}");
    for agent in &agents {
        wait_until("every agent runs the folded-in version again", async || {
            running_sha(agent).await.as_deref() == Some(sha["roster-logger"].as_str())
        })
        .await;
    }
    // Only the canary ever ran the trapping version.
    for (agent, host) in agents.iter().zip(HOSTS) {
        let text = scrape(agent.metrics_addr().unwrap()).await;
        let swaps: f64 = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .unwrap()
            .samples
            .into_iter()
            .filter(|s| {
                s.metric == "ccfleet_agent_plugin_rollouts_total"
                    && s.labels.get("result") == Some("swapped")
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                _ => 0.0,
            })
            .sum();
        let expected = if host == "node01" { 4.0 } else { 2.0 };
        assert_eq!(swaps, expected, "{host}: versions swapped in");
    }
    for agent in agents {
        agent.shutdown().await.unwrap();
    }
    server.shutdown().await.unwrap();
}
