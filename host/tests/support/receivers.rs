//! Metric receivers from Debian packages, started by tests on free loopback ports:
//! VictoriaMetrics (`victoria-metrics`, InfluxDB line protocol on `/write` and
//! `/api/v2/write`, read back through `/api/v1/export`) and InfluxDB 1.x (`influxd`, read
//! back through `/query`). A missing binary fails the test naming the package.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a receiver may take to start on a loaded machine.
const START: Duration = Duration::from_secs(120);

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// Finds `name` on `PATH` (and in the sbin directories) or panics naming the package.
pub fn binary(name: &str, package: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found: install the Debian package {package} (scripts/test.sh installs it)"
            )
        })
}

fn wait_accepting(port: u16, what: &str, child: &mut Child) {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + START;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before accepting connections: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not start within {START:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the receiver with SIGTERM, so that it writes what it acknowledged to disk (a
/// receiver killed outright may lose points it answered 204 for, which is not a sink's
/// loss), and waits until it exited and its port is closed.
fn stop(child: &mut Option<Child>, port: u16) {
    if let Some(mut c) = child.take() {
        let pid = libc::pid_t::try_from(c.id()).expect("a pid");
        // SAFETY: signalling a child of this process that has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the receiver still accepts after kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP client for the read-back queries.
fn http() -> reqwest::Client {
    // ccfleet's builder: it installs the TLS crypto provider reqwest needs.
    ccfleet::tls::http_client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// `url` with the query `pairs`.
fn with_query(url: &str, pairs: &[(&str, &str)]) -> reqwest::Url {
    let mut url = reqwest::Url::parse(url).unwrap();
    url.query_pairs_mut().extend_pairs(pairs);
    url
}

/// Polls `url` until it answers 2xx.
async fn wait_healthy(url: &str, what: &str) {
    let deadline = Instant::now() + START;
    loop {
        let ok = http()
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "{what} is not healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A VictoriaMetrics single-node server with its own storage directory, kept across
/// restarts on the same port.
pub struct VictoriaMetrics {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl VictoriaMetrics {
    /// Starts one and waits until it answers `/health`.
    pub async fn start() -> VictoriaMetrics {
        let mut vm = VictoriaMetrics {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        vm.restart().await;
        vm
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id (benchmarks read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops it (SIGTERM) and waits until the port is closed.
    pub fn kill(&mut self) {
        stop(&mut self.child, self.port);
    }

    /// Starts it again on the same port and storage.
    pub async fn restart(&mut self) {
        self.kill();
        let mut child = Command::new(binary("victoria-metrics", "victoria-metrics"))
            .arg(format!("-storageDataPath={}", self.dir.path().display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{}", self.port))
            .arg("-loggerLevel=ERROR")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start victoria-metrics");
        wait_accepting(self.port, "victoria-metrics", &mut child);
        self.child = Some(child);
        wait_healthy(&format!("{}/health", self.url()), "victoria-metrics").await;
    }

    /// Makes what it received searchable.
    pub async fn flush(&self) {
        let status = http()
            .get(format!("{}/internal/force_flush", self.url()))
            .send()
            .await
            .expect("force_flush")
            .status();
        assert!(status.is_success(), "force_flush: {status}");
    }

    /// Every sample it holds: (metric name with labels sorted, timestamp in ms, value).
    pub async fn export(&self) -> Vec<(String, i64, f64)> {
        self.flush().await;
        let text = http()
            .get(with_query(
                &format!("{}/api/v1/export", self.url()),
                &[("match[]", "{__name__=~\".+\"}")],
            ))
            .send()
            .await
            .expect("export")
            .text()
            .await
            .unwrap();
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let row: Value = serde_json::from_str(line).expect("export line is JSON");
            let mut labels: Vec<String> = row["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                .collect();
            labels.sort();
            let series = labels.join(",");
            let values = row["values"].as_array().unwrap();
            let stamps = row["timestamps"].as_array().unwrap();
            for (v, t) in values.iter().zip(stamps) {
                out.push((series.clone(), t.as_i64().unwrap(), v.as_f64().unwrap()));
            }
        }
        out.sort_by(|a, b| a.partial_cmp(b).unwrap());
        out
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An InfluxDB 1.x server (`influxd`) with its own directories, kept across restarts.
pub struct InfluxDb {
    port: u16,
    dir: tempfile::TempDir,
    config: PathBuf,
    child: Option<Child>,
}

fn influx_config(dir: &Path, http_port: u16, rpc_port: u16) -> String {
    let d = dir.display();
    format!(
        "reporting-disabled = true\n\
         bind-address = \"127.0.0.1:{rpc_port}\"\n\
         [meta]\n  dir = \"{d}/meta\"\n\
         [data]\n  dir = \"{d}/data\"\n  wal-dir = \"{d}/wal\"\n  query-log-enabled = false\n\
         [http]\n  enabled = true\n  bind-address = \"127.0.0.1:{http_port}\"\n  auth-enabled = false\n  log-enabled = false\n\
         [monitor]\n  store-enabled = false\n\
         [continuous_queries]\n  enabled = false\n\
         [subscriber]\n  enabled = false\n"
    )
}

impl InfluxDb {
    /// Starts one and waits until it answers `/ping`.
    pub async fn start() -> InfluxDb {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("influxdb.conf");
        std::fs::write(&config, influx_config(dir.path(), port, free_port())).unwrap();
        let mut db = InfluxDb {
            port,
            dir,
            config,
            child: None,
        };
        db.restart().await;
        db
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops it (SIGTERM) and waits until the port is closed.
    pub fn kill(&mut self) {
        stop(&mut self.child, self.port);
    }

    /// Starts it again on the same port and directories.
    pub async fn restart(&mut self) {
        self.kill();
        let mut child = Command::new(binary("influxd", "influxdb"))
            .arg("-config")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start influxd");
        wait_accepting(self.port, "influxd", &mut child);
        self.child = Some(child);
        wait_healthy(&format!("{}/ping", self.url()), "influxd").await;
    }

    /// Runs an InfluxQL statement and returns the JSON answer.
    pub async fn query(&self, db: &str, q: &str) -> Value {
        let response = http()
            .post(with_query(
                &format!("{}/query", self.url()),
                &[("db", db), ("q", q), ("epoch", "ns")],
            ))
            .send()
            .await
            .expect("query");
        assert!(
            response.status().is_success(),
            "query {q}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }

    /// Every row of `measurement` in `db`: (tags and fields as `key=value` sorted, time in ns).
    pub async fn rows(&self, db: &str, measurement: &str) -> Vec<(String, i64)> {
        let answer = self
            .query(db, &format!("SELECT * FROM \"{measurement}\""))
            .await;
        let mut out = Vec::new();
        for series in answer["results"][0]["series"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let columns: Vec<&str> = series["columns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            for row in series["values"].as_array().unwrap() {
                let row = row.as_array().unwrap();
                let mut cells: Vec<String> = columns
                    .iter()
                    .zip(row)
                    .filter(|(c, v)| **c != "time" && !v.is_null())
                    .map(|(c, v)| match v {
                        Value::String(s) => format!("{c}={s}"),
                        v => format!("{c}={v}"),
                    })
                    .collect();
                cells.sort();
                let time = row[0].as_i64().unwrap();
                out.push((cells.join(","), time));
            }
        }
        out.sort();
        out
    }
}

impl Drop for InfluxDb {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
