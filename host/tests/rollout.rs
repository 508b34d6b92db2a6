//! Fleet rollout of plugins: the fleet server serves components of its `plugin-dir` by
//! SHA-256 behind the fleet API's authentication; an operator edits one file of the config
//! tree and every agent of the cluster runs the new version at its next configuration poll;
//! a corrupted download and a component that cannot be instantiated leave the running
//! version in place, counted. Real peers: the project's fleet server, three in-process agents
//! and the guest plugins built from source; the only stand-in is an HTTP proxy that corrupts
//! one component on its way to the agents.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/store.rs"]
mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use ccfleet::server::plugins::sha256_hex;
use ccfleet::server::{RunningServer, ServerConfig, auth::Keypair};
use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(90);
/// The agents' configuration poll interval.
const POLL: Duration = Duration::from_secs(2);

struct Component {
    path: PathBuf,
    sha256: String,
}

fn component(name: &str) -> Component {
    let path = guests::component(name);
    let sha256 = sha256_hex(&std::fs::read(&path).unwrap());
    Component { path, sha256 }
}

/// A proxy in front of the fleet server that flips one byte of the component `corrupt`.
async fn corrupting_proxy(upstream: String, corrupt: String) -> SocketAddr {
    #[derive(Clone)]
    struct Proxy {
        upstream: String,
        corrupt: String,
        http: reqwest::Client,
    }
    async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let mut out = proxy.http.request(
            request.method().clone(),
            format!("{}{path}", proxy.upstream),
        );
        for (name, value) in request.headers() {
            if name != "host" {
                out = out.header(name, value);
            }
        }
        let body = axum::body::to_bytes(request.into_body(), 1 << 20)
            .await
            .unwrap();
        let answer = out.body(body).send().await.unwrap();
        let mut response = Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            response = response.header(name, value);
        }
        let mut bytes = answer.bytes().await.unwrap().to_vec();
        if path.ends_with(&proxy.corrupt) && !bytes.is_empty() {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        }
        response.body(Body::from(bytes)).unwrap()
    }
    let proxy = Arc::new(Proxy {
        upstream,
        corrupt,
        http: http_client(),
    });
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn samples(text: &str) -> Vec<prometheus_parse::Sample> {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap()
        .samples
}

/// The SHA-256 `/metrics` says the plugin `name` runs.
async fn running_sha(agent: &RunningAgent, name: &str) -> Option<String> {
    let text = scrape(agent.metrics_addr().unwrap()).await;
    samples(&text)
        .into_iter()
        .find(|s| s.metric == "ccfleet_agent_plugin_info" && s.labels.get("plugin") == Some(name))
        .and_then(|s| s.labels.get("sha256").map(str::to_owned))
}

async fn rollouts(agent: &RunningAgent, name: &str, result: &str) -> f64 {
    let text = scrape(agent.metrics_addr().unwrap()).await;
    samples(&text)
        .into_iter()
        .find(|s| {
            s.metric == "ccfleet_agent_plugin_rollouts_total"
                && s.labels.get("plugin") == Some(name)
                && s.labels.get("result") == Some(result)
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            _ => panic!("not a counter"),
        })
        .unwrap_or(0.0)
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// The cluster's config file naming the plugin `collector` by `sha256`.
fn name_collector(tree: &Path, entry: Json) {
    let dir = tree.join("ccmc").join("fritz");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("defaults.json"),
        json!({"plugins": [entry]}).to_string(),
    )
    .unwrap();
}

