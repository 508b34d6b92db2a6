//! `ccfleet fleet status` against a running fleet server: the grouped table, JSON, filters,
//! the token from the environment or a file, the errors that say what to fix, and
//! `--watch`. Each test runs the built binary.

use std::process::Stdio;
use std::time::Duration;

use ccfleet::server::auth::Keypair;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");

/// A command with a clean environment for the variables ccfleet reads.
fn ccfleet(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    for var in [
        "RUST_LOG",
        "NO_COLOR",
        "CC_FLEET_TOKEN",
        "CC_FLEET_TOKEN_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

struct Fleet {
    server: ccfleet::server::RunningServer,
    keys: Keypair,
    node: String,
    http: reqwest::Client,
}

impl Fleet {
    async fn start() -> Fleet {
        let keys = Keypair::generate();
        let config = json!({"addr": "127.0.0.1:0", "jwt-public-key": keys.public_key_base64()});
        let config = ccfleet::server::ServerConfig::from_json(&config.to_string()).unwrap();
        let server = ccfleet::server::start(config).await.unwrap();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let node = keys.sign_token("node", &["api"], None);
        Fleet {
            server,
            keys,
            node,
            http,
        }
    }

    async fn register(&self, cluster: &str, host: &str, heartbeat: bool) -> String {
        let base = self.server.base_url();
        let answer: Value = self
            .http
            .post(format!("{base}/api/fleet/register/cluster/"))
            .header("X-Auth-Token", &self.node)
            .body(json!({"cluster": cluster, "hostname": host, "serviceType": "ccmc"}).to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = answer["instanceId"].as_str().unwrap().to_owned();
        if heartbeat {
            let status = self
                .http
                .post(format!("{base}/api/fleet/heartbeat/{id}"))
                .header("X-Auth-Token", &self.node)
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status, 204);
        }
        id
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_is_a_table_grouped_by_cluster_and_type() {
    let fleet = Fleet::start().await;
    let f1 = fleet.register("fritz", "f0101", true).await;
    fleet.register("fritz", "f0102", false).await;
    fleet.register("alex", "a0101", true).await;
    let url = fleet.server.base_url();
    let admin = fleet.keys.sign_token("operator", &["admin"], None);

    let out = ccfleet(&["fleet", "status", "--url", &url])
        .env("CC_FLEET_TOKEN", &admin)
        .output()
        .await
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let blocks: Vec<&str> = stdout.split("\n\n").collect();
    assert_eq!(blocks.len(), 2, "{stdout}");
    assert!(blocks[0].starts_with("alex / ccmc: 1 active\n"), "{stdout}");
    assert!(
        blocks[1].starts_with("fritz / ccmc: 1 active, 1 pending\n"),
        "{stdout}"
    );
    let f0101 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("f0101"))
        .unwrap();
    assert!(
        f0101.contains("active") && f0101.contains(" s ago"),
        "{f0101}"
    );
    assert!(
        f0101.contains(&format!("{}…{}", &f1[..4], &f1[28..])),
        "{f0101}"
    );
    assert!(!stdout.contains(&f1), "never the whole id");
    let f0102 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("f0102"))
        .unwrap();
    assert!(
        f0102.contains("pending") && f0102.contains("never"),
        "{f0102}"
    );
    assert!(!stdout.contains('\x1b'), "no colour into a pipe");

    // The token from a file, filters, JSON.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(
        &token_file,
        format!(
            "{}\n",
            fleet.keys.sign_token("helpdesk", &["support"], None)
        ),
    )
    .unwrap();
    let out = ccfleet(&[
        "fleet",
        "status",
        "--url",
        &url,
        "--json",
        "--cluster",
        "fritz",
        "--state",
        "active",
    ])
    .env("CC_FLEET_TOKEN_FILE", &token_file)
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let instances = answer["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0]["hostname"], "f0101");
    assert!(answer["now"].is_i64());
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_to_fix() {
    let fleet = Fleet::start().await;
    let url = fleet.server.base_url();
    let run = |token: Option<String>, extra: &'static [&'static str]| {
        let mut args = vec!["fleet", "status", "--url", url.as_str()];
        args.extend_from_slice(extra);
        let mut cmd = ccfleet(&args);
        if let Some(token) = token {
            cmd.env("CC_FLEET_TOKEN", token);
        }
        async move { cmd.output().await.unwrap() }
    };
    let out = run(Some(fleet.node.clone()), &[]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("403") && stderr.contains("admin or support role"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&fleet.node),
        "the token never reaches an error"
    );
    let out = run(None, &[]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("CC_FLEET_TOKEN"),
        "{stderr}"
    );
    let admin = fleet.keys.sign_token("operator", &["admin"], None);
    let out = run(Some(admin), &["--type", "ccmx"]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("400") && stderr.contains("unknown type"),
        "{stderr}"
    );
    fleet.server.shutdown().await.unwrap();

    let out = ccfleet(&[
        "fleet",
        "status",
        "--url",
        "http://127.0.0.1:1",
        "--timeout",
        "2s",
    ])
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("http://127.0.0.1:1"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_the_status_again_on_each_interval() {
    let fleet = Fleet::start().await;
    fleet.register("fritz", "f0101", true).await;
    let url = fleet.server.base_url();
    let admin = fleet.keys.sign_token("operator", &["admin"], None);
    let mut child = ccfleet(&[
        "fleet",
        "status",
        "--url",
        &url,
        "--watch",
        "--json",
        "--interval",
        "100ms",
    ])
    .env("CC_FLEET_TOKEN", &admin)
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut counts: Vec<usize> = Vec::new();
    let watched = tokio::time::timeout(Duration::from_secs(60), async {
        // Every line is a whole document; a later round sees what was registered meanwhile.
        while counts.last() != Some(&2) {
            let line = lines.next_line().await.unwrap().expect("watch keeps going");
            let answer: Value = serde_json::from_str(&line).expect("one JSON document per line");
            counts.push(answer["instances"].as_array().unwrap().len());
            if counts.len() == 1 {
                fleet.register("fritz", "f0102", false).await;
            }
        }
    })
    .await;
    assert!(watched.is_ok(), "the new instance never showed: {counts:?}");
    assert_eq!(counts[0], 1);
    child.kill().await.unwrap();
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fleet_shows_its_summary_and_filters_find_hosts() {
    let fleet = Fleet::start().await;
    // 201 members: more than a table anyone reads. f0001..f0200 pending, f0201 active.
    for n in 1..=200 {
        fleet.register("fritz", &format!("f{n:04}"), false).await;
    }
    fleet.register("fritz", "f0201", true).await;
    let url = fleet.server.base_url();
    let admin = fleet.keys.sign_token("operator", &["admin"], None);
    let run = |args: Vec<&str>| {
        let mut all = vec!["fleet", "status", "--url", url.as_str()];
        all.extend(args);
        let mut cmd = ccfleet(&all);
        cmd.env("CC_FLEET_TOKEN", &admin);
        async move {
            let out = cmd.output().await.unwrap();
            let stdout = text(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
            stdout
        }
    };

    // No filter: the summary, with the pending hosts as a host list.
    let summary = run(vec![]).await;
    assert_eq!(
        summary,
        "201 members: 1 active, 200 pending\nfritz / ccmc: 1 active, 200 pending\n  pending   f[0001-0200]\n"
    );
    // --all lists them anyway; a filter lists what it names.
    assert_eq!(
        run(vec!["--all"])
            .await
            .lines()
            .filter(|l| l.contains(" pending "))
            .count(),
        200
    );
    let listed = run(vec!["--host", "f[0002-0003,0201]"]).await;
    let hosts: Vec<&str> = listed
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(hosts, ["f0002", "f0003", "f0201"], "{listed}");
    let one = run(vec!["--cluster", "fritz", "--state", "active"]).await;
    assert!(one.starts_with("fritz / ccmc: 1 active\n"), "{one}");
    // The summary of a filter, as JSON.
    let json_summary: Value =
        serde_json::from_str(&run(vec!["--summary", "--json", "--host", "f02*"]).await).unwrap();
    assert_eq!(json_summary["total"]["active"], 1);
    assert_eq!(json_summary["total"]["pending"], 1);
    // As the server answers it: the compact form, the pending hosts as [count, host list].
    assert_eq!(json_summary["v"], 2);
    assert_eq!(json_summary["groups"][0]["pending"], json!([1, "f0200"]));

    // A malformed host list is refused before any request.
    let out = ccfleet(&["fleet", "status", "--url", &url, "--host", "f[1-"])
        .output()
        .await
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("without its ']'"),
        "{}",
        text(&out.stderr)
    );
    fleet.server.shutdown().await.unwrap();
}
