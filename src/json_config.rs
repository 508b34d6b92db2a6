//! Reading configuration files so that a mistake names its key and the form it takes.
//!
//! serde_json alone reports `invalid type: integer 18081, expected a string at line 2
//! column 15`, which leaves the reader to count lines and guess what a string should hold.
//! [`from_str`] and [`from_value`] track the path of the value being read
//! (`fleet.stale-after`, `plugins[0].path`) and, for a value of the wrong type or form, add
//! what the key takes (`a string "host:port", e.g. "127.0.0.1:8080"`), from the key's
//! name: the configuration files of the server, the agent and the fleet client share their
//! naming (durations end in `-interval`, `-timeout`, ...; paths in `-dir`, `-file`, ...).

use std::fmt;

use serde::de::DeserializeOwned;

use crate::untrusted::Untrusted;

/// Longest key path quoted in a message (a key is whatever the file holds).
const PATH_CAP: usize = 200;

/// A configuration value that could not be read, with the path of its key.
#[derive(Debug)]
pub struct KeyError {
    path: String,
    source: serde_json::Error,
}

impl KeyError {
    /// The key path of the value that failed (`fleet.stale-after`, `plugins[0].path`); empty
    /// for the top level (broken JSON, a file that is not an object).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The same error for text that was the section `prefix` of a larger file: its path is
    /// put below `prefix` (`heartbeat-interval` -> `fleet.heartbeat-interval`).
    pub fn within(mut self, prefix: &str) -> KeyError {
        self.path = if self.path.is_empty() {
            prefix.to_owned()
        } else if self.path.starts_with('[') {
            format!("{prefix}{}", self.path)
        } else {
            format!("{prefix}.{}", self.path)
        };
        self
    }

    /// The JSON error as serde_json reported it.
    pub fn json(&self) -> &serde_json::Error {
        &self.source
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            return write!(f, "{}", self.source);
        }
        write!(
            f,
            "{}: {}",
            Untrusted(&self.path).capped(PATH_CAP),
            self.source
        )?;
        let message = self.source.to_string();
        let about_the_value = ["invalid type", "invalid value", "invalid length"]
            .iter()
            .any(|start| message.starts_with(start));
        // For an unknown or missing field the form is not the question.
        if about_the_value && let Some(form) = expected_form(leaf(&self.path)) {
            write!(f, "; {} takes {form}", leaf(&self.path))?;
        }
        Ok(())
    }
}

// The JSON error stays inside the message: `source()` would make callers that print the
// chain repeat it.
impl std::error::Error for KeyError {}

/// Parses configuration text, naming the key of a value that does not fit.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, KeyError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(keyed(""))?;
    deserializer.end().map_err(|source| KeyError {
        path: String::new(),
        source,
    })?;
    Ok(value)
}

/// Reads a section already parsed as JSON; `prefix` is the section's own key path
/// (`fleet`), put before the keys inside it.
pub fn from_value<T: DeserializeOwned>(
    value: serde_json::Value,
    prefix: &str,
) -> Result<T, KeyError> {
    serde_path_to_error::deserialize(value).map_err(keyed(prefix))
}

fn keyed(prefix: &str) -> impl FnOnce(serde_path_to_error::Error<serde_json::Error>) -> KeyError {
    move |e| {
        use serde_json::error::Category;
        // Broken JSON is found at a position, not at a key (the path would end in `?`).
        let at_a_key = matches!(e.inner().classify(), Category::Data);
        let inner = e.path().to_string();
        let path = match (prefix.is_empty(), inner.as_str()) {
            _ if !at_a_key => prefix.to_owned(),
            (_, ".") => prefix.to_owned(),
            (true, _) => inner,
            (false, _) => format!("{prefix}.{inner}"),
        };
        KeyError {
            path,
            source: e.into_inner(),
        }
    }
}

/// The last key of a path, without an array index: `plugins[0].path` -> `path`,
/// `api-allowed-ips[2]` -> `api-allowed-ips`.
fn leaf(path: &str) -> &str {
    let last = path.rsplit('.').next().unwrap_or(path);
    last.split('[').next().unwrap_or(last)
}

