//! The `ganglia` and `libganglia` sinks: every point as gmond's two XDR messages (metadata
//! and value, as libganglia's `Ganglia_metric_send` sends them), over UDP to the send
//! channels of a `gmond.conf`.
//!
//! cc-lib's `ganglia` runs the `gmetric` program per point and its `libganglia` calls
//! libganglia; both send these same messages, and the agent sends them itself. Their keys
//! are cc-lib's: `gmetric_config` (`ganglia`) or `gmond_config` (`libganglia`) names the
//! `gmond.conf` whose `udp_send_channel`s receive the messages (default
//! `/etc/ganglia/gmond.conf`, read when the sink starts); `add_ganglia_group`,
//! `add_type_to_name`, `add_units` (default: off for `ganglia`, on for `libganglia`) and
//! `cluster_name` as cc-lib has them. `gmetric_path`, `libganglia_path` and
//! `add_tags_as_desc` (which cc-lib reads but does not use) are accepted and have no
//! effect. `host` and `port`, the agent's own keys, send to one gmond without reading a
//! `gmond.conf`.

pub mod gmond_conf;
pub mod naming;
pub mod xdr;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ccfleet::lineproto::Decoder;
use serde::Deserialize;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::counters::SinkCounters;
use super::influxdb::Port;
use crate::sink::Batch;

/// The `gmond.conf` read when the configuration names none.
pub const DEFAULT_GMOND_CONFIG: &str = "/etc/ganglia/gmond.conf";

/// The keys of a `ganglia` sink (cc-lib's, and `host`/`port`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangliaConfig {
    /// cc-lib's path of `gmetric`: no effect (the agent sends the messages itself).
    #[serde(default)]
    pub gmetric_path: Option<String>,
    /// The `gmond.conf` naming the send channels.
    #[serde(default)]
    pub gmetric_config: Option<PathBuf>,
    /// Send the metric's group.
    #[serde(default)]
    pub add_ganglia_group: bool,
    /// Read by cc-lib but not used: no effect.
    #[serde(default)]
    pub add_tags_as_desc: bool,
    /// Sent as the metric's `CLUSTER`.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// Put the type and its id, or the device, into the name.
    #[serde(default)]
    pub add_type_to_name: bool,
    /// Send the metric's units.
    #[serde(default)]
    pub add_units: bool,
    /// Send to this host instead of the send channels of the `gmond.conf`.
    #[serde(default)]
    pub host: Option<String>,
    /// The port of `host` (default 8649).
    #[serde(default)]
    pub port: Option<Port>,
}

fn yes() -> bool {
    true
}

/// The keys of a `libganglia` sink (cc-lib's, and `host`/`port`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibgangliaConfig {
    /// cc-lib's path of libganglia: no effect (the agent sends the messages itself).
    #[serde(default)]
    pub libganglia_path: Option<String>,
    /// The `gmond.conf` naming the send channels.
    #[serde(default)]
    pub gmond_config: Option<PathBuf>,
    /// Send the metric's group.
    #[serde(default)]
    pub add_ganglia_group: bool,
    /// Put the type and its id, or the device, into the name.
    #[serde(default)]
    pub add_type_to_name: bool,
    /// Send the metric's units (default: on).
    #[serde(default = "yes")]
    pub add_units: bool,
    /// Sent as the metric's `CLUSTER`.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// Send to this host instead of the send channels of the `gmond.conf`.
    #[serde(default)]
    pub host: Option<String>,
    /// The port of `host` (default 8649).
    #[serde(default)]
    pub port: Option<Port>,
}

/// What both kinds do, from either's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The `gmond.conf` read for send channels (unless `host` is given).
    pub gmond_config: PathBuf,
    /// Send the group.
    pub group: bool,
    /// Type and id into the name.
    pub type_to_name: bool,
    /// Send units.
    pub units: bool,
    /// Sent as `CLUSTER`.
    pub cluster: Option<String>,
    /// The one receiver given by `host` and `port`.
    pub host: Option<(String, Option<Port>)>,
}

impl GangliaConfig {
    /// What the sink does.
    pub fn options(&self) -> Options {
        Options {
            gmond_config: self
                .gmetric_config
                .clone()
                .unwrap_or_else(|| DEFAULT_GMOND_CONFIG.into()),
            group: self.add_ganglia_group,
            type_to_name: self.add_type_to_name,
            units: self.add_units,
            cluster: self.cluster_name.clone().filter(|c| !c.is_empty()),
            host: self.host.clone().map(|h| (h, self.port.clone())),
        }
    }
}

impl LibgangliaConfig {
    /// What the sink does.
    pub fn options(&self) -> Options {
        Options {
            gmond_config: self
                .gmond_config
                .clone()
                .unwrap_or_else(|| DEFAULT_GMOND_CONFIG.into()),
            group: self.add_ganglia_group,
            type_to_name: self.add_type_to_name,
            units: self.add_units,
            cluster: self.cluster_name.clone().filter(|c| !c.is_empty()),
            host: self.host.clone().map(|h| (h, self.port.clone())),
        }
    }
}

impl Options {
    /// Checks for impossible values.
    pub fn validate(&self) -> Result<(), String> {
        match &self.host {
            Some((host, _)) if host.trim().is_empty() => Err("host is empty".to_owned()),
            Some((_, Some(port))) => port.number().map(|_| ()),
            None if self.gmond_config.as_os_str().is_empty() => {
                Err("the gmond configuration file name is empty".to_owned())
            }
            _ => Ok(()),
        }
    }

