//! The registry under faults: a full disk through the real HTTP API (a small tmpfs), and the
//! size of the write-ahead log under registration-only traffic.
#![cfg(all(feature = "server", feature = "client"))]

#[allow(unused_imports)]
mod server_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ccfleet::server::RunningServer;
use ccfleet::server::registry::{
    JOURNAL_SIZE_LIMIT, Registration, Registry, State, parse_instance_id,
};
use ccfleet::wire::{Scope, ServiceType};
use serde_json::{Value, json};
use server_common::*;

/// A tmpfs of a given size, mounted on a fresh directory and unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

/// Whether this process runs with an effective uid of 0.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            Some(line.split_whitespace().nth(2)? == "0")
        })
        .unwrap_or(false)
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it). `None`, after saying so,
    /// only when this process may not mount; any other failure fails the test.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("a directory to mount on");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        let stderr = match output {
            Ok(output) if output.status.success() => return Some(Tmpfs { dir }),
            Ok(output) => String::from_utf8_lossy(&output.stderr).to_lowercase(),
            Err(e) if !is_root() => e.to_string(),
            Err(e) => panic!("running mount: {e}"),
        };
        let not_permitted = [
            "permission denied",
            "not permitted",
            "superuser",
            "only root",
        ]
        .iter()
        .any(|m| stderr.contains(m));
        if not_permitted || !is_root() {
            eprintln!(
                "SKIPPED: mounting a {size} tmpfs is not permitted here ({}); run as root to \
                 test a full disk",
                stderr.trim()
            );
            return None;
        }
        panic!("mounting a {size} tmpfs failed: {stderr}");
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Something still holds a file open; detach it so the directory can go.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

async fn healthz(client: &reqwest::Client, server: &RunningServer) -> (u16, Value) {
    let response = client
        .get(format!("{}/healthz", server.base_url()))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Copies the database and its WAL (as they are after a clean stop) to `to`.
fn copy_database(db: &Path, to: &Path) -> PathBuf {
    let copy = to.join("fleet.sqlite");
    std::fs::copy(db, &copy).unwrap();
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    if wal.exists() {
        std::fs::copy(&wal, format!("{}-wal", copy.display())).unwrap();
    }
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_full_disk_every_acknowledged_write_is_stored_and_the_rest_answer_500() {
    let Some(disk) = Tmpfs::mount("3m") else {
        return;
    };
    let db = disk.path().join("fleet.sqlite");
    let server = start(json!({"disable-authentication": true, "db": db})).await;
    let client = http();
    let (status, body) = healthz(&client, &server).await;
    assert_eq!((status, &body["down"]), (200, &json!([])), "{body}");

    // Registrations with 1 KiB of metadata each fill 3 MiB within a few thousand.
    let padding = "x".repeat(1024);
    let mut acknowledged = Vec::new();
    let (mut failed, mut failed_in_a_row) = (0, 0);
    for i in 0..4_000 {
        let body = json!({
            "cluster": "fritz",
            "hostname": format!("f{i:05}"),
            "serviceType": "ccmc",
            "metaData": {"padding": padding},
        });
        let (status, reply) = register(&client, &server, "cluster", &body.to_string(), None).await;
        match status {
            201 => {
                acknowledged.push(reply["instanceId"].as_str().unwrap().to_owned());
                failed_in_a_row = 0;
            }
            500 => {
                assert_eq!(
                    reply,
                    json!({"status": "Internal Server Error", "error": "internal server error"})
                );
                failed += 1;
                failed_in_a_row += 1;
                if failed_in_a_row == 20 {
                    break;
                }
            }
            other => panic!("registration answered {other}: {reply}"),
        }
    }
    eprintln!(
        "{} registrations acknowledged, {failed} answered 500",
        acknowledged.len()
    );
    if failed > 0 {
        // The latest write failed: the database is named as down.
        let (status, body) = healthz(&client, &server).await;
        assert_eq!(
            (status, &body["down"]),
            (503, &json!(["database"])),
            "{body}"
        );
        assert_eq!(body["status"], "unavailable");
        assert!(
            body["checks"]["database"]
                .as_str()
                .unwrap()
                .contains("full"),
            "{body}"
        );
    }

    // Heartbeats and deregistrations answer 204 only when they were written.
    let mut expected = Vec::with_capacity(acknowledged.len());
    for (n, id) in acknowledged.iter().enumerate() {
        let mut state = State::Pending;
        match heartbeat(&client, &server, id).await {
            204 => state = State::Active,
            500 => {}
            other => panic!("heartbeat answered {other}"),
        }
        if n % 5 == 0 {
            match deregister(&client, &server, id).await {
                204 => state = State::Deregistered,
                500 => {}
                other => panic!("deregistration answered {other}"),
            }
        }
        expected.push(state);
    }
    let beats = expected.iter().filter(|s| **s == State::Active).count();
    let gone = expected
        .iter()
        .filter(|s| **s == State::Deregistered)
        .count();
    eprintln!("{beats} heartbeats and {gone} deregistrations answered 204");
    server.shutdown().await.unwrap();

    let copy = tempfile::tempdir().unwrap();
    let reopened = Registry::open(Some(&copy_database(&db, copy.path()))).unwrap();
    let counts = reopened.counts();
    assert_eq!(
        counts.pending + counts.active + counts.stale + counts.deregistered,
        acknowledged.len() as u64,
        "exactly the acknowledged registrations are stored ({failed} answered 500)"
    );
    for (id, state) in acknowledged.iter().zip(expected) {
        let stored = reopened
            .lookup(id)
            .unwrap_or_else(|| panic!("acknowledged registration {id} was lost"));
        assert_eq!(stored.state, state, "instance {id}");
    }
    assert!(
        failed > 0,
        "the disk never filled up, so a full disk was not tested"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_under_registration_only_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.sqlite");
    let wal = dir.path().join("fleet.sqlite-wal");
    let registry = Registry::open(Some(&path)).unwrap();
    let mut largest = 0;
    for i in 0..2_000 {
        let registered = registry
            .register(Registration {
                scope: Scope::Cluster,
                cluster: "fritz".into(),
                hostname: format!("f{i:05}"),
                service_type: ServiceType::MetricCollector,
                meta: Default::default(),
            })
            .await
            .unwrap();
        assert!(parse_instance_id(&registered.instance_id).is_some());
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    assert_eq!(registry.counts().pending, 2_000);
    eprintln!("largest WAL: {largest} bytes");
    assert!(
        largest <= JOURNAL_SIZE_LIMIT as u64,
        "the WAL grew to {largest} bytes under 2000 registrations (limit {JOURNAL_SIZE_LIMIT})"
    );
}
