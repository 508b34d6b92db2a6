//! A fleet for the ceiling tests: the project's fleet server behind a loopback proxy that
//! records the agents' reports, a config tree the test writes, components published by
//! SHA-256, `ccfleet agent` processes pulling from it and an HTTP metric receiver keeping
//! every byte sent to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use ccfleet::server::plugins::sha256_hex;
use ccfleet::server::{RunningServer, ServerConfig, auth::Keypair};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::agent_process::AgentProcess;
use super::guests;

/// How long a condition may take on a loaded machine.
pub const WAIT: Duration = Duration::from_secs(180);

/// A random marker, to be looked for where a secret must never appear.
pub fn marker() -> String {
    let mut bytes = [0u8; 12];
    getrandom(&mut bytes);
    format!(
        "decoy{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

fn getrandom(out: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .expect("reading /dev/urandom");
}

/// The fleet: server, proxy, tree, published components.
pub struct Fleet {
    dir: tempfile::TempDir,
    token: String,
    /// A token of the `admin` role, for the status API.
    admin_token: String,
    server: Option<RunningServer>,
    proxy: SocketAddr,
    proxy_task: tokio::task::JoinHandle<()>,
    reports: Arc<Mutex<Vec<String>>>,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    reports: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
}

async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    if let Some(report) = request.headers().get("x-ccfleet-report") {
        proxy
            .reports
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(report.as_bytes()).into_owned());
    }
    let mut out = proxy.http.request(
        request.method().clone(),
        format!("{}{path}", proxy.upstream),
    );
    for (name, value) in request.headers() {
        if name != "host" {
            out = out.header(name, value);
        }
    }
    let Ok(body) = axum::body::to_bytes(request.into_body(), 1 << 20).await else {
        return Response::builder().status(400).body(Body::empty()).unwrap();
    };
    let Ok(answer) = out.body(body).send().await else {
        return Response::builder().status(502).body(Body::empty()).unwrap();
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    let bytes = answer.bytes().await.unwrap_or_default();
    response.body(Body::from(bytes)).unwrap()
}

fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

impl Fleet {
    /// Starts the server (authentication on) and the proxy the agents use.
    pub async fn start() -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let keys = Keypair::generate();
        let root = dir.path();
        std::fs::create_dir_all(root.join("plugins")).unwrap();
        std::fs::create_dir_all(root.join("tree").join("ccmc").join("fritz")).unwrap();
        let config = json!({
            "addr": "127.0.0.1:0",
            "jwt-public-key": keys.public_key_base64(),
            "fleet": {"config-dir": root.join("tree"), "plugin-dir": root.join("plugins"),
                      "config-reload-interval": "1h"}
        });
        let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
            .await
            .expect("fleet server");
        let reports = Arc::new(Mutex::new(Vec::new()));
        let proxy = Arc::new(Proxy {
            upstream: server.base_url(),
            reports: reports.clone(),
            http: http_client(),
        });
        let app = axum::Router::new().fallback(forward).with_state(proxy);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy_task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Fleet {
            dir,
            token: keys.sign_token("agent", &["api"], None),
            admin_token: keys.sign_token("operator", &["admin"], None),
            server: Some(server),
            proxy: addr,
            proxy_task,
            reports,
        }
    }

    /// The test's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The fleet token the agents use.
    pub fn token(&self) -> String {
        self.token.clone()
    }

    /// Publishes a built component; its SHA-256.
    pub fn publish(&self, component: &str) -> String {
        self.publish_file(&guests::component(component))
    }

    /// Publishes any file in the server's plugin directory; its SHA-256.
    pub fn publish_file(&self, file: &Path) -> String {
        let bytes = std::fs::read(file).unwrap();
        let sha = sha256_hex(&bytes);
        std::fs::write(
            self.dir().join("plugins").join(format!("{sha}.wasm")),
            bytes,
        )
        .unwrap();
        sha
    }

    /// Names `entries` as the cluster's plugins and has the server read its tree again.
    pub async fn serve(&self, entries: Json) {
        std::fs::write(
            self.dir()
                .join("tree")
                .join("ccmc")
                .join("fritz")
                .join("defaults.json"),
            json!({ "plugins": entries }).to_string(),
        )
        .unwrap();
        if let Some(server) = &self.server {
            server.reload_config().await.unwrap();
        }
    }

    /// Stops the server and the proxy: agents find no fleet server any more.
    pub async fn stop_server(&mut self) {
        self.proxy_task.abort();
        if let Some(server) = self.server.take() {
            server.shutdown().await.unwrap();
        }
    }

    /// `GET /api/fleet/instances` of the server (the status API, as `ccfleet fleet status`
    /// reads it): every member with the plugins it reports.
    pub async fn instances(&self) -> Json {
        let answer = http_client()
            .get(format!("http://{}/api/fleet/instances", self.proxy))
            .header("X-Auth-Token", &self.admin_token)
            .send()
            .await
            .expect("the status API");
        assert!(answer.status().is_success(), "{}", answer.status());
        answer.json().await.expect("JSON from the status API")
    }

    /// The reports agents sent with their configuration polls so far.
    pub fn reports(&self) -> Vec<String> {
        self.reports.lock().unwrap().clone()
    }

    /// Starts `ccfleet agent` in `<dir>/node` with `extra` keys in its configuration and
    /// `env` in its environment.
    pub fn agent(&self, sink: &Receiver, extra: Json, env: &[(&str, &str)]) -> AgentProcess {
        self.agent_with_fleet(sink, extra, env, json!({}))
    }

    /// [`Fleet::agent`] with `fleet_extra` keys in its `fleet` section.
    pub fn agent_with_fleet(
        &self,
        sink: &Receiver,
        extra: Json,
        env: &[(&str, &str)],
        fleet_extra: Json,
    ) -> AgentProcess {
        let node = self.dir().join("node");
        std::fs::create_dir_all(&node).unwrap();
        let mut fleet = json!({"url": format!("http://{}", self.proxy), "token": self.token(),
                               "cluster": "fritz", "hostname": "node01",
                               "config-poll-interval": "1s"});
        merge(&mut fleet, fleet_extra);
        let mut config = json!({
            "service-type": "ccmc",
            "fleet": fleet,
            "plugin-cache-dir": self.dir().join("compiled"),
            "fleet-plugin-dir": node.join("fleet-plugins"),
            "metrics-addr": "127.0.0.1:0",
            "sinks": {"receiver": {"type": "http", "url": sink.url(), "flush-delay": "50ms"}}
        });
        merge(&mut config, extra);
        AgentProcess::start_with_env(&node, &config, env)
    }
}

