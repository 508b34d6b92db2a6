//! The fleet client with a real nats-server and the project's fleet server: heartbeats over
//! REST until the NATS provider yields a connected client and over NATS only afterwards,
//! roster delivery, a nats-server killed mid-run and restarted, and re-registration detected
//! by the config poll when heartbeats go over NATS.

mod client_support;
#[path = "support/nats.rs"]
mod nats;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::connection::State as NatsState;
use ccfleet::client::{Client, NatsProvider, Options};
use ccfleet::server::registry::State as ServiceState;
use ccfleet::wire::{self, ServiceType};
use client_support::{CLUSTER, Fleet, FleetSetup, HEARTBEAT_SUBJECT, HOST, eventually};
use futures::StreamExt;
use nats::NatsServer;

const WAIT: Duration = Duration::from_secs(10);

/// The application's NATS client, as a provider that can start empty.
#[derive(Clone, Default)]
struct AppNats(Arc<Mutex<Option<async_nats::Client>>>);

impl AppNats {
    fn provider(&self) -> NatsProvider {
        let slot = self.0.clone();
        Arc::new(move || slot.lock().unwrap().clone())
    }

    async fn connect(&self, url: &str) -> async_nats::Client {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            // Constant and not too short, so a test observer reconnects first after a restart.
            .reconnect_delay_callback(|_| Duration::from_millis(500))
            .connect(url)
            .await
            .expect("NATS client");
        eventually("the app's NATS client to connect", WAIT, || async {
            client.connection_state() == NatsState::Connected
        })
        .await;
        *self.0.lock().unwrap() = Some(client.clone());
        client
    }
}

fn member_options(fleet: &Fleet, app: &AppNats, heartbeat: Duration) -> Options {
    let mut opts = fleet.options();
    opts.config.heartbeat_interval = heartbeat;
    opts.config.heartbeat_subject = HEARTBEAT_SUBJECT.into();
    opts.nats = Some(app.provider());
    opts
}

fn spawn_run(client: &Client) -> tokio::task::JoinHandle<Result<(), ccfleet::client::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.run().await })
}

