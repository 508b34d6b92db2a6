use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::WireError;

/// The kind of a ClusterCockpit service. The code is used as database value, configuration
/// tree directory and NATS subject token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceType {
    /// cc-metric-store (`ccms`).
    MetricStore,
    /// cc-metric-collector (`ccmc`).
    MetricCollector,
    /// cc-backend (`ccb`).
    Backend,
    /// cc-event-store (`cces`).
    EventStore,
    /// cc-slurm-adapter (`ccsa`).
    SlurmAdapter,
    /// cc-node-controller (`ccnc`).
    NodeController,
    /// cc-energy-manager (`ccem`).
    EnergyManager,
}

impl ServiceType {
    /// Every service type, in the order the fleet publishes rosters.
    pub const ALL: [ServiceType; 7] = [
        ServiceType::MetricStore,
        ServiceType::MetricCollector,
        ServiceType::Backend,
        ServiceType::EventStore,
        ServiceType::SlurmAdapter,
        ServiceType::NodeController,
        ServiceType::EnergyManager,
    ];

    /// The short code (`ccms`, `ccmc`, ...).
    pub const fn code(self) -> &'static str {
        match self {
            ServiceType::MetricStore => "ccms",
            ServiceType::MetricCollector => "ccmc",
            ServiceType::Backend => "ccb",
            ServiceType::EventStore => "cces",
            ServiceType::SlurmAdapter => "ccsa",
            ServiceType::NodeController => "ccnc",
            ServiceType::EnergyManager => "ccem",
        }
    }

    /// The service's name (`cc-metric-store`, ...), for messages to people.
    pub const fn name(self) -> &'static str {
        match self {
            ServiceType::MetricStore => "cc-metric-store",
            ServiceType::MetricCollector => "cc-metric-collector",
            ServiceType::Backend => "cc-backend",
            ServiceType::EventStore => "cc-event-store",
            ServiceType::SlurmAdapter => "cc-slurm-adapter",
            ServiceType::NodeController => "cc-node-controller",
            ServiceType::EnergyManager => "cc-energy-manager",
        }
    }
}

impl FromStr for ServiceType {
    type Err = WireError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ServiceType::ALL
            .into_iter()
            .find(|t| t.code() == s)
            .ok_or_else(|| WireError::UnknownServiceType(s.to_owned()))
    }
}

impl fmt::Display for ServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for ServiceType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

impl<'de> Deserialize<'de> for ServiceType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        code.parse().map_err(serde::de::Error::custom)
    }
}

/// The type of a provider in a discovery roster: one of the known [`ServiceType`]s, or a type
/// this version does not know yet, kept as its string.
///
/// Registration stays strict (a [`ServiceType`]), but a roster from a newer cc-backend may
/// list provider types an older agent has never heard of. Go's client keeps such entries, and
/// so does this one: rejecting the whole roster would blind the agent to every provider it
/// does know. Unknown types compare unequal to every [`ServiceType`] and round-trip
/// byte for byte.
///
/// ```
/// use ccfleet::wire::{ProviderType, ServiceType};
///
/// let known = ProviderType::from("ccb");
/// assert_eq!(known, ServiceType::Backend);
/// assert_eq!(known.known(), Some(ServiceType::Backend));
/// let newer = ProviderType::from("ccxy");
/// assert_eq!(newer.known(), None);
/// assert_eq!(newer.code(), "ccxy");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ProviderType(ProviderRepr);

// Private so that `Other` never holds the code of a known type: equality and hashing rely on
// every code having exactly one representation.
#[derive(Clone, PartialEq, Eq, Hash)]
enum ProviderRepr {
    Known(ServiceType),
    Other(Box<str>),
}

impl ProviderType {
    /// The known service type, or `None` for a type this version does not know.
    pub fn known(&self) -> Option<ServiceType> {
        match &self.0 {
            ProviderRepr::Known(t) => Some(*t),
            ProviderRepr::Other(_) => None,
        }
    }

