//! Issue 26, one server per SQLite file, with real processes: a second `ccfleet server` on a
//! database another one uses exits at once with status 2, naming the file and the process
//! holding it; after the first server is SIGKILLed (leaving its lock file behind) the kernel
//! has released the lock and a new server starts on the file, with what the first stored.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One HTTP/1.1 request: the status and the body, or `None` when nothing answers.
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
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

fn server_command(dir: &Path, name: &str, port: u16, db: &Path) -> Command {
    let config = dir.join(format!("server-{name}.json"));
    std::fs::write(
        &config,
        json!({"addr": format!("127.0.0.1:{port}"), "disable-authentication": true, "db": db})
            .to_string(),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ccfleet"));
    command
        .arg("server")
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// A running server process; SIGKILLed when dropped.
struct Server(Child);

impl Server {
    fn start(dir: &Path, name: &str, port: u16, db: &Path) -> Server {
        let mut child = server_command(dir, name, port, db)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ccfleet server");
        let stderr = child.stderr.take().unwrap();
        let shown = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("server {shown} | {line}");
            }
        });
        let mut server = Server(child);
        let deadline = Instant::now() + WAIT;
        while request(port, "GET", "/healthz", "").map(|(s, _)| s) != Some(200) {
            if let Ok(Some(status)) = server.0.try_wait() {
                panic!("server {name} exited ({status}) before it was healthy");
            }
            assert!(
                Instant::now() < deadline,
                "server {name} not healthy in time"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_second_server_process_refuses_a_database_in_use_and_a_killed_holder_leaves_it_free() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.db");
    let port_a = free_port();
    let mut first = Server::start(dir.path(), "a", port_a, &db);
    let registration = r#"{"cluster":"fritz","hostname":"node01","serviceType":"ccmc"}"#;
    let (status, body) =
        request(port_a, "POST", "/api/fleet/register/cluster/", registration).unwrap();
    assert_eq!(status, 201, "{body}");
    let id: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = id["instanceId"].as_str().unwrap().to_owned();

    // The second server exits with status 2 and one line naming file and holder.
    let port_b = free_port();
    let output = server_command(dir.path(), "b", port_b, &db)
        .stderr(Stdio::piped())
        .output()
        .expect("run the second server");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("ccfleet: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    let canonical = std::fs::canonicalize(&db).unwrap();
    assert!(
        error.contains(&db.display().to_string())
            || error.contains(&canonical.display().to_string()),
        "{error}"
    );
    assert!(
        error.contains(&format!("process {}", first.0.id())),
        "{error}"
    );
    assert!(
        error.contains("ccfleet"),
        "the holder's command name: {error}"
    );
    assert!(
        request(port_b, "GET", "/healthz", "").is_none(),
        "it must not serve"
    );

    // SIGKILL: no clean-up ran, the lock file stays, yet the lock is gone with the process.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let lock_file = canonical.with_file_name("fleet.db.lock");
    assert!(lock_file.exists());
    let second = Server::start(dir.path(), "b", port_b, &db);
    // One registry: the instance registered through the first server is known here.
    let (status, body) =
        request(port_b, "POST", &format!("/api/fleet/heartbeat/{id}"), "").unwrap();
    assert_eq!(status, 204, "{body}");
    let holder = std::fs::read_to_string(&lock_file).unwrap();
    assert!(
        holder.starts_with(&format!("pid {}\n", second.0.id())),
        "{holder}"
    );
}
