//! The agent end to end: a real fleet server with a config tree, a real nats-server, and the
//! example plugins built from guest/. A config edit in the tree reaches the plugin, and its
//! metrics arrive on NATS.

#[path = "support/guests.rs"]
mod guests;
#[path = "../../tests/support/nats.rs"]
mod nats;

use std::path::Path;
use std::time::Duration;

use ccfleet::client::{Client, Options};
use ccfleet::lineproto::Decoder;
use ccfleet::server::{ServerConfig, auth::Keypair};
use ccfleet::wire::ServiceType;
use ccfleet_host::PluginEvent;
use ccfleet_host::agent::{Agent, AgentConfig};
use ccfleet_host::events::EventKind;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::broadcast;

const WAIT: Duration = Duration::from_secs(30);

fn write_tree(tree: &Path, rack: &str) {
    let dir = tree.join("ccmc");
    std::fs::create_dir_all(&dir).unwrap();
    let body = json!({"interval": "10s", "loadavg": {"tags": {"rack": rack}}});
    std::fs::write(dir.join("defaults.json"), body.to_string()).unwrap();
}

async fn wait_for(
    events: &mut broadcast::Receiver<PluginEvent>,
    what: &str,
    pred: impl Fn(&PluginEvent) -> bool,
) -> PluginEvent {
    tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(event) if pred(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn log_of(event: &PluginEvent, plugin: &str, needle: &str) -> bool {
    &*event.plugin == plugin
        && matches!(&event.kind, EventKind::Log { message, .. } if message.contains(needle))
}

/// Waits for a metric batch on `subscriber` whose `load_one` line carries `rack`.
async fn wait_for_metrics(subscriber: &mut async_nats::Subscriber, rack: &str) -> Vec<String> {
    tokio::time::timeout(WAIT, async {
        loop {
            let message = subscriber.next().await.expect("metrics subscription ended");
            let mut lines = Vec::new();
            let mut racks = Vec::new();
            for line in Decoder::new(&message.payload) {
                let line = line.expect("valid line protocol on NATS");
                lines.push(line.measurement().unescape().into_owned());
                racks.push(line.tag("rack").map(|t| t.unescape().into_owned()));
                assert_eq!(
                    line.tag("hostname").map(|t| t.unescape().into_owned()),
                    Some("node01".to_owned())
                );
                assert_eq!(
                    line.tag("type").map(|t| t.unescape().into_owned()),
                    Some("node".to_owned())
                );
            }
            if racks.iter().all(|r| r.as_deref() == Some(rack)) {
                return lines;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for metrics with rack={rack}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_edit_reaches_the_plugin_and_metrics_arrive_on_nats() {
    let nats = nats::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    write_tree(&tree, "r1");

    let keys = Keypair::generate();
    let server_config = json!({
        "addr": "127.0.0.1:0",
        "db": dir.path().join("fleet.db"),
        "jwt-public-key": keys.public_key_base64(),
        "nats": {"address": nats.url()},
        "fleet": {
            "config-dir": tree,
            "config-reload-interval": "1h",
            "heartbeat-subject": "cc.fleet.event",
            "discovery-interval": "1s",
            "discovery-debounce": "50ms"
        }
    });
    let server =
        ccfleet::server::start(ServerConfig::from_json(&server_config.to_string()).unwrap())
            .await
            .expect("fleet server");
    let token = keys.sign_token("agent", &["api"], None);

    let observer = async_nats::connect(nats.url()).await.unwrap();
    let mut metrics = observer.subscribe("cc.metric.fritz").await.unwrap();
    let mut heartbeats = observer.subscribe("cc.fleet.event").await.unwrap();
    observer.flush().await.unwrap();

    // A backend is registered, so the collector's roster has a provider in it.
    let mut backend = ccfleet::client::Config::new(server.base_url());
    backend.token = token.clone();
    backend.hostname = "backend01".to_owned();
    let backend = Client::new(Options::new(backend, ServiceType::Backend)).unwrap();
    backend.register().await.expect("backend registers");
    // A registration is pending until its first heartbeat; only active services are listed.
    backend.heartbeat().await.expect("backend heartbeat");

    let agent_config = json!({
        "service-type": "ccmc",
        "fleet": {
            "url": server.base_url(),
            "token": token,
            "cluster": "fritz",
            "hostname": "node01",
            "heartbeat-interval": "200ms",
            "config-poll-interval": "200ms",
            "heartbeat-subject": "cc.fleet.event",
            "cache-path": dir.path().join("fleet-cache.json")
        },
        "nats": {"address": nats.url()},
        "metrics": {"type": "nats", "subject": "cc.metric.fritz"},
        "plugin-cache-dir": dir.path().join("compiled"),
        "plugin-watch-interval": "100ms",
        "plugins": [
            {"path": guests::component("roster-logger")},
            {
                "path": guests::component("loadavg"),
                "config": {"cluster": "fritz", "hostname": "node01"},
                "collect-interval": "200ms",
                "capabilities": {"read-files": ["/proc/loadavg"]}
            }
        ]
    });
    let agent =
        Agent::new(AgentConfig::from_json(&agent_config.to_string(), dir.path()).unwrap()).unwrap();
    let mut events = agent.subscribe();
    let agent = agent.start().await.expect("agent starts");
    assert_eq!(agent.initial().source, ccfleet::client::Source::Fleet);
    let first_revision = agent.initial().revision.clone();

    // The configuration from the tree reaches both plugins.
    wait_for(&mut events, "roster-logger sees the revision", |e| {
        log_of(
            e,
            "roster-logger",
            &format!("config revision {first_revision} from fleet"),
        )
    })
    .await;
    let lines = wait_for_metrics(&mut metrics, "r1").await;
    assert_eq!(
        lines,
        [
            "load_one",
            "load_five",
            "load_fifteen",
            "proc_run",
            "proc_total"
        ]
    );

    // Heartbeats go over NATS; the roster names the backend.
    let heartbeat = tokio::time::timeout(WAIT, heartbeats.next())
        .await
        .expect("a heartbeat on NATS")
        .expect("subscription open");
    assert!(
        heartbeat.payload.starts_with(b"fleet,"),
        "{:?}",
        heartbeat.payload
    );
    wait_for(&mut events, "roster", |e| {
        log_of(e, "roster-logger", "joined: [ccb/backend01]")
    })
    .await;

    // Edit the tree: the new revision reaches the plugins live and changes the metrics.
    write_tree(&tree, "r2");
    server.reload_config().await.expect("tree reload");
    // The plugin logs the change from inside `on-config`, then the host records the delivery.
    let applied = wait_for(&mut events, "loadavg applies the edit", |e| {
        log_of(e, "loadavg", "extra tags [rack=r2]")
    })
    .await;
    assert_eq!(applied.generation, 1, "delivered live, without a restart");
    wait_for(&mut events, "new revision delivered to loadavg", |e| {
        &*e.plugin == "loadavg"
            && matches!(&e.kind, EventKind::ConfigDelivered { revision } if *revision != first_revision)
    })
    .await;
    wait_for_metrics(&mut metrics, "r2").await;

    agent.shutdown().await.expect("clean shutdown");
    server.shutdown().await.expect("server shutdown");
}

/// Without NATS no roster ever arrives; the configured discovery provider must still reach
/// the plugins instead of waiting behind the fleet source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_only_agent_hands_plugins_the_configured_discovery_set() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    write_tree(&tree, "r1");
    let server_config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "fleet": {"config-dir": tree}
    });
    let server =
        ccfleet::server::start(ServerConfig::from_json(&server_config.to_string()).unwrap())
            .await
            .expect("fleet server");
    let agent_config = json!({
        "service-type": "ccmc",
        "fleet": {
            "url": server.base_url(),
            "cluster": "fritz",
            "hostname": "node01",
            "heartbeat-interval": "200ms",
            "config-poll-interval": "200ms"
        },
        "discovery": {"provider": "STATIC", "static-endpoints": ["10.1.0.1:7000", "10.1.0.2"]},
        "discovery-refresh-interval": "100ms",
        "metrics": {"type": "stdout"},
        "plugin-cache-dir": dir.path().join("compiled"),
        "plugins": [{"path": guests::component("roster-logger")}]
    });
    let agent =
        Agent::new(AgentConfig::from_json(&agent_config.to_string(), dir.path()).unwrap()).unwrap();
    let mut events = agent.subscribe();
    let agent = agent.start().await.expect("agent starts");
    wait_for(&mut events, "the static instances", |e| {
        matches!(e.kind, EventKind::InstancesDelivered { instances: 2 })
    })
    .await;
    agent.shutdown().await.expect("clean shutdown");
    server.shutdown().await.expect("server shutdown");
}
