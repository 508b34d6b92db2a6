//! Last-seen times kept in memory are written when the server stops.

use std::collections::BTreeMap;

use ccfleet::server::ServerConfig;
use ccfleet::server::registry::{Registration, Registry, State, parse_instance_id};
use ccfleet::wire::{Scope, ServiceType};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_writes_the_last_seen_times_it_kept_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    let config = serde_json::json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "db": db,
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .unwrap();
    let registered = server
        .registry()
        .register(Registration {
            scope: Scope::Cluster,
            cluster: "fritz".into(),
            hostname: "f0101".into(),
            service_type: ServiceType::MetricCollector,
            meta: BTreeMap::new(),
        })
        .await
        .unwrap();
    let id = parse_instance_id(&registered.instance_id).unwrap();
    // The first heartbeat activates (a durable write), the second only moves the time.
    server
        .registry()
        .heartbeat_batch(vec![(id, 100)])
        .await
        .unwrap();
    server
        .registry()
        .heartbeat_batch(vec![(id, 200)])
        .await
        .unwrap();
    assert_eq!(server.registry().unwritten_last_seen(), 1);
    server.shutdown().await.unwrap();

    let reopened = Registry::open(Some(&db)).unwrap();
    let svc = reopened.lookup(&registered.instance_id).unwrap();
    assert_eq!((svc.state, svc.last_heartbeat), (State::Active, Some(200)));
}
