//! The `prometheus` sink: the latest value of every metric, served for Prometheus to
//! scrape, as cc-lib's prometheusSink serves it.
//!
//! Each metric is a gauge named as the point's measurement (with `group_as_namespace`,
//! `<group>_<name>`, the group lower-cased, from a `group` tag). Its labels are cc-lib's:
//! a point tagged `type` and `type-id` gets the label named by its type holding the type
//! id (`socket="1"`), and a `device` tag becomes the label `device`; no other tag becomes
//! a label (Prometheus adds the scraped instance itself). The value is the numeric field
//! `value`; points without one are dropped and counted. A series keeps its latest value
//! for as long as the agent runs, as cc-lib keeps it. Names and label names are made
//! valid for Prometheus by writing `_` for any character it does not allow.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use ccfleet::lineproto::Decoder;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::counters::SinkCounters;
use super::influxdb::Port;
use crate::sink::Batch;

/// The keys of a `prometheus` sink: cc-lib's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    /// The address to listen on (empty: every interface).
    #[serde(default)]
    pub host: String,
    /// The port to listen on.
    pub port: Port,
    /// The path metrics are served at, without its leading `/` (empty: `/`).
    #[serde(default)]
    pub path: String,
    /// Prefix each name with its lower-cased `group` tag and `_`.
    #[serde(default)]
    pub group_as_namespace: bool,
}

impl PrometheusConfig {
    /// Checks for impossible values.
    pub fn validate(&self) -> Result<(), String> {
        self.port.number()?;
        if self.path.chars().any(|c| c.is_whitespace() || c == '?') {
            return Err(format!(
                "path {:?} is not a URL path",
                ccfleet::untrusted::Untrusted(&self.path).capped(64)
            ));
        }
        Ok(())
    }

    /// The address to listen on.
    pub fn listen_address(&self) -> Result<SocketAddr, String> {
        let port = self.port.number()?;
        let host = self.host.trim();
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("host {host:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("host {host:?} has no address"))
    }

    /// The path served.
    pub fn route(&self) -> String {
        format!("/{}", self.path.trim_start_matches('/'))
    }
}

/// A label set: (name, value) pairs in the order cc-lib gives them.
type Labels = Vec<(String, String)>;

/// The latest value of each series, by metric name.
#[derive(Debug, Default)]
pub struct Exposition {
    families: BTreeMap<String, BTreeMap<Labels, f64>>,
}

/// `name` with every character Prometheus does not allow in a metric or label name
/// replaced by `_` (and a leading digit prefixed with `_`).
fn valid_name(name: &str, colons: bool) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    for (i, c) in name.chars().enumerate() {
        let ok = c.is_ascii_alphabetic()
            || c == '_'
            || (colons && c == ':')
            || (i > 0 && c.is_ascii_digit());
        if i == 0 && c.is_ascii_digit() {
            out.push('_');
            out.push(c);
        } else {
            out.push(if ok { c } else { '_' });
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// A label value as the text format writes it.
fn escape_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A sample value as the text format writes it.
fn format_value(value: f64, out: &mut String) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{value}");
    }
}

impl Exposition {
    /// Takes the points of `lines`; returns how many were taken and how many had no numeric
    /// `value` (or could not be read).
    pub fn update(&mut self, lines: &[u8], group_as_namespace: bool) -> (usize, usize) {
        let (mut taken, mut skipped) = (0, 0);
        for line in Decoder::new(lines) {
            let Ok(line) = line else {
                skipped += 1;
                continue;
            };
            let Some(value) = line.field("value").and_then(|v| v.as_f64()) else {
                skipped += 1;
                continue;
            };
            let mut name = line.measurement().unescape().into_owned();
            if group_as_namespace && let Some(group) = line.tag("group") {
                let group = group.unescape().to_lowercase();
                if !group.is_empty() {
                    name = format!("{group}_{name}");
                }
            }
            let mut labels = Labels::new();
            if let (Some(kind), Some(id)) = (line.tag("type"), line.tag("type-id")) {
                labels.push((
                    valid_name(&kind.unescape(), false),
                    id.unescape().into_owned(),
                ));
            }
            if let Some(device) = line.tag("device") {
                labels.push(("device".to_owned(), device.unescape().into_owned()));
            }
            self.families
                .entry(valid_name(&name, true))
                .or_default()
                .insert(labels, value);
            taken += 1;
        }
        (taken, skipped)
    }