fn merge(into: &mut Json, extra: Json) {
    if let (Json::Object(into), Json::Object(extra)) = (into, extra) {
        into.extend(extra);
    }
}

/// An HTTP metric receiver keeping every body sent to it.
pub struct Receiver {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<u8>>>,
}

impl Receiver {
    /// Starts it on a free loopback port.
    pub async fn start() -> Receiver {
        async fn keep(State(bodies): State<Arc<Mutex<Vec<u8>>>>, request: Request) -> Response {
            if let Ok(body) = axum::body::to_bytes(request.into_body(), 64 << 20).await {
                bodies.lock().unwrap().extend_from_slice(&body);
            }
            Response::builder().status(204).body(Body::empty()).unwrap()
        }
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .fallback(keep)
            .with_state(bodies.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, bodies }
    }

    /// The write URL.
    pub fn url(&self) -> String {
        format!("http://{}/api/write", self.addr)
    }

    /// Everything received, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bodies.lock().unwrap()).into_owned()
    }
}

/// The address the agent serves `/metrics` on, from its log.
pub fn metrics_addr(agent: &mut AgentProcess) -> SocketAddr {
    agent.wait_for_log("serving /metrics", WAIT);
    let log = agent.log();
    let line = log.iter().find(|l| l.contains("serving /metrics")).unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line}"));
    addr.parse().unwrap()
}

async fn scrape(addr: SocketAddr) -> String {
    get(addr, "/metrics").await
}

/// The body of `GET path` from the agent's listener (empty when it does not answer).
async fn get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// The error `/readyz` gives for the fleet plugin `name` (`None`: it runs or is not named).
pub async fn readyz_error(addr: SocketAddr, name: &str) -> Option<String> {
    let body: Json = serde_json::from_str(&get(addr, "/readyz").await).ok()?;
    body["fleet_plugins"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["error"].as_str().map(str::to_owned))
}

/// `ccfleet_agent_plugin_rollouts_total` of `plugin` and `result`.
pub async fn rollouts(addr: SocketAddr, plugin: &str, result: &str) -> f64 {
    let text = scrape(addr).await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .map(|s| s.samples)
        .unwrap_or_default()
        .into_iter()
        .find(|s| {
            s.metric == "ccfleet_agent_plugin_rollouts_total"
                && s.labels.get("plugin") == Some(plugin)
                && s.labels.get("result") == Some(result)
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            _ => panic!("not a counter"),
        })
        .unwrap_or(0.0)
}

/// Polls `check` until it holds; panics after [`WAIT`].
pub async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// A shared library whose constructor creates `<dir>/constructor-ran`: the library and the
/// marker's path.
pub fn build_evil_library(dir: &Path) -> (PathBuf, PathBuf) {
    let ran = dir.join("constructor-ran");
    let source = dir.join("evil.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void pwn(void) {{\n\
                 FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f);\n\
             }}\n\
             int nvmlInit_v2(void) {{ return 0; }}\n",
            ran.display()
        ),
    )
    .unwrap();
    let library = dir.join("evil.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) is needed to build the test's hostile library");
    assert!(status.success(), "building the hostile library failed");
    (library, ran)
}

/// A copy of the NVML stand-in library (built once per test binary) in `dir`.
pub fn nvml_standin(dir: &Path) -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    let built = LIB.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvml-standin/Cargo.toml");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvml-standin");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .status()
            .expect("running cargo build for the stand-in NVML");
        assert!(status.success(), "building the stand-in NVML failed");
        target.join("debug/libnvidia_ml_standin.so")
    });
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(built, &lib).unwrap();
    lib
}

/// A copy of the LIKWID stand-in library (built once per test binary) in `dir`, under
/// LIKWID's versioned file name.
pub fn likwid_standin(dir: &Path) -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    let built = LIB.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/likwid-standin/Cargo.toml");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("likwid-standin");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .status()
            .expect("running cargo build for the stand-in LIKWID");
        assert!(status.success(), "building the stand-in LIKWID failed");
        target.join("debug/liblikwid_standin.so")
    });
    let lib = dir.join("liblikwid.so.5.2");
    std::fs::copy(built, &lib).unwrap();
    lib
}

/// The `likwid` plugin's configuration: NHR@FAU's `fritz` section, measuring 200 ms, its
/// lock file in `dir`.
pub fn likwid_config(dir: &Path) -> Json {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ccmc-fau/fritz/collectors.json");
    let all: Json = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut config = all["likwid"].clone();
    config["duration"] = json!("200ms");
    config["lockfile_path"] = json!(dir.join("likwid.lock"));
    config["hostname"] = json!("node01");
    config
}
