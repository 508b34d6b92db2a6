//! cc-metric-collector's sinks (cc-lib's `sinks`), as the agent's sinks.
//!
//! `http` (cc-metric-store's write API), `nats`, `stdout`, `influxdb`, `influxasync`,
//! `prometheus`, `ganglia` and `libganglia` carry over; a JWT or an InfluxDB password moves out of the configuration into a file of
//! its own (the agent reads it from `jwt-file`, `password_file`), and the other kinds are
//! named with the reason they are left out. Each converted sink is read back with the
//! agent's own parser, so what is written is what the agent accepts.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Findings, Secret};

/// The sinks converted: the agent's `sinks` object and, for a `nats` sink, its `nats`
/// section.
#[derive(Debug, Default)]
pub struct Converted {
    /// The `sinks` object.
    pub sinks: Map<String, Value>,
    /// The `nats` section, from the first `nats` sink.
    pub nats: Option<Value>,
    /// Files holding secrets the configuration refers to.
    pub secrets: Vec<Secret>,
    /// Each converted sink's `meta_as_tags` (cc-lib's default: none).
    pub meta_as_tags: BTreeMap<String, Vec<String>>,
}

/// cc-lib's keys of the `influxdb` and `influxasync` sinks, taken as they are (the agent's
/// InfluxDB sinks read the same keys; `password` goes to a file).
const INFLUX_KEYS: &[&str] = &[
    "host",
    "port",
    "database",
    "user",
    "password",
    "organization",
    "ssl",
    "batch_size",
    "flush_delay",
    "flush_interval",
    "custom_flush_interval",
    "precision",
    "http_request_timeout",
    "retry_interval",
    "max_retry_interval",
    "retry_exponential_base",
    "max_retries",
    "max_retry_attempts",
    "max_retry_time",
    "use_gzip",
];

/// cc-lib's keys of the `prometheus` sink.
const PROMETHEUS_KEYS: &[&str] = &["host", "port", "path", "group_as_namespace"];

/// cc-lib's keys of the `ganglia` sink.
const GANGLIA_KEYS: &[&str] = &[
    "gmetric_path",
    "gmetric_config",
    "add_ganglia_group",
    "add_tags_as_desc",
    "cluster_name",
    "add_type_to_name",
    "add_units",
];

/// cc-lib's keys of the `libganglia` sink.
const LIBGANGLIA_KEYS: &[&str] = &[
    "libganglia_path",
    "gmond_config",
    "add_ganglia_group",
    "add_type_to_name",
    "add_units",
    "cluster_name",
];

/// Copies `keys` of `config` into `sink` as they are (an empty string or null left out, as
/// cc-lib's `omitempty` reads them).
fn copy_keys(config: &Map<String, Value>, keys: &[&str], sink: &mut Map<String, Value>) {
    for key in keys {
        match config.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(value) => {
                sink.insert((*key).into(), value.clone());
            }
        }
    }
}

fn text<'a>(config: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    config
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn reason_for(kind: &str) -> String {
    match kind {
        "questdb" => "the agent writes no QuestDB".to_owned(),
        "sample" => "the sample sink is an example without output".to_owned(),
        other => format!("unknown sink type {other:?}"),
    }
}

