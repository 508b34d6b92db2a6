//! Staged rollouts with three fleet servers sharing a JetStream registry (a real
//! nats-server), and 100 in-process fleet clients as agents, each polling one of the servers
//! (and failing over to the others).
//!
//! Each agent reports to its own server only; the lease holder judges every member all the
//! same, because the servers pass changed reports on to each other. Killing the lease holder
//! (its runtime dropped where it stands, as a crash) hands the rollout to another server,
//! which continues at the saved stage.
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;
#[path = "support/rollout_agents.rs"]
mod rollout_agents;
mod server_common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ccfleet::server::RunningServer;
use ccfleet::server::rollout::definition::bucket;
use nats::NatsServer;
use rollout_agents::{Agent, CLUSTER, Shared, all_served, host, plugin_versions, plugins_layer};
use serde_json::{Value, json};
use server_common::*;

const AGENTS: usize = 100;
const ROLLOUT: &str = "loadavg-v2";
const BUCKET: &str = "fleet";
const PATIENCE: Duration = Duration::from_secs(90);

/// The tests start a nats-server and three fleet servers each: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fleet server on a runtime of its own.
struct Node {
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<RunningServer>,
}

impl Node {
    async fn start(json: Value) -> Node {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let server = runtime.block_on(start(json));
            let _ = tx.send((runtime, server));
        });
        let (runtime, server) = rx.await.expect("the server starts");
        Node {
            runtime: Some(runtime),
            server: Some(server),
        }
    }

    fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("a running server")
    }

    fn alive(&self) -> bool {
        self.server.is_some()
    }

    /// Crashes the server: its tasks are dropped where they stand (no lease release).
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        drop(self.server.take());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The tree: every ccmc of the cluster runs `old`; the rollout changes it to `new`.
fn author(tree: &Path, old: &str, new: &str, stages: Value, gates: Value) {
    write(
        tree,
        &format!("ccmc/{CLUSTER}/defaults.json"),
        &plugins_layer(old).to_string(),
    );
    let mut rollout = json!({
        "type": "ccmc", "cluster": CLUSTER, "change": plugins_layer(new), "stages": stages,
    });
    for (key, value) in gates.as_object().unwrap() {
        rollout[key] = value.clone();
    }
    write(
        tree,
        &format!("rollouts/{ROLLOUT}.json"),
        &rollout.to_string(),
    );
}

fn config(nats: &str, tree: &Path, plugins: &Path) -> Value {
    json!({
        "disable-authentication": true,
        "nats": {"address": nats},
        "registry": {"type": "jetstream-kv", "bucket": BUCKET, "replicas": 1, "lease-ttl": "2s"},
        "fleet": {"config-dir": tree, "plugin-dir": plugins, "rollout-interval": "1s"},
    })
}

async fn three_servers(nats: &NatsServer, tree: &Path, plugins: &Path) -> Vec<Node> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(Node::start(config(&nats.url(), tree, plugins)).await);
    }
    eventually("one lease holder", PATIENCE, || async {
        nodes
            .iter()
            .filter(|n| n.server().is_roster_leader())
            .count()
            == 1
    })
    .await;
    nodes
}

fn leader(nodes: &[Node]) -> Option<usize> {
    nodes
        .iter()
        .position(|n| n.alive() && n.server().is_roster_leader())
}

/// Starts the agents: agent `i` polls server `home(i)` first; `traps(i)` quarantines the
/// new version.
fn agents(
    nodes: &[Node],
    new: &str,
    home: impl Fn(usize) -> usize,
    traps: impl Fn(usize) -> bool,
) -> (Shared, Vec<tokio::task::JoinHandle<()>>) {
    let urls: Vec<String> = nodes.iter().map(|n| n.server().base_url()).collect();
    let seen: Shared = Arc::default();
    let tasks = (0..AGENTS)
        .map(|i| {
            let first = home(i);
            let mut mine = vec![urls[first].clone()];
            mine.extend(
                (0..urls.len())
                    .filter(|j| *j != first)
                    .map(|j| urls[j].clone()),
            );
            let agent = Agent {
                urls: mine,
                i,
                new: new.to_owned(),
                traps: traps(i),
                poll: Duration::from_millis(200),
            };
            tokio::spawn(agent.run(seen.clone()))
        })
        .collect();
    (seen, tasks)
}

async fn rollout(server: &RunningServer) -> Value {
    let Ok(response) = http()
        .get(format!("{}/api/fleet/rollouts", server.base_url()))
        .send()
        .await
    else {
        return Value::Null;
    };
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    answer["rollouts"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == ROLLOUT).cloned())
        .unwrap_or(Value::Null)
}

