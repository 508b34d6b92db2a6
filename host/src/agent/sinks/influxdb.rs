//! The `influxdb` and `influxasync` sinks: InfluxDB's write API with cc-lib's keys.
//!
//! cc-lib writes through InfluxDB's v2 API (`POST /api/v2/write?org=&bucket=&precision=`,
//! `Authorization: Token <password>` or `Token <user>:<password>`); `"api": "v1"` writes to
//! the 1.x API instead (`POST /write?db=&precision=`, basic authentication with `user` and
//! `password`), for InfluxDB before 1.8. Both kinds use the batching writer of the `http`
//! sink: requests of `batch_size` points or what `flush_delay` gathered, a bounded retry
//! buffer (`retry_buffer` points, the oldest dropped first), exponential back-off
//! (`retry_interval`, `retry_exponential_base`, `max_retry_interval`) and optional gzip.
//! cc-lib's `influxasync` is the same writer here: no sink blocks a plugin in the agent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::duration::serde_go;
use reqwest::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;

use super::batch::{self, Batching, Outcome, Writer};

/// Points kept for retrying by default; beyond it the oldest batches are dropped.
pub const DEFAULT_RETRY_BUFFER: usize = 100_000;

/// A port as cc-lib gives it: a string (`"8086"`) or a number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Port {
    /// `"8086"`.
    Text(String),
    /// `8086`.
    Number(u16),
}

impl Port {
    /// The port number.
    pub fn number(&self) -> Result<u16, String> {
        match self {
            Port::Number(n) => Ok(*n),
            Port::Text(s) => s
                .trim()
                .parse()
                .map_err(|_| format!("port {s:?} is not a port number")),
        }
    }
}

/// Which of InfluxDB's write APIs the sink uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `/api/v2/write` (InfluxDB 2.x, 1.8 and later, VictoriaMetrics), as cc-lib writes.
    #[default]
    V2,
    /// `/write` (InfluxDB 1.x, VictoriaMetrics).
    V1,
}

/// The keys of an `influxdb` or `influxasync` sink: cc-lib's, plus `api`, `password_file`
/// and `retry_buffer`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct InfluxConfig {
    /// The server's host name or address.
    pub host: String,
    /// Its port.
    pub port: Port,
    /// The bucket (v2) or database (v1).
    pub database: String,
    /// The user (v2: sent as `Token <user>:<password>`; v1: basic authentication).
    #[serde(default)]
    pub user: Option<String>,
    /// The password or token, given in the configuration.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password or token (instead of `password`).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The organization (v2).
    #[serde(default)]
    pub organization: Option<String>,
    /// `https` instead of `http`.
    #[serde(default)]
    pub ssl: bool,
    /// `v2` (default) or `v1`.
    #[serde(default)]
    pub api: Api,
    /// Points per request.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The longest a point waits for its batch to fill (`influxdb`).
    #[serde(default, deserialize_with = "optional_duration")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub flush_delay: Option<Duration>,
    /// `influxasync`: the flush interval in milliseconds.
    #[serde(default)]
    pub flush_interval: Option<u64>,
    /// `influxasync`: the flush interval as a duration.
    #[serde(default, deserialize_with = "optional_duration")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub custom_flush_interval: Option<Duration>,
    /// `s` (cc-lib's default), `ms`, `us` or `ns`: timestamps are sent in this unit.
    #[serde(default = "default_precision")]
    pub precision: String,
    /// The bound of one request.
    #[serde(default = "default_timeout", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub http_request_timeout: Duration,
    /// The first retry's delay.
    #[serde(default = "default_retry_interval", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub retry_interval: Duration,
    /// The longest delay between retries.
    #[serde(default = "default_max_retry_interval", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_retry_interval: Duration,
    /// What the delay is multiplied with after each failure in a row.
    #[serde(default = "default_base")]
    pub retry_exponential_base: u32,
    /// Failed attempts after which a batch is dropped (default: retried while the buffer
    /// holds it).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// `influxasync`'s name for `max_retries`.
    #[serde(default)]
    pub max_retry_attempts: Option<u32>,
    /// How long a batch is retried before it is dropped.
    #[serde(default, deserialize_with = "optional_duration")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub max_retry_time: Option<Duration>,
    /// Points kept for retrying; when full, the oldest batch is dropped.
    #[serde(default = "default_retry_buffer")]
    pub retry_buffer: usize,
    /// Compress request bodies.
    #[serde(default)]
    pub use_gzip: bool,
}

/// An optional Go duration string.
fn optional_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| ccfleet::duration::parse(&s).map_err(serde::de::Error::custom))
        .transpose()
}

