//! The fleet's wire definitions, shared by client and server (cc-lib's Go `fleet` package):
//! service types, registration bodies, roster entries, and the line-protocol encoding of
//! heartbeats and discovery rosters on NATS.
//!
//! Every encoder here writes the bytes the Go implementation writes, e.g.
//!
//! ```
//! let line = ccfleet::wire::encode_heartbeat(1_734_000_000_000_000_000, &["3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c"]).unwrap();
//! assert_eq!(
//!     line,
//!     b"fleet,function=heartbeat event=\"{\\\"instanceId\\\":\\\"3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c\\\"}\" 1734000000000000000\n"
//! );
//! ```

mod error;
pub mod gojson;
mod heartbeat;
mod instance_id;
mod lp;
mod report;
mod roster;
mod service_type;
mod types;

pub use error::WireError;
pub use heartbeat::{
    HEARTBEAT_MAX_LINE_LEN, HeartbeatLine, IgnoreReason, decode_heartbeats, encode_heartbeat,
    encode_heartbeat_into, parse_heartbeat, scan_heartbeats,
};
pub use instance_id::{format_instance_id, is_instance_id, parse_instance_id};
pub use report::{
    AgentReport, MAX_REASON_LEN, MAX_REPORT_LEN, MAX_REPORTED_PLUGINS, PluginHealth,
    REPORTED_HASH_LEN, ReportedPlugin, reported_hash, valid_reason,
};
pub use roster::{
    MAX_SUBJECT_TOKEN_LEN, ROSTER_SIGNATURE_HEADER, decode_roster, decode_roster_timed,
    encode_roster, encode_roster_line, roster_signing_input, subject_token_problem,
};
pub use service_type::{ProviderType, Scope, ServiceType};
pub use types::{Provider, RegisterRequest, RegisterResponse};

/// Measurement of heartbeat messages.
pub const HEARTBEAT_MEASUREMENT: &str = "fleet";
/// Value of the `function` tag of a heartbeat.
pub const HEARTBEAT_FUNCTION: &str = "heartbeat";
/// Measurement of discovery roster messages.
pub const DISCOVERY_MEASUREMENT: &str = "fleetdiscovery";
/// Subject prefix of discovery rosters when none is configured.
pub const DEFAULT_DISCOVERY_PREFIX: &str = "cc.fleet.discovery";
/// The roster bucket of infrastructure-scope services (those without a cluster).
pub const INFRA_BUCKET: &str = "infra";
/// Response header carrying the configuration revision.
pub const HEADER_CONFIG_REVISION: &str = "X-CC-Config-Revision";
/// The header an agent reports what it runs in, on each configuration poll (see
/// [`AgentReport`]).
pub const HEADER_AGENT_REPORT: &str = "X-CCFleet-Report";
/// The largest NATS message the decoders accept (the NATS server's own hard maximum).
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;

/// The roster bucket of a service: its cluster, or [`INFRA_BUCKET`] without one.
pub fn bucket(cluster: &str) -> &str {
    if cluster.is_empty() {
        INFRA_BUCKET
    } else {
        cluster
    }
}

/// The subject on which `consumer`s in `bucket` receive their roster:
/// `<prefix>.<bucket>.<consumer>`, with [`DEFAULT_DISCOVERY_PREFIX`] for an empty prefix.
pub fn discovery_subject(prefix: &str, bucket: &str, consumer: ServiceType) -> String {
    let prefix = if prefix.is_empty() {
        DEFAULT_DISCOVERY_PREFIX
    } else {
        prefix
    };
    format!("{prefix}.{bucket}.{}", consumer.code())
}

/// Whether `s` can name a directory of the configuration tree: non-empty, not `.`, without
/// `..`, `/` or `\` (FQDN hostnames such as `h1.example.org` pass).
pub fn safe_path_component(s: &str) -> bool {
    !s.is_empty() && s != "." && !s.contains("..") && !s.contains(['/', '\\'])
}

/// The wall clock as Unix nanoseconds (saturating outside the int64 range).
pub fn now_ns() -> i64 {
    let now = std::time::SystemTime::now();
    match now.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_go_vectors() {
        assert_eq!(
            discovery_subject("", bucket("fritz"), ServiceType::MetricCollector),
            "cc.fleet.discovery.fritz.ccmc"
        );
        assert_eq!(
            discovery_subject("", bucket(""), ServiceType::MetricStore),
            "cc.fleet.discovery.infra.ccms"
        );
        assert_eq!(
            discovery_subject("site.disc", "alex", ServiceType::SlurmAdapter),
            "site.disc.alex.ccsa"
        );
    }

    #[test]
    fn path_components() {
        for ok in ["fritz", "h1.example.org", "node-01"] {
            assert!(safe_path_component(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../etc", "a/b", "a\\b", "x..y"] {
            assert!(!safe_path_component(bad), "{bad}");
        }
    }
}