async fn metric(server: &RunningServer, name: &str) -> u64 {
    let text = http()
        .get(format!("{}/metrics", server.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Whether every live server is at `stage` and counts every member of it as reporting.
async fn every_server_counts_every_report(nodes: &[Node], stage: u64) -> bool {
    for node in nodes.iter().filter(|n| n.alive()) {
        let r = rollout(node.server()).await;
        let counts = &r["counts"];
        if r["stage"] != stage
            || counts["members"].as_u64().unwrap_or(0) == 0
            || counts["reporting"] != counts["members"]
            || counts["unknown"] != 0
        {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_servers_reports_count_and_killing_the_lease_holder_hands_the_rollout_to_another_server()
 {
    let _serial = SERIAL.lock().await;
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let nats = NatsServer::start_jetstream();
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    // Every reached member must run the change; the second stage runs long enough to kill
    // the lease holder in it.
    author(
        tree.path(),
        &old,
        &new,
        json!([{"percent": 20}, {"percent": 50, "min-time": "20s"}, {"percent": 100}]),
        json!({"min-running": 100, "max-failed": 5, "rollback-failed": 10}),
    );
    let mut nodes = three_servers(&nats, tree.path(), plugins.path()).await;
    // Agents spread evenly: each server hears from a third of them.
    let (seen, tasks) = agents(&nodes, &new, |i| i % 3, |_| false);

    eventually(
        "the rollout to reach its second stage",
        PATIENCE,
        || async { rollout(nodes[0].server()).await["stage"] == 1 },
    )
    .await;
    // Every server, not only the lease holder, counts the reports sent to the others.
    eventually(
        "every server to count every reached member's report",
        PATIENCE,
        || every_server_counts_every_report(&nodes, 1),
    )
    .await;
    for node in &nodes {
        assert!(
            metric(node.server(), "ccfleet_rollout_reports_received_total").await > 0,
            "every server took over reports from the others"
        );
    }
    // The lease may have moved on a busy machine: kill whoever holds it now, mid-rollout.
    let first = leader(&nodes).expect("a lease holder");
    let before = rollout(nodes[first].server()).await;
    assert_eq!(
        (before["status"].as_str(), before["stage"].as_u64()),
        (Some("running"), Some(1)),
        "{before}"
    );
    seen.lock().unwrap().armed = true;
    nodes[first].kill();
    eventually("another server to take the lease", PATIENCE, || async {
        leader(&nodes).is_some()
    })
    .await;
    let second = leader(&nodes).unwrap();
    assert_ne!(second, first);
    let continued = rollout(nodes[second].server()).await;
    assert_eq!(
        (&continued["stage"], &continued["stageStartedAt"]),
        (&before["stage"], &before["stageStartedAt"]),
        "the new lease holder continues at the saved stage: {continued}"
    );

    // Until it completes, no live server goes back before the saved stage.
    eventually("the rollout to complete", PATIENCE, || async {
        let mut done = true;
        for node in nodes.iter().filter(|n| n.alive()) {
            let now = rollout(node.server()).await;
            if now.is_null() {
                // No answer this time (a busy machine): nothing to judge.
                done = false;
                continue;
            }
            assert!(
                now["stage"].as_u64().unwrap_or(0) >= 1,
                "a server went back before the saved stage: {now}"
            );
            done &= now["status"] == "completed";
        }
        done
    })
    .await;
    let done = rollout(nodes[second].server()).await;
    let reason = done["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("{AGENTS} of {AGENTS} reporting member(s)"))
            && reason.contains("0 without a report"),
        "the last stage was judged on every member's report: {done}"
    );
    assert!(
        metric(
            nodes[second].server(),
            "ccfleet_rollout_stage_advances_total"
        )
        .await
            >= 1,
        "the new lease holder advanced the rollout"
    );
    assert_eq!(
        metric(nodes[second].server(), "ccfleet_rollout_completions_total").await,
        1
    );
    eventually(
        "every agent to run the new version, served by the remaining servers",
        PATIENCE,
        || async { all_served(&seen, AGENTS, &new) },
    )
    .await;
    // Members the saved stage had reached kept the change through the crash, whichever
    // server served them. (A member the next stage reaches may be served the old version
    // once more by a server that has not read the new progress yet, when it moves between
    // servers at that moment: followers read the progress each second.)
    let taken_back: Vec<String> = seen
        .lock()
        .unwrap()
        .taken_back
        .iter()
        .filter(|h| bucket(ROLLOUT, CLUSTER, h) < 5000)
        .cloned()
        .collect();
    assert!(
        taken_back.is_empty(),
        "reached members kept the change whichever server served them: {taken_back:?}"
    );
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_reported_only_to_other_servers_roll_the_change_back() {
    let _serial = SERIAL.lock().await;
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let nats = NatsServer::start_jetstream();
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    author(
        tree.path(),
        &old,
        &new,
        json!([{"percent": 50, "min-time": "3s"}, {"percent": 100}]),
        json!({"max-failed": 5, "rollback-failed": 10}),
    );
    let nodes = three_servers(&nats, tree.path(), plugins.path()).await;
    let holder = leader(&nodes).expect("a lease holder");
    let others: Vec<usize> = (0..3).filter(|i| *i != holder).collect();
    // A fifth of the canary traps the new version, and every one of those polls a server
    // that does not hold the lease: only shared reports tell the lease holder.
    let canary: Vec<usize> = (0..AGENTS)
        .filter(|i| bucket(ROLLOUT, CLUSTER, &host(*i)) < 5000)
        .collect();
    let trapping: BTreeSet<usize> = canary.iter().copied().step_by(4).collect();
    assert!(trapping.len() * 100 > canary.len() * 20);
    let home = {
        let trapping = trapping.clone();
        move |i: usize| {
            if trapping.contains(&i) {
                others[i % 2]
            } else {
                i % 3
            }
        }
    };
    let traps = {
        let trapping = trapping.clone();
        move |i: usize| trapping.contains(&i)
    };
    let (seen, tasks) = agents(&nodes, &new, home, traps);

    eventually("the rollout to be rolled back", PATIENCE, || async {
        rollout(nodes[holder].server()).await["status"] == "rolled-back"
    })
    .await;
    let back = rollout(nodes[holder].server()).await;
    assert_eq!(back["stage"], 0, "stopped at the first stage: {back}");
    assert!(
        back["reason"].as_str().unwrap().contains("rollback-failed"),
        "{back}"
    );
    eventually(
        "every agent to be back on the old version",
        PATIENCE,
        || async { all_served(&seen, AGENTS, &old) },
    )
    .await;
    tasks.iter().for_each(|t| t.abort());
}
