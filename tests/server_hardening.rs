//! The fleet server's HTTP side under hostile input: names that would break subjects or
//! paths, slow and idle connections, stalled bodies, log forging, and config trees that Go
//! reads but serde_json would refuse. Real sockets on loopback throughout.
#![cfg(all(feature = "server", feature = "client"))]

mod server_common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ccfleet::server::RunningServer;
use serde_json::json;
use server_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------
// Log capture: one global subscriber for this test binary, writing into a buffer.

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged by this test binary so far.
fn captured_logs() -> Buffer {
    static LOGS: OnceLock<Buffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        buffer
    })
    .clone()
}

async fn metric(client: &reqwest::Client, server: &RunningServer, name: &str) -> u64 {
    let text = client
        .get(format!("{}/metrics", server.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

fn body(cluster: &str, hostname: &str) -> String {
    json!({"cluster": cluster, "hostname": hostname, "serviceType": "ccmc"}).to_string()
}

// ---------------------------------------------------------------------------------------
// Names.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_would_break_a_roster_subject_or_a_tree_path_are_refused() {
    let server = start(json!({"disable-authentication": true})).await;
    let client = http();
    let long_cluster = "c".repeat(5000);
    let long_host = "h".repeat(254);
    let long_label = format!("{}.example.org", "l".repeat(64));
    let cases = [
        (long_cluster.as_str(), "f0101", "longer than 255 bytes"),
        ("infra", "f0101", "reserved for the infra roster"),
        ("fritz.a", "f0101", "'.'"),
        ("fritz*", "f0101", "wildcards"),
        ("fritz>", "f0101", "wildcards"),
        ("fr itz", "f0101", "whitespace"),
        ("fr\titz", "f0101", "control characters"),
        ("fritz", long_host.as_str(), "longer than 253 bytes"),
        ("fritz", long_label.as_str(), "label"),
        ("fritz", "f01 01", "whitespace"),
        ("fritz", "f0101\n", "control characters"),
        ("fritz", "f0101.", "'..'"),
    ];
    for (cluster, hostname, why) in cases {
        let (status, json) =
            register(&client, &server, "cluster", &body(cluster, hostname), None).await;
        let short = |s: &str| s.chars().take(20).collect::<String>();
        assert_eq!(
            status,
            400,
            "{:?} {:?}: {json}",
            short(cluster),
            short(hostname)
        );
        let error = json["error"].as_str().unwrap();
        assert!(error.contains(why), "{error}");
        assert!(
            error.len() < 200,
            "the refused name is quoted short: {error}"
        );
    }
    assert_eq!(server.registry().counts().pending, 0);

    // What Go members send keeps working: FQDNs, underscores, upper case, the longest names.
    let max_host = format!(
        "{}.{}.{}.example",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63)
    );
    for (cluster, hostname) in [
        ("fritz", "f0101"),
        ("fritz", "h1.example.org"),
        ("Alex_2", "NODE_7"),
        ("c".repeat(255).as_str(), max_host.as_str()),
    ] {
        register_ok(&client, &server, "cluster", &body(cluster, hostname)).await;
    }
    // The infra endpoint is where infra services go.
    register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01.example.org","serviceType":"ccb"}"#,
    )
    .await;
    server.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Slow clients.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_idle_connections_are_closed_while_normal_requests_are_served() {
    const SLOW: usize = 250;
    const IDLE: usize = 250;
    let server = start(json!({
        "disable-authentication": true,
        "http-header-timeout": "1s",
        "http-max-connections": 600,
    }))
    .await;
    let client = http();
    let addr = server.local_addr();

    let mut held = Vec::with_capacity(SLOW + IDLE);
    for i in 0..SLOW + IDLE {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        if i < SLOW {
            // A request whose headers never end.
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: fleet\r\nX-Slow: ")
                .await
                .unwrap();
        }
        held.push(stream);
    }
    // All of them are being served at once ...
    eventually(
        "the slow connections to be accepted",
        Duration::from_secs(10),
        || {
            let client = &client;
            let server = &server;
            async move {
                metric(client, server, "ccfleet_http_connections").await > (SLOW + IDLE) as u64
            }
        },
    )
    .await;
    // ... and normal requests still get through.
    for i in 0..20 {
        let id = register_ok(
            &client,
            &server,
            "cluster",
            &body("fritz", &format!("n{i}")),
        )
        .await;
        assert_eq!(heartbeat(&client, &server, &id).await, 204);
    }

    // Every slow or idle connection is closed by the server after the header timeout.
    let closed = futures::future::join_all(held.into_iter().map(|mut stream| async move {
        let mut sink = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut sink)).await
    }))
    .await;
    let still_open = closed.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        still_open, 0,
        "{still_open} connection(s) were never closed"
    );
    assert!(
        metric(&client, &server, "ccfleet_http_header_timeouts_total").await
            >= (SLOW + IDLE) as u64
    );
    eventually(
        "the connection gauge to drop",
        Duration::from_secs(10),
        || {
            let client = &client;
            let server = &server;
            async move { metric(client, server, "ccfleet_http_connections").await < 10 }
        },
    )
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_connection_cap_new_clients_wait_until_a_connection_closes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = start(json!({
        "disable-authentication": true,
        "http-header-timeout": "1s",
        "http-max-connections": 2,
    }))
    .await;
    let client = http();
    let order = Arc::new(AtomicUsize::new(0));
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
        let order = order.clone();
        idle.push(tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
            order.fetch_add(1, Ordering::SeqCst)
        }));
    }
    // Both permits are taken by the idle connections (the listener accepts them at once), so
    // this request is only accepted once the header timeout has closed one of them.
    let (status, _) = register(&client, &server, "cluster", &body("fritz", "f0101"), None).await;
    let served_at = order.fetch_add(1, Ordering::SeqCst);
    assert_eq!(status, 201);
    let mut closed_at = Vec::new();
    for task in idle {
        closed_at.push(task.await.unwrap());
    }
    assert!(
        closed_at.iter().any(|&at| at < served_at),
        "the request was served while both idle connections held the cap: {closed_at:?} vs {served_at}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_fails_after_the_body_timeout() {
    let server = start(json!({
        "disable-authentication": true,
        "http-body-timeout": "500ms",
    }))
    .await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    stream
        .write_all(
            b"POST /api/fleet/register/cluster/ HTTP/1.1\r\nHost: fleet\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"cluster\"",
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut head))
        .await
        .expect("an answer before the client gives up")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 400");
    assert_eq!(server.registry().counts().pending, 0);
    server.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Logs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_supplied_names_cannot_forge_log_lines() {
    let logs = captured_logs();
    let server = start(json!({"disable-authentication": true})).await;
    let client = http();
    let hostile = [
        "fritz\nERROR forged line",
        "fritz\u{1b}[2J",
        "fritz\0",
        "fritz\r",
        "fritz\u{7f}",
    ];
    for name in hostile {
        for (cluster, hostname) in [(name, "f0101"), ("fritz", name)] {
            let (status, _) =
                register(&client, &server, "cluster", &body(cluster, hostname), None).await;
            assert_eq!(status, 400);
        }
        let service_type = json!({"cluster": "fritz", "hostname": "h", "serviceType": name});
        let (status, _) =
            register(&client, &server, "cluster", &service_type.to_string(), None).await;
        assert_eq!(status, 400);
    }
    // Accepted names are escaped too: a right-to-left override reorders a terminal line.
    register_ok(&client, &server, "cluster", &body("fritz\u{202e}", "f\"01")).await;
    server.shutdown().await.unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains(r#"fleet: registered fritz\u{202e}/ccmc/f\"01"#),
        "the registration was logged, escaped: {text}"
    );
    for line in text.lines() {
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "raw control character in the log: {line:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Config trees as Go reads them.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_trees_that_go_reads_are_served_as_cc_backend_serves_them() {
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path();
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // A top-level null is an empty layer.
    write(root, "defaults.json", "null");
    // 200 levels of nesting (serde_json alone stops at 128).
    write(
        root,
        "ccmc/defaults.json",
        &format!(r#"{{"deep":{}}}"#, nested(199)),
    );
    // A lone surrogate escape.
    write(root, "ccmc/fritz/defaults.json", r#"{"s":"x\ud800y"}"#);
    // Invalid UTF-8 inside a string.
    let leaf = root.join("ccmc/fritz/f0101.json");
    std::fs::write(&leaf, b"{\"b\":\"a\xffb\"}").unwrap();
    // As deep as Go allows, for an infra member.
    write(
        root,
        "ccms/mgmt01.json",
        &format!(r#"{{"deep":{}}}"#, nested(9_999)),
    );
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": root, "config-reload-interval": "1h"}
    }))
    .await;
    let client = http();

    let id = register_ok(&client, &server, "cluster", &body("fritz", "f0101")).await;
    let response = pull(&client, &server, &id, None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        format!(
            "{{\"b\":\"a\u{fffd}b\",\"deep\":{},\"s\":\"x\u{fffd}y\"}}",
            nested(199)
        )
    );
    let only_null = register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"alex","hostname":"a1","serviceType":"ccb"}"#,
    )
    .await;
    let response = pull(&client, &server, &only_null, None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "{}");

    let deep = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01","serviceType":"ccms"}"#,
    )
    .await;
    let response = pull(&client, &server, &deep, None).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert_eq!(text, format!(r#"{{"deep":{}}}"#, nested(9_999)));
    let etag = pull(&client, &server, &deep, None).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();

    // One level more than Go allows is refused, and the previous generation stays.
    write(
        root,
        "ccms/mgmt01.json",
        &format!(r#"{{"deep":{}}}"#, nested(10_000)),
    );
    let err = server.reload_config().await.unwrap_err();
    assert!(
        err.to_string().contains("nesting deeper than 10000"),
        "{err}"
    );
    assert_eq!(
        pull(&client, &server, &deep, Some(&etag)).await.status(),
        304
    );
    // A good edit replaces (and drops) the deep generation.
    write(root, "ccms/mgmt01.json", r#"{"deep":[]}"#);
    server.reload_config().await.unwrap();
    let response = pull(&client, &server, &deep, None).await;
    assert_eq!(response.text().await.unwrap(), r#"{"deep":[]}"#);
    server.shutdown().await.unwrap();
}
