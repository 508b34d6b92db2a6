//! Tests of the `fleet` section: parsing, defaults, errors and the schema.

use super::*;
use std::collections::HashMap;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
        .collect();
    move |name| map.get(name).cloned()
}

#[test]
fn minimal_section_gets_defaults() {
    let c = Config::from_json(r#"{"url":"https://cc.example.org"}"#).unwrap();
    assert_eq!(c, Config::new("https://cc.example.org"));
    assert_eq!(c.heartbeat_interval, Duration::from_secs(30));
    assert_eq!(c.config_poll_interval, Duration::from_secs(60));
    assert_eq!(c.timeout, Duration::from_secs(10));
    assert_eq!(c.discovery_subject_prefix, "cc.fleet.discovery");
    assert!(c.cache_path.is_none());
    c.validate().unwrap();
}

#[test]
fn full_section_from_the_readme() {
    let c = Config::from_json(
        r#"{
          "url": "https://cc.example.org",
          "token": "jwt",
          "cluster": "fritz",
          "hostname": "f0101",
          "heartbeat-interval": "1m30s",
          "config-poll-interval": "1.5h",
          "heartbeat-subject": "cc.fleet.event",
          "discovery-subject-prefix": "site.disc",
          "cache-path": "/var/lib/cc-metric-collector/fleet-config.json",
          "timeout": "500ms"
        }"#,
    )
    .unwrap();
    assert_eq!(c.token, "jwt");
    assert_eq!(c.cluster, "fritz");
    assert_eq!(c.hostname, "f0101");
    assert_eq!(c.heartbeat_interval, Duration::from_secs(90));
    assert_eq!(c.config_poll_interval, Duration::from_secs(5400));
    assert_eq!(c.heartbeat_subject, "cc.fleet.event");
    assert_eq!(c.discovery_subject_prefix, "site.disc");
    assert_eq!(
        c.cache_path.as_deref(),
        Some(std::path::Path::new(
            "/var/lib/cc-metric-collector/fleet-config.json"
        ))
    );
    assert_eq!(c.timeout, Duration::from_millis(500));
    c.validate().unwrap();
}

#[test]
fn from_value_matches_from_json() {
    let v = serde_json::json!({"url": "http://h:8080/", "cluster": "alex"});
    let a = Config::from_value(v.clone()).unwrap();
    let b = Config::from_json(&v.to_string()).unwrap();
    assert_eq!(a, b);
    assert!(matches!(
        Config::from_value(serde_json::Value::Null),
        Err(ConfigError::Empty)
    ));
}

