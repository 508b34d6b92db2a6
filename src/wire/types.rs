//! The JSON bodies of the fleet REST API (registration request and answer) and the
//! providers a roster lists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ProviderType, ServiceType};

/// The body of `POST /api/fleet/register/{cluster|infra}/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The cluster; empty (and omitted) for infrastructure services.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The host the service runs on.
    #[serde(default)]
    pub hostname: String,
    /// What kind of service registers.
    #[serde(rename = "serviceType")]
    pub service_type: ServiceType,
    /// Free-form metadata, broadcast unauthenticated in rosters: never secrets.
    #[serde(
        rename = "metaData",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub meta_data: BTreeMap<String, String>,
}

/// The body of a successful (201) registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The instance id: a bearer credential for this registration (never log it).
    #[serde(rename = "instanceId")]
    pub instance_id: String,
    /// The last configuration revision the service acknowledged; 0 when it never pulled.
    #[serde(rename = "configRevision")]
    pub config_revision: i64,
}

/// One entry of a discovery roster: a service another service depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provider {
    /// The provider's service type; a type unknown to this version is kept as its string,
    /// so a newer cc-backend's rosters still reach older agents whole.
    #[serde(rename = "type")]
    pub service_type: ProviderType,
    /// Where it runs.
    pub hostname: String,
    /// Its registry state (`active` in practice).
    pub state: String,
    /// Its registration metadata (a port, a version, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
}
