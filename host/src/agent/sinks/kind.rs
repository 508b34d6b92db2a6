//! The kinds of sink, by the names configurations use.

/// A sink's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkType {
    /// Publish to NATS.
    Nats,
    /// Write to standard output.
    Stdout,
    /// POST to cc-metric-store's write API.
    Http,
    /// Write to InfluxDB's write API (v2 or v1), one request per batch.
    Influxdb,
    /// cc-lib's non-blocking InfluxDB sink: the same writer here (every sink is
    /// non-blocking in the agent), with cc-lib's `influxasync` keys.
    Influxasync,
    /// Serve the latest values for Prometheus to scrape.
    Prometheus,
    /// Send gmond's XDR packets over UDP (cc-lib ran `gmetric`).
    Ganglia,
    /// Send gmond's XDR packets over UDP (cc-lib called libganglia).
    Libganglia,
}

impl SinkType {
    /// Every kind, in the order messages list them.
    pub const ALL: [SinkType; 8] = [
        SinkType::Http,
        SinkType::Nats,
        SinkType::Stdout,
        SinkType::Influxdb,
        SinkType::Influxasync,
        SinkType::Prometheus,
        SinkType::Ganglia,
        SinkType::Libganglia,
    ];

    /// The name configurations use.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkType::Nats => "nats",
            SinkType::Stdout => "stdout",
            SinkType::Http => "http",
            SinkType::Influxdb => "influxdb",
            SinkType::Influxasync => "influxasync",
            SinkType::Prometheus => "prometheus",
            SinkType::Ganglia => "ganglia",
            SinkType::Libganglia => "libganglia",
        }
    }

    /// The kind a configuration names, if there is one.
    pub fn from_name(name: &str) -> Option<SinkType> {
        SinkType::ALL.into_iter().find(|k| k.as_str() == name)
    }
}
