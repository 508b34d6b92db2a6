//! Tests of roster building, encoding and the publisher's pacing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::build::*;
use super::encode::*;
use super::publish::*;
use crate::server::registry::Service;
use crate::server::registry::State;
use crate::wire::now_ns;
use crate::wire::{INFRA_BUCKET, Scope, ServiceType, encode_roster_line};

fn svc(scope: Scope, cluster: &str, host: &str, ty: ServiceType) -> Service {
    Service {
        scope,
        cluster: cluster.to_owned(),
        hostname: host.to_owned(),
        service_type: ty,
        state: State::Active,
        registered_at: 0,
        last_heartbeat: Some(0),
        config_revision: 0,
        meta: Arc::new(BTreeMap::new()),
    }
}

#[test]
fn buckets_policy_and_order() {
    let active = vec![
        svc(
            Scope::Cluster,
            "fritz",
            "f0101",
            ServiceType::MetricCollector,
        ),
        svc(Scope::Cluster, "alex", "a01", ServiceType::MetricCollector),
        svc(Scope::Cluster, "alex", "ccb-z", ServiceType::Backend),
        svc(Scope::Infra, "", "mgmt02", ServiceType::Backend),
        svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
        svc(Scope::Infra, "", "store", ServiceType::MetricStore),
    ];
    let (rosters, skipped) = build_rosters(&active, "");
    assert!(skipped.is_empty());
    // 3 buckets x 6 consumer types (ccb consumes nothing).
    assert_eq!(rosters.len(), 18);
    let subjects: Vec<&str> = rosters.iter().map(|r| r.subject.as_str()).collect();
    assert_eq!(subjects[0], "cc.fleet.discovery.alex.ccms");
    assert_eq!(subjects[1], "cc.fleet.discovery.alex.ccmc");
    assert_eq!(subjects[6], "cc.fleet.discovery.fritz.ccms");
    assert_eq!(subjects[12], "cc.fleet.discovery.infra.ccms");
    assert!(!subjects.iter().any(|s| s.ends_with(".ccb")));
    let hosts = |r: &Roster| {
        r.providers
            .iter()
            .map(|p| p.hostname.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(hosts(&rosters[1]), ["ccb-z", "mgmt01", "mgmt02"]);
    assert_eq!(hosts(&rosters[7]), ["mgmt01", "mgmt02"]);
    assert_eq!(hosts(&rosters[12]), ["ccb-z", "mgmt01", "mgmt02"]);
    assert!(
        rosters
            .iter()
            .all(|r| r.providers.iter().all(|p| p.state == "active"))
    );

    let (empty, _) = build_rosters(&[], "site.disc");
    assert_eq!(empty.len(), 6);
    assert_eq!(empty[0].subject, "site.disc.infra.ccms");
    assert!(empty.iter().all(|r| r.providers.is_empty()));
}

#[test]
fn rows_whose_cluster_cannot_name_a_subject_are_skipped_and_the_rest_published() {
    let long = "x".repeat(5000);
    let active = vec![
        svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
        svc(Scope::Cluster, "fritz", "ccb-f", ServiceType::Backend),
        svc(Scope::Cluster, "my cluster", "b1", ServiceType::Backend),
        svc(Scope::Cluster, &long, "b2", ServiceType::Backend),
        svc(Scope::Cluster, "a.b", "b3", ServiceType::Backend),
        svc(Scope::Cluster, "infra", "b4", ServiceType::Backend),
    ];
    let (rosters, skipped) = build_rosters(&active, "");
    let hosts: Vec<&str> = skipped.iter().map(|s| s.hostname.as_str()).collect();
    assert_eq!(hosts, ["b1", "b2", "b3", "b4"]);
    assert!(skipped[3].reason.contains("infra"));
    let buckets: std::collections::BTreeSet<&str> =
        rosters.iter().map(|r| r.bucket.as_str()).collect();
    assert_eq!(buckets, ["fritz", "infra"].into());
    assert!(rosters.iter().all(|r| r.subject.len() < 100));
    let infra = rosters
        .iter()
        .find(|r| r.subject == "cc.fleet.discovery.infra.ccmc")
        .unwrap();
    let names: Vec<&str> = infra
        .providers
        .iter()
        .map(|p| p.hostname.as_str())
        .collect();
    assert_eq!(names, ["ccb-f", "mgmt01"], "skipped rows are in no roster");
}

fn with_meta(mut service: Service, meta: &[(&str, &str)]) -> Service {
    service.meta = Arc::new(
        meta.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    service
}

#[test]
fn rosters_encoded_from_borrowed_rows_are_the_bytes_of_the_owned_encoding() {
    let active = vec![
        with_meta(
            svc(Scope::Cluster, "fritz", "ccb-<f>", ServiceType::Backend),
            &[("url", "http://a&b/\"quoted\""), ("note", "\u{2028}")],
        ),
        svc(Scope::Cluster, "fritz", "f01", ServiceType::MetricCollector),
        svc(Scope::Infra, "", "mgmt01", ServiceType::Backend),
    ];
    let (rosters, _) = build_rosters(&active, "");
    let buckets = Buckets::of(&active);
    for roster in rosters {
        let candidates: Vec<&Service> = if roster.bucket == INFRA_BUCKET {
            buckets.everyone.clone()
        } else {
            buckets.clusters[roster.bucket.as_str()]
                .iter()
                .chain(&buckets.infra)
                .copied()
                .collect()
        };
        let members = members_of(candidates.into_iter(), relevant_providers(roster.consumer));
        let encoded = encode_members(members, &roster.bucket, ROSTER_LIMIT).unwrap();
        let mut line = Vec::new();
        encode_roster_line(
            &mut line,
            &roster.bucket,
            roster.consumer,
            &encoded.payload,
            7,
        );
        let owned =
            crate::wire::encode_roster(&roster.bucket, roster.consumer, &roster.providers, 7)
                .unwrap();
        assert_eq!(line, owned, "{}", roster.subject);
        assert!(encoded.left_out.is_empty());
    }
}

#[test]
fn members_with_the_most_metadata_are_left_out_until_the_roster_fits() {
    let big = "m".repeat(4000);
    let bigger = "m".repeat(5000);
    let members = [
        with_meta(
            svc(Scope::Cluster, "c", "a", ServiceType::Backend),
            &[("n", &big)],
        ),
        svc(Scope::Cluster, "c", "b", ServiceType::Backend),
        with_meta(
            svc(Scope::Cluster, "c", "c", ServiceType::Backend),
            &[("n", &bigger)],
        ),
        svc(Scope::Cluster, "c", "d", ServiceType::Backend),
    ];
    let refs: Vec<&Service> = members.iter().collect();
    let limit = 4096;
    let encoded = encode_members(refs.clone(), "c", limit).unwrap();
    let left: Vec<&str> = encoded
        .left_out
        .iter()
        .map(|m| m.hostname.as_str())
        .collect();
    assert_eq!(
        left,
        ["c", "a"],
        "both would not fit together: the larger goes first"
    );
    assert_eq!(encoded.providers, 2);
    let mut line = Vec::new();
    encode_roster_line(
        &mut line,
        "c",
        ServiceType::MetricCollector,
        &encoded.payload,
        now_ns(),
    );
    assert!(line.len() <= limit, "{}", line.len());
    let listed = crate::wire::decode_roster(&line).unwrap();
    let hosts: Vec<&str> = listed.iter().map(|p| p.hostname.as_str()).collect();
    assert_eq!(hosts, ["b", "d"]);

    // With room for one large member, only the largest is left out.
    let encoded = encode_members(refs, "c", 8192).unwrap();
    let left: Vec<&str> = encoded
        .left_out
        .iter()
        .map(|m| m.hostname.as_str())
        .collect();
    assert_eq!(left, ["c"]);
    assert_eq!(encoded.left_out[0].meta_bytes, 5001);
}

#[test]
fn a_round_that_published_nothing_opens_no_debounce_window() {
    let debounce = Duration::from_secs(2);
    let t0 = Instant::now();
    let mut pacer = Pacer::new(debounce);
    pacer.publishing(t0);
    // Long after: a change, but its round finds nothing changed.
    let t1 = t0 + Duration::from_secs(10);
    pacer.changed(t1);
    let previous = pacer.publishing(t1);
    pacer.restore(previous);
    // A real change right after goes out at once.
    let t2 = t1 + Duration::from_millis(100);
    pacer.changed(t2);
    assert_eq!(pacer.due, Some(t2));
}

#[test]
fn the_first_change_is_published_at_once_and_later_ones_within_the_window_wait() {
    let debounce = Duration::from_secs(2);
    let t0 = Instant::now();
    let mut pacer = Pacer::new(debounce);
    // Nothing published yet: a change is due at once.
    pacer.changed(t0);
    assert_eq!(pacer.due, Some(t0));
    pacer.publishing(t0);
    assert_eq!(pacer.due, None);
    // Within the window after that publish: wait for its end, however many changes come.
    pacer.changed(t0 + Duration::from_millis(500));
    pacer.changed(t0 + Duration::from_millis(900));
    assert_eq!(pacer.due, Some(t0 + debounce));
    pacer.publishing(t0 + debounce);
    // Long after the previous publish: at once again.
    let later = t0 + Duration::from_secs(60);
    pacer.changed(later);
    assert_eq!(pacer.due, Some(later));
}
