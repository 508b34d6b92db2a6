//! The JSON Schema of a sink entry (`sinks.<name>`), for the book's configuration
//! reference. An entry is read by hand in [`super::SinkConfig::from_map`] (the common keys,
//! then the keys of its `type`); the types here describe that shape, and a test holds them
//! to every kind the agent knows.

use super::ganglia::{GangliaConfig, LibgangliaConfig};
use super::http::HttpConfig;
use super::influxdb::InfluxConfig;
use super::nats::NatsConfig;
use super::prometheus::PrometheusConfig;
use super::stdout::StdoutConfig;

/// The keys every sink has, and those of its type.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
pub struct WithCommon<T> {
    /// Batches queued for this sink; when full, new batches are dropped for this sink and
    /// counted (`reason="queue_full"`). Default 1024.
    #[serde(rename = "queue-size")]
    queue_size: Option<usize>,
    /// cc-lib's per-sink list: of the meta keys the plugins write as tags (the union of
    /// their `meta_as_tags`, default `["unit"]`), this sink keeps only those named; `[]`
    /// sends no `unit` tag to this sink while another sink keeps it. Default: every tag the
    /// plugins write.
    meta_as_tags: Option<Vec<String>>,
    #[serde(flatten)]
    settings: T,
}

/// A metric sink, `sinks.<name>` of the agent's configuration, as cc-metric-collector names
/// its outputs. Each point goes to every sink, and each sink has its own bounded queue, so a
/// slow or stalled sink drops (and counts) its own points and never delays a plugin or
/// another sink. The `type` key chooses the kind; each kind refuses keys it does not know.
#[derive(schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(dead_code)]
pub enum SinkSchema {
    /// POST to cc-metric-store's write API (`POST /api/write?cluster=...`), in batches,
    /// with a JWT, a bounded retry buffer and optional gzip.
    Http(WithCommon<HttpConfig>),
    /// Publish each batch on a NATS subject (needs the agent's `nats` section).
    Nats(WithCommon<NatsConfig>),
    /// Print line protocol on standard output.
    Stdout(WithCommon<StdoutConfig>),
    /// Write to InfluxDB: `api` `v2` posts to `/api/v2/write?org=&bucket=` with
    /// `Authorization: Token [user:]password` as cc-lib does, `v1` to `/write?db=` with basic
    /// authentication, for InfluxDB before 1.8.
    Influxdb(WithCommon<InfluxConfig>),
    /// cc-lib's non-blocking InfluxDB sink: the same writer (every sink is non-blocking in
    /// the agent), with cc-lib's `influxasync` keys.
    Influxasync(WithCommon<InfluxConfig>),
    /// Serve the latest value of each series at `http://host:port/path` for Prometheus to
    /// scrape, in its text exposition format, as cc-lib's sink does.
    Prometheus(WithCommon<PrometheusConfig>),
    /// Send gmond's XDR packets over UDP to the send channels of a `gmond.conf` (or to
    /// `host`/`port`), with cc-lib's `ganglia` keys (cc-lib ran `gmetric` per point).
    Ganglia(WithCommon<GangliaConfig>),
    /// The same packets with cc-lib's `libganglia` keys (cc-lib called libganglia).
    Libganglia(WithCommon<LibgangliaConfig>),
}

impl super::SinkConfig {
    /// The JSON Schema of a sink entry, its keys described by their documentation (the
    /// book's configuration reference is generated from it).
    pub fn json_schema() -> schemars::Schema {
        schemars::schema_for!(SinkSchema)
    }
}

#[cfg(test)]
mod tests {
    use super::super::SinkConfig;
    use super::super::kind::SinkType;

    #[test]
    fn every_kind_of_sink_is_described() {
        let schema = serde_json::to_value(SinkConfig::json_schema()).unwrap();
        let described: Vec<String> = schema["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|variant| {
                variant["properties"]["type"]["const"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        let known: Vec<String> = SinkType::ALL
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect();
        let mut described_sorted = described.clone();
        described_sorted.sort();
        let mut known_sorted = known;
        known_sorted.sort();
        assert_eq!(
            described_sorted, known_sorted,
            "document every sink type in SinkSchema"
        );
    }
}
