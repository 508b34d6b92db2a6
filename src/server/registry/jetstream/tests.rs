//! Tests of the JetStream registry: records, digests and the store.

use std::collections::BTreeMap;

use super::super::{RegistryErrorKind, State};
use super::record::{Op, Record, kv_key, parse_kv_key};
use super::replication::{decode_digest, encode_digest};
use super::*;
use crate::wire::{Scope, ServiceType};

#[test]
fn digests_round_trip_and_stay_under_the_payload_limit() {
    let writes: Vec<(i64, i64)> = (0..1000)
        .map(|k| (k * 7919, 1_700_000_000 + k % 13))
        .collect();
    let chunks = encode_digest(42, &writes, 4096);
    assert!(chunks.len() > 1);
    let mut back = Vec::new();
    for chunk in &chunks {
        assert!(chunk.len() <= 4096);
        let (sender, entries) = decode_digest(chunk).unwrap();
        assert_eq!(sender, 42);
        back.extend(entries);
    }
    assert_eq!(back, writes);
}

#[test]
fn a_truncated_or_foreign_digest_is_refused() {
    let chunk = encode_digest(1, &[(5, 100), (6, 101)], 1 << 20).remove(0);
    assert!(decode_digest(&chunk[..chunk.len() - 1]).is_none());
    assert!(decode_digest(b"CCD1").is_none());
    assert!(decode_digest(&[b'x'; 64]).is_none());
}

#[test]
fn keys_are_stable_valid_kv_keys_and_names_do_not_leak_into_them() {
    let a = service_key(
        Scope::Cluster,
        "fritz",
        "f0101",
        ServiceType::MetricCollector,
    );
    assert_eq!(
        a,
        service_key(
            Scope::Cluster,
            "fritz",
            "f0101",
            ServiceType::MetricCollector
        )
    );
    assert!(a >= 0);
    let odd = service_key(Scope::Cluster, "a b.c*>", "h\u{e9}", ServiceType::Backend);
    let key = kv_key(odd);
    assert!(
        key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
        "{key}"
    );
    assert_eq!(parse_kv_key(&key), Some(odd));
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    assert_ne!(
        service_key(Scope::Cluster, "ab", "c", ServiceType::Backend),
        service_key(Scope::Cluster, "a", "bc", ServiceType::Backend)
    );
    assert_eq!(parse_kv_key("lease.roster"), None);
}

fn record(instance: &str, state: State) -> Record {
    Record {
        scope: "cluster".into(),
        cluster: "fritz".into(),
        hostname: "f0101".into(),
        service_type: "ccmc".into(),
        instance: instance.into(),
        state: state.as_str().into(),
        registered_at: 1,
        last_heartbeat: Some(10),
        config_revision: 3,
        meta: BTreeMap::new(),
    }
}

#[test]
fn a_lost_race_is_re_decided_on_the_newer_record() {
    let old = "00000000000000000000000000000001".to_owned();
    let new = "00000000000000000000000000000002".to_owned();
    // A revival of a re-registered or deregistered instance is dropped.
    let revive = Op::Revive {
        instance: old.clone(),
        at: 20,
    };
    assert!(
        revive
            .apply(Some(&record(&new, State::Pending)))
            .unwrap()
            .is_none()
    );
    assert!(
        revive
            .apply(Some(&record(&old, State::Deregistered)))
            .unwrap()
            .is_none()
    );
    // One that another server revived already needs no write.
    assert!(
        revive
            .apply(Some(&record(&old, State::Active)))
            .unwrap()
            .is_none()
    );
    let revived = revive
        .apply(Some(&record(&old, State::Stale)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (revived.state.as_str(), revived.last_heartbeat),
        ("active", Some(20))
    );
    // A stale mark of an instance revived meanwhile is dropped.
    let stale = Op::Stale {
        instance: old.clone(),
        last: Some(5),
    };
    assert!(
        stale
            .apply(Some(&record(&old, State::Active)))
            .unwrap()
            .is_none()
    );
    // A registration keeps the heartbeat and revision of the record it replaces.
    let mut fresh = record(&new, State::Pending);
    fresh.last_heartbeat = None;
    fresh.config_revision = 0;
    let reg = Op::Register(Box::new(fresh));
    let merged = reg
        .apply(Some(&record(&old, State::Active)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            merged.instance.as_str(),
            merged.last_heartbeat,
            merged.config_revision
        ),
        (new.as_str(), Some(10), 3)
    );
    // A different identity under the same key is a conflict, not an overwrite.
    let mut other = record(&old, State::Active);
    other.hostname = "f0102".into();
    let e = reg.apply(Some(&other)).unwrap_err();
    assert_eq!(e.kind(), RegistryErrorKind::Conflict);
}
