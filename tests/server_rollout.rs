//! Staged rollouts against a real server with 100 in-process fleet clients as agents.
//!
//! Each agent registers with the project's fleet client, polls its configuration and
//! reports what it runs with the next poll, as the agent does: the plugin version it was
//! served, `running`, or `quarantined` where the version traps (on the hosts a test picks).
//! The tests watch what every agent was served and what the server decides.

#[path = "support/rollout_agents.rs"]
mod rollout_agents;
mod server_common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ccfleet::server::rollout::definition::bucket;
use rollout_agents::{Agent, CLUSTER, Shared, all_served, host, plugin_versions, plugins_layer};
use serde_json::{Value, json};
use server_common::*;

const AGENTS: usize = 100;
const ROLLOUT: &str = "loadavg-v2";
const PATIENCE: Duration = Duration::from_secs(60);

/// The tree: every ccmc of the cluster runs `old`; the rollout changes it to `new`.
fn author(tree: &Path, old: &str, new: &str, stages: Value) {
    write(
        tree,
        &format!("ccmc/{CLUSTER}/defaults.json"),
        &plugins_layer(old).to_string(),
    );
    let rollout = json!({
        "type": "ccmc", "cluster": CLUSTER, "change": plugins_layer(new),
        "stages": stages, "max-failed": 5, "rollback-failed": 10
    });
    write(
        tree,
        &format!("rollouts/{ROLLOUT}.json"),
        &rollout.to_string(),
    );
}

/// Starts the agents, polling every 100 ms; the new version traps on `trapping`.
fn agents(
    url: &str,
    new: &str,
    trapping: &BTreeSet<usize>,
) -> (Shared, Vec<tokio::task::JoinHandle<()>>) {
    let seen: Shared = Arc::default();
    let tasks = (0..AGENTS)
        .map(|i| {
            let agent = Agent {
                urls: vec![url.to_owned()],
                i,
                new: new.to_owned(),
                traps: trapping.contains(&i),
                poll: Duration::from_millis(100),
            };
            tokio::spawn(agent.run(seen.clone()))
        })
        .collect();
    (seen, tasks)
}

