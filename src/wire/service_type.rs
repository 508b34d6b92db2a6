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
        assert_eq!(
            "zzz".parse::<ServiceType>().unwrap_err().to_string(),
            "unknown serviceType \"zzz\""
        );
        assert!("CCMS".parse::<ServiceType>().is_err());
        assert_eq!(
            serde_json::to_string(&ServiceType::Backend).unwrap(),
            "\"ccb\""
        );
        assert!(serde_json::from_str::<ServiceType>("\"zzz\"").is_err());
    }
}