fn default_batch_size() -> usize {
    1000
}
fn default_precision() -> String {
    "s".to_owned()
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_retry_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_max_retry_interval() -> Duration {
    Duration::from_secs(125)
}
fn default_base() -> u32 {
    2
}
fn default_retry_buffer() -> usize {
    DEFAULT_RETRY_BUFFER
}

/// Nanoseconds per unit of a precision, and the names the two APIs give it.
fn precision(name: &str) -> Option<(i64, &'static str, &'static str)> {
    Some(match name {
        "s" => (1_000_000_000, "s", "s"),
        "ms" => (1_000_000, "ms", "ms"),
        "us" => (1_000, "us", "u"),
        "ns" => (1, "ns", "n"),
        _ => return None,
    })
}

impl InfluxConfig {
    /// Checks for missing and impossible values.
    pub fn validate(&self) -> Result<(), String> {
        if self.host.trim().is_empty() {
            return Err("host is empty".to_owned());
        }
        self.port.number()?;
        if self.database.is_empty() {
            return Err("database (the bucket) is empty".to_owned());
        }
        if self.api == Api::V2 && self.organization.as_deref().is_none_or(str::is_empty) {
            return Err(
                "the v2 API needs an organization (or give \"api\": \"v1\" for InfluxDB 1.x)"
                    .to_owned(),
            );
        }
        if self.password.is_some() && self.password_file.is_some() {
            return Err("give password or password_file, not both".to_owned());
        }
        if precision(&self.precision).is_none() {
            return Err(format!(
                "precision {:?}: one of s, ms, us, ns",
                ccfleet::untrusted::Untrusted(&self.precision).capped(16)
            ));
        }
        if self.http_request_timeout.is_zero() {
            return Err("http_request_timeout must be positive".to_owned());
        }
        self.batching().validate()
    }

    /// Resolves a relative `password_file` against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(file) = &mut self.password_file
            && file.is_relative()
        {
            *file = base.join(&*file);
        }
    }

    pub(crate) fn batching(&self) -> Batching {
        let flush_delay = self
            .flush_delay
            .or(self.custom_flush_interval)
            .or(self.flush_interval.map(Duration::from_millis))
            .unwrap_or(Duration::from_secs(1));
        Batching {
            batch_size: self.batch_size,
            flush_delay,
            retry_buffer: self.retry_buffer,
            retry_backoff: self.retry_interval,
            max_retry_backoff: self.max_retry_interval.max(self.retry_interval),
            backoff_base: self.retry_exponential_base,
            max_retries: self.max_retries.or(self.max_retry_attempts),
            max_retry_time: self.max_retry_time,
            gzip: self.use_gzip,
        }
    }

    /// The write URL.
    pub fn write_url(&self) -> Result<reqwest::Url, String> {
        let scheme = if self.ssl { "https" } else { "http" };
        let port = self.port.number()?;
        let host = self.host.trim();
        // An IPv6 address goes in brackets.
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let (_, v2, v1) = precision(&self.precision).ok_or("unknown precision")?;
        let mut url = reqwest::Url::parse(&format!("{scheme}://{host}:{port}/"))
            .map_err(|e| format!("host {host:?}: {e}"))?;
        match self.api {
            Api::V2 => {
                url.set_path("/api/v2/write");
                url.query_pairs_mut()
                    .append_pair("org", self.organization.as_deref().unwrap_or_default())
                    .append_pair("bucket", &self.database)
                    .append_pair("precision", v2);
            }
            Api::V1 => {
                url.set_path("/write");
                url.query_pairs_mut()
                    .append_pair("db", &self.database)
                    .append_pair("precision", v1);
            }
        }
        Ok(url)
    }
}

/// The `Authorization` header: shown nowhere (`Debug` prints a placeholder).
struct Auth(HeaderValue);

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<credentials>")
    }
}

fn auth(name: &str, config: &InfluxConfig) -> Result<Option<Auth>, String> {
    let password = if let Some(file) = &config.password_file {
        let text = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "sinks.{name}: cannot read password_file {}: {}",
                file.display(),
                e.kind()
            )
        })?;
        Some(text.trim().to_owned())
    } else {
        config.password.clone()
    };
    let user = config.user.as_deref().filter(|u| !u.is_empty());
    let password = password.filter(|p| !p.is_empty());
    let text = match (config.api, user, password) {
        (_, None, None) => return Ok(None),
        (Api::V2, None, Some(token)) => format!("Token {token}"),
        (Api::V2, Some(user), password) => {
            format!("Token {user}:{}", password.unwrap_or_default())
        }
        (Api::V1, user, password) => {
            use base64::Engine;
            let pair = format!(
                "{}:{}",
                user.unwrap_or_default(),
                password.unwrap_or_default()
            );
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        }
    };
    let mut value = HeaderValue::from_str(&text).map_err(|_| {
        format!("sinks.{name}: the user or password holds characters a header cannot carry")
    })?;
    value.set_sensitive(true);
    Ok(Some(Auth(value)))
}