/// Converts `sinks`; `secrets_dir` is where JWT files are written (relative to the agent
/// configuration).
pub fn convert(
    sinks: &Map<String, Value>,
    secrets_dir: &str,
    findings: &mut Findings,
) -> Converted {
    let mut out = Converted::default();
    for (name, value) in sinks {
        let at = format!("sinks.{name}");
        let Value::Object(config) = value else {
            findings.left_out(&at, "a sink must be a JSON object");
            continue;
        };
        let Some(kind) = text(config, "type") else {
            findings.left_out(&at, "the sink names no `type`");
            continue;
        };
        let mut sink = Map::new();
        let secrets_before = out.secrets.len();
        let mut known: Vec<&str> = vec!["type", "meta_as_tags", "process_messages"];
        match kind {
            "http" => {
                known.extend([
                    "url",
                    "jwt",
                    "username",
                    "password",
                    "timeout",
                    "idle_connection_timeout",
                    "flush_delay",
                    "max_retries",
                    "precision",
                ]);
                let Some(url) = text(config, "url") else {
                    findings.left_out(&at, "the http sink names no `url`");
                    continue;
                };
                if reqwest::Url::parse(url).is_err() {
                    findings.left_out(&at, "the http sink's `url` is not a URL");
                    continue;
                }
                if text(config, "username").is_some() || text(config, "password").is_some() {
                    findings.left_out(
                        &at,
                        "basic authentication (`username`, `password`): the agent authenticates to cc-metric-store with a JWT only",
                    );
                    continue;
                }
                sink.insert("type".into(), json!("http"));
                sink.insert("url".into(), json!(url));
                if let Some(jwt) = text(config, "jwt") {
                    let file = format!("{secrets_dir}/{name}.jwt");
                    out.secrets.push(Secret {
                        path: file.clone().into(),
                        contents: jwt.to_owned(),
                    });
                    sink.insert("jwt-file".into(), json!(file));
                }
                for (from, to) in [("timeout", "timeout"), ("flush_delay", "flush-delay")] {
                    if let Some(v) = text(config, from) {
                        sink.insert(to.into(), json!(v));
                    }
                }
                if config.contains_key("max_retries") {
                    findings.note(
                        &format!("{at}.max_retries"),
                        "the agent retries a failed write with back-off for as long as its retry buffer (retry-buffer, 100,000 points) holds it, rather than a number of times",
                    );
                }
                if config.contains_key("idle_connection_timeout") {
                    findings.note(
                        &format!("{at}.idle_connection_timeout"),
                        "not needed: the agent's HTTP client closes idle connections itself",
                    );
                }
                if let Some(p) = text(config, "precision").filter(|p| *p != "s") {
                    findings.note(
                        &format!("{at}.precision"),
                        &format!("the agent sends timestamps in nanoseconds, as its plugins stamp them, and cc-metric-store detects the precision of each line; {p:?} is not applied"),
                    );
                }
            }
            "nats" => {
                known.extend([
                    "host",
                    "port",
                    "subject",
                    "database",
                    "user",
                    "password",
                    "nkey_file",
                    "flush_delay",
                    "precision",
                ]);
                let Some(subject) = text(config, "subject").or_else(|| text(config, "database"))
                else {
                    findings.left_out(&at, "the nats sink names no `subject` (or `database`)");
                    continue;
                };
                let host = text(config, "host").unwrap_or("localhost");
                let port = match config.get("port") {
                    Some(Value::String(p)) if !p.is_empty() => p.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => "4222".to_owned(),
                };
                let mut section = Map::new();
                section.insert("address".into(), json!(format!("nats://{host}:{port}")));
                if let Some(user) = text(config, "user") {
                    section.insert("username".into(), json!(user));
                    section.insert(
                        "password".into(),
                        json!(text(config, "password").unwrap_or_default()),
                    );
                } else if let Some(file) = text(config, "nkey_file") {
                    // cc-lib hands this file to the NATS client as user credentials.
                    section.insert("creds-file-path".into(), json!(file));
                }
                match &out.nats {
                    None => out.nats = Some(Value::Object(section)),
                    Some(first) if *first == Value::Object(section.clone()) => {}
                    Some(_) => {
                        findings.left_out(
                            &at,
                            "a second NATS server or login: the agent has one NATS connection, taken from the first nats sink",
                        );
                        continue;
                    }
                }
                sink.insert("type".into(), json!("nats"));
                sink.insert("subject".into(), json!(subject));
                if config.contains_key("flush_delay") {
                    findings.note(
                        &format!("{at}.flush_delay"),
                        "the agent publishes each collect round's points as they come",
                    );
                }
            }
            "stdout" => {
                known.push("output_file");
                if let Some(file) = text(config, "output_file") {
                    let _ = file;
                    findings.left_out(
                        &at,
                        "`output_file`: the agent's stdout sink writes to standard output only (systemd's StandardOutput= can send it to a file)",
                    );
                    continue;
                }
                sink.insert("type".into(), json!("stdout"));
            }
            "influxdb" | "influxasync" => {
                known.extend(INFLUX_KEYS);
                sink.insert("type".into(), json!(kind));
                for key in INFLUX_KEYS {
                    let Some(value) = config.get(*key) else {
                        continue;
                    };
                    // cc-lib leaves an empty string out (`omitempty`).
                    if value.as_str().is_some_and(str::is_empty) || value.is_null() {
                        continue;
                    }
                    if *key == "password"
                        && let Some(password) = value.as_str()
                    {
                        let file = format!("{secrets_dir}/{name}.password");
                        out.secrets.push(Secret {
                            path: file.clone().into(),
                            contents: password.to_owned(),
                        });
                        sink.insert("password_file".into(), json!(file));
                    } else {
                        sink.insert((*key).into(), value.clone());
                    }
                }
            }
            "prometheus" => {
                known.extend(PROMETHEUS_KEYS);
                sink.insert("type".into(), json!(kind));
                copy_keys(config, PROMETHEUS_KEYS, &mut sink);
            }
            "ganglia" | "libganglia" => {
                let keys = if kind == "ganglia" {
                    GANGLIA_KEYS
                } else {
                    LIBGANGLIA_KEYS
                };
                known.extend(keys);
                sink.insert("type".into(), json!(kind));
                copy_keys(config, keys, &mut sink);
            }
            other => {
                findings.left_out(&at, &reason_for(other));
                continue;
            }
        }
        // What the agent would refuse is left out here, with its reason.
        if let Err(why) = crate::agent::sinks::SinkConfig::from_map(sink.clone())
            .and_then(|c| c.validate(name).map(|()| c))
        {
            findings.left_out(&at, &why);
            out.secrets.truncate(secrets_before);
            continue;
        }
        if let Some(rules) = config.get("process_messages")
            && rules.as_object().is_some_and(|m| !m.is_empty())
        {
            findings.left_out(
                &format!("{at}.process_messages"),
                "the agent applies one message processor to every sink (the router's process_messages); rules of a single sink are not carried over",
            );
        }
        for key in config.keys().filter(|k| !known.contains(&k.as_str())) {
            findings.note(
                &format!("{at}.{key}"),
                "not a setting of this sink type: left out",
            );
        }
        let mut tags: Vec<String> = config
            .get("meta_as_tags")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        // cc-lib's Ganglia sinks send the unit from the meta information whatever their
        // meta_as_tags; the agent's read it from the plugins' `unit` tag.
        let units = config.get("add_units").and_then(Value::as_bool);
        if (units == Some(true) || (kind == "libganglia" && units.is_none()))
            && !tags.iter().any(|t| t == "unit")
        {
            tags.push("unit".to_owned());
        }
        out.meta_as_tags.insert(name.clone(), tags);
        out.sinks.insert(name.clone(), Value::Object(sink));
    }
    out
}

/// cc-lib's sinks write as tags the meta keys their own `meta_as_tags` names (none by
/// default). The agent's plugins write meta as tags for every sink (their `meta_as_tags`,
/// default `["unit"]`) and a sink's own `meta_as_tags` removes those it does not name: so
/// the plugins get the union of the sinks' lists (returned; `None` without sinks), and a
/// sink whose list is not the whole union keeps its list.
pub fn share_meta_as_tags(converted: &mut Converted) -> Option<Vec<String>> {
    if converted.meta_as_tags.is_empty() {
        return None;
    }
    let union: std::collections::BTreeSet<&String> =
        converted.meta_as_tags.values().flatten().collect();
    let union: Vec<String> = union.into_iter().cloned().collect();
    for (name, tags) in &converted.meta_as_tags {
        let mut own = tags.clone();
        own.sort();
        own.dedup();
        if own != union
            && let Some(Value::Object(sink)) = converted.sinks.get_mut(name)
        {
            sink.insert("meta_as_tags".into(), json!(tags));
        }
    }
    Some(union)
}