    /// The receivers: `host`, else the send channels of the `gmond.conf`.
    fn channels(&self) -> Result<Vec<gmond_conf::SendChannel>, String> {
        if let Some((host, port)) = &self.host {
            let port = port.as_ref().map(Port::number).transpose()?.unwrap_or(8649);
            return Ok(vec![gmond_conf::SendChannel {
                host: host.trim().to_owned(),
                port,
                multicast: false,
                ttl: 1,
            }]);
        }
        let text = std::fs::read_to_string(&self.gmond_config).map_err(|e| {
            format!(
                "cannot read the gmond configuration {}: {}",
                self.gmond_config.display(),
                e.kind()
            )
        })?;
        let channels = gmond_conf::send_channels(&text)
            .map_err(|e| format!("{}: {e}", self.gmond_config.display()))?;
        if channels.is_empty() {
            return Err(format!(
                "{} has no udp_send_channel",
                self.gmond_config.display()
            ));
        }
        Ok(channels)
    }
}

/// One send channel, opened.
struct Channel {
    socket: UdpSocket,
    to: SocketAddr,
}

/// Opens a socket for each send channel, resolving names now as libganglia does. Needs a
/// Tokio runtime.
fn open(name: &str, options: &Options) -> Result<Vec<Channel>, String> {
    use std::net::ToSocketAddrs as _;
    let mut out = Vec::new();
    for channel in options
        .channels()
        .map_err(|e| format!("sinks.{name}: {e}"))?
    {
        let host = channel.host.trim_start_matches('[').trim_end_matches(']');
        let to = (host, channel.port)
            .to_socket_addrs()
            .map_err(|e| format!("sinks.{name}: udp_send_channel {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("sinks.{name}: udp_send_channel {host} has no address"))?;
        let local = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
        let socket = std::net::UdpSocket::bind(local)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(UdpSocket::from_std)
            .map_err(|e| format!("sinks.{name}: cannot open a UDP socket: {e}"))?;
        if channel.multicast && to.is_ipv4() {
            socket
                .set_multicast_ttl_v4(channel.ttl)
                .map_err(|e| format!("sinks.{name}: multicast ttl: {e}"))?;
        }
        tracing::info!(sink = %name, to = %to, "metrics go to Ganglia");
        out.push(Channel { socket, to });
    }
    Ok(out)
}

/// Opens the send channels of `options` and starts sending what `rx` brings.
pub(crate) fn start(
    name: &str,
    options: Options,
    rx: mpsc::Receiver<Batch>,
    counters: Arc<SinkCounters>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let channels = open(name, &options)?;
    Ok(tokio::spawn(run(
        name.to_owned(),
        options,
        channels,
        rx,
        counters,
    )))
}

/// The machine's host name, as libganglia puts it into every message.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Sends each point that arrives, until the queue closes.
async fn run(
    name: String,
    options: Options,
    channels: Vec<Channel>,
    mut rx: mpsc::Receiver<Batch>,
    counters: Arc<SinkCounters>,
) {
    let host = host_name();
    let (mut meta, mut value) = (Vec::new(), Vec::new());
    while let Some(batch) = rx.recv().await {
        let (mut sent, mut skipped, mut failed) = (0, 0, 0);
        let mut why = None;
        for line in Decoder::new(&batch.lines) {
            let Some(d) = line
                .ok()
                .and_then(|line| naming::describe(&line, options.type_to_name))
            else {
                skipped += 1;
                continue;
            };
            // libganglia refuses a double quote (it would break gmond's XML).
            if [&d.name, &d.value, &d.units]
                .iter()
                .any(|s| s.contains('"'))
            {
                skipped += 1;
                continue;
            }
            let mut extra: Vec<(&str, &str)> = Vec::with_capacity(2);
            if let Some(cluster) = &options.cluster {
                extra.push(("CLUSTER", cluster));
            }
            if options.group && !d.group.is_empty() {
                extra.push(("GROUP", &d.group));
            }
            let metric = xdr::Metric {
                host: &host,
                name: &d.name,
                kind: d.kind,
                units: if options.units { &d.units } else { "" },
                slope: d.slope,
                tmax: d.tmax,
                dmax: 0,
                extra: &extra,
                value: &d.value,
            };
            xdr::metadata(&metric, &mut meta);
            xdr::value(&metric, &mut value);
            if meta.len() > xdr::MAX_MESSAGE_LEN || value.len() > xdr::MAX_MESSAGE_LEN {
                skipped += 1;
                continue;
            }
            let mut ok = true;
            for channel in &channels {
                for packet in [&meta, &value] {
                    if let Err(e) = channel.socket.send_to(packet, channel.to).await {
                        ok = false;
                        why = Some(format!("cannot send to {}: {e}", channel.to));
                    }
                }
            }
            if ok { sent += 1 } else { failed += 1 }
        }
        SinkCounters::add(&counters.sent, sent);
        SinkCounters::add(&counters.dropped_rejected, skipped);
        SinkCounters::add(&counters.dropped_failed, failed);
        match why {
            None => {
                SinkCounters::add(&counters.batches, 1);
                counters.delivered();
            }
            Some(why) => {
                SinkCounters::add(&counters.errors, 1);
                tracing::warn!(sink = %name, points = failed, "{why}; dropped");
                counters.failed(why);
            }
        }
    }
}