async fn fleet_server(dir: &Path, keys: &Keypair) -> RunningServer {
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"config-dir": dir.join("tree"), "plugin-dir": dir.join("plugins"),
                  "config-reload-interval": "1h"}
    });
    ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_route_needs_the_fleet_token_and_a_lowercase_hash() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keypair::generate();
    std::fs::create_dir_all(dir.path().join("tree")).unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    let hello = component("hello");
    std::fs::copy(
        &hello.path,
        dir.path().join("plugins").join("any-name.wasm"),
    )
    .unwrap();
    let server = fleet_server(dir.path(), &keys).await;
    let token = keys.sign_token("agent", &["api"], None);
    let http = http_client();
    let get = async |path: String, token: Option<&str>| {
        let mut request = http.get(format!("{}{path}", server.base_url()));
        if let Some(token) = token {
            request = request.header("X-Auth-Token", token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.bytes().await.unwrap())
    };
    let route = format!("/api/fleet/plugins/{}", hello.sha256);
    assert_eq!(get(route.clone(), None).await.0, 401);
    let (status, body) = get(route, Some(&token)).await;
    assert_eq!(status, 200);
    assert_eq!(sha256_hex(&body), hello.sha256);
    let unknown = format!("/api/fleet/plugins/{}", "0".repeat(64));
    assert_eq!(get(unknown, Some(&token)).await.0, 404);
    let upper = format!("/api/fleet/plugins/{}", hello.sha256.to_uppercase());
    assert_eq!(get(upper, Some(&token)).await.0, 400);
    let traversal = "/api/fleet/plugins/..%2F..%2Fetc%2Fpasswd".to_owned();
    assert_eq!(get(traversal, Some(&token)).await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_edit_rolls_a_new_version_out_to_every_agent_and_bad_versions_keep_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let keys = Keypair::generate();
    let (hello, loadavg, roster, probe) = (
        component("hello"),
        component("loadavg"),
        component("roster-logger"),
        component("hostile-proc-probe"),
    );
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for c in [&hello, &loadavg, &roster, &probe] {
        std::fs::copy(&c.path, plugins.join(c.path.file_name().unwrap())).unwrap();
    }
    let tree = root.join("tree");
    name_collector(
        &tree,
        json!({"name": "collector", "sha256": hello.sha256, "collect-interval": "100ms"}),
    );
    let server = fleet_server(root, &keys).await;
    let token = keys.sign_token("agent", &["api"], None);
    let proxy = corrupting_proxy(server.base_url(), roster.sha256.clone()).await;
    let store = store::Store::start(None).await;

    // Compiled once up front, so the agents' starts are compile-cache hits.
    let compiled = root.join("compiled");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(compiled.clone()),
        ..RuntimeOptions::default()
    })
    .unwrap();
    for c in [&hello, &loadavg] {
        runtime.load(&PluginSpec::new(&c.path)).await.unwrap();
    }

    let mut agents = Vec::new();
    for host in ["node01", "node02", "node03"] {
        let config = json!({
            "service-type": "ccmc",
            "fleet": {"url": format!("http://{proxy}"), "token": token, "cluster": "fritz",
                      "hostname": host, "config-poll-interval": ccfleet::duration::format(POLL)},
            "plugin-cache-dir": compiled,
            "fleet-plugin-dir": root.join(host).join("fleet-plugins"),
            // The fleet's plugins may read the fixtures, and only under this root.
            "fleet-ceiling": {"read-files": ["/proc/**", "/sys/**"], "mount-info": true,
                              "files-root": root.join("fixtures")},
            "metrics-addr": "127.0.0.1:0",
            "sinks": {"store": {"type": "http", "url": store.url(), "flush-delay": "50ms"}}
        });
        let config = AgentConfig::from_json(&config.to_string(), root).unwrap();
        agents.push(
            Agent::new(config)
                .unwrap()
                .start()
                .await
                .expect("agent starts"),
        );
    }
    for agent in &agents {
        wait_until("every agent runs hello", async || {
            running_sha(agent, "collector").await.as_deref() == Some(&hello.sha256)
        })
        .await;
    }
    // Kept privately.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let kept = root.join("node01").join("fleet-plugins");
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(kept.join(format!("{}.wasm", hello.sha256)).is_file());
    }

    // The operator names the new version in the cluster's one file.
    // The collector reads its file from a directory of fixtures, not the machine's /proc.
    let fixtures = root.join("fixtures");
    std::fs::create_dir_all(fixtures.join("proc")).unwrap();
    std::fs::write(
        fixtures.join("proc").join("loadavg"),
        "1.50 1.00 0.50 1/100 7\n",
    )
    .unwrap();
    name_collector(
        &tree,
        json!({"name": "collector", "sha256": loadavg.sha256, "collect-interval": "100ms",
               "config": {"hostname": "fleet", "cluster": "fritz"},
               "capabilities": {"read-files": ["/proc/loadavg"], "files-root": fixtures}}),
    );
    server.reload_config().await.unwrap();
    let edited = Instant::now();
    for agent in &agents {
        wait_until("every agent runs loadavg", async || {
            running_sha(agent, "collector").await.as_deref() == Some(&loadavg.sha256)
        })
        .await;
    }
    let took = edited.elapsed();
    // A figure, not a check: wall-clock bounds fail on a loaded machine.
    eprintln!("rollout to 3 agents took {took:?} (config-poll-interval {POLL:?})");
    wait_until("the new version's points arrive", async || {
        store.points().iter().any(|p| p.measurement == "load_one")
    })
    .await;
    for agent in &agents {
        assert_eq!(rollouts(agent, "collector", "swapped").await, 2.0);
    }

    // A download that does not match its hash is not used: loadavg keeps running.
    name_collector(
        &tree,
        json!({"name": "collector", "sha256": roster.sha256, "collect-interval": "100ms"}),
    );
    server.reload_config().await.unwrap();
    for (agent, host) in agents.iter().zip(["node01", "node02", "node03"]) {
        wait_until("the corrupt download is counted", async || {
            rollouts(agent, "collector", "hash_mismatch").await >= 1.0
        })
        .await;
        assert_eq!(
            running_sha(agent, "collector").await.as_deref(),
            Some(&*loadavg.sha256)
        );
        let kept = root.join(host).join("fleet-plugins");
        assert!(!kept.join(format!("{}.wasm", roster.sha256)).exists());
    }

    // A component that cannot be instantiated (it imports WASI, which is not granted): the
    // old version keeps running and collecting.
    name_collector(
        &tree,
        json!({"name": "collector", "sha256": probe.sha256, "collect-interval": "100ms"}),
    );
    server.reload_config().await.unwrap();
    for agent in &agents {
        wait_until("the failed start is counted", async || {
            rollouts(agent, "collector", "instantiate_failed").await >= 1.0
        })
        .await;
        assert_eq!(
            running_sha(agent, "collector").await.as_deref(),
            Some(&*loadavg.sha256)
        );
    }
    let before = store.points().len();
    wait_until("the old version keeps collecting", async || {
        store.points().len() >= before + 9
    })
    .await;
    for agent in agents {
        agent.shutdown().await.expect("clean shutdown");
    }
}
