//! Issue 28, a bounded shutdown of `ccfleet server`: a second SIGTERM or SIGINT during the
//! shutdown exits at once with 128 + the signal's number, as the agent does. Before, the
//! server ignored every signal after the first and went on waiting for what held its
//! shutdown up (here a request whose body stalls; with a large fleet, a NATS that went away).

#[path = "support/agent_process.rs"]
mod agent_process;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use agent_process::AgentProcess;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn server(dir: &std::path::Path, port: u16) -> AgentProcess {
    let mut server = AgentProcess::start_command(
        "server",
        dir,
        &json!({
            "addr": format!("127.0.0.1:{port}"),
            "disable-authentication": true,
            "db": dir.join("fleet.sqlite"),
            "http-body-timeout": "2m"
        }),
    );
    server.wait_for_log("Enabling REST fleet service API", WAIT);
    server
}

/// The open connections the server counts (`ccfleet_http_connections`), this request's
/// included.
fn connections(port: u16) -> u64 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ccfleet_http_connections "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A registration whose body never arrives whole: the request stays under way, so the
/// shutdown waits its grace period for it.
fn stalled_request(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST /api/fleet/register/cluster/ HTTP/1.1\r\nHost: test\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"cluster\":"
    )
    .unwrap();
    let deadline = Instant::now() + WAIT;
    while connections(port) < 2 {
        assert!(
            Instant::now() < deadline,
            "the server never saw the request"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stream
}

#[test]
fn a_second_signal_ends_a_waiting_shutdown_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = server(dir.path(), port);
    let _stalled = stalled_request(port);
    server.signal("TERM");
    server.wait_for_log("shutting down", WAIT);
    server.signal("INT");
    let status = server
        .wait_exit(WAIT)
        .expect("the server exits after the second signal");
    assert_eq!(
        status.code(),
        Some(128 + 2),
        "exit status 128 + SIGINT: {:?}",
        server.log()
    );
    assert!(
        server
            .log()
            .iter()
            .any(|l| l.contains("second signal (SIGINT)")),
        "{:?}",
        server.log()
    );
}

#[test]
fn a_shutdown_held_by_a_stalled_request_ends_by_itself_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = server(dir.path(), port);
    let _stalled = stalled_request(port);
    server.signal("TERM");
    let status = server.wait_exit(WAIT).expect("the shutdown ends by itself");
    assert_eq!(status.code(), Some(0), "{:?}", server.log());
    assert!(
        server
            .log()
            .iter()
            .any(|l| l.contains("still open after the grace period")),
        "{:?}",
        server.log()
    );
}
