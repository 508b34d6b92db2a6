//! Staged rollouts with real agents: three in-process agents run a fleet plugin; a rollout
//! in the server's configuration tree takes a new version to one canary host first. A
//! healthy version completes every stage; after the operator folds it into the tree, a
//! version that traps on `collect` is taken back from the canary by the server itself and
//! never reaches the other two. Real peers: the project's fleet server, the agents and the
//! guest plugins built from source.

#[path = "support/fault_proxy.rs"]
mod fault_proxy;
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

/// The plugin the rollouts change. Its calls get a generous deadline: on a loaded machine a
/// healthy version's call may take a second of wall time, and a single failure of it would
/// roll the rollout back (`rollback-failed` 0).
fn collector(sha256: &str) -> Value {
    json!({"plugins": [{"name": "collector", "sha256": sha256, "collect-interval": "200ms",
                        "limits": {"call-timeout": "30s"}}]})
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

/// A rollout that neither pauses nor rolls back: on a loaded machine a healthy version may
/// fail a call now and then, and this rollout is there to complete, which needs every
/// reporting member running it all the same.
fn tolerant(mut rollout: Value) -> Value {
    rollout["max-failed"] = json!(100);
    rollout["rollback-failed"] = json!(100);
    rollout
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
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
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s", "config-reload-interval": "200ms"}
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
            // The collector's call timeout is above the default ceiling's.
            "fleet-ceiling": {"limits": {"call-timeout": "30s"}},
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
        &tolerant(rollout_file("collector-v2", &sha["roster-logger"])),
    );
    let mut last = Value::Null;
    let completed = tokio::time::timeout(WAIT, async {
        loop {
            last = rollout_status(&server, &admin, "collector-v2").await;
            if last["status"] == "completed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        completed.is_ok(),
        "the healthy rollout did not complete: {last}"
    );
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

/// Waits until the rollout `name` completes, failing at once if it pauses or rolls back: a
/// healthy version must never trip a gate.
async fn completes_without_a_gate_firing(server: &RunningServer, admin: &str, name: &str) {
    let mut last = Value::Null;
    let outcome = tokio::time::timeout(WAIT, async {
        loop {
            last = rollout_status(server, admin, name).await;
            match last["status"].as_str() {
                Some("completed") => return Ok(()),
                Some("paused" | "rolled-back" | "aborted") => return Err(()),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    assert!(
        matches!(outcome, Ok(Ok(()))),
        "the healthy rollout {name} did not complete untroubled: {last}"
    );
}

/// Issue 35: every agent reported each new version `download-failed` while it was still
/// being downloaded, so a healthy rollout with `max-failed` 0 paused or rolled back. Here
/// every download is held back 2 s by a proxy in front of the server, while agents poll
/// every 300 ms and the server judges every second: a version in flight must count as
/// starting, never as failed. Two healthy versions in a row, six agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_version_that_downloads_slowly_never_trips_a_gate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let keys = Keypair::generate();
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut sha = std::collections::BTreeMap::new();
    for name in ["hello", "loadavg", "roster-logger"] {
        let path = guests::component(name);
        std::fs::copy(&path, plugins.join(format!("{name}.wasm"))).unwrap();
        sha.insert(name, sha256_hex(&std::fs::read(&path).unwrap()));
    }
    let tree = root.join("tree");
    write(&tree, "ccmc/fritz/defaults.json", &collector(&sha["hello"]));
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s", "config-reload-interval": "200ms"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server");
    let upstream: SocketAddr = server
        .base_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = fault_proxy::FaultProxy::start(
        upstream,
        fault_proxy::Mode::Delay {
            path: "/api/fleet/plugins/",
            delay: Duration::from_secs(2),
        },
    )
    .await;
    let token = keys.sign_token("agent", &["api"], None);
    let admin = keys.sign_token("operator", &["admin"], None);

    let mut agents = Vec::new();
    for i in 1..=6 {
        let host = format!("r27n{i:02}");
        let config = json!({
            "service-type": "ccmc",
            "fleet": {"url": proxy.url(), "token": token, "cluster": "fritz",
                      "hostname": host, "config-poll-interval": "300ms", "heartbeat-interval": "1s"},
            "plugin-cache-dir": root.join("compiled"),
            "fleet-plugin-dir": root.join(&host).join("fleet-plugins"),
            "fleet-ceiling": {"read-files": ["/proc/**"], "limits": {"call-timeout": "30s"}},
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

    let strict = |version: &str| {
        let mut change = collector(&sha[version]);
        change["plugins"][0]["capabilities"] =
            json!({"read-files": ["/proc/loadavg", "/proc/sys/kernel/hostname"]});
        json!({"type": "ccmc", "cluster": "fritz", "change": change,
               "stages": [{"hosts": ["r27n01"], "min-time": "1s"},
                          {"percent": 50, "min-time": "1s"},
                          {"percent": 100, "min-time": "1s"}],
               "min-running": 100, "max-failed": 0, "rollback-failed": 0})
    };
    for (round, version) in ["loadavg", "roster-logger"].into_iter().enumerate() {
        let name = format!("collector-v{}", round + 2);
        write(&tree, &format!("rollouts/{name}.json"), &strict(version));
        completes_without_a_gate_firing(&server, &admin, &name).await;
        for agent in &agents {
            wait_until("every agent runs the new version", async || {
                running_sha(agent).await.as_deref() == Some(sha[version].as_str())
            })
            .await;
        }
        // Folded into the tree; the next round stages the next version.
        let mut folded = collector(&sha[version]);
        folded["plugins"][0]["capabilities"] =
            json!({"read-files": ["/proc/loadavg", "/proc/sys/kernel/hostname"]});
        write(&tree, "ccmc/fritz/defaults.json", &folded);
        std::fs::remove_file(tree.join(format!("rollouts/{name}.json"))).unwrap();
    }
    for agent in agents {
        agent.shutdown().await.unwrap();
    }
    server.shutdown().await.unwrap();
}

/// Publishes the `hello` component in the server's plugin directory `plugins`; its SHA-256.
fn publish_hello(plugins: &Path) -> String {
    std::fs::create_dir_all(plugins).unwrap();
    let hello = guests::component("hello");
    std::fs::copy(&hello, plugins.join("hello.wasm")).unwrap();
    sha256_hex(&std::fs::read(&hello).unwrap())
}

/// Runs `ccfleet rollout ARGS` with `token` in the environment.
fn cli(token: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("rollout")
        .args(args)
        .env("CC_FLEET_TOKEN", token)
        .env_remove("CC_FLEET_TOKEN_FILE")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_read_and_steer_a_rollout_from_the_command_line() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let keys = Keypair::generate();
    let plugins = root.join("plugins");
    let sha = publish_hello(&plugins);
    let tree = root.join("tree");
    write(
        &tree,
        "rollouts/collector-v2.json",
        &rollout_file("collector-v2", &sha),
    );
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server");
    let url = server.base_url();
    let admin = keys.sign_token("operator", &["admin"], None);
    let support = keys.sign_token("helpdesk", &["support"], None);
    let node = keys.sign_token("node", &["api"], None);
    wait_until("the rollout starts", async || {
        rollout_status(&server, &admin, "collector-v2").await["status"] == "running"
    })
    .await;

    let (ok, table, _) = cli(&support, &["status", "--url", &url]);
    assert!(ok);
    assert!(
        table.contains("collector-v2  ccmc in fritz  running  stage 1 of 2"),
        "{table}"
    );
    let (ok, json_out, _) = cli(&support, &["status", "--url", &url, "--json"]);
    assert!(ok);
    let parsed: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(parsed["rollouts"][0]["plugins"][0][1], sha.as_str());

    let (ok, _, err) = cli(&node, &["status", "--url", &url]);
    assert!(
        !ok && err.contains("403") && err.contains("admin or support"),
        "{err}"
    );
    let (ok, _, err) = cli(&support, &["pause", "collector-v2", "--url", &url]);
    assert!(
        !ok && err.contains("403") && err.contains("the admin role"),
        "{err}"
    );
    let (ok, _, err) = cli("", &["pause", "collector-v2", "--url", &url]);
    assert!(
        !ok && err.contains("401") && err.contains("CC_FLEET_TOKEN"),
        "{err}"
    );

    let (ok, out, err) = cli(&admin, &["pause", "collector-v2", "--url", &url]);
    assert!(ok, "{err}");
    assert!(
        out.contains("paused") && out.contains("pause by operator"),
        "{out}"
    );
    let (ok, _, err) = cli(&admin, &["pause", "collector-v2", "--url", &url]);
    assert!(
        !ok && err.contains("409") && err.contains("cannot pause"),
        "{err}"
    );
    let (ok, out, _) = cli(&admin, &["resume", "collector-v2", "--url", &url]);
    assert!(ok && out.contains("running"), "{out}");
    let (ok, out, _) = cli(&admin, &["abort", "collector-v2", "--url", &url]);
    assert!(ok && out.contains("aborted"), "{out}");
    let (ok, _, err) = cli(&admin, &["abort", "no-such", "--url", &url]);
    assert!(!ok && err.contains("404"), "{err}");
    server.shutdown().await.unwrap();
}

#[test]
fn check_config_refuses_bad_stage_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let plugins = root.join("plugins");
    let sha = publish_hello(&plugins);
    let tree = root.join("tree");
    write(&tree, "rollouts/good.json", &rollout_file("good", &sha));
    let mut too_much = rollout_file("too-much", &sha);
    too_much["cluster"] = json!("woody");
    too_much["stages"][1]["percent"] = json!(150);
    write(&tree, "rollouts/too-much.json", &too_much);
    let mut missing = rollout_file("missing", &"e".repeat(64));
    missing["cluster"] = json!("meggie");
    write(&tree, "rollouts/missing.json", &missing);
    let mut overlap = rollout_file("overlap", &sha);
    overlap["stages"] = json!([{"hosts": ["node09"]}]);
    write(&tree, "rollouts/overlap.json", &overlap);
    let config = root.join("server.json");
    std::fs::write(
        &config,
        json!({"disable-authentication": true, "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s"}})
            .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .args(["server", "--check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("rollouts/too-much.json: stages[1]: `percent` is 150"),
        "{report}"
    );
    assert!(
        report.contains("rollouts/missing.json: plugin \"collector\" names sha256 eeee"),
        "{report}"
    );
    assert!(
        report.contains("rollouts/overlap.json: it covers members rollout \"good\" covers too"),
        "{report}"
    );
    assert!(
        report.contains("note: rollout good: 2 stage(s) for type ccmc in cluster fritz"),
        "{report}"
    );
    assert!(report.contains("3 error(s)"), "{report}");
}

/// A version the nodes refuse fails the rollout with the nodes' reason: the agents report
/// `refused` with why (here a command the node does not define), and the rollout's view and
/// `ccfleet rollout status` count the failing members by that reason, so an operator reads
/// "refused beyond_ceiling/capabilities.run" rather than a bare failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_nodes_refuse_is_counted_with_their_reason() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let keys = Keypair::generate();
    let plugins = root.join("plugins");
    let sha = publish_hello(&plugins);
    let tree = root.join("tree");
    write(&tree, "ccmc/fritz/defaults.json", &json!({"plugins": []}));
    // Neither pauses nor rolls back: the failing members stay in view.
    let mut change = collector(&sha);
    change["plugins"][0]["capabilities"] = json!({"run": ["ipmi-sensors"]});
    write(
        &tree,
        "rollouts/ipmi.json",
        &tolerant(json!({"type": "ccmc", "cluster": "fritz", "change": change,
                         "stages": [{"percent": 100}]})),
    );
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server");
    let url = server.base_url();
    let token = keys.sign_token("agent", &["api"], None);
    let admin = keys.sign_token("operator", &["admin"], None);
    let mut agents = Vec::new();
    for host in HOSTS {
        // The default ceiling: no command is the fleet's to grant.
        let config = json!({
            "service-type": "ccmc",
            "fleet": {"url": url, "token": token, "cluster": "fritz",
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
    let expected = json!([{"health": "refused", "why": "beyond_ceiling/capabilities.run",
                           "members": HOSTS.len()}]);
    let mut last = Value::Null;
    let counted = tokio::time::timeout(WAIT, async {
        loop {
            last = rollout_status(&server, &admin, "ipmi").await;
            if last["failing"] == expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the refusals were not counted: {last}");
    assert_eq!(last["counts"]["failed"], HOSTS.len());
    let (ok, table, err) = cli(&admin, &["status", "--url", &url]);
    assert!(ok, "{err}");
    assert!(
        table.contains("failing: 3 refused (beyond_ceiling/capabilities.run)"),
        "{table}"
    );
    for agent in agents {
        agent.shutdown().await.unwrap();
    }
    server.shutdown().await.unwrap();
}
