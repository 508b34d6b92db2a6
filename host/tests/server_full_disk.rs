//! Issue 35, a fleet server on a full disk starts again: `ccfleet server` processes on a
//! small tmpfs. A restart after registrations filled the disk (and after a clean stop, on a
//! disk another program filled) serves every acknowledged instance, and a second server on
//! the same file is still refused, naming the first, although neither could write anything.
//! Before, the restart failed with `cannot write the lock file ...: No space left on
//! device`.

#[path = "support/agent_process.rs"]
mod agent_process;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_process::AgentProcess;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A tmpfs of a given size, mounted on a fresh directory and unmounted when dropped (a
/// failing test included: declare it before the servers on it, so they go first).
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
    /// Mounts a tmpfs of `size`. `None`, after saying so, only when this process may not
    /// mount (not root); any other failure fails the test.
    fn mount(size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("SKIPPED: mounting a tmpfs needs root; run as root to test a full disk");
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory to mount on");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            output.status.success(),
            "mounting a {size} tmpfs failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills what is left with a file of its own (as another program filling the disk
    /// would); returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let block = [0u8; 512];
        loop {
            match file.write_all(&block).and_then(|()| file.sync_data()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return path,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
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

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One HTTP/1.1 request: the status and the body, or `None` when nothing answers.
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
}

fn healthz(port: u16) -> (u16, Value) {
    let (status, body) = request(port, "GET", "/healthz", "").expect("/healthz answers");
    (status, serde_json::from_str(&body).unwrap())
}

fn config(db: &Path, port: u16) -> Value {
    json!({"addr": format!("127.0.0.1:{port}"), "disable-authentication": true, "db": db})
}

/// Starts `ccfleet server` (its configuration in `home`) and waits until it answers
/// `/healthz`, whatever it answers: on a full disk the database is down, and that is said
/// there.
fn start(home: &Path, db: &Path, port: u16) -> AgentProcess {
    std::fs::create_dir_all(home).unwrap();
    let mut server = AgentProcess::start_command("server", home, &config(db, port));
    let deadline = Instant::now() + WAIT;
    while request(port, "GET", "/healthz", "").is_none() {
        if let Some(status) = server.wait_exit(Duration::ZERO) {
            panic!(
                "the server exited ({status}) instead of serving:\n{}",
                server.log().join("\n")
            );
        }
        assert!(
            Instant::now() < deadline,
            "the server did not answer in time:\n{}",
            server.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// SIGTERM, and the clean stop it asks for.
fn stop(mut server: AgentProcess) {
    server.signal("TERM");
    let status = server.wait_exit(WAIT).expect("the server stops");
    assert_eq!(status.code(), Some(0), "{}", server.log().join("\n"));
}

fn register(port: u16, host: &str, padding: &str) -> (u16, String) {
    let body = json!({
        "cluster": "fritz",
        "hostname": host,
        "serviceType": "ccmc",
        "metaData": {"padding": padding},
    });
    request(
        port,
        "POST",
        "/api/fleet/register/cluster/",
        &body.to_string(),
    )
    .expect("the registration is answered")
}

/// Every id in `ids` is known (a config pull answers 204: no configuration tree, nothing
/// written), and an id never registered is not.
fn assert_known(port: u16, ids: &[String]) {
    for id in ids {
        let answer = request(port, "GET", &format!("/api/fleet/config/{id}"), "");
        assert_eq!(
            answer.as_ref().map(|a| a.0),
            Some(204),
            "acknowledged instance {id}: {answer:?}"
        );
    }
    let unknown = "0123456789abcdef0123456789abcdef";
    let answer = request(port, "GET", &format!("/api/fleet/config/{unknown}"), "");
    assert_eq!(answer.map(|a| a.0), Some(404));
}

/// `/healthz` answers, with the database `ok` or down for want of space: a small write may
/// still fit (SQLite reuses the WAL frames of the write that failed), so the probe decides.
fn assert_database_up_or_full(port: u16) -> Value {
    let (status, health) = healthz(port);
    let database = health["checks"]["database"].as_str().unwrap_or_default();
    match status {
        200 => assert_eq!(database, "ok", "{health}"),
        503 => {
            assert_eq!(health["down"], json!(["database"]), "{health}");
            assert!(database.contains("full"), "{health}");
        }
        _ => panic!("/healthz answered {status}: {health}"),
    }
    health
}

/// A second server on `db` exits with status 2 and an error naming `holder`'s process.
fn assert_refused(home: &Path, db: &Path, holder: &AgentProcess) {
    std::fs::create_dir_all(home).unwrap();
    let path = home.join("server.json");
    std::fs::write(&path, config(db, free_port()).to_string()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("server")
        .arg("--config")
        .arg(&path)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run the second server");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("ccfleet: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(error.contains("in use by another fleet server"), "{error}");
    assert!(
        error.contains(&format!("process {} (ccfleet)", holder.pid())),
        "the holder is named although it could not write the lock file: {error}"
    );
}

#[test]
fn a_server_on_a_disk_its_registrations_filled_starts_again_and_serves_every_acknowledged_id() {
    let Some(disk) = Tmpfs::mount("3m") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let db = disk.path().join("fleet.sqlite");
    let port = free_port();
    let first = start(&home.path().join("first"), &db, port);

    // Registrations with 1 KiB of metadata each fill 3 MiB within a few thousand.
    let padding = "x".repeat(1024);
    let mut acknowledged = Vec::new();
    let (mut failed, mut failed_in_a_row) = (0, 0);
    for i in 0..6_000 {
        let (status, body) = register(port, &format!("f{i:05}"), &padding);
        match status {
            201 => {
                let reply: Value = serde_json::from_str(&body).unwrap();
                acknowledged.push(reply["instanceId"].as_str().unwrap().to_owned());
                failed_in_a_row = 0;
            }
            500 => {
                failed += 1;
                failed_in_a_row += 1;
                if failed_in_a_row == 20 {
                    break;
                }
            }
            other => panic!("registration answered {other}: {body}"),
        }
    }
    eprintln!(
        "{} registrations acknowledged, {failed} answered 500",
        acknowledged.len()
    );
    assert!(failed_in_a_row == 20, "the disk never filled up");
    stop(first);
    // Whatever the stop gave back (a lock file emptied) is taken again.
    disk.fill();

    let second = start(&home.path().join("second"), &db, port);
    assert_known(port, &acknowledged);
    assert_database_up_or_full(port);
    assert_refused(&home.path().join("third"), &db, &second);
}

#[test]
fn a_server_stopped_cleanly_starts_again_on_a_disk_another_program_filled() {
    let Some(disk) = Tmpfs::mount("3m") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let db = disk.path().join("fleet.sqlite");
    let port = free_port();
    let first = start(&home.path().join("first"), &db, port);
    let mut acknowledged = Vec::new();
    for i in 0..50 {
        let (status, body) = register(port, &format!("f{i:05}"), "x");
        assert_eq!(status, 201, "{body}");
        let reply: Value = serde_json::from_str(&body).unwrap();
        acknowledged.push(reply["instanceId"].as_str().unwrap().to_owned());
    }
    stop(first);
    // A clean stop checkpoints the WAL and removes it with the shared-memory index, which
    // the next start must create again (32 KiB).
    let shm = disk.path().join("fleet.sqlite-shm");
    assert!(!shm.exists(), "the -shm file outlived a clean stop");
    let filler = disk.fill();

    let second = start(&home.path().join("second"), &db, port);
    assert_known(port, &acknowledged);
    let health = assert_database_up_or_full(port);
    assert_eq!(health["degraded"], json!(["registry"]), "{health}");
    assert!(
        health["checks"]["registry"]
            .as_str()
            .unwrap()
            .contains("-shm"),
        "{health}"
    );
    assert_refused(&home.path().join("third"), &db, &second);

    // Space again: writes work at once, the database is healthy at the next probe; the
    // exclusive hold on the file lasts until the next start.
    std::fs::remove_file(filler).unwrap();
    let (status, body) = register(port, "late", "x");
    assert_eq!(status, 201, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    acknowledged.push(reply["instanceId"].as_str().unwrap().to_owned());
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, health) = healthz(port);
        if status == 200 {
            assert_eq!(health["status"], "degraded", "{health}");
            break;
        }
        assert!(Instant::now() < deadline, "still unhealthy: {health}");
        std::thread::sleep(Duration::from_millis(200));
    }
    stop(second);
    let third = start(&home.path().join("fourth"), &db, port);
    assert_known(port, &acknowledged);
    let (status, health) = healthz(port);
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    drop(third);
}