/// What a key of the configuration files takes, known from its name.
pub fn expected_form(key: &str) -> Option<&'static str> {
    const DURATION: &str = "a Go duration string such as \"30s\", \"1m30s\" or \"1.5h\"";
    const PATH: &str = "a file system path as a string";
    Some(match key {
        "addr" | "metrics-addr" => "a string \"host:port\", e.g. \"127.0.0.1:8080\"",
        "url" => {
            "a URL string such as \"http://127.0.0.1:8080\", or an array of them (several fleet servers)"
        }
        "address" => "a NATS URL string such as \"nats://127.0.0.1:4222\"",
        "service-type" | "serviceType" => {
            "a service type string: one of \"ccms\", \"ccmc\", \"ccb\", \"cces\", \"ccsa\", \"ccnc\", \"ccem\""
        }
        "api-allowed-ips" | "trusted-proxies" => {
            "an array of strings: addresses or CIDR ranges such as \"10.0.0.0/8\""
        }
        "read-files" | "read-dirs" | "static-endpoints" => "an array of strings",
        "meta" | "tags" => "an object of strings, e.g. {\"rack\": \"r1\"}",
        "db" | "path" | "cache-path" => PATH,
        "disable-authentication" | "gzip" | "wasi" | "host-ip" | "k8s-api-insecure" => {
            "true or false"
        }
        "replicas" => "an integer from 1 to 5",
        "port" => "a port number (an integer from 1 to 65535)",
        "provider" => "a string: DNS, K8S-PODS, NOMAD, NOMAD+K8S-PODS or STATIC",
        "type" => "a string naming the kind (see the documentation of the section)",
        _ if key.ends_with("-dir") || key.ends_with("-file") || key.ends_with("-path") => PATH,
        _ if [
            "interval", "timeout", "after", "debounce", "-age", "ttl", "wait", "delay", "backoff",
            "period",
        ]
        .iter()
        .any(|end| key.ends_with(end)) =>
        {
            DURATION
        }
        _ if [
            "-bytes",
            "-size",
            "-connections",
            "-concurrency",
            "-messages",
            "-providers",
            "-points",
            "-mb",
            "-budget",
            "-burst",
            "-second",
            "-buffer",
        ]
        .iter()
        .any(|end| key.ends_with(end)) =>
        {
            "a positive integer"
        }
        _ if key.ends_with("-subject") || key.ends_with("-prefix") || key.ends_with("-key") => {
            "a string"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    #[allow(dead_code)]
    struct Config {
        addr: Option<String>,
        #[serde(default)]
        fleet: Fleet,
        #[serde(default)]
        plugins: Vec<Plugin>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    #[allow(dead_code)]
    struct Fleet {
        stale_after: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    #[allow(dead_code)]
    struct Plugin {
        path: String,
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key_and_form() {
        let e = from_str::<Config>("{\n  \"addr\": 18081\n}").unwrap_err();
        let text = e.to_string();
        assert_eq!(e.path(), "addr");
        assert!(
            text.starts_with("addr: invalid type: integer `18081`"),
            "{text}"
        );
        assert!(text.contains("line 2 column"), "{text}");
        assert!(text.contains("\"host:port\""), "{text}");

        let e = from_str::<Config>(r#"{"fleet": {"stale-after": 90}}"#).unwrap_err();
        assert_eq!(e.path(), "fleet.stale-after");
        assert!(e.to_string().contains("Go duration"), "{e}");

        let e = from_str::<Config>(r#"{"plugins": [{"path": "a"}, {"path": 1}]}"#).unwrap_err();
        assert_eq!(e.path(), "plugins[1].path");
        assert!(e.to_string().contains("path"), "{e}");
    }

    #[test]
    fn an_unknown_key_is_named_without_a_form() {
        let e = from_str::<Config>(r#"{"fleet": {"bogus": 1}}"#).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("fleet.bogus: unknown field `bogus`"),
            "{text}"
        );
        assert!(!text.contains(" takes "), "{text}");
        let e = from_str::<Config>("{\"addr\": \"x\"").unwrap_err();
        assert_eq!(e.path(), "");
        let e = from_str::<Config>("{} {}").unwrap_err();
        assert!(e.to_string().contains("trailing characters"), "{e}");
    }

    #[test]
    fn a_section_read_from_a_value_gets_its_prefix() {
        let value = serde_json::json!({"stale-after": false});
        let e = from_value::<Fleet>(value, "fleet").unwrap_err();
        assert_eq!(e.path(), "fleet.stale-after");
    }

    #[test]
    fn leaves_and_forms() {
        assert_eq!(leaf("plugins[0].path"), "path");
        assert_eq!(leaf("api-allowed-ips[2]"), "api-allowed-ips");
        assert_eq!(leaf("addr"), "addr");
        assert!(
            expected_form("heartbeat-interval")
                .unwrap()
                .contains("duration")
        );
        assert!(expected_form("config-dir").unwrap().contains("path"));
        assert!(
            expected_form("roster-max-bytes")
                .unwrap()
                .contains("integer")
        );
        assert!(expected_form("whatever").is_none());
    }
}
