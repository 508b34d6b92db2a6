//! The fleet server during a NATS outage: the outage is logged once (and its end once), with
//! the address but never its credentials, however many reconnect attempts fail in between.
//! A real nats-server, stopped and restarted; the server's log captured in process.
#![cfg(feature = "server")]

#[path = "support/nats.rs"]
mod nats;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccfleet::server::ServerConfig;
use serde_json::json;

/// Every log line of this test binary.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn wait_for_line(log: &Log, from: usize, text: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !log.lines()[from..].iter().any(|l| l.contains(text)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {text:?} in {:#?}",
            &log.lines()[from..]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Item 11 (server): the server's NATS handler warned on every failed reconnect attempt
/// (about eight lines in five seconds of outage). Now the outage is one warning naming the
/// address (not its credentials) and the reason, and the recovery one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_outage_is_logged_once_by_the_server_without_credentials() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();

    let mut nats = nats::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", nats.port());
    let config = json!({
        "addr": "127.0.0.1:0",
        "db": dir.path().join("fleet.db"),
        "disable-authentication": true,
        "nats": {"address": format!("nats://ccserver:hunter2@{address}")}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("server starts");
    // The connection's own "connected" line, not another line that mentions the word: a late
    // one would otherwise land inside the outage window below.
    wait_for_line(&log, 0, " ccfleet::nats: NATS connected").await;

    let from = log.lines().len();
    nats.kill();
    wait_for_line(&log, from, "disconnected").await;
    // Reconnect attempts back off from 0 to 2 s: about eight of them in five seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The connection's own lines (the binary silences async-nats' per-event log; roster
    // publishing reports its subjects separately).
    let outage: Vec<String> = log.lines()[from..]
        .iter()
        .filter(|l| {
            l.contains("NATS")
                && (l.contains(" ccfleet::nats: ") || l.contains(" ccfleet::server: "))
        })
        .cloned()
        .collect();
    let back = log.lines().len();
    nats.restart();
    wait_for_line(&log, back, "connected").await;
    server.shutdown().await.unwrap();

    let said: Vec<&String> = outage
        .iter()
        .filter(|l| l.contains("NATS unreachable"))
        .collect();
    assert_eq!(said.len(), 1, "{outage:#?}");
    assert!(
        said[0].contains(&format!("nats://{address}"))
            && said[0].to_ascii_lowercase().contains("refused"),
        "the line names the address and why: {}",
        said[0]
    );
    // Besides that line: the disconnection; nothing per reconnect attempt.
    assert!(outage.len() <= 2, "{outage:#?}");
    assert!(
        log.lines().iter().all(|l| !l.contains("hunter2")),
        "a NATS password reached the log"
    );
}
