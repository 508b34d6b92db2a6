//! The opt-in JetStream heartbeat consumer (`fleet.heartbeat-stream`) against a real
//! nats-server with JetStream: nothing published while servers are down or while the
//! registry fails is lost, servers sharing the stream apply each heartbeat once, and a
//! stream replicated over three NATS nodes survives the death of its leader.
#![cfg(feature = "server")]

#[path = "support/nats.rs"]
mod nats;
mod server_common;

use std::time::Duration;

use ccfleet::server::RunningServer;
use ccfleet::server::registry::{Registration, Registry, State};
use ccfleet::wire::{Scope, ServiceType, encode_heartbeat, now_ns};
use nats::{NatsCluster, NatsServer};
use serde_json::{Value, json};
use server_common::{eventually, nats_client, start};

const SUBJECT: &str = "cc.fleet.event";

fn config(nats: &NatsServer, extra: Value) -> Value {
    let mut config = json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {"heartbeat-subject": SUBJECT, "heartbeat-stream": {"ack-wait": "5s"}},
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

async fn register(registry: &Registry, host: &str) -> String {
    registry
        .register(Registration {
            scope: Scope::Infra,
            cluster: String::new(),
            hostname: host.to_owned(),
            service_type: ServiceType::MetricStore,
            meta: Default::default(),
        })
        .await
        .unwrap()
        .instance_id
}

/// Publishes one plain (core NATS) heartbeat message per id, as agents do.
async fn publish(url: &str, ids: &[String]) {
    let publisher = async_nats::connect(url).await.unwrap();
    for id in ids {
        let payload = encode_heartbeat(now_ns(), &[id.as_str()]).unwrap();
        publisher.publish(SUBJECT, payload.into()).await.unwrap();
    }
    publisher.flush().await.unwrap();
}

fn state(server: &RunningServer, id: &str) -> State {
    server.registry().lookup(id).unwrap().state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_published_while_no_server_runs_are_applied_when_one_starts_again() {
    let nats = NatsServer::start_jetstream();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&nats, json!({"db": dir.path().join("fleet.sqlite")}));
    let first = start(config.clone()).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(register(first.registry(), &format!("m{i:02}")).await);
    }
    first.shutdown().await.unwrap();

    // Nobody subscribes now: a plain subscription would never see these.
    publish(&nats.url(), &ids).await;

    let second = start(config).await;
    eventually(
        "every heartbeat published during the downtime applied",
        Duration::from_secs(20),
        || async { second.heartbeat_stats().applied == ids.len() as u64 },
    )
    .await;
    for id in &ids {
        assert_eq!(state(&second, id), State::Active, "{id}");
    }
    let stats = second.heartbeat_stats();
    assert_eq!(
        (stats.messages, stats.unknown, stats.dropped),
        (50, 0, 0),
        "{stats:?}"
    );
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_crashed_server_held_unacknowledged_are_applied_by_the_next_one() {
    let nats = NatsServer::start_jetstream();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    let json = config(&nats, json!({"db": db}));
    // The first server runs on a runtime of its own, so it can be stopped dead: no
    // graceful apply, no acknowledgement.
    let first_json = json.clone();
    let (runtime, first) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(start(first_json));
        (runtime, server)
    })
    .join()
    .unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(register(first.registry(), &format!("m{i:02}")).await);
    }
    // The activation writes wait for this lock, so the server holds the messages when it dies.
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    publish(&nats.url(), &ids).await;
    eventually(
        "the first server holding every message",
        Duration::from_secs(20),
        || async { first.heartbeat_stats().messages == ids.len() as u64 },
    )
    .await;
    runtime.shutdown_background();
    drop(first);
    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);

    let second = start(json).await;
    eventually(
        "the held messages delivered again after ack-wait and applied",
        Duration::from_secs(30),
        || async { second.heartbeat_stats().applied == ids.len() as u64 },
    )
    .await;
    let stats = second.heartbeat_stats();
    assert_eq!(stats.stream_redelivered, ids.len() as u64, "{stats:?}");
    for id in &ids {
        assert_eq!(state(&second, id), State::Active, "{id}");
    }
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_carries_on_after_nats_server_restarts() {
    let mut nats = NatsServer::start_jetstream();
    let server = start(config(&nats, json!({}))).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(register(server.registry(), &format!("m{i:02}")).await);
    }
    publish(&nats.url(), &ids[..5]).await;
    eventually(
        "the heartbeats before the restart applied",
        Duration::from_secs(20),
        || async { server.heartbeat_stats().applied == 5 },
    )
    .await;
    // The stream and the consumer are on disk; the server's pull resumes after reconnecting.
    nats.kill();
    nats.restart();
    publish(&nats.url(), &ids[5..]).await;
    eventually(
        "the heartbeats after the restart applied",
        Duration::from_secs(60),
        || async { server.heartbeat_stats().applied == 10 },
    )
    .await;
    for id in &ids {
        assert_eq!(state(&server, id), State::Active, "{id}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_registry_refuses_is_redelivered_and_applied_once_the_fault_is_gone() {
    let nats = NatsServer::start_jetstream();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    let mut json = config(&nats, json!({"db": db}));
    // Longer than the whole test: only the refusal (nak) can bring the message back.
    json["fleet"]["heartbeat-stream"]["ack-wait"] = json!("5m");
    let server = start(json).await;
    let id = register(server.registry(), "m01").await;
    assert_eq!(state(&server, &id), State::Pending);

    // Another writer holds the database's write lock: the heartbeat's pending -> active
    // write fails once SQLite's busy timeout runs out.
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    publish(&nats.url(), std::slice::from_ref(&id)).await;
    eventually(
        "the batch refused by the locked registry",
        Duration::from_secs(30),
        || async { server.heartbeat_stats().stream_failed_batches >= 1 },
    )
    .await;
    assert_eq!(state(&server, &id), State::Pending);

    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);
    // The registry shows the instance active as soon as its write commits; the consumer
    // counts the batch as applied only when the registry call returns. Wait for both, or a
    // busy machine reads the state between the two and sees `applied` still at 0.
    eventually(
        "the redelivered heartbeat applied and counted",
        Duration::from_secs(30),
        || async { state(&server, &id) == State::Active && server.heartbeat_stats().applied >= 1 },
    )
    .await;
    let stats = server.heartbeat_stats();
    assert!(stats.stream_redelivered >= 1, "{stats:?}");
    server.shutdown().await.unwrap();
    // What was applied is stored.
    let reopened = Registry::open(Some(&db)).unwrap();
    assert_eq!(reopened.lookup(&id).unwrap().state, State::Active);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_sharing_the_stream_apply_each_heartbeat_once() {
    let nats = NatsServer::start_jetstream();
    let shared =
        json!({"registry": {"type": "jetstream-kv", "bucket": "shared", "lease-ttl": "1s"}});
    let one = start(config(&nats, shared.clone())).await;
    let two = start(config(&nats, shared)).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(register(one.registry(), &format!("m{i:02}")).await);
    }
    // Five heartbeats per instance, in as many messages.
    let messages: Vec<String> = (0..5).flat_map(|_| ids.iter().cloned()).collect();
    publish(&nats.url(), &messages).await;

    let total = || {
        let (a, b) = (one.heartbeat_stats(), two.heartbeat_stats());
        (
            a.applied + b.applied,
            a.messages + b.messages,
            a.unknown + b.unknown,
        )
    };
    eventually(
        "every heartbeat applied by one of the servers",
        Duration::from_secs(20),
        || async { total().0 >= messages.len() as u64 },
    )
    .await;
    // Anything delivered twice would show up within an ack-wait.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        total(),
        (messages.len() as u64, messages.len() as u64, 0),
        "one: {:?}, two: {:?}",
        one.heartbeat_stats(),
        two.heartbeat_stats()
    );
    for id in &ids {
        assert_eq!(state(&two, id), State::Active, "{id}");
    }
    one.shutdown().await.unwrap();
    two.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_ack_wait_reaches_the_existing_consumer_at_the_next_start() {
    // The durable consumer outlives the servers: a new `ack-wait` in the configuration must
    // not be silently ignored because the consumer already exists.
    let nats = NatsServer::start_jetstream();
    let ack_wait = async || {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let stream = js
            .get_stream(ccfleet::server::config::DEFAULT_HEARTBEAT_STREAM)
            .await
            .unwrap();
        let mut consumer = stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                ccfleet::server::config::DEFAULT_HEARTBEAT_CONSUMER,
            )
            .await
            .unwrap();
        consumer.info().await.unwrap().config.ack_wait
    };
    let mut json = config(&nats, json!({}));
    let server = start(json.clone()).await;
    server.shutdown().await.unwrap();
    assert_eq!(ack_wait().await, Duration::from_secs(5));
    json["fleet"]["heartbeat-stream"]["ack-wait"] = json!("1m");
    let server = start(json).await;
    assert_eq!(ack_wait().await, Duration::from_secs(60));
    // It still consumes.
    let id = register(server.registry(), "m00").await;
    publish(&nats.url(), std::slice::from_ref(&id)).await;
    eventually("the heartbeat applied", Duration::from_secs(20), || async {
        server.heartbeat_stats().applied == 1
    })
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_that_name_without_the_heartbeat_subject_is_refused_at_start_by_name() {
    let nats = NatsServer::start_jetstream();
    let client = async_nats::connect(nats.url()).await.unwrap();
    async_nats::jetstream::new(client)
        .create_stream(async_nats::jetstream::stream::Config {
            name: "taken".to_owned(),
            subjects: vec!["other.subject".to_owned()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut json = config(&nats, json!({"addr": "127.0.0.1:0"}));
    json["fleet"]["heartbeat-stream"] = json!({"name": "taken"});
    let parsed = ccfleet::server::ServerConfig::from_json(&json.to_string()).unwrap();
    let e = ccfleet::server::start(parsed)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fleet.heartbeat-stream")
            && e.contains("\"taken\"")
            && e.contains("does not capture")
            && e.contains(SUBJECT),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_stream_on_a_nats_server_without_jetstream_fails_start_up_by_name() {
    let nats = NatsServer::start();
    let json = config(&nats, json!({"addr": "127.0.0.1:0"}));
    let parsed = ccfleet::server::ServerConfig::from_json(&json.to_string()).unwrap();
    let e = ccfleet::server::start(parsed)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fleet.heartbeat-stream") && e.contains("creating stream"),
        "{e}"
    );
}

/// The NATS node (`n0`..`n2`) leading the stream, once it has a leader.
async fn stream_leader(js: &async_nats::jetstream::Context) -> Option<String> {
    let mut stream = js.get_stream(STREAM).await.ok()?;
    let info = stream.info().await.ok()?;
    info.cluster.as_ref()?.leader.clone()
}

const STREAM: &str = "ccfleet-heartbeats";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_replicated_on_three_nats_nodes_loses_nothing_when_its_leader_is_killed() {
    let mut cluster = NatsCluster::start();
    let js = async_nats::jetstream::new(nats_client(&cluster.url(1)).await);
    eventually("JetStream to answer", Duration::from_secs(30), || async {
        js.query_account().await.is_ok()
    })
    .await;
    let config = json!({
        "disable-authentication": true,
        "nats": {"address": cluster.url(0)},
        "fleet": {
            "heartbeat-subject": SUBJECT,
            "heartbeat-stream": {"replicas": 3, "ack-wait": "5s"},
        },
    });
    let server = start(config).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(register(server.registry(), &format!("m{i:02}")).await);
    }
    let info = js
        .get_stream(STREAM)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.num_replicas, 3, "{info:?}");

    let publisher = nats_client(&cluster.url(1)).await;
    let publish = |ids: Vec<String>| {
        let publisher = publisher.clone();
        async move {
            for id in ids {
                let payload = encode_heartbeat(now_ns(), &[id.as_str()]).unwrap();
                publisher.publish(SUBJECT, payload.into()).await.unwrap();
            }
            publisher.flush().await.unwrap();
        }
    };
    publish(ids[..20].to_vec()).await;
    eventually(
        "the heartbeats before the kill applied",
        Duration::from_secs(20),
        || async { server.heartbeat_stats().applied == 20 },
    )
    .await;

    // SIGKILL the node leading the stream (and so, most likely, the consumer): the stream
    // and the durable consumer move to the survivors, and the server's pulls must follow.
    let leader = stream_leader(&js).await.expect("the stream has a leader");
    let killed: usize = leader.trim_start_matches('n').parse().unwrap();
    cluster.nodes[killed].kill();
    let survivor = cluster.url((killed + 1) % 3);
    let js = async_nats::jetstream::new(nats_client(&survivor).await);
    eventually(
        "the survivors to elect a new stream leader",
        Duration::from_secs(45),
        || async { stream_leader(&js).await.is_some_and(|now| now != leader) },
    )
    .await;
    // Plain publishes, as agents send them, to a node that is still up; stored by the
    // stream now that it has a leader again.
    let publisher = nats_client(&survivor).await;
    for id in &ids[20..] {
        let payload = encode_heartbeat(now_ns(), &[id.as_str()]).unwrap();
        publisher.publish(SUBJECT, payload.into()).await.unwrap();
    }
    publisher.flush().await.unwrap();
    // A work-queue stream drops what was acknowledged: its last sequence counts what it
    // ever stored.
    eventually(
        "the stream to have stored all 40 heartbeats",
        Duration::from_secs(20),
        || async {
            let Ok(mut stream) = js.get_stream(STREAM).await else {
                return false;
            };
            stream
                .info()
                .await
                .is_ok_and(|info| info.state.last_sequence >= 40)
        },
    )
    .await;
    eventually(
        "every heartbeat applied after the leader moved",
        Duration::from_secs(60),
        || async { server.heartbeat_stats().applied >= 40 },
    )
    .await;
    for id in &ids {
        assert_eq!(state(&server, id), State::Active, "{id}");
    }
    let stats = server.heartbeat_stats();
    assert_eq!((stats.unknown, stats.dropped), (0, 0), "{stats:?}");
    server.shutdown().await.unwrap();
}