    /// The text exposition format (version 0.0.4) of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, series) in &self.families {
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (labels, value) in series {
                out.push_str(name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (label, value)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(label);
                        out.push_str("=\"");
                        escape_value(value, &mut out);
                        out.push('"');
                    }
                    out.push('}');
                }
                out.push(' ');
                format_value(*value, &mut out);
                out.push('\n');
            }
        }
        out
    }
}

type Shared = Arc<Mutex<Exposition>>;

async fn scrape(State(exposition): State<Shared>) -> impl IntoResponse {
    let text = exposition
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .render();
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
}

/// Binds the sink's listener now, so that an address in use fails the agent's start.
pub(crate) fn bind(
    name: &str,
    config: &PrometheusConfig,
) -> Result<tokio::net::TcpListener, String> {
    let address = config
        .listen_address()
        .map_err(|e| format!("sinks.{name}: {e}"))?;
    let listener = std::net::TcpListener::bind(address)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| format!("sinks.{name}: cannot listen on {address}: {e}"))?;
    let shown = listener.local_addr().unwrap_or(address);
    tracing::info!(sink = %name, address = %shown, path = %config.route(), "metrics served for Prometheus");
    Ok(listener)
}

/// Serves the latest values on `listener` and takes in what arrives until the queue closes.
pub(crate) async fn run(
    listener: tokio::net::TcpListener,
    config: PrometheusConfig,
    mut rx: mpsc::Receiver<Batch>,
    counters: Arc<SinkCounters>,
) {
    let exposition: Shared = Arc::default();
    let router = Router::new()
        .route(&config.route(), get(scrape))
        .with_state(exposition.clone());
    let server = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the prometheus sink's listener failed");
        }
    });
    while let Some(batch) = rx.recv().await {
        let (taken, skipped) = exposition
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .update(&batch.lines, config.group_as_namespace);
        SinkCounters::add(&counters.batches, 1);
        SinkCounters::add(&counters.sent, taken);
        SinkCounters::add(&counters.dropped_rejected, skipped);
        counters.delivered();
    }
    // Aborting only asks the task to stop; waiting for it drops the listener before the sink
    // counts as ended, so a sink started again at once (a reload) finds its port free.
    server.abort();
    let _ = server.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_cc_lib_and_names_are_made_valid() {
        let mut e = Exposition::default();
        let lines = b"cpu_load,hostname=n1,type=node value=1.5 1\n\
                      flops_any,hostname=n1,type=socket,type-id=1,group=FLOPS value=2i 1\n\
                      nv_util,type=accelerator,type-id=00000000:3B:00.0,device=\"x\" value=3 1\n\
                      mem.used,hostname=n1 value=4u 1\n\
                      text,hostname=n1 value=\"x\" 1\n";
        let (taken, skipped) = e.update(lines, true);
        assert_eq!((taken, skipped), (4, 1));
        assert_eq!(
            e.render(),
            "# TYPE cpu_load gauge\ncpu_load 1.5\n\
             # TYPE flops_flops_any gauge\nflops_flops_any{socket=\"1\"} 2\n\
             # TYPE mem_used gauge\nmem_used 4\n\
             # TYPE nv_util gauge\nnv_util{accelerator=\"00000000:3B:00.0\",device=\"\\\"x\\\"\"} 3\n"
        );
        assert_eq!(valid_name("9x-y", false), "_9x_y");
    }
}
