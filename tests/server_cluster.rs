//! Several fleet servers sharing one registry in a JetStream key-value bucket, on a real
//! three-node nats-server cluster (loopback only).
//!
//! Each fleet server runs on a runtime of its own; "killing" one shuts that runtime down
//! without running any of the server's shutdown path (no lease release, no last digest, its
//! NATS connection just drops), as a crash would.
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;
mod server_common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccfleet::server::registry::jetstream::{self, JetStreamSettings, JetStreamStore};
use ccfleet::server::registry::{Registration, Registry, State};
use ccfleet::server::{RegistryErrorKind, RunningServer};
use ccfleet::wire::{DEFAULT_DISCOVERY_PREFIX, Scope, ServiceType, encode_heartbeat, now_ns};
use futures::StreamExt;
use nats::{NatsCluster, NatsServer};
use serde_json::{Value, json};
use server_common::*;

const SUBJECT: &str = "cc.fleet.event";
const BUCKET: &str = "fleet";

/// The cluster tests start three nats-servers and three fleet servers each: one at a time.
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

    fn registry(&self) -> &Registry {
        self.server().registry()
    }

    /// Crashes the server: its tasks are dropped where they stand.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        drop(self.server.take());
    }

    /// Stops the server gracefully.
    async fn stop(mut self) {
        let server = self.server.take().unwrap();
        let runtime = self.runtime.take().unwrap();
        runtime
            .spawn(async move { server.shutdown().await })
            .await
            .unwrap()
            .unwrap();
        runtime.shutdown_background();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(url: &str, lease_ttl: &str, tree: Option<&std::path::Path>) -> Value {
    let mut fleet = json!({
        "heartbeat-subject": SUBJECT,
        "discovery-interval": "1s",
        "discovery-debounce": "100ms",
    });
    if let Some(tree) = tree {
        fleet["config-dir"] = Value::from(tree.display().to_string());
    }
    json!({
        "disable-authentication": true,
        "nats": {"address": url},
        "registry": {"type": "jetstream-kv", "bucket": BUCKET, "replicas": 3, "lease-ttl": lease_ttl},
        "fleet": fleet,
    })
}

/// Waits until JetStream answers on `url` (the cluster elected its meta leader).
async fn jetstream_ready(url: &str) {
    let js = async_nats::jetstream::new(nats_client(url).await);
    eventually("JetStream to answer", Duration::from_secs(30), || async {
        js.query_account().await.is_ok()
    })
    .await;
}

async fn cluster_of_three(
    lease_ttl: &str,
    tree: Option<&std::path::Path>,
) -> (NatsCluster, Vec<Node>) {
    let nats = NatsCluster::start();
    jetstream_ready(&nats.url(0)).await;
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Node::start(config(&nats.url(i), lease_ttl, tree)).await);
    }
    (nats, nodes)
}

