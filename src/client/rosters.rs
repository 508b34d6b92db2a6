//! Admission of discovery rosters: size and provider caps, and signatures.
//!
//! Anyone who may publish on a discovery subject can send a roster, and a roster replaces
//! the whole provider list. So before a roster reaches the application it must be at most
//! `roster-max-bytes` long and list at most `roster-max-providers` providers; with
//! `roster-public-key` configured it must also carry a valid Ed25519 signature of the fleet
//! server (header [`ROSTER_SIGNATURE_HEADER`] over [`roster_signing_input`], which binds the
//! subject), and its timestamp must lie within `roster-max-age` of the local clock and not
//! before the last accepted roster's (so an old roster cannot be replayed). Every rejection
//! is counted ([`RosterStats`]) and logged: the first of each kind as a warning, repeats at
//! debug level.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, VerifyingKey};

use super::config::{Config, ConfigError};
use crate::untrusted::Untrusted;
use crate::wire::{self, Provider, ROSTER_SIGNATURE_HEADER, roster_signing_input};

/// Counts of received rosters by outcome, since the client was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RosterStats {
    /// Rosters handed to the application.
    pub accepted: u64,
    /// Rejected: larger than `roster-max-bytes`.
    pub too_large: u64,
    /// Rejected: more providers than `roster-max-providers`.
    pub too_many_providers: u64,
    /// Rejected: no, a malformed or a wrong signature while a roster key is configured.
    pub bad_signature: u64,
    /// Rejected: a signed roster too far from the local clock, or older than the last
    /// accepted one (a replay).
    pub stale: u64,
    /// Rejected: not a roster message.
    pub malformed: u64,
}

/// Why a roster was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Rejection {
    #[error("roster of {size} bytes exceeds roster-max-bytes ({limit})")]
    TooLarge { size: usize, limit: usize },
    #[error("roster lists {count} providers, more than roster-max-providers ({limit})")]
    TooManyProviders { count: usize, limit: usize },
    #[error("unsigned roster rejected: roster-public-key is configured")]
    Unsigned,
    #[error("roster signature header is not base64 of 64 bytes")]
    MalformedSignature,
    #[error("roster signature does not verify against roster-public-key (forged or altered)")]
    BadSignature,
    #[error(
        "signed roster is {offset_secs}s away from the local clock, more than roster-max-age ({max_age}); check the clocks"
    )]
    OutOfWindow { offset_secs: i64, max_age: String },
    #[error("signed roster is older than the last accepted one (a replay)")]
    Replayed,
    #[error("malformed roster: {0}")]
    Malformed(String),
}

impl Rejection {
    fn index(&self) -> usize {
        match self {
            Rejection::TooLarge { .. } => 0,
            Rejection::TooManyProviders { .. } => 1,
            Rejection::Unsigned | Rejection::MalformedSignature | Rejection::BadSignature => 2,
            Rejection::OutOfWindow { .. } | Rejection::Replayed => 3,
            Rejection::Malformed(_) => 4,
        }
    }
}

/// The admission policy of one client and its counters.
pub(crate) struct RosterGate {
    max_bytes: usize,
    max_providers: usize,
    key: Option<VerifyingKey>,
    max_age: Duration,
    /// Timestamp of the last accepted signed roster.
    last_signed: Mutex<Option<i64>>,
    counts: [AtomicU64; 6],
    /// Which rejection kinds were already logged as a warning.
    warned: [std::sync::atomic::AtomicBool; 5],
}

const ACCEPTED: usize = 5;

impl RosterGate {
    pub(crate) fn new(config: &Config) -> Result<RosterGate, ConfigError> {
        Ok(RosterGate {
            max_bytes: config.roster_max_bytes,
            max_providers: config.roster_max_providers,
            key: config.roster_key()?,
            max_age: config.roster_max_age,
            last_signed: Mutex::new(None),
            counts: Default::default(),
            warned: Default::default(),
        })
    }

    /// Whether rosters must be signed.
    pub(crate) fn requires_signature(&self) -> bool {
        self.key.is_some()
    }

    pub(crate) fn stats(&self) -> RosterStats {
        let get = |i: usize| self.counts[i].load(Ordering::Relaxed);
        RosterStats {
            accepted: get(ACCEPTED),
            too_large: get(0),
            too_many_providers: get(1),
            bad_signature: get(2),
            stale: get(3),
            malformed: get(4),
        }
    }

    /// Checks one received message; counts and logs a rejection.
    pub(crate) fn admit(
        &self,
        subject: &str,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
    ) -> Option<Vec<Provider>> {
        match self.check(subject, headers, payload, wire::now_ns()) {
            Ok(providers) => {
                self.counts[ACCEPTED].fetch_add(1, Ordering::Relaxed);
                Some(providers)
            }
            Err(rejection) => {
                let kind = rejection.index();
                self.counts[kind].fetch_add(1, Ordering::Relaxed);
                if self.warned[kind].swap(true, Ordering::Relaxed) {
                    tracing::debug!(subject, error = %rejection, "fleet: roster rejected");
                } else {
                    tracing::warn!(
                        subject,
                        error = %rejection,
                        "fleet: roster rejected; further rejections of this kind are counted and logged at debug level"
                    );
                }
                None
            }
        }
    }