async fn rollout(server: &ccfleet::server::RunningServer) -> Value {
    let answer: Value = http()
        .get(format!("{}/api/fleet/rollouts", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["rollouts"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == ROLLOUT).cloned())
        .unwrap_or(Value::Null)
}

async fn wait_status(server: &ccfleet::server::RunningServer, status: &str) -> Value {
    eventually(
        &format!("the rollout to be {status}"),
        PATIENCE,
        || async move { rollout(server).await["status"] == status },
    )
    .await;
    // Completed and rolled back are final: what was seen stays.
    rollout(server).await
}

async fn refused(server: &ccfleet::server::RunningServer) -> Value {
    let answer: Value = http()
        .get(format!("{}/api/fleet/rollouts", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["refused"].clone()
}

fn stages(canary: u32, min_time: &str) -> Value {
    json!([
        {"percent": canary, "min-time": min_time},
        {"percent": 50, "min-time": min_time},
        {"percent": 100, "min-time": min_time}
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_version_reaches_every_agent_stage_by_stage() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    author(tree.path(), &old, &new, stages(20, "1s"));
    let server =
        start(json!({"disable-authentication": true, "fleet": {"config-dir": tree.path(), "plugin-dir": plugins.path(), "rollout-interval": "1s"}})).await;
    let (seen, tasks) = agents(&server.base_url(), &new, &BTreeSet::new());

    let done = wait_status(&server, "completed").await;
    assert_eq!(done["stage"], 2, "{done}");
    eventually("every agent to run the new version", PATIENCE, || async {
        all_served(&seen, AGENTS, &new)
    })
    .await;
    let metrics = http()
        .get(format!("{}/metrics", server.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ccfleet_rollout_stage_advances_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ccfleet_rollout_completions_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "ccfleet_rollout_stage{{rollout=\"{ROLLOUT}\",status=\"completed\"}} 2"
    )));
    // The status page shows the stage and what the agents report.
    let page: Value = http()
        .get(format!("{}/fleet/status.json", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let staged = &page["staged"][0];
    assert_eq!(
        (staged["name"].as_str(), staged["status"].as_str()),
        (Some(ROLLOUT), Some("completed")),
        "{page}"
    );
    assert_eq!(staged["counts"]["members"], AGENTS, "{staged}");
    assert_eq!(staged["counts"]["running"], AGENTS, "{staged}");
    tasks.iter().for_each(|t| t.abort());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_traps_on_a_fifth_stops_at_the_canary_and_is_rolled_back() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    author(tree.path(), &old, &new, stages(20, "1s"));
    // A fifth of the agents, picked independently of the stages' hash.
    let trapping: BTreeSet<usize> = (0..AGENTS).filter(|i| i % 5 == 0).collect();
    let canary: BTreeSet<usize> = (0..AGENTS)
        .filter(|i| bucket(ROLLOUT, CLUSTER, &host(*i)) < 2000)
        .collect();
    let trapping_in_canary = canary.intersection(&trapping).count();
    assert!(
        trapping_in_canary * 100 > canary.len() * 10,
        "the canary holds more than 10 % of trapping agents ({trapping_in_canary} of {})",
        canary.len()
    );
    let server =
        start(json!({"disable-authentication": true, "fleet": {"config-dir": tree.path(), "plugin-dir": plugins.path(), "rollout-interval": "1s"}})).await;
    let (seen, tasks) = agents(&server.base_url(), &new, &trapping);

    let rolled_back = wait_status(&server, "rolled-back").await;
    assert_eq!(
        rolled_back["stage"], 0,
        "stopped at the canary: {rolled_back}"
    );
    assert!(
        rolled_back["reason"]
            .as_str()
            .unwrap()
            .contains("rollback-failed")
    );
    eventually(
        "every agent to be back on the old version",
        PATIENCE,
        || async { all_served(&seen, AGENTS, &old) },
    )
    .await;
    {
        let seen = seen.lock().unwrap();
        for i in 0..AGENTS {
            let got_new = seen.all.get(&host(i)).is_some_and(|s| s.contains(&new));
            assert!(
                !got_new || canary.contains(&i),
                "{} outside the canary was served the new version",
                host(i)
            );
        }
    }
    tasks.iter().for_each(|t| t.abort());
    server.shutdown().await.unwrap();
}

async fn act(server: &ccfleet::server::RunningServer, action: &str) -> (u16, Value) {
    let response = http()
        .post(format!(
            "{}/api/fleet/rollouts/{ROLLOUT}/{action}",
            server.base_url()
        ))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_continues_the_rollout_and_operators_pause_resume_and_abort_it() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    // The canary passes at once; the second stage waits an hour.
    author(
        tree.path(),
        &old,
        &new,
        json!([{"percent": 20, "min-time": "0s"}, {"percent": 50, "min-time": "1h"}, {"percent": 100}]),
    );
    let config = json!({"disable-authentication": true, "db": db.path().join("fleet.sqlite"),
                        "fleet": {"config-dir": tree.path(), "plugin-dir": plugins.path(), "rollout-interval": "1s"}});
    let server = start(config.clone()).await;
    let (seen, tasks) = agents(&server.base_url(), &new, &BTreeSet::new());
    eventually(
        "the rollout to reach its second stage",
        PATIENCE,
        || async { rollout(&server).await["stage"] == 1 },
    )
    .await;
    let before = rollout(&server).await;
    tasks.iter().for_each(|t| t.abort());
    server.shutdown().await.unwrap();

    // A new server on the same registry continues where the first stopped.
    let server = start(config).await;
    eventually(
        "the restarted server to take over the saved progress",
        PATIENCE,
        || async {
            let now = rollout(&server).await;
            now["status"] == "running" && now["stage"] == 1
        },
    )
    .await;
    let after = rollout(&server).await;
    assert_eq!(
        after["stageStartedAt"], before["stageStartedAt"],
        "the stage's clock survives"
    );
    let (seen2, tasks) = agents(&server.base_url(), &new, &BTreeSet::new());
    eventually(
        "half of the agents to be served the new version again",
        PATIENCE,
        || async {
            let seen = seen2.lock().unwrap();
            let new_count = seen.latest.values().filter(|s| **s == new).count();
            seen.latest.len() == AGENTS && new_count > 20 && new_count < 80
        },
    )
    .await;
    drop(seen);

    let (status, paused) = act(&server, "pause").await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["status"], "paused");
    assert_eq!(
        act(&server, "pause").await.0,
        409,
        "only a running rollout pauses"
    );
    let (status, resumed) = act(&server, "resume").await;
    assert_eq!((status, resumed["status"].as_str()), (200, Some("running")));
    let (status, aborted) = act(&server, "abort").await;
    assert_eq!((status, aborted["status"].as_str()), (200, Some("aborted")));
    assert_eq!(
        act(&server, "resume").await.0,
        409,
        "an aborted rollout is final"
    );
    assert_eq!(act(&server, "launch").await.0, 404);
    eventually(
        "every agent to be back on the old version",
        PATIENCE,
        || async { all_served(&seen2, AGENTS, &old) },
    )
    .await;
    tasks.iter().for_each(|t| t.abort());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_definition_is_refused_and_the_previous_one_kept() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, new) = plugin_versions(plugins.path());
    author(
        tree.path(),
        &old,
        &new,
        json!([{"percent": 20, "min-time": "1h"}, {"percent": 100}]),
    );
    let server = start(
        json!({"disable-authentication": true, "fleet": {"config-dir": tree.path(), "plugin-dir": plugins.path(), "rollout-interval": "1s",
                                        "config-reload-interval": "100ms"}}),
    )
    .await;
    eventually("the rollout to start", PATIENCE, || async {
        rollout(&server).await["status"] == "running"
    })
    .await;
    // Above 100 %, and a plugin version plugin-dir does not hold.
    for bad in [
        json!({"type": "ccmc", "cluster": CLUSTER, "change": plugins_layer(&new), "stages": [{"percent": 150}]}),
        json!({"type": "ccmc", "cluster": CLUSTER, "change": plugins_layer(&"e".repeat(64)), "stages": [{"percent": 10}]}),
    ] {
        write(
            tree.path(),
            &format!("rollouts/{ROLLOUT}.json"),
            &bad.to_string(),
        );
        eventually("the definition to be refused", PATIENCE, || async {
            refused(&server)
                .await
                .as_array()
                .is_some_and(|r| !r.is_empty())
        })
        .await;
        let refused = refused(&server).await;
        let kept = rollout(&server).await;
        assert_eq!(
            (kept["status"].as_str(), kept["stages"].as_u64()),
            (Some("running"), Some(2)),
            "{refused} {kept}"
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_change_is_staged_on_the_revision_the_agents_apply() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let (old, _) = plugin_versions(plugins.path());
    write(
        tree.path(),
        &format!("ccmc/{CLUSTER}/defaults.json"),
        &plugins_layer(&old).to_string(),
    );
    // No plugin version changes: the gate is "the revision served is applied, no plugin
    // failing".
    let change = json!({"type": "ccmc", "cluster": CLUSTER,
                        "change": {"interval": "5s", "tags": {"rack": "r1"}},
                        "stages": [{"percent": 30, "min-time": "1s"}, {"percent": 100}]});
    write(
        tree.path(),
        &format!("rollouts/{ROLLOUT}.json"),
        &change.to_string(),
    );
    let server = start(json!({"disable-authentication": true,
                              "fleet": {"config-dir": tree.path(), "plugin-dir": plugins.path(), "rollout-interval": "1s"}}))
    .await;
    let (seen, tasks) = agents(&server.base_url(), "none", &BTreeSet::new());
    let done = wait_status(&server, "completed").await;
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("100 of 100 reporting"),
        "{done}"
    );
    assert_eq!(seen.lock().unwrap().latest.len(), AGENTS);
    // Every member is served the change now.
    let id = register_ok(
        &http(),
        &server,
        "cluster",
        &json!({"cluster": CLUSTER, "hostname": host(7), "serviceType": "ccmc"}).to_string(),
    )
    .await;
    let body: Value = pull(&http(), &server, &id, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["interval"], "5s", "{body}");
    tasks.iter().for_each(|t| t.abort());
    server.shutdown().await.unwrap();
}
