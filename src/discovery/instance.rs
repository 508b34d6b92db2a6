//! The discovered instance and the names of the backends that produce it.

use serde::{Deserialize, Serialize};

/// Backend name of instances listed from Nomad.
pub const BACKEND_NOMAD: &str = "nomad";
/// Backend name of instances listed from Kubernetes pods.
pub const BACKEND_KUBERNETES: &str = "kubernetes";
/// Backend name of the single configured local instance.
pub const BACKEND_LOCAL: &str = "local";
/// Backend name of instances reported by another cluster's edge API.
pub const BACKEND_REMOTE: &str = "remote";
/// Backend name of instances resolved from DNS A records.
pub const BACKEND_DNS: &str = "dns";
/// Backend name of instances from a static list.
pub const BACKEND_STATIC: &str = "static";
/// Backend name of instances taken from the fleet's own rosters.
pub const BACKEND_FLEET: &str = "fleet";

/// The port an instance listens on when its source does not say (the `PORT` default).
pub const DEFAULT_PORT: u16 = 5008;

/// The process-wide environment variable (no prefix) holding the default port of the
/// [`Local`](super::Local) and [`NomadNodePool`](super::NomadNodePool) listers, as in the
/// deployments these listers come from; unset means [`DEFAULT_PORT`].
pub const ENV_ORCHESTRATOR_PORT: &str = "ORCHESTRATOR_PORT";

/// The default port of the local and node-pool listers: `ORCHESTRATOR_PORT` from the process
/// environment, else [`DEFAULT_PORT`]. A value that is not a port is an error naming the
/// variable, not a silent fallback.
pub fn orchestrator_port() -> Result<u16, super::DiscoveryError> {
    orchestrator_port_from(|name| std::env::var(name).ok())
}

/// [`orchestrator_port`] read through `lookup` instead of the process environment.
pub fn orchestrator_port_from(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<u16, super::DiscoveryError> {
    match lookup(ENV_ORCHESTRATOR_PORT).map(|v| v.trim().to_owned()) {
        None => Ok(DEFAULT_PORT),
        Some(v) if v.is_empty() => Ok(DEFAULT_PORT),
        Some(v) => v
            .parse()
            .map_err(|_| super::DiscoveryError::InvalidSetting {
                name: ENV_ORCHESTRATOR_PORT,
                reason: format!("{:?} is not a port number", crate::untrusted::Untrusted(&v)),
            }),
    }
}

/// One discovered instance.
///
/// It carries two identities because consumers need different ones. `workload_id` answers
/// "is this the same thing I saw last cycle": every backend picks the narrowest identity its
/// source exposes (an allocation, a pod), so a restart yields a new id and a consumer tracking
/// service instances notices it. `node_id` answers "which machine is it on" and survives that
/// restart, so a consumer tracking placement is not churned by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Instance {
    /// Unique within the instance's source, per run where the source allows. Backends that are
    /// unioned must agree on it for the same instance. Compare it as an opaque string.
    pub workload_id: String,
    /// The machine the instance runs on; empty where the source has no notion of one (DNS and
    /// static lists resolve addresses, not schedulers).
    pub node_id: String,
    /// The host the instance's server listens on (an IP address or a host name).
    pub ip_address: String,
    /// That server's port; 0 where the instance is never dialled directly (remote clusters).
    pub port: u16,
    /// The lister that produced this instance (`nomad`, `kubernetes`, `dns`, ...), so an
    /// operator can tell apart instances that two schedulers run side by side.
    pub backend: String,
}

impl Instance {
    /// `host:port`, with an IPv6 host in brackets.
    pub fn address(&self) -> String {
        join_host_port(&self.ip_address, self.port)
    }
}

/// Joins a host and a port the way Go's `net.JoinHostPort` does.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Why a `host[:port]` string could not be split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostPortError {
    /// No host before the port (`":5008"`, `""`).
    EmptyHost,
    /// The port is not a number in 0..=65535.
    InvalidPort(String),
    /// Brackets that do not enclose the whole host (`"[::1"`, `"[::1]x"`).
    Malformed,
    /// More than one colon outside brackets, and not an IPv6 address (`"a:b:c"`).
    TooManyColons,
}

impl std::fmt::Display for HostPortError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPortError::EmptyHost => f.write_str("empty host"),
            HostPortError::InvalidPort(p) => write!(f, "invalid port {p:?}"),
            HostPortError::Malformed => f.write_str("unbalanced brackets"),
            HostPortError::TooManyColons => f.write_str(
                "too many colons: write host:port, or an IPv6 address as [address]:port",
            ),
        }
    }
}

/// Splits `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address into the host and
/// the port, if one is given.
pub(crate) fn split_host_port(s: &str) -> Result<(&str, Option<u16>), HostPortError> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(HostPortError::Malformed)?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(after.strip_prefix(':').ok_or(HostPortError::Malformed)?),
            ),
        }
    } else {
        match s.matches(':').count() {
            0 => (s, None),
            1 => {
                let (h, p) = s.split_once(':').unwrap_or((s, ""));
                (h, Some(p))
            }
            // More than one colon without brackets can only be a bare IPv6 address; anything
            // else (`a:b:c`) is a typo that must not become a host name.
            _ if s.parse::<std::net::Ipv6Addr>().is_ok() => (s, None),
            _ => return Err(HostPortError::TooManyColons),
        }
    };
    if host.is_empty() {
        return Err(HostPortError::EmptyHost);
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| HostPortError::InvalidPort(p.to_owned()))?,
        ),
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_brackets_ipv6() {
        let mut i = Instance {
            workload_id: "a".into(),
            node_id: String::new(),
            ip_address: "10.0.0.1".into(),
            port: 5008,
            backend: BACKEND_STATIC.into(),
        };
        assert_eq!(i.address(), "10.0.0.1:5008");
        i.ip_address = "fd00::1".into();
        assert_eq!(i.address(), "[fd00::1]:5008");
    }

    #[test]
    fn splits_every_form() {
        assert_eq!(split_host_port("10.0.0.1"), Ok(("10.0.0.1", None)));
        assert_eq!(
            split_host_port("10.0.0.1:6123"),
            Ok(("10.0.0.1", Some(6123)))
        );
        assert_eq!(split_host_port("orch:6123"), Ok(("orch", Some(6123))));
        assert_eq!(split_host_port("fd00::1"), Ok(("fd00::1", None)));
        assert_eq!(split_host_port("[fd00::1]"), Ok(("fd00::1", None)));
        assert_eq!(
            split_host_port("[fd00::1]:5008"),
            Ok(("fd00::1", Some(5008)))
        );
        assert_eq!(split_host_port(""), Err(HostPortError::EmptyHost));
        assert_eq!(split_host_port(":6123"), Err(HostPortError::EmptyHost));
        assert_eq!(
            split_host_port("h:70000"),
            Err(HostPortError::InvalidPort("70000".into()))
        );
        assert_eq!(
            split_host_port("h:grpc"),
            Err(HostPortError::InvalidPort("grpc".into()))
        );
        assert_eq!(split_host_port("[::1"), Err(HostPortError::Malformed));
        assert_eq!(split_host_port("a:b:c"), Err(HostPortError::TooManyColons));
        assert_eq!(split_host_port("fd00::1:5008"), Ok(("fd00::1:5008", None)));
        assert_eq!(split_host_port("[::1]x"), Err(HostPortError::Malformed));
    }
}