fn member(host: &str, kind: &str) -> String {
    format!(r#"{{"cluster":"fritz","hostname":"{host}","serviceType":"{kind}"}}"#)
}

/// Publishes one heartbeat message per id (the queue group spreads them over the servers).
async fn heartbeat_all(nats: &async_nats::Client, ids: &[String]) {
    for id in ids {
        let message = encode_heartbeat(now_ns(), &[id.as_str()]).unwrap();
        nats.publish(SUBJECT, message.into()).await.unwrap();
    }
    nats.flush().await.unwrap();
}

fn unix_now() -> i64 {
    ccfleet::server::registry::unix_seconds()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_through_one_server_is_served_by_the_others_and_heartbeats_spread_over_them()
{
    let _serial = SERIAL.lock().await;
    let tree = tempfile::tempdir().unwrap();
    write(
        tree.path(),
        "defaults.json",
        r#"{"interval": "10s", "sinks": {}}"#,
    );
    let (nats, nodes) = cluster_of_three("2s", Some(tree.path())).await;
    let http = http();
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(
            register_ok(
                &http,
                nodes[0].server(),
                "cluster",
                &member(&format!("f{i:04}"), "ccmc"),
            )
            .await,
        );
    }
    // At once, before any watch could be relied on: another server knows the instance.
    assert_eq!(heartbeat(&http, nodes[1].server(), &ids[19]).await, 204);
    let first = pull(&http, nodes[2].server(), &ids[18], None).await;
    assert_eq!(first.status(), 200);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    let body = first.bytes().await.unwrap();
    eventually(
        "every server to know every registration",
        Duration::from_secs(1),
        || async {
            nodes
                .iter()
                .all(|n| ids.iter().all(|id| n.registry().lookup(id).is_some()))
        },
    )
    .await;

    // The same tree gives the same revision and body everywhere: moving costs a 304.
    for node in &nodes {
        let again = pull(&http, node.server(), &ids[18], Some(&etag)).await;
        assert_eq!(again.status(), 304);
        let fresh = pull(&http, node.server(), &ids[17], None).await;
        assert_eq!(fresh.headers()["etag"].to_str().unwrap(), etag);
        assert_eq!(fresh.bytes().await.unwrap(), body);
    }

    let publisher = nats_client(&nats.url(0)).await;
    heartbeat_all(&publisher, &ids).await;
    eventually(
        "heartbeats over NATS to activate everyone everywhere",
        Duration::from_secs(5),
        || async {
            nodes.iter().all(|n| {
                ids.iter()
                    .all(|id| n.registry().lookup(id).unwrap().state == State::Active)
            })
        },
    )
    .await;
    let accepted: Vec<u64> = nodes
        .iter()
        .map(|n| n.server().heartbeat_stats().accepted)
        .collect();
    assert!(
        accepted.iter().filter(|&&a| a > 0).count() >= 2,
        "the queue group spread heartbeats over the servers: {accepted:?}"
    );

    // Steady state: times move through digests, so every server sees every instance's
    // latest heartbeat although each received only some of them.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = unix_now();
    heartbeat_all(&publisher, &ids).await;
    eventually(
        "digests to carry the latest times to every server",
        Duration::from_secs(5),
        || async {
            nodes.iter().all(|n| {
                ids.iter()
                    .all(|id| n.registry().lookup(id).unwrap().last_heartbeat >= Some(second))
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_leader_killed_under_load_fails_over_within_two_lease_periods_and_loses_nothing_acknowledged()
 {
    let _serial = SERIAL.lock().await;
    let ttl = Duration::from_secs(2);
    let (nats, mut nodes) = cluster_of_three("2s", None).await;
    let http = http();
    let backend = register_ok(&http, nodes[0].server(), "cluster", &member("ccb01", "ccb")).await;
    assert_eq!(heartbeat(&http, nodes[0].server(), &backend).await, 204);

    let watcher = nats_client(&nats.url(2)).await;
    let mut rosters = watcher
        .subscribe(format!("{DEFAULT_DISCOVERY_PREFIX}.>"))
        .await
        .unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = arrivals.clone();
    tokio::spawn(async move {
        while let Some(_roster) = rosters.next().await {
            seen.lock().unwrap().push(Instant::now());
        }
    });
    eventually("one roster leader", Duration::from_secs(10), || async {
        nodes
            .iter()
            .filter(|n| n.server().is_roster_leader())
            .count()
            == 1
    })
    .await;
    let leader = nodes
        .iter()
        .position(|n| n.server().is_roster_leader())
        .unwrap();

    // Load: registrations and deregistrations through every server, the leader included,
    // until the test ends; only acknowledged ones are remembered.
    let urls: Vec<String> = nodes.iter().map(|n| n.server().base_url()).collect();
    // Per acknowledged registration: whether it is gone; `None` when its deregistration was
    // sent but not answered (the server may have applied it just before it was killed).
    let acknowledged = Arc::new(Mutex::new(HashMap::<String, Option<bool>>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (w, url) in urls.iter().enumerate() {
        let (url, acknowledged, stop, http) = (
            url.clone(),
            acknowledged.clone(),
            stop.clone(),
            http.clone(),
        );
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let body = member(&format!("w{w}h{i:05}"), "ccmc");
                let Ok(response) = http
                    .post(format!("{url}/api/fleet/register/cluster/"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if response.status() != 201 {
                    continue;
                }
                let Ok(json) = response.json::<Value>().await else {
                    continue;
                };
                let id = json["instanceId"].as_str().unwrap().to_owned();
                acknowledged.lock().unwrap().insert(id.clone(), Some(false));
                if i % 3 == 0 {
                    let answer = http
                        .delete(format!("{url}/api/fleet/deregister/{id}"))
                        .send()
                        .await
                        .map(|r| r.status().as_u16());
                    // Anything but 204 acknowledged nothing, which does not mean nothing
                    // happened: a write whose answer was lost with a killed server may be in.
                    let gone = matches!(answer, Ok(204)).then_some(true);
                    acknowledged.lock().unwrap().insert(id, gone);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = Instant::now();
    nodes[leader].kill();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    eventually("a new roster leader", ttl * 2, || async {
        survivors
            .iter()
            .any(|&i| nodes[i].server().is_roster_leader())
    })
    .await;
    eventually("rosters to continue", ttl * 2, || async {
        arrivals.lock().unwrap().iter().any(|&at| at > killed_at)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        survivors
            .iter()
            .filter(|&&i| nodes[i].server().is_roster_leader())
            .count(),
        1,
        "exactly one survivor leads"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 20,
        "the load ran: {}",
        acknowledged.len()
    );
    for &i in &survivors {
        let registry = nodes[i].registry().clone();
        // The watch needs moments; a loaded machine (the whole suite at once) more of them.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let wrong: Vec<String> = acknowledged
                .iter()
                .filter_map(|(id, gone)| match registry.lookup(id) {
                    Some(s) if gone.is_none_or(|g| (s.state == State::Deregistered) == g) => None,
                    other => Some(format!(
                        "{id}: acknowledged gone {gone:?}, survivor holds {:?}",
                        other.map(|s| s.state)
                    )),
                })
                .collect();
            if wrong.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "survivor {i}, 10 s after the load: {} of {} wrong, e.g. {:#?}",
                wrong.len(),
                acknowledged.len(),
                &wrong[..wrong.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The dead server's lease is gone with it; the survivors keep their ids apart.
    let _ = nodes.remove(leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nats_node_and_a_restart_of_every_server_lose_nothing() {
    let _serial = SERIAL.lock().await;
    let tree = tempfile::tempdir().unwrap();
    write(tree.path(), "defaults.json", r#"{"interval": "10s"}"#);
    let (mut nats, nodes) = cluster_of_three("1s", Some(tree.path())).await;
    let http = http();
    let mut ids = Vec::new();
    for i in 0..9 {
        let node = nodes[i % 3].server();
        ids.push(register_ok(&http, node, "cluster", &member(&format!("g{i:03}"), "ccmc")).await);
    }

    // SIGKILL the node the first server is connected to: it moves to another node.
    nats.nodes[0].kill();
    let mut more = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let body = member(&format!("after{i}"), "ccmc");
        let mut id = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        while id.is_none() {
            let (status, json) = register(&http, node.server(), "cluster", &body, None).await;
            if status == 201 {
                id = json["instanceId"].as_str().map(str::to_owned);
            } else {
                assert_eq!(status, 500, "{json}");
                assert!(
                    Instant::now() < deadline,
                    "server {i} never registered again"
                );
            }
        }
        more.push(id.unwrap());
    }
    ids.extend(more);
    let publisher = nats_client(&nats.url(1)).await;
    assert_eq!(deregister(&http, nodes[1].server(), &ids[6]).await, 204);
    let pulled = pull(&http, nodes[2].server(), &ids[7], None).await;
    assert_eq!(pulled.status(), 200);
    let revision: i64 = pulled.headers()["x-cc-config-revision"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Heartbeats keep coming, as from real members: one that landed while JetStream moved
    // its leaders may have failed to activate its instance; a later one does. Electing new
    // leaders after a SIGKILL takes JetStream seconds, more on a loaded machine.
    eventually(
        "the survivors to agree",
        Duration::from_secs(45),
        || async {
            heartbeat_all(&publisher, &ids[..6]).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            nodes.iter().all(|n| {
                let r = n.registry();
                ids[..6]
                    .iter()
                    .all(|id| r.lookup(id).unwrap().state == State::Active)
                    && r.lookup(&ids[6]).unwrap().state == State::Deregistered
                    && r.lookup(&ids[7]).unwrap().config_revision == revision
            })
        },
    )
    .await;

    // Every fleet server restarts (cleanly); the node comes back too.
    for node in nodes {
        node.stop().await;
    }
    nats.nodes[0].restart();
    jetstream_ready(&nats.url(0)).await;
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Node::start(config(&nats.url(i), "1s", Some(tree.path()))).await);
    }
    for node in &nodes {
        let r = node.registry();
        for id in &ids {
            assert!(
                r.lookup(id).is_some(),
                "an acknowledged registration is back"
            );
        }
        for id in &ids[..6] {
            assert_eq!(r.lookup(id).unwrap().state, State::Active);
        }
        assert_eq!(r.lookup(&ids[6]).unwrap().state, State::Deregistered);
        assert_eq!(r.lookup(&ids[7]).unwrap().config_revision, revision);
        assert_eq!(r.lookup(&ids[8]).unwrap().state, State::Pending);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_racing_to_register_one_member_leave_one_identity() {
    let _serial = SERIAL.lock().await;
    let (nats, nodes) = cluster_of_three("2s", None).await;
    let http = http();
    let mut pairs = Vec::new();
    for i in 0..30 {
        let body = member(&format!("race{i:02}"), "ccmc");
        let (a, b) = tokio::join!(
            register_ok(&http, nodes[0].server(), "cluster", &body),
            register_ok(&http, nodes[1].server(), "cluster", &body),
        );
        pairs.push((a, b));
    }
    eventually(
        "every server to settle on one id per member",
        Duration::from_secs(2),
        || async {
            pairs.iter().all(|(a, b)| {
                let resolving: Vec<HashSet<&str>> = nodes
                    .iter()
                    .map(|n| {
                        [a.as_str(), b.as_str()]
                            .into_iter()
                            .filter(|id| n.registry().lookup(id).is_some())
                            .collect()
                    })
                    .collect();
                resolving[0].len() == 1 && resolving.iter().all(|r| *r == resolving[0])
            })
        },
    )
    .await;
    let kv = async_nats::jetstream::new(nats_client(&nats.url(2)).await)
        .get_key_value(BUCKET)
        .await
        .unwrap();
    let keys: Vec<String> = kv.keys().await.unwrap().map(|k| k.unwrap()).collect().await;
    assert_eq!(keys.iter().filter(|k| k.starts_with("svc.")).count(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_that_reach_only_other_servers_keep_an_instance_from_the_leaders_sweep() {
    let _serial = SERIAL.lock().await;
    let nats = NatsCluster::start();
    jetstream_ready(&nats.url(0)).await;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut json = config(&nats.url(i), "1s", None);
        json["fleet"]["stale-after"] = Value::from("3s");
        json["fleet"]["sweep-interval"] = Value::from("500ms");
        nodes.push(Node::start(json).await);
    }
    let http = http();
    eventually("one roster leader", Duration::from_secs(10), || async {
        nodes
            .iter()
            .filter(|n| n.server().is_roster_leader())
            .count()
            == 1
    })
    .await;
    let leader = nodes
        .iter()
        .position(|n| n.server().is_roster_leader())
        .unwrap();
    let others: Vec<&Node> = (0..3).filter(|&i| i != leader).map(|i| &nodes[i]).collect();
    let kept = register_ok(
        &http,
        others[0].server(),
        "cluster",
        &member("kept", "ccmc"),
    )
    .await;
    let silent = register_ok(
        &http,
        others[0].server(),
        "cluster",
        &member("silent", "ccmc"),
    )
    .await;
    assert_eq!(heartbeat(&http, others[1].server(), &silent).await, 204);
    // For three stale-after periods, heartbeats go only to the servers that do not sweep.
    let until = Instant::now() + Duration::from_secs(9);
    let mut turn = 0;
    while Instant::now() < until {
        assert_eq!(
            heartbeat(&http, others[turn % 2].server(), &kept).await,
            204
        );
        turn += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let state = nodes[leader].registry().lookup(&kept).unwrap().state;
        assert_eq!(
            state,
            State::Active,
            "the leader saw the others' heartbeats"
        );
    }
    // The one that stopped heartbeating went stale, on every server.
    for node in &nodes {
        assert_eq!(node.registry().lookup(&silent).unwrap().state, State::Stale);
    }
}

fn settings(bucket: &str) -> JetStreamSettings {
    JetStreamSettings {
        bucket: bucket.to_owned(),
        replicas: 1,
        lease_ttl: Duration::from_secs(1),
    }
}

fn registration(host: &str) -> Registration {
    Registration {
        scope: Scope::Cluster,
        cluster: "fritz".to_owned(),
        hostname: host.to_owned(),
        service_type: ServiceType::MetricCollector,
        meta: Default::default(),
    }
}

async fn registry_on(client: &async_nats::Client, bucket: &str) -> Registry {
    let store = JetStreamStore::open(client.clone(), settings(bucket))
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || Registry::new(store))
        .await
        .unwrap()
        .unwrap()
}

/// A registry on `bucket` kept current by its replication tasks (watch, applier, digests), as
/// in a running server; they stop when the returned sender is dropped.
async fn watching_registry_on(
    client: &async_nats::Client,
    bucket: &str,
) -> (Registry, tokio::sync::watch::Sender<bool>) {
    let store = JetStreamStore::open(client.clone(), settings(bucket))
        .await
        .unwrap();
    let replication = store.replication();
    let registry = tokio::task::spawn_blocking(move || Registry::new(store))
        .await
        .unwrap()
        .unwrap();
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    replication
        .spawn(registry.clone(), || {}, shutdown)
        .await
        .unwrap();
    (registry, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_an_unavailable_store_naming_it() {
    let nats = NatsServer::start_jetstream();
    let client = nats_client(&nats.url()).await;
    let e = jetstream::bucket(&client, &settings("nothere"), false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Unavailable);
    assert!(e.to_string().contains("\"nothere\""), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deregistration_that_lost_a_race_to_a_re_registration_leaves_the_new_instance_alone() {
    let nats = NatsServer::start_jetstream();
    let client = nats_client(&nats.url()).await;
    // Two servers' registries on one bucket, without their watches: each learns of the
    // other's writes only through lost compare-and-set races.
    let one = registry_on(&client, "race").await;
    let two = registry_on(&client, "race").await;
    let old = one.register(registration("f0101")).await.unwrap();
    one.acknowledge(&old.instance_id, 42).await.unwrap();
    // Server two does not know the key yet: its create loses, it re-reads and re-registers
    // on top, keeping the acknowledged revision.
    let new = two.register(registration("f0101")).await.unwrap();
    assert_eq!(new.config_revision, 42);
    // Server one's deregistration of the old id loses against that and is dropped.
    assert!(one.deregister(&old.instance_id).await.unwrap());
    one.apply_remote().await.unwrap();
    assert!(one.lookup(&old.instance_id).is_none());
    let current = one.lookup(&new.instance_id).unwrap();
    assert_eq!(
        (current.state, current.config_revision),
        (State::Pending, 42)
    );
    // What a third server loads from the bucket agrees.
    let three = registry_on(&client, "race").await;
    assert!(three.lookup(&old.instance_id).is_none());
    assert_eq!(
        three.lookup(&new.instance_id).unwrap().state,
        State::Pending
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_registered_through_another_server_a_moment_ago_is_never_unknown() {
    let nats = NatsServer::start_jetstream();
    let client = nats_client(&nats.url()).await;
    let elsewhere = registry_on(&client, "moment").await;
    let (here, _stop) = watching_registry_on(&client, "moment").await;
    for i in 0..20 {
        let id = elsewhere
            .register(registration(&format!("m{i:02}")))
            .await
            .unwrap()
            .instance_id;
        // Each kind of request, straight after the registration was acknowledged.
        match i % 3 {
            0 => assert_eq!(here.heartbeat(&id).await.unwrap(), Some(true)),
            1 => assert!(here.lookup_fresh(&id).await.unwrap().is_some()),
            _ => assert!(here.deregister(&id).await.unwrap()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nats_down_writes_answer_500_with_cc_backends_body_and_acknowledged_ones_survive() {
    let mut nats = NatsServer::start_jetstream();
    let json = json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "registry": {"type": "jetstream-kv", "bucket": "down", "lease-ttl": "1s"},
    });
    let server = start(json.clone()).await;
    let http = http();
    let mut ids = Vec::new();
    for host in ["d01", "d02", "d03"] {
        ids.push(register_ok(&http, &server, "cluster", &member(host, "ccmc")).await);
    }
    nats.kill();
    let (status, body) = register(&http, &server, "cluster", &member("d04", "ccmc"), None).await;
    assert_eq!(status, 500);
    assert_eq!(
        body,
        json!({"status": "Internal Server Error", "error": "internal server error"})
    );
    assert_eq!(deregister(&http, &server, &ids[0]).await, 500);
    // Reads are served from the index meanwhile.
    assert_eq!(pull(&http, &server, &ids[1], None).await.status(), 204);
    nats.restart();
    server.shutdown().await.unwrap();
    let server = start(json).await;
    for id in &ids {
        assert_eq!(server.registry().lookup(id).unwrap().state, State::Pending);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_registrations_reaches_the_other_servers_watch_whatever_the_heartbeat_buffer() {
    // `heartbeat-pending-messages` bounds the heartbeat subscription only: the bucket watch
    // must not share that bound, or a burst of changes overflows it and the watch falls
    // behind while its consumer is recreated again and again.
    let nats = NatsServer::start_jetstream();
    let mut json = config(&nats.url(), "2s", None);
    json["registry"]["replicas"] = Value::from(1);
    json["fleet"]["heartbeat-pending-messages"] = Value::from(1);
    let one = Node::start(json.clone()).await;
    let two = Node::start(json).await;
    let members = 2_000u64;
    let registrations = (0..members).map(|i| {
        let registry = one.registry().clone();
        async move { registry.register(registration(&format!("b{i:05}"))).await }
    });
    for result in futures::future::join_all(registrations).await {
        result.unwrap();
    }
    eventually(
        "the other server's watch to hold every registration",
        Duration::from_secs(10),
        || async { two.registry().counts().pending == members },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_watch_that_stopped_delivering_is_noticed_and_replaced() {
    // A watch can go silent without an error: after a NATS node died, the client library
    // recreated the watch's consumer on the dead node and waited for it forever, and the
    // server never learned another change. Here the consumer is paused instead (it keeps
    // sending idle heartbeats, so nothing looks wrong to the client): the server must see
    // that the bucket moved on without it and watch anew.
    let nats = NatsServer::start_jetstream();
    let writer = nats_client(&nats.url()).await;
    let elsewhere = registry_on(&writer, "stall").await;
    let (here, _stop) = watching_registry_on(&nats_client(&nats.url()).await, "stall").await;
    let first = elsewhere
        .register(registration("s00"))
        .await
        .unwrap()
        .instance_id;
    // Within what the check below allows a watch (a stuck one is replaced within
    // seconds), on a loaded machine too.
    eventually("the watch to deliver", Duration::from_secs(60), || async {
        here.lookup(&first).is_some()
    })
    .await;

    let stream = async_nats::jetstream::new(writer.clone())
        .get_stream("KV_stall")
        .await
        .unwrap();
    let consumers: Vec<String> = stream
        .consumer_names()
        .map(|name| name.unwrap())
        .collect()
        .await;
    assert!(!consumers.is_empty());
    for name in consumers {
        let answer = writer
            .request(
                format!("$JS.API.CONSUMER.PAUSE.KV_stall.{name}"),
                r#"{"pause_until":"2100-01-01T00:00:00Z"}"#.into(),
            )
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
        assert_eq!(answer["paused"], Value::Bool(true), "{answer}");
    }
    let second = elsewhere
        .register(registration("s01"))
        .await
        .unwrap()
        .instance_id;
    eventually(
        "the silent watch to be replaced",
        Duration::from_secs(60),
        || async { here.lookup(&second).is_some() },
    )
    .await;
}