/// A running `influxdb` or `influxasync` sink.
pub(crate) struct InfluxSink {
    client: reqwest::Client,
    url: reqwest::Url,
    auth: Option<Auth>,
    /// Nanoseconds per unit of the precision sent.
    divisor: i64,
    gzip: bool,
}

impl InfluxSink {
    /// The sink `name` of `config`.
    pub(crate) fn new(name: &str, config: &InfluxConfig) -> Result<InfluxSink, String> {
        let url = config
            .write_url()
            .map_err(|e| format!("sinks.{name}: {e}"))?;
        let auth = auth(name, config)?;
        let (divisor, _, _) = precision(&config.precision).ok_or("unknown precision")?;
        let client = ccfleet::tls::http_client_builder()
            .timeout(config.http_request_timeout)
            .build()
            .map_err(|e| format!("sinks.{name}: HTTP client: {e}"))?;
        tracing::info!(sink = %name, url = %batch::shown_url(&url), "metrics go to InfluxDB");
        Ok(InfluxSink {
            client,
            url,
            auth,
            divisor,
            gzip: config.use_gzip,
        })
    }
}

impl Writer for InfluxSink {
    fn receiver(&self) -> &'static str {
        "InfluxDB"
    }

    fn shown_url(&self) -> String {
        batch::shown_url(&self.url)
    }

    fn encode(&self, lines: Vec<u8>) -> (Vec<u8>, usize) {
        if self.divisor == 1 {
            (lines, 0)
        } else {
            (with_precision(&lines, self.divisor), 0)
        }
    }

    async fn post(&self, body: bytes::Bytes) -> Outcome {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(body);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.0.clone());
        }
        if self.gzip {
            request = request.header(CONTENT_ENCODING, "gzip");
        }
        batch::send(request, |_| None).await
    }
}

/// `lines` with each line's nanosecond timestamp divided by `divisor` (rounded down). A line
/// whose last token is not an integer (no timestamp) is left as it is.
pub fn with_precision(lines: &[u8], divisor: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.len());
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let stamp = body
            .iter()
            .rposition(|&b| b == b' ')
            .map(|at| (at, &body[at + 1..]))
            .and_then(|(at, token)| Some((at, parse_int(token)?)));
        match stamp {
            Some((at, nanos)) => {
                out.extend_from_slice(&body[..=at]);
                let mut digits = itoa_buf(nanos.div_euclid(divisor));
                out.append(&mut digits);
                if body.len() < line.len() {
                    out.push(b'\n');
                }
            }
            None => out.extend_from_slice(line),
        }
    }
    out
}

fn parse_int(token: &[u8]) -> Option<i64> {
    let (negative, digits) = match token.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, token),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -n } else { n })
}

fn itoa_buf(n: i64) -> Vec<u8> {
    n.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> InfluxConfig {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn timestamps_are_sent_in_the_configured_precision_and_other_lines_unchanged() {
        let lines = b"m,t=a value=1 1700000000123456789\nm value=\"a b\"\nm value=2 -1500000000\nm value=3 12";
        assert_eq!(
            with_precision(lines, 1_000_000_000),
            b"m,t=a value=1 1700000000\nm value=\"a b\"\nm value=2 -2\nm value=3 0".to_vec()
        );
        assert_eq!(
            with_precision(b"m value=1 1700000000123456789\n", 1_000_000),
            b"m value=1 1700000000123\n".to_vec()
        );
    }

    #[test]
    fn the_v2_and_v1_urls_and_credentials_are_those_influxdb_expects() {
        let v2 = config(
            serde_json::json!({"host": "db", "port": "8086", "database": "fritz",
            "organization": "cc", "user": "u", "password": "p", "ssl": true}),
        );
        assert_eq!(
            v2.write_url().unwrap().as_str(),
            "https://db:8086/api/v2/write?org=cc&bucket=fritz&precision=s"
        );
        let auth_v2 = auth("n", &v2).unwrap().unwrap();
        assert_eq!(auth_v2.0.to_str().unwrap(), "Token u:p");
        assert!(!format!("{auth_v2:?}").contains('p'));
        let v1 = config(
            serde_json::json!({"host": "::1", "port": 8086, "database": "fritz",
            "api": "v1", "user": "u", "password": "p", "precision": "ns"}),
        );
        assert_eq!(
            v1.write_url().unwrap().as_str(),
            "http://[::1]:8086/write?db=fritz&precision=n"
        );
        assert_eq!(
            auth("n", &v1).unwrap().unwrap().0.to_str().unwrap(),
            "Basic dTpw"
        );
        let no_org = config(serde_json::json!({"host": "db", "port": "8086", "database": "x"}));
        assert!(no_org.validate().unwrap_err().contains("organization"));
        let bad = config(
            serde_json::json!({"host": "db", "port": "x", "database": "x",
            "organization": "o"}),
        );
        assert!(bad.validate().unwrap_err().contains("port"));
    }
}
