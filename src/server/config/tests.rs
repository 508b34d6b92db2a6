//! Tests of the server's configuration file: defaults, parsing and refusals.

use super::*;

#[test]
fn defaults_match_cc_backend() {
    let c = ServerConfig::from_json("{}").unwrap();
    assert_eq!(c.addr, DEFAULT_ADDR);
    assert!(c.db.is_none() && c.nats.is_none() && !c.disable_authentication);
    assert_eq!(c.fleet.stale_after, Duration::from_secs(90));
    assert_eq!(c.fleet.sweep_interval, Duration::from_secs(30));
    assert_eq!(c.fleet.config_reload_interval, Duration::from_secs(60));
    assert_eq!(c.fleet.discovery_interval, Duration::from_secs(60));
    assert_eq!(c.fleet.discovery_debounce, Duration::from_secs(2));
    assert_eq!(c.fleet.heartbeat_concurrency, 2);
    assert_eq!(c.fleet.discovery_subject_prefix, "cc.fleet.discovery");
    assert!(c.fleet.heartbeat_subject.is_none());
    assert!(
        c.trusted_proxies.is_empty(),
        "no proxy is trusted by default"
    );
    assert_eq!(c.http, HttpLimits::default());
}

#[test]
fn parses_the_http_limits_and_trusted_proxies() {
    let c = ServerConfig::from_json(
        r#"{"trusted-proxies":["10.0.0.1","192.168.0.0/16"],"http-header-timeout":"250ms",
        "http-body-timeout":"2s","http-max-connections":64}"#,
    )
    .unwrap();
    assert_eq!(c.trusted_proxies, ["10.0.0.1", "192.168.0.0/16"]);
    assert_eq!(c.http.header_timeout, Duration::from_millis(250));
    assert_eq!(c.http.body_timeout, Duration::from_secs(2));
    assert_eq!(c.http.max_connections, 64);
    assert!(ServerConfig::from_json(r#"{"http-max-connections":0}"#).is_err());
    let e = ServerConfig::from_json(r#"{"http-header-timeout":"soon"}"#).unwrap_err();
    assert!(e.to_string().contains("http-header-timeout"), "{e}");
}

#[test]
fn parses_every_key() {
    let c = ServerConfig::from_json(
        r#"{"addr":"127.0.0.1:0","db":"x.sqlite","api-allowed-ips":["10.0.0.0/8"],
        "disable-authentication":true,"jwt-public-key":"k","jwt-private-key":"s",
        "nats":{"address":"nats://h:4222","username":"u","password":"p"},
        "fleet":{"config-dir":"cfg","stale-after":"1m30s","sweep-interval":"10s",
        "config-reload-interval":"5s","heartbeat-subject":"cc.fleet.event",
        "heartbeat-concurrency":4,"heartbeat-pending-messages":2048,
        "discovery-subject-prefix":"site.disc",
        "discovery-interval":"2m","discovery-debounce":"100ms"}}"#,
    )
    .unwrap();
    assert_eq!(c.addr, "127.0.0.1:0");
    assert_eq!(c.db.as_deref(), Some(std::path::Path::new("x.sqlite")));
    assert_eq!(c.api_allowed_ips, ["10.0.0.0/8"]);
    assert_eq!(c.jwt_private_key.as_deref(), Some("s"));
    assert_eq!(c.nats.unwrap().username, "u");
    assert_eq!(c.fleet.stale_after, Duration::from_secs(90));
    assert_eq!(c.fleet.heartbeat_concurrency, 4);
    assert_eq!(c.fleet.heartbeat_pending_messages, 2048);
    assert_eq!(c.fleet.discovery_debounce, Duration::from_millis(100));
    assert_eq!(c.fleet.heartbeat_subject.as_deref(), Some("cc.fleet.event"));
}

#[test]
fn malformed_or_non_positive_durations_are_errors_naming_key_and_value() {
    for (fleet, key, value) in [
        (
            r#"{"stale-after":"90 seconds"}"#,
            "fleet.stale-after",
            "90 seconds",
        ),
        (r#"{"stale-after":"soon"}"#, "fleet.stale-after", "soon"),
        (r#"{"sweep-interval":"0s"}"#, "fleet.sweep-interval", "0s"),
        (
            r#"{"rollout-interval":"0s"}"#,
            "fleet.rollout-interval",
            "0s",
        ),
        (
            r#"{"discovery-debounce":"-1s"}"#,
            "fleet.discovery-debounce",
            "-1s",
        ),
    ] {
        let e = ServerConfig::from_json(&format!(r#"{{"fleet":{fleet}}}"#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains(&format!("\"{value}\"")),
            "{fleet}: {e}"
        );
    }
    assert!(ServerConfig::from_json(r#"{"bogus":1}"#).is_err());
    assert!(ServerConfig::from_json(r#"{"fleet":{"bogus":1}}"#).is_err());
    assert!(ServerConfig::from_json(r#"{"nats":{"address":""}}"#).is_err());
}

#[test]
fn an_addr_without_host_or_port_is_refused() {
    for bad in [
        "localhost",
        "localhost:",
        ":8080",
        "127.0.0.1:99999",
        "::1:8080",
        "a b:1",
    ] {
        let e = ServerConfig::from_json(&format!(r#"{{"addr":"{bad}"}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("addr") && e.contains("host:port"), "{bad}: {e}");
    }
    for good in [
        "localhost:8080",
        "127.0.0.1:0",
        "[::1]:8080",
        "[::]:80",
        "fleet.example:443",
    ] {
        let c = ServerConfig::from_json(&format!(r#"{{"addr":"{good}"}}"#)).unwrap();
        assert_eq!(c.addr, good);
    }
}

#[test]
fn a_value_of_the_wrong_type_names_its_key_and_form() {
    let e = ServerConfig::from_json("{\n  \"addr\": 18081\n}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("addr: invalid type: integer `18081`"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("\"host:port\""), "{e}");
    let e = ServerConfig::from_json(r#"{"fleet": {"stale-after": 90}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fleet.stale-after") && e.contains("Go duration"),
        "{e}"
    );
}

#[test]
fn relative_paths_are_resolved_against_the_config_directory() {
    let mut c = ServerConfig::from_json(
        r#"{"db":"var/fleet.sqlite","fleet":{"config-dir":"/etc/cc/tree"}}"#,
    )
    .unwrap();
    c.resolve_paths(Path::new("/etc/ccfleet"));
    assert_eq!(
        c.db.as_deref(),
        Some(Path::new("/etc/ccfleet/var/fleet.sqlite"))
    );
    assert_eq!(
        c.fleet.config_dir.as_deref(),
        Some(Path::new("/etc/cc/tree"))
    );
}

#[test]
fn a_config_dir_that_does_not_exist_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-tree");
    let mut c = ServerConfig::from_json(r#"{"fleet":{"config-dir":"no-such-tree"}}"#).unwrap();
    c.resolve_paths(dir.path());
    let warnings = c.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&missing.display().to_string()) && warnings[0].contains("204"),
        "{warnings:?}"
    );
    std::fs::create_dir(&missing).unwrap();
    assert!(c.warnings().is_empty());
}

#[test]
fn a_heartbeat_subject_nats_would_refuse_is_refused() {
    for subject in [
        "cc..event",
        ".cc",
        "cc.",
        "c c.x",
        "cc\\n",
        "cc.>.x",
        "cc.ev*",
        "cc.>x",
        "cc.a>",
    ] {
        let text = format!(r#"{{"fleet":{{"heartbeat-subject":"{subject}"}}}}"#);
        let err = ServerConfig::from_json(&text).unwrap_err();
        assert!(
            err.to_string().contains("heartbeat-subject"),
            "{subject:?}: {err}"
        );
    }
    let long = format!(
        r#"{{"fleet":{{"heartbeat-subject":"{}"}}}}"#,
        "a".repeat(1025)
    );
    assert!(ServerConfig::from_json(&long).is_err());
    for subject in [
        "cc.fleet.event",
        "cc.*.event",
        "cc.fleet.>",
        ">",
        "site-1.hb_2",
    ] {
        let text = format!(r#"{{"fleet":{{"heartbeat-subject":"{subject}"}}}}"#);
        let c = ServerConfig::from_json(&text).unwrap();
        assert_eq!(c.fleet.heartbeat_subject.as_deref(), Some(subject));
    }
}

#[test]
fn a_discovery_prefix_that_is_no_literal_subject_is_refused() {
    for prefix in ["cc.*", "cc.>", "cc..x", ".cc", "cc.", "c c", "cc\n"] {
        let text = format!(r#"{{"fleet":{{"discovery-subject-prefix":"{prefix}"}}}}"#);
        assert!(ServerConfig::from_json(&text).is_err(), "{prefix:?}");
    }
    let long = format!(
        r#"{{"fleet":{{"discovery-subject-prefix":"{}"}}}}"#,
        "a".repeat(1025)
    );
    assert!(ServerConfig::from_json(&long).is_err());
    let c = ServerConfig::from_json(r#"{"fleet":{"discovery-subject-prefix":"site-1.disc_2"}}"#)
        .unwrap();
    assert_eq!(c.fleet.discovery_subject_prefix, "site-1.disc_2");
}

#[test]
fn a_heartbeat_pending_limit_out_of_range_is_refused_by_name() {
    assert_eq!(
        ServerConfig::from_json("{}")
            .unwrap()
            .fleet
            .heartbeat_pending_messages,
        DEFAULT_HEARTBEAT_PENDING_MESSAGES
    );
    for bad in ["0", "-1", "4097"] {
        let e = ServerConfig::from_json(&format!(
            r#"{{"fleet":{{"heartbeat-pending-messages":{bad}}}}}"#
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("fleet.heartbeat-pending-messages"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn the_heartbeat_stream_section_is_parsed_and_bad_values_are_refused_by_name() {
    let base = r#""nats": {"address": "nats://127.0.0.1:4222"}"#;
    let c = ServerConfig::from_json(&format!(
        r#"{{{base}, "fleet": {{"heartbeat-subject": "hb", "heartbeat-stream": {{}}}}}}"#
    ))
    .unwrap();
    assert_eq!(
        c.fleet.heartbeat_stream,
        Some(HeartbeatStreamConfig {
            name: DEFAULT_HEARTBEAT_STREAM.to_owned(),
            consumer: DEFAULT_HEARTBEAT_CONSUMER.to_owned(),
            replicas: 1,
            max_age: DEFAULT_HEARTBEAT_STREAM_MAX_AGE,
            max_bytes: DEFAULT_HEARTBEAT_STREAM_MAX_BYTES,
            ack_wait: DEFAULT_HEARTBEAT_ACK_WAIT,
        })
    );
    let c = ServerConfig::from_json(&format!(
        r#"{{{base}, "fleet": {{"heartbeat-subject": "hb", "heartbeat-stream": {{"name": "hb_1",
        "consumer": "site-a", "replicas": 3, "max-age": "10m", "max-bytes": 2097152, "ack-wait": "1m"}}}}}}"#
    ))
    .unwrap();
    let s = c.fleet.heartbeat_stream.unwrap();
    assert_eq!(
        (s.name.as_str(), s.consumer.as_str(), s.replicas),
        ("hb_1", "site-a", 3)
    );
    assert_eq!(
        (s.max_age, s.max_bytes, s.ack_wait),
        (Duration::from_secs(600), 2_097_152, Duration::from_secs(60))
    );
    assert!(
        ServerConfig::from_json("{}")
            .unwrap()
            .fleet
            .heartbeat_stream
            .is_none()
    );
    let refused = [
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"name": "a.b"}"#,
            "heartbeat-stream.name",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"consumer": ""}"#,
            "heartbeat-stream.consumer",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"replicas": 0}"#,
            "heartbeat-stream.replicas",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"max-age": "soon"}"#,
            "heartbeat-stream.max-age",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"max-bytes": 1000}"#,
            "heartbeat-stream.max-bytes",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"ack-wait": "1s"}"#,
            "heartbeat-stream.ack-wait",
        ),
        (
            r#""heartbeat-subject": "hb", "heartbeat-stream": {"bogus": 1}"#,
            "bogus",
        ),
        (r#""heartbeat-stream": {}"#, "needs fleet.heartbeat-subject"),
    ];
    for (fleet, needle) in refused {
        let e = ServerConfig::from_json(&format!(r#"{{{base}, "fleet": {{{fleet}}}}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{fleet}: {e}");
    }
    let e = ServerConfig::from_json(
        r#"{"fleet": {"heartbeat-subject": "hb", "heartbeat-stream": {}}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs a nats connection"), "{e}");
}

#[test]
fn the_registry_section_selects_sqlite_or_a_jetstream_bucket() {
    let nats = r#""nats": {"address": "nats://127.0.0.1:4222"}"#;
    assert_eq!(
        ServerConfig::from_json(r#"{"db": "fleet.sqlite"}"#)
            .unwrap()
            .registry,
        RegistryConfig::Sqlite
    );
    let c = ServerConfig::from_json(&format!(
        r#"{{{nats}, "registry": {{"type": "jetstream-kv", "bucket": "fleet-a", "replicas": 3, "lease-ttl": "2s"}}}}"#
    ))
    .unwrap();
    let RegistryConfig::JetStreamKv(settings) = c.registry else {
        panic!("not jetstream");
    };
    assert_eq!(
        (
            settings.bucket.as_str(),
            settings.replicas,
            settings.lease_ttl
        ),
        ("fleet-a", 3, Duration::from_secs(2))
    );
    let refused = [
        (r#"{"registry": {"type": "jetstream-kv"}}"#, "needs a nats"),
        (
            &format!(r#"{{{nats}, "db": "x.sqlite", "registry": {{"type": "jetstream-kv"}}}}"#),
            "migrate",
        ),
        (
            &format!(r#"{{{nats}, "registry": {{"type": "jetstream-kv", "bucket": "a.b"}}}}"#),
            "registry.bucket",
        ),
        (
            &format!(r#"{{{nats}, "registry": {{"type": "jetstream-kv", "replicas": 7}}}}"#),
            "registry.replicas",
        ),
        (
            &format!(r#"{{{nats}, "registry": {{"type": "jetstream-kv", "lease-ttl": "1ms"}}}}"#),
            "lease-ttl",
        ),
        (
            r#"{"registry": {"type": "sqlite", "bucket": "x"}}"#,
            "jetstream-kv",
        ),
        (r#"{"registry": {"type": "etcd"}}"#, "registry.type"),
    ];
    for (json, needle) in refused {
        let e = ServerConfig::from_json(json).unwrap_err().to_string();
        assert!(e.contains(needle), "{json}: {e}");
    }
}
