//! The service record as the bucket stores it (JSON under a key derived from the
//! identity), and the writes that change one.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::super::{
    RegistryError, RegistryErrorKind, Service, State, StoredService, format_instance_id,
    parse_instance_id,
};
use super::SERVICE_PREFIX;
use crate::wire::{Scope, ServiceType};

/// The store key of an identity: the first 63 bits of SHA-256 over its length-prefixed
/// parts, the same on every server.
pub fn service_key(scope: Scope, cluster: &str, hostname: &str, service_type: ServiceType) -> i64 {
    let mut hasher = sha2::Sha256::new();
    for part in [scope.as_str(), cluster, hostname, service_type.code()] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 1) as i64
}

pub(super) fn kv_key(key: i64) -> String {
    format!("{SERVICE_PREFIX}{key:016x}")
}

pub(super) fn parse_kv_key(key: &str) -> Option<i64> {
    let hex = key.strip_prefix(SERVICE_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    i64::from_str_radix(hex, 16).ok().filter(|k| *k >= 0)
}

/// One service as the bucket stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct Record {
    pub(super) scope: String,
    pub(super) cluster: String,
    pub(super) hostname: String,
    #[serde(rename = "type")]
    pub(super) service_type: String,
    pub(super) instance: String,
    pub(super) state: String,
    pub(super) registered_at: i64,
    pub(super) last_heartbeat: Option<i64>,
    pub(super) config_revision: i64,
    #[serde(default)]
    pub(super) meta: BTreeMap<String, String>,
}

impl Record {
    pub(super) fn decode(bytes: &[u8]) -> Result<Record, RegistryError> {
        serde_json::from_slice(bytes).map_err(|e| {
            RegistryError::with_source(
                RegistryErrorKind::Corrupt,
                "a service record in the bucket is not valid JSON",
                e,
            )
        })
    }

    pub(super) fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("records serialize"))
    }

    pub(super) fn state(&self) -> Option<State> {
        State::parse(&self.state)
    }

    pub(super) fn same_identity(&self, other: &Record) -> bool {
        (
            &self.scope,
            &self.cluster,
            &self.hostname,
            &self.service_type,
        ) == (
            &other.scope,
            &other.cluster,
            &other.hostname,
            &other.service_type,
        )
    }

    pub(super) fn to_stored(&self, key: i64) -> Result<StoredService, RegistryError> {
        let corrupt = |what: &str| {
            RegistryError::new(
                RegistryErrorKind::Corrupt,
                format!("a service record in the bucket has an invalid {what}"),
            )
        };
        Ok(StoredService {
            key,
            instance: parse_instance_id(&self.instance).ok_or_else(|| corrupt("instance id"))?,
            service: Service {
                scope: self.scope.parse().map_err(|_| corrupt("scope"))?,
                cluster: self.cluster.clone(),
                hostname: self.hostname.clone(),
                service_type: self.service_type.parse().map_err(|_| corrupt("type"))?,
                state: self.state().ok_or_else(|| corrupt("state"))?,
                registered_at: self.registered_at,
                last_heartbeat: self.last_heartbeat,
                config_revision: self.config_revision,
                meta: Arc::new(self.meta.clone()),
            },
        })
    }

    pub(super) fn from_stored(stored: &StoredService) -> Record {
        let s = &stored.service;
        Record {
            scope: s.scope.as_str().to_owned(),
            cluster: s.cluster.clone(),
            hostname: s.hostname.clone(),
            service_type: s.service_type.code().to_owned(),
            instance: format_instance_id(stored.instance),
            state: s.state.as_str().to_owned(),
            registered_at: s.registered_at,
            last_heartbeat: s.last_heartbeat,
            config_revision: s.config_revision,
            meta: (*s.meta).clone(),
        }
    }
}

/// What a write does to a record; re-decided on the newest record after a lost race.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Register(Box<Record>),
    Revive { instance: String, at: i64 },
    Stale { instance: String, last: Option<i64> },
    Deregister { instance: String },
    Acknowledge { revision: i64 },
}

impl Op {
    /// The record to write, `Ok(None)` when the change no longer applies.
    pub(super) fn apply(&self, current: Option<&Record>) -> Result<Option<Record>, RegistryError> {
        match (self, current) {
            (Op::Register(new), None) => Ok(Some((**new).clone())),
            (Op::Register(new), Some(old)) => {
                if !old.same_identity(new) {
                    return Err(RegistryError::new(
                        RegistryErrorKind::Conflict,
                        "two services share one bucket key (hash collision); registration refused",
                    ));
                }
                let mut record = (**new).clone();
                record.last_heartbeat = old.last_heartbeat;
                record.config_revision = old.config_revision;
                Ok(Some(record))
            }
            (_, None) => Ok(None),
            (Op::Revive { instance, at }, Some(old)) => {
                // Already active (another server revived it): the time is soft state.
                if old.instance != *instance
                    || matches!(old.state(), Some(State::Deregistered | State::Active))
                {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Active.as_str().to_owned();
                record.last_heartbeat = record.last_heartbeat.max(Some(*at));
                Ok(Some(record))
            }
            (Op::Stale { instance, last }, Some(old)) => {
                if old.instance != *instance
                    || old.state() != Some(State::Active)
                    || old.last_heartbeat > *last
                {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Stale.as_str().to_owned();
                Ok(Some(record))
            }
            (Op::Deregister { instance }, Some(old)) => {
                if old.instance != *instance || old.state() == Some(State::Deregistered) {
                    return Ok(None);
                }
                let mut record = old.clone();
                record.state = State::Deregistered.as_str().to_owned();
                Ok(Some(record))
            }
            (Op::Acknowledge { revision }, Some(old)) => {
                let mut record = old.clone();
                record.config_revision = *revision;
                Ok(Some(record))
            }
        }
    }
}
