//! `ccfleet server migrate --from-sqlite FILE`: copying a single server's SQLite registry
//! into the JetStream bucket its configuration names, against a real nats-server.

#[path = "../../tests/support/nats.rs"]
mod nats;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ccfleet::server::registry::jetstream::{JetStreamSettings, JetStreamStore};
use ccfleet::server::registry::{Registration, Registry, State};
use ccfleet::wire::{Scope, ServiceType};

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");

fn migrate(config: &Path, db: &Path) -> Output {
    Command::new(BIN)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .args(["server", "migrate", "--config"])
        .arg(config)
        .arg("--from-sqlite")
        .arg(db)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn registration(host: &str) -> Registration {
    Registration {
        scope: Scope::Cluster,
        cluster: "fritz".to_owned(),
        hostname: host.to_owned(),
        service_type: ServiceType::MetricCollector,
        meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
    }
}

async fn bucket_registry(url: &str) -> Registry {
    let client = async_nats::connect(url).await.unwrap();
    let settings = JetStreamSettings {
        bucket: "moved".to_owned(),
        replicas: 1,
        lease_ttl: Duration::from_secs(1),
    };
    let store = JetStreamStore::open(client, settings).await.unwrap();
    tokio::task::spawn_blocking(move || Registry::new(store))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_copies_a_sqlite_registry_once_and_counts_what_it_did() {
    let nats = nats::NatsServer::start_jetstream();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    let sqlite = Registry::open(Some(&db)).unwrap();
    let a = sqlite.register(registration("f01")).await.unwrap();
    let b = sqlite.register(registration("f02")).await.unwrap();
    let c = sqlite.register(registration("f03")).await.unwrap();
    assert_eq!(sqlite.heartbeat(&a.instance_id).await.unwrap(), Some(true));
    sqlite.acknowledge(&a.instance_id, 77).await.unwrap();
    assert!(sqlite.deregister(&b.instance_id).await.unwrap());
    drop(sqlite);
    let config = dir.path().join("server.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"nats": {{"address": "{}"}}, "registry": {{"type": "jetstream-kv", "bucket": "moved"}}}}"#,
            nats.url()
        ),
    )
    .unwrap();

    let first = migrate(&config, &db);
    assert!(first.status.success(), "{}", text(&first.stderr));
    // Progress goes to the log, the counts to standard output.
    let log = text(&first.stderr);
    assert!(
        log.contains("migrate: connected to NATS at nats://127.0.0.1:"),
        "{log}"
    );
    assert!(log.contains("migrate: copying 3 member(s)"), "{log}");
    assert!(log.contains("migrate: 3 of 3 member(s) done"), "{log}");
    assert!(
        text(&first.stdout).contains("3 copied, 0 already present, 0 skipped"),
        "{}",
        text(&first.stdout)
    );
    let again = migrate(&config, &db);
    assert!(
        text(&again.stdout).contains("0 copied, 3 already present, 0 skipped"),
        "{}",
        text(&again.stdout)
    );

    let bucket = bucket_registry(&nats.url()).await;
    let moved = bucket.lookup(&a.instance_id).unwrap();
    assert_eq!(
        (
            moved.state,
            moved.config_revision,
            moved.meta["rack"].as_str()
        ),
        (State::Active, 77, "r1")
    );
    assert_eq!(
        bucket.lookup(&b.instance_id).unwrap().state,
        State::Deregistered
    );
    // A member that registered through a server since keeps the bucket's registration.
    let newer = bucket.register(registration("f03")).await.unwrap();
    let third = migrate(&config, &db);
    assert!(
        text(&third.stdout).contains("0 copied, 2 already present, 1 skipped"),
        "{}",
        text(&third.stdout)
    );
    let reread = bucket_registry(&nats.url()).await;
    assert!(reread.lookup(&c.instance_id).is_none());
    assert!(reread.lookup(&newer.instance_id).is_some());
}

#[test]
fn migrate_refuses_a_missing_file_and_a_sqlite_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.json");
    std::fs::write(
        &config,
        r#"{"nats": {"address": "nats://127.0.0.1:1"}, "registry": {"type": "jetstream-kv"}}"#,
    )
    .unwrap();
    let out = migrate(&config, &dir.path().join("none.sqlite"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("none.sqlite: no such SQLite registry file"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&config, r#"{"db": "fleet.sqlite"}"#).unwrap();
    let out = migrate(&config, &dir.path().join("fleet.sqlite"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("\"jetstream-kv\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn migrate_names_an_unreachable_nats_and_why_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let db = dir.path().join("fleet.sqlite");
    drop(Registry::open(Some(&db)).unwrap());
    let config = dir.path().join("server.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"nats": {{"address": "nats://user:s3cret@127.0.0.1:{port}"}}, "registry": {{"type": "jetstream-kv"}}}}"#
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = migrate(&config, &db);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot reach NATS at nats://127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("refused"),
        "the cause: {stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
    // Not the 30 s of JetStream request timeouts it took before; the bound is the connect
    // deadline (5 s) with room for a loaded machine.
    assert!(took < Duration::from_secs(20), "took {took:?}");
}