    fn check(
        &self,
        subject: &str,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
        now: i64,
    ) -> Result<Vec<Provider>, Rejection> {
        // Size first: nothing is decoded (or verified) beyond the cap.
        if payload.len() > self.max_bytes {
            return Err(Rejection::TooLarge {
                size: payload.len(),
                limit: self.max_bytes,
            });
        }
        if let Some(key) = &self.key {
            let signature = headers
                .and_then(|h| h.get(ROSTER_SIGNATURE_HEADER))
                .ok_or(Rejection::Unsigned)?;
            let bytes = STANDARD
                .decode(signature.as_str().trim())
                .map_err(|_| Rejection::MalformedSignature)?;
            let bytes: [u8; 64] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| Rejection::MalformedSignature)?;
            key.verify_strict(
                &roster_signing_input(subject, payload),
                &Signature::from_bytes(&bytes),
            )
            .map_err(|_| Rejection::BadSignature)?;
        }
        let (time, providers) = wire::decode_roster_timed(payload)
            .map_err(|e| Rejection::Malformed(Untrusted(&e.to_string()).to_string()))?;
        if providers.len() > self.max_providers {
            return Err(Rejection::TooManyProviders {
                count: providers.len(),
                limit: self.max_providers,
            });
        }
        if self.key.is_some() {
            let offset = now.saturating_sub(time);
            let max_age = i64::try_from(self.max_age.as_nanos()).unwrap_or(i64::MAX);
            if offset.unsigned_abs() > max_age.unsigned_abs() {
                return Err(Rejection::OutOfWindow {
                    offset_secs: offset / 1_000_000_000,
                    max_age: crate::duration::format(self.max_age),
                });
            }
            let mut last = self.last_signed.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|last| time < last) {
                return Err(Rejection::Replayed);
            }
            *last = Some(time);
        }
        Ok(providers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use wire::{ServiceType, encode_roster};

    const SUBJECT: &str = "cc.fleet.discovery.fritz.ccmc";

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[42; 32])
    }

    fn gate(signed: bool) -> RosterGate {
        let mut config = Config::new("https://h");
        config.roster_max_providers = 2;
        config.roster_max_bytes = 4096;
        if signed {
            config.roster_public_key = STANDARD.encode(key().verifying_key().as_bytes());
        }
        RosterGate::new(&config).unwrap()
    }

    fn roster(time: i64, n: usize) -> Vec<u8> {
        let providers: Vec<Provider> = (0..n)
            .map(|i| Provider {
                service_type: ServiceType::Backend.into(),
                hostname: format!("mgmt{i}"),
                state: "active".into(),
                meta: Default::default(),
            })
            .collect();
        encode_roster("fritz", ServiceType::MetricCollector, &providers, time).unwrap()
    }

    fn signed(key: &SigningKey, subject: &str, payload: &[u8]) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        let signature = key.sign(&roster_signing_input(subject, payload));
        headers.insert(
            ROSTER_SIGNATURE_HEADER,
            STANDARD.encode(signature.to_bytes()).as_str(),
        );
        headers
    }

    #[test]
    fn caps_reject_large_rosters_and_many_providers() {
        let gate = gate(false);
        let now = wire::now_ns();
        assert_eq!(
            gate.check(SUBJECT, None, &roster(now, 2), now)
                .unwrap()
                .len(),
            2
        );
        assert!(matches!(
            gate.check(SUBJECT, None, &roster(now, 3), now),
            Err(Rejection::TooManyProviders { count: 3, limit: 2 })
        ));
        let big = vec![b'x'; 4097];
        assert!(matches!(
            gate.check(SUBJECT, None, &big, now),
            Err(Rejection::TooLarge { size: 4097, .. })
        ));
        // Without a key, signatures are not looked at.
        assert!(gate.admit(SUBJECT, None, &roster(now, 1)).is_some());
        assert!(gate.admit(SUBJECT, None, &big).is_none());
        let stats = gate.stats();
        assert_eq!((stats.accepted, stats.too_large), (1, 1));
    }

    #[test]
    fn with_a_key_only_fresh_rosters_signed_for_their_subject_pass() {
        let gate = gate(true);
        let now = wire::now_ns();
        let payload = roster(now, 1);
        let headers = signed(&key(), SUBJECT, &payload);
        assert!(gate.check(SUBJECT, Some(&headers), &payload, now).is_ok());
        assert_eq!(
            gate.check(SUBJECT, None, &payload, now),
            Err(Rejection::Unsigned)
        );
        // Signed by another key.
        let forged = signed(&SigningKey::from_bytes(&[1; 32]), SUBJECT, &payload);
        assert_eq!(
            gate.check(SUBJECT, Some(&forged), &payload, now),
            Err(Rejection::BadSignature)
        );
        // The right signature on another subject or altered bytes.
        assert_eq!(
            gate.check(
                "cc.fleet.discovery.alex.ccmc",
                Some(&headers),
                &payload,
                now
            ),
            Err(Rejection::BadSignature)
        );
        let mut altered = payload.clone();
        altered[payload.len() - 3] ^= 1;
        assert_eq!(
            gate.check(SUBJECT, Some(&headers), &altered, now),
            Err(Rejection::BadSignature)
        );
        let mut garbage = async_nats::HeaderMap::new();
        garbage.insert(ROSTER_SIGNATURE_HEADER, "bm90IGEgc2lnbmF0dXJl");
        assert_eq!(
            gate.check(SUBJECT, Some(&garbage), &payload, now),
            Err(Rejection::MalformedSignature)
        );
        // Too old, too far ahead, and older than the last accepted one.
        let hour = 3_600_000_000_000;
        for time in [now - hour, now + hour] {
            let payload = roster(time, 1);
            let headers = signed(&key(), SUBJECT, &payload);
            assert!(matches!(
                gate.check(SUBJECT, Some(&headers), &payload, now),
                Err(Rejection::OutOfWindow { .. })
            ));
        }
        let earlier = roster(now - 1_000_000_000, 1);
        let headers = signed(&key(), SUBJECT, &earlier);
        assert_eq!(
            gate.check(SUBJECT, Some(&headers), &earlier, now),
            Err(Rejection::Replayed)
        );
    }
}