#[test]
fn rejects_bad_sections() {
    assert!(matches!(Config::from_json(""), Err(ConfigError::Empty)));
    assert!(matches!(Config::from_json("  \n"), Err(ConfigError::Empty)));
    assert!(matches!(
        Config::from_json("{}"),
        Err(ConfigError::MissingUrl)
    ));
    assert!(matches!(
        Config::from_json(r#"{"url":""}"#),
        Err(ConfigError::MissingUrl)
    ));
    let err = Config::from_json(r#"{"url":"https://x","bogus":1}"#).unwrap_err();
    assert!(matches!(err, ConfigError::Decode(_)));
    assert!(err.to_string().contains("bogus"), "{err}");
    assert!(matches!(
        Config::from_json(r#"{"url":"https://x","heartbeat-interval":"often"}"#),
        Err(ConfigError::InvalidDuration {
            key: "heartbeat-interval",
            ..
        })
    ));
    let err = Config::from_json(r#"{"url":"https://x","timeout":"-1s"}"#).unwrap_err();
    assert!(matches!(
        err,
        ConfigError::NotPositive { key: "timeout", .. }
    ));
    assert_eq!(
        err.to_string(),
        r#"fleet: timeout must be positive, got "-1s""#
    );
    assert!(matches!(
        Config::from_json(r#"{"url":"https://x","config-poll-interval":"0s"}"#),
        Err(ConfigError::NotPositive { .. })
    ));
    assert!(matches!(
        Config::from_json(r#"{"url":5}"#),
        Err(ConfigError::Decode(_))
    ));
}

#[test]
fn validate_checks_url_names_and_durations() {
    for bad in [
        "cc.example.org",
        "ftp://cc.example.org",
        "http://",
        "https://h/?x=1",
    ] {
        let err = Config::new(bad).validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidUrl { .. }),
            "{bad}: {err}"
        );
    }
    let mut c = Config::new("https://h");
    c.hostname = "../etc".into();
    assert!(matches!(
        c.validate(),
        Err(ConfigError::UnsafeName {
            key: "hostname",
            ..
        })
    ));
    c.hostname = "h1.example.org".into();
    c.validate().unwrap();
    c.cluster = "a/b".into();
    assert!(matches!(
        c.validate(),
        Err(ConfigError::UnsafeName { key: "cluster", .. })
    ));
    c.cluster = "fritz".into();
    c.heartbeat_interval = Duration::ZERO;
    assert!(matches!(c.validate(), Err(ConfigError::NotPositive { .. })));
}

#[test]
fn one_url_string_is_one_server_as_in_go() {
    let c = Config::from_json(r#"{"url":"https://cc.example.org/"}"#).unwrap();
    assert_eq!(c.url, "https://cc.example.org/");
    assert!(c.failover_urls.is_empty());
    assert_eq!(c.base_urls().unwrap(), ["https://cc.example.org"]);
}

#[test]
fn an_array_of_urls_lists_the_servers_in_order_of_preference() {
    let c = Config::from_json(
        r#"{"url":["https://fleet1.example.org","http://fleet2:8080/cc/","https://fleet3"]}"#,
    )
    .unwrap();
    assert_eq!(c.url, "https://fleet1.example.org");
    assert_eq!(
        c.failover_urls,
        ["http://fleet2:8080/cc/", "https://fleet3"]
    );
    assert_eq!(
        c.urls().collect::<Vec<_>>(),
        [
            "https://fleet1.example.org",
            "http://fleet2:8080/cc/",
            "https://fleet3"
        ]
    );
    assert_eq!(
        c.base_urls().unwrap(),
        [
            "https://fleet1.example.org",
            "http://fleet2:8080/cc",
            "https://fleet3"
        ]
    );
    c.validate().unwrap();
    // A list of one is the same as the string.
    let one = Config::from_json(r#"{"url":["https://h"]}"#).unwrap();
    assert_eq!(one, Config::new("https://h"));
    let value = Config::from_value(serde_json::json!({"url": ["https://a", "https://b"]}));
    assert_eq!(value.unwrap().failover_urls, ["https://b"]);
}

#[test]
fn an_empty_url_list_is_refused_naming_the_key() {
    let err = Config::from_json(r#"{"url":[]}"#).unwrap_err();
    assert!(matches!(err, ConfigError::EmptyUrlList), "{err}");
    assert_eq!(
        err.to_string(),
        "fleet: 'url' is an empty list; give at least one server URL"
    );
    assert!(matches!(
        Config::from_json(r#"{"url":null}"#),
        Err(ConfigError::MissingUrl)
    ));
}

#[test]
fn a_url_that_is_neither_a_string_nor_a_list_of_strings_is_refused_naming_the_key() {
    for bad in [
        r#"{"url":5}"#,
        r#"{"url":{"a":1}}"#,
        r#"{"url":["https://h",7]}"#,
    ] {
        let err = Config::from_json(bad).unwrap_err();
        assert!(matches!(err, ConfigError::Decode(_)), "{bad}: {err}");
        assert!(err.to_string().contains("url"), "{bad}: {err}");
    }
}

#[test]
fn a_server_listed_twice_is_refused() {
    for list in [
        r#"["https://a","https://b","https://a"]"#,
        r#"["https://a","https://b","https://A:443/"]"#,
        r#"["http://u:p@a","https://b","http://u:p@a/"]"#,
    ] {
        let err = Config::from_json(&format!(r#"{{"url":{list}}}"#))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::DuplicateUrl {
                    first: 1,
                    second: 3
                }
            ),
            "{list}: {err}"
        );
        assert_eq!(
            err.to_string(),
            "fleet: 'url' lists the same server twice (entries 1 and 3)"
        );
    }
}

#[test]
fn a_bad_entry_of_a_url_list_is_named_by_its_position_without_its_credentials() {
    let c = Config::from_json(r#"{"url":["https://a","ftp://u:s3cret@b"]}"#).unwrap();
    let err = c.validate().unwrap_err();
    assert!(
        matches!(err, ConfigError::InvalidUrl { entry: Some(2), .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "fleet: invalid url (entry 2 of the list): the scheme must be http or https"
    );
    let c = Config::from_json(r#"{"url":["https://a",""]}"#).unwrap();
    assert!(matches!(
        c.validate(),
        Err(ConfigError::InvalidUrl {
            entry: Some(2),
            reason: "the entry is empty"
        })
    ));
    let c = Config::from_json(r#"{"url":["","https://a"]}"#).unwrap();
    assert!(matches!(
        c.validate(),
        Err(ConfigError::InvalidUrl { entry: Some(1), .. })
    ));
    // A single bad URL keeps its message.
    let err = Config::new("ftp://h").validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "fleet: invalid url: the scheme must be http or https"
    );
}

#[test]
fn comma_separated_urls_in_one_string_are_refused_with_a_hint() {
    for bad in ["https://a,https://b", "http://a:8080, http://b:8080"] {
        let err = Config::new(bad).validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidUrl { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("JSON array"), "{bad}: {err}");
    }
    // A comma inside a path is a URL's own business.
    Config::new("https://h/a,b").validate().unwrap();
}

#[test]
fn base_url_trims_trailing_slashes() {
    assert_eq!(
        base_url("https://cc.example.org//").unwrap(),
        "https://cc.example.org"
    );
    assert_eq!(base_url("http://h:8080/cc").unwrap(), "http://h:8080/cc");
}

#[test]
fn invalid_url_message_does_not_echo_credentials() {
    let err = Config::new("ftp://user:s3cret@h").validate().unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

#[test]
fn token_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "  from-file\n").unwrap();
    let file_str = file.to_str().unwrap();
    let mut c = Config::new("https://h");
    c.token = "from-config".into();

    assert_eq!(c.resolve_token_with(env(&[])).unwrap(), "from-config");
    assert_eq!(
        c.resolve_token_with(env(&[(ENV_TOKEN, "from-env"), (ENV_TOKEN_FILE, file_str)]))
            .unwrap(),
        "from-env"
    );
    assert_eq!(
        c.resolve_token_with(env(&[(ENV_TOKEN, ""), (ENV_TOKEN_FILE, file_str)]))
            .unwrap(),
        "from-file"
    );
}

#[test]
fn token_file_errors_do_not_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let blank = dir.path().join("blank");
    std::fs::write(&blank, " \n\t").unwrap();
    let mut c = Config::new("https://h");
    c.token = "from-config".into();
    let err = c
        .resolve_token_with(env(&[(ENV_TOKEN_FILE, blank.to_str().unwrap())]))
        .unwrap_err();
    assert!(matches!(err, ConfigError::EmptyTokenFile { .. }));
    let missing = dir.path().join("missing");
    let err = c
        .resolve_token_with(env(&[(ENV_TOKEN_FILE, missing.to_str().unwrap())]))
        .unwrap_err();
    assert!(matches!(err, ConfigError::TokenFile { .. }));
    assert!(!err.to_string().contains("from-config"));
}

#[test]
fn roster_limits_and_key_are_parsed_and_checked() {
    let c = Config::from_json(r#"{"url":"https://h"}"#).unwrap();
    assert_eq!(c.roster_max_bytes, 1 << 20);
    assert_eq!(c.roster_max_providers, 10_000);
    assert!(c.roster_key().unwrap().is_none());
    let key = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        ed25519_dalek::SigningKey::from_bytes(&[7; 32])
            .verifying_key()
            .as_bytes(),
    );
    let c = Config::from_value(serde_json::json!({
        "url": "https://h", "roster-max-bytes": 4096, "roster-max-providers": 3,
        "roster-public-key": key, "roster-max-age": "30s"
    }))
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.roster_max_bytes, 4096);
    assert_eq!(c.roster_max_providers, 3);
    assert_eq!(c.roster_max_age, Duration::from_secs(30));
    assert!(c.roster_key().unwrap().is_some());
    for bad in ["not base64!", "AAAA"] {
        let mut c = Config::new("https://h");
        c.roster_public_key = bad.into();
        assert!(matches!(c.validate(), Err(ConfigError::InvalidRosterKey)));
    }
    let mut c = Config::new("https://h");
    c.roster_max_providers = 0;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::ZeroLimit {
            key: "roster-max-providers"
        })
    ));
    assert!(Config::from_json(r#"{"url":"https://h","roster-max-bytes":-1}"#).is_err());
}

#[test]
fn debug_redacts_the_token() {
    let mut c = Config::new("https://h");
    c.token = "eyJ-secret".into();
    let shown = format!("{c:?}");
    assert!(!shown.contains("eyJ-secret"), "{shown}");
    assert!(shown.contains("<redacted>"));
}

#[test]
fn debug_shows_urls_without_their_user_information() {
    let mut c = Config::new("https://cc:pw-one@fleet1");
    c.failover_urls = vec!["https://cc:pw-two@fleet2:8443".into(), "a@b:c".into()];
    let shown = format!("{c:?}");
    for secret in ["pw-one", "pw-two", "a@b"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("https://fleet1"), "{shown}");
    assert!(shown.contains("https://fleet2:8443"), "{shown}");
    assert!(format!("{:?}", Config::new("cc.example.org")).contains("cc.example.org"));
}

#[test]
fn schema_lists_exactly_the_accepted_keys() {
    let schema: serde_json::Value = serde_json::from_str(CONFIG_SCHEMA).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["url"]));
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));
    let props = schema["properties"].as_object().unwrap();
    assert_eq!(props.len(), 14);
    for (key, prop) in props {
        // Every key of the schema is accepted by the parser (with a value valid for it).
        let value = if prop["type"] == "integer" {
            serde_json::json!(5)
        } else if key.ends_with("interval") || key == "timeout" || key.ends_with("age") {
            serde_json::json!("5s")
        } else if key == "url" {
            serde_json::json!("https://h")
        } else {
            assert_eq!(prop["type"], "string", "{key}");
            serde_json::json!("x")
        };
        let mut section = serde_json::json!({"url": "https://h"});
        section[key] = value;
        Config::from_value(section).unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

#[test]
fn effective_hostname_prefers_the_configured_one() {
    let mut c = Config::new("https://h");
    c.hostname = "f0101".into();
    assert_eq!(c.effective_hostname().unwrap(), "f0101");
    c.hostname.clear();
    let system = c.effective_hostname().unwrap();
    assert!(!system.is_empty());
}