/// Makes an infra-scope cc-backend active, so ccmc rosters list it.
async fn activate_backend(fleet: &Fleet, host: &str) {
    let id = fleet.register_direct("", host, ServiceType::Backend).await;
    assert_eq!(fleet.heartbeat_direct(&id).await, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_heartbeats_until_nats_connects_then_nats_only_and_rosters() {
    let nats = NatsServer::start();
    let fleet = Fleet::start(FleetSetup {
        nats_url: Some(nats.url()),
    })
    .await;
    let app = AppNats::default();
    let client = Client::new(member_options(&fleet, &app, Duration::from_millis(50))).unwrap();
    assert_eq!(client.discovery_subject(), "cc.fleet.discovery.fritz.ccmc");
    let mut rosters = client.rosters();
    let run = spawn_run(&client);

    // No NATS client yet: heartbeats go over REST.
    eventually("REST heartbeats", WAIT, || async {
        fleet.rest_heartbeats().await >= 2
    })
    .await;
    assert_eq!(fleet.nats_heartbeats(), 0);
    assert!(rosters.try_recv().is_none());

    // The provider yields a connected client: heartbeats move to NATS.
    let first = app.connect(&nats.url()).await;
    eventually("NATS heartbeats", WAIT, || async {
        fleet.nats_heartbeats() >= 2
    })
    .await;
    let rest = fleet.rest_heartbeats().await;
    let on_nats = fleet.nats_heartbeats();
    eventually("more NATS heartbeats", WAIT, || async {
        fleet.nats_heartbeats() >= on_nats + 4
    })
    .await;
    assert_eq!(
        fleet.rest_heartbeats().await,
        rest,
        "no REST heartbeats while NATS is connected"
    );

    // Rosters: an active cc-backend shows up in the ccmc roster of fritz.
    activate_backend(&fleet, "mgmt01").await;
    let providers = tokio::time::timeout(WAIT, async {
        loop {
            let providers = rosters.recv().await.expect("client open");
            if !providers.is_empty() {
                return providers;
            }
        }
    })
    .await
    .expect("a roster listing the backend");
    assert_eq!(providers.len(), 1);
    assert_eq!(providers[0].service_type, ServiceType::Backend);
    assert_eq!(providers[0].hostname, "mgmt01");
    assert_eq!(providers[0].state, "active");

    // The application replaces its NATS client and closes the old one: the member
    // subscribes again on the new client, and heartbeats keep going over NATS.
    app.connect(&nats.url()).await;
    first.drain().await.unwrap();
    let rest = fleet.rest_heartbeats().await;
    let on_nats = fleet.nats_heartbeats();
    while rosters.try_recv().is_some() {}
    let providers = tokio::time::timeout(WAIT, rosters.recv())
        .await
        .expect("a roster on the new NATS client")
        .expect("client open");
    assert_eq!(providers.len(), 1);
    eventually("NATS heartbeats on the new client", WAIT, || async {
        fleet.nats_heartbeats() >= on_nats + 2
    })
    .await;
    assert_eq!(fleet.rest_heartbeats().await, rest);

    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
    // The member and the test's cc-backend; only the member deregistered.
    assert_eq!(fleet.instances(ServiceState::Deregistered), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_mid_run_falls_back_to_rest_and_returns_after_restart() {
    let mut nats = NatsServer::start();
    let fleet = Fleet::start(FleetSetup {
        nats_url: Some(nats.url()),
    })
    .await;
    let app = AppNats::default();
    let app_client = app.connect(&nats.url()).await;
    let client = Client::new(member_options(&fleet, &app, Duration::from_millis(50))).unwrap();
    let mut rosters = client.rosters();
    let run = spawn_run(&client);
    eventually("NATS heartbeats", WAIT, || async {
        fleet.nats_heartbeats() >= 2
    })
    .await;
    assert_eq!(fleet.rest_heartbeats().await, 0);
    tokio::time::timeout(WAIT, rosters.recv())
        .await
        .expect("a roster before the outage")
        .expect("client open");

    // Outage: every heartbeat goes over REST, none is queued in the NATS client.
    tokio::task::block_in_place(|| nats.kill());
    eventually("the app's NATS client to notice", WAIT, || async {
        app_client.connection_state() != NatsState::Connected
    })
    .await;
    // From here on the member knows NATS is down. A heartbeat it published in the moment
    // between the kill and the client noticing it sits in the NATS client's write buffer
    // and goes out after the reconnect (the client cannot take it back); one made once the
    // outage was known must never be queued.
    let outage_known_ns = wire::now_ns();
    let nats_during_outage = fleet.nats_heartbeats();
    eventually("REST heartbeats during the outage", WAIT, || async {
        fleet.rest_heartbeats().await >= 4
    })
    .await;

    let restart_ns = wire::now_ns();
    tokio::task::block_in_place(|| nats.restart());
    // An observer of the heartbeat subject, subscribed before the member reconnects.
    let observer = async_nats::connect(nats.url()).await.expect("observer");
    let mut observed = observer.subscribe(HEARTBEAT_SUBJECT).await.unwrap();
    observer.flush().await.unwrap();

    eventually("NATS heartbeats after the restart", WAIT, || async {
        fleet.nats_heartbeats() > nats_during_outage
    })
    .await;
    let rest = fleet.rest_heartbeats().await;
    let on_nats = fleet.nats_heartbeats();
    eventually("more NATS heartbeats", WAIT, || async {
        fleet.nats_heartbeats() >= on_nats + 4
    })
    .await;
    assert!(
        fleet.rest_heartbeats().await <= rest + 1,
        "back on NATS: at most the REST heartbeat in flight at the switch"
    );

    // Nothing made during the known outage arrived after the restart.
    let mut seen = 0;
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(100), observed.next()).await
    {
        let text = std::str::from_utf8(&message.payload).unwrap();
        for line in text.lines() {
            let ts: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(
                ts >= restart_ns || ts < outage_known_ns,
                "a heartbeat made during the outage was queued and sent after the restart: {line}"
            );
            seen += 1;
        }
        if seen >= 4 {
            break;
        }
    }
    assert!(seen >= 1, "the observer saw no heartbeats");

    // Re-subscribed: rosters arrive again.
    while rosters.try_recv().is_some() {}
    tokio::time::timeout(WAIT, rosters.recv())
        .await
        .expect("a roster after the restart")
        .expect("client open");

    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_poll_detects_a_forgotten_instance_when_heartbeats_go_over_nats() {
    let nats = NatsServer::start();
    let fleet = Fleet::start(FleetSetup {
        nats_url: Some(nats.url()),
    })
    .await;
    let app = AppNats::default();
    app.connect(&nats.url()).await;
    let mut opts = member_options(&fleet, &app, Duration::from_millis(50));
    opts.config.config_poll_interval = Duration::from_millis(100);
    let client = Client::new(opts).unwrap();
    let run = spawn_run(&client);
    eventually("the member to be active via NATS", WAIT, || async {
        fleet.instances(ServiceState::Active) == 1
    })
    .await;

    let from = fleet.relay.len();
    let rotated = fleet
        .register_direct(CLUSTER, HOST, ServiceType::MetricCollector)
        .await;
    // NATS heartbeats for the old id are silently unknown; the next poll gets 404.
    eventually("re-registration after the config 404", WAIT, || async {
        let seen = fleet.relay.summaries_since(from);
        seen.windows(2)
            .any(|w| w == ["GET config 404", "POST register 201"])
    })
    .await;
    assert_eq!(fleet.heartbeat_direct(&rotated).await, 404);
    eventually("the new id to be active via NATS", WAIT, || async {
        fleet.instances(ServiceState::Active) == 1
    })
    .await;
    assert_eq!(
        fleet.rest_heartbeats().await,
        0,
        "every heartbeat of the member went over NATS"
    );

    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
}
