//! Ganglia's `gmond` (Debian package ganglia-monitor) started by tests with its own
//! configuration: metrics received over UDP on a free loopback port, the cluster's state
//! read back as XML from its TCP port. It collects nothing itself (no collection groups).
#![allow(dead_code)]

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long gmond may take to start, and metrics to show, on a loaded machine.
const WAIT: Duration = Duration::from_secs(120);

/// A running gmond.
pub struct Gmond {
    /// The UDP port it receives metrics on.
    pub udp_port: u16,
    /// The TCP port it answers with XML on.
    pub tcp_port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

/// One `<METRIC>` of gmond's XML: its attributes and its extra data.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// The host it was reported for.
    pub host: String,
    /// `NAME`, `VAL`, `TYPE`, `UNITS`, `SLOPE`, `TMAX`, ... as written.
    pub attributes: Vec<(String, String)>,
    /// `EXTRA_ELEMENT`s: (`NAME`, `VAL`).
    pub extra: Vec<(String, String)>,
}

impl Metric {
    /// The attribute `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The extra element `key`.
    pub fn extra(&self, key: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A free loopback UDP port (bound and released).
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a loopback UDP port")
        .port()
}

/// The attributes of one tag's text (`NAME="x" VAL="y"`), with XML's entities decoded.
fn attributes(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim().rsplit(' ').next().unwrap_or_default();
        let after = &rest[eq + 2..];
        let end = after.find('"').expect("a closed attribute value");
        let value = after[..end]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&apos;", "'")
            .replace("&amp;", "&");
        out.push((key.to_owned(), value));
        rest = &after[end + 1..];
    }
    out
}

/// The metrics of gmond's XML.
pub fn parse(xml: &str) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::new();
    let mut host = String::new();
    for tag in xml.split('<').skip(1) {
        let body = tag.split('>').next().unwrap_or_default();
        if let Some(rest) = body.strip_prefix("HOST ") {
            host = attributes(rest)
                .into_iter()
                .find(|(k, _)| k == "NAME")
                .map(|(_, v)| v)
                .unwrap_or_default();
        } else if let Some(rest) = body.strip_prefix("METRIC ") {
            out.push(Metric {
                host: host.clone(),
                attributes: attributes(rest.trim_end_matches('/')),
                extra: Vec::new(),
            });
        } else if let Some(rest) = body.strip_prefix("EXTRA_ELEMENT ") {
            let a = attributes(rest.trim_end_matches('/'));
            let get = |k: &str| {
                a.iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            out.last_mut()
                .expect("extra data inside a metric")
                .extra
                .push((get("NAME"), get("VAL")));
        }
    }
    out
}

impl Gmond {
    /// Starts one in the foreground and waits until it answers on its TCP port.
    pub fn start() -> Gmond {
        let binary = super::receivers::binary("gmond", "ganglia-monitor");
        let dir = tempfile::tempdir().unwrap();
        let udp_port = free_udp_port();
        let tcp_port = super::receivers::free_port();
        let config = dir.path().join("gmond.conf");
        std::fs::write(
            &config,
            format!(
                "globals {{\n  daemonize = no\n  setuid = no\n  debug_level = 0\n  mute = yes\n  \
                 deaf = no\n  host_dmax = 0\n  cleanup_threshold = 300\n  send_metadata_interval = 0\n}}\n\
                 cluster {{ name = \"ccfleet-test\" }}\n\
                 udp_recv_channel {{ bind = 127.0.0.1 port = {udp_port} }}\n\
                 tcp_accept_channel {{ bind = 127.0.0.1 port = {tcp_port} }}\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(binary)
            .arg("-f")
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting gmond");
        let addr: SocketAddr = ([127, 0, 0, 1], tcp_port).into();
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("gmond exited before accepting connections: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "gmond did not start within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Gmond {
            udp_port,
            tcp_port,
            dir,
            child,
        }
    }

    /// A `gmond.conf` for senders, with one `udp_send_channel` to this gmond.
    pub fn client_config(&self) -> PathBuf {
        let path = self.dir.path().join("client.conf");
        std::fs::write(
            &path,
            format!(
                "# senders' configuration\nglobals {{ daemonize = yes }}\n\
                 udp_send_channel {{\n  host = \"127.0.0.1\"\n  port = {}\n  ttl = 1\n}}\n",
                self.udp_port
            ),
        )
        .unwrap();
        path
    }

    /// gmond's XML now.
    pub fn xml(&self) -> String {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.tcp_port)).expect("connecting to gmond");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let mut text = String::new();
        stream
            .read_to_string(&mut text)
            .expect("reading gmond's XML");
        text
    }

    /// Polls until every one of `names` is reported; returns the metrics then.
    pub fn wait_for(&self, names: &[&str]) -> Vec<Metric> {
        let deadline = Instant::now() + WAIT;
        loop {
            let metrics = parse(&self.xml());
            if names
                .iter()
                .all(|n| metrics.iter().any(|m| m.get("NAME") == Some(n)))
            {
                return metrics;
            }
            assert!(
                Instant::now() < deadline,
                "gmond did not report {names:?} within {WAIT:?}: {metrics:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Gmond {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