    /// The type's code as it appears on the wire (`ccb`, or whatever a newer server sent).
    pub fn code(&self) -> &str {
        match &self.0 {
            ProviderRepr::Known(t) => t.code(),
            ProviderRepr::Other(s) => s,
        }
    }
}

impl From<ServiceType> for ProviderType {
    fn from(t: ServiceType) -> Self {
        ProviderType(ProviderRepr::Known(t))
    }
}

impl From<&str> for ProviderType {
    fn from(s: &str) -> Self {
        match s.parse::<ServiceType>() {
            Ok(t) => t.into(),
            Err(_) => ProviderType(ProviderRepr::Other(s.into())),
        }
    }
}

impl PartialEq<ServiceType> for ProviderType {
    fn eq(&self, other: &ServiceType) -> bool {
        self.known() == Some(*other)
    }
}

impl PartialEq<ProviderType> for ServiceType {
    fn eq(&self, other: &ProviderType) -> bool {
        other == self
    }
}

impl PartialOrd for ProviderType {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ProviderType {
    /// By code, which is unique per type.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.code().cmp(other.code())
    }
}

impl fmt::Debug for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ProviderRepr::Known(t) => fmt::Debug::fmt(t, f),
            ProviderRepr::Other(s) => f.debug_tuple("Other").field(s).finish(),
        }
    }
}

impl fmt::Display for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for ProviderType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

impl<'de> Deserialize<'de> for ProviderType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(ProviderType::from(code.as_ref()))
    }
}

/// Whether a service belongs to a cluster or to the site's infrastructure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// A cluster member (has a cluster name).
    Cluster,
    /// Site infrastructure (no cluster).
    Infra,
}

impl Scope {
    /// The scope of a service with this cluster name (empty means infrastructure).
    pub fn of_cluster(cluster: &str) -> Scope {
        if cluster.is_empty() {
            Scope::Infra
        } else {
            Scope::Cluster
        }
    }

    /// `cluster` or `infra`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Infra => "infra",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cluster" => Ok(Scope::Cluster),
            "infra" => Ok(Scope::Infra),
            other => Err(format!("unknown scope {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_in_order_and_validation() {
        let codes: Vec<_> = ServiceType::ALL.iter().map(|t| t.code()).collect();
        assert_eq!(
            codes,
            ["ccms", "ccmc", "ccb", "cces", "ccsa", "ccnc", "ccem"]
        );
        for t in ServiceType::ALL {
            assert_eq!(t.code().parse::<ServiceType>(), Ok(t));
        }
        // The message lists every valid code, so a typo shows its fix.
        let message = "zzz".parse::<ServiceType>().unwrap_err().to_string();
        assert!(
            message.starts_with("unknown serviceType \"zzz\" (valid: "),
            "{message}"
        );
        for t in ServiceType::ALL {
            assert!(message.contains(t.code()), "{message}");
        }
        assert!("CCMS".parse::<ServiceType>().is_err());
        assert_eq!(
            serde_json::to_string(&ServiceType::Backend).unwrap(),
            "\"ccb\""
        );
        assert!(serde_json::from_str::<ServiceType>("\"zzz\"").is_err());
    }

    #[test]
    fn a_provider_type_keeps_unknown_codes_and_normalizes_known_ones() {
        for t in ServiceType::ALL {
            let p = ProviderType::from(t.code());
            assert_eq!(p, ProviderType::from(t));
            assert_eq!(p, t);
            assert_eq!(t, p);
        }
        let newer: ProviderType = serde_json::from_str("\"cc-quantum\"").unwrap();
        assert_eq!(newer.known(), None);
        assert_eq!(newer.code(), "cc-quantum");
        assert_eq!(serde_json::to_string(&newer).unwrap(), "\"cc-quantum\"");
        assert!(ServiceType::ALL.iter().all(|t| newer != *t));
        assert_ne!(newer, ProviderType::from("cc-other"));
        // Go accepts any string, the empty one included.
        let empty: ProviderType = serde_json::from_str("\"\"").unwrap();
        assert_eq!(empty.code(), "");
        assert!(ProviderType::from("ccb") < ProviderType::from("ccmc"));
    }
}
