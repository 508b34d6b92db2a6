//! The `http` sink: cc-metric-store's `POST /api/write?cluster=...`, JWT bearer auth,
//! batching, a bounded retry buffer and optional gzip (through the `batch` module).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::duration::serde_go;
use ccfleet::lineproto::FieldValue;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;

use super::batch::{self, Batching, Outcome, Writer};

/// Points per cc-metric-store request by default (cc-metric-collector's default too).
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Points the HTTP sink keeps for retrying by default; beyond it the oldest are dropped.
pub const DEFAULT_RETRY_BUFFER: usize = 100_000;

/// The keys of an `http` sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HttpConfig {
    /// The write endpoint, e.g. `http://ms01:8082/api/write`.
    pub url: String,
    /// The `cluster` query parameter (default: the fleet section's cluster).
    #[serde(default)]
    pub cluster: Option<String>,
    /// A file holding the JWT sent as `Authorization: Bearer`.
    #[serde(default)]
    pub jwt_file: Option<PathBuf>,
    /// An environment variable holding the JWT.
    #[serde(default)]
    pub jwt_env: Option<String>,
    /// Points per request; a request is sent once this many are pending.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The longest a point waits for its batch to fill.
    #[serde(default = "default_flush_delay", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub flush_delay: Duration,
    /// The bound of one request.
    #[serde(default = "default_timeout", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub timeout: Duration,
    /// Points kept for retrying; when full, the oldest batch is dropped.
    #[serde(default = "default_retry_buffer")]
    pub retry_buffer: usize,
    /// The first retry's delay; it doubles with each failure in a row.
    #[serde(default = "default_retry_backoff", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub retry_backoff: Duration,
    /// The longest delay between retries.
    #[serde(default = "default_max_retry_backoff", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_retry_backoff: Duration,
    /// Compress request bodies (`Content-Encoding: gzip`).
    #[serde(default)]
    pub gzip: bool,
}

fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}
fn default_flush_delay() -> Duration {
    Duration::from_secs(1)
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_retry_buffer() -> usize {
    DEFAULT_RETRY_BUFFER
}
fn default_retry_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_max_retry_backoff() -> Duration {
    Duration::from_secs(30)
}

impl HttpConfig {
    /// An `http` sink posting to `url`, every other key at its default.
    pub fn new(url: impl Into<String>) -> HttpConfig {
        HttpConfig {
            url: url.into(),
            cluster: None,
            jwt_file: None,
            jwt_env: None,
            batch_size: DEFAULT_BATCH_SIZE,
            flush_delay: default_flush_delay(),
            timeout: default_timeout(),
            retry_buffer: DEFAULT_RETRY_BUFFER,
            retry_backoff: default_retry_backoff(),
            max_retry_backoff: default_max_retry_backoff(),
            gzip: false,
        }
    }

    /// Checks for impossible values.
    pub fn validate(&self) -> Result<(), String> {
        match reqwest::Url::parse(&self.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(_) => return Err("url must be http:// or https://".to_owned()),
            Err(e) => return Err(format!("url is not a URL: {e}")),
        }
        if self.jwt_file.is_some() && self.jwt_env.is_some() {
            return Err("give jwt-file or jwt-env, not both".to_owned());
        }
        if self.batch_size == 0 || self.retry_buffer == 0 {
            return Err("batch-size and retry-buffer must be positive".to_owned());
        }
        if self.retry_buffer < self.batch_size {
            return Err("retry-buffer must hold at least one batch (batch-size points)".to_owned());
        }
        if self.flush_delay.is_zero() || self.timeout.is_zero() || self.retry_backoff.is_zero() {
            return Err("flush-delay, timeout and retry-backoff must be positive".to_owned());
        }
        Ok(())
    }

    /// Resolves a relative `jwt-file` against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(file) = &mut self.jwt_file
            && file.is_relative()
        {
            *file = base.join(&*file);
        }
    }

    pub(crate) fn batching(&self) -> Batching {
        Batching {
            batch_size: self.batch_size,
            flush_delay: self.flush_delay,
            retry_buffer: self.retry_buffer,
            retry_backoff: self.retry_backoff,
            max_retry_backoff: self.max_retry_backoff,
            backoff_base: 2,
            max_retries: None,
            max_retry_time: None,
            gzip: self.gzip,
        }
    }
}

/// A JWT: shown nowhere (`Debug` prints a placeholder).
#[derive(Clone)]
pub(crate) struct Jwt(HeaderValue);

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<jwt>")
    }
}

/// Reads the JWT of an HTTP sink: errors name the file or variable, never the value.
pub(crate) fn read_jwt(name: &str, config: &HttpConfig) -> Result<Option<Jwt>, String> {
    let raw = if let Some(file) = &config.jwt_file {
        std::fs::read_to_string(file).map_err(|e| {
            format!(
                "sinks.{name}: cannot read jwt-file {}: {}",
                file.display(),
                e.kind()
            )
        })?
    } else if let Some(var) = &config.jwt_env {
        std::env::var(var).map_err(|_| {
            format!("sinks.{name}: environment variable {var} (jwt-env) is not set or not UTF-8")
        })?
    } else {
        return Ok(None);
    };
    let token = raw.trim();
    if token.is_empty() {
        return Err(format!("sinks.{name}: the JWT is empty"));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| format!("sinks.{name}: the JWT holds characters a header cannot carry"))?;
    value.set_sensitive(true);
    Ok(Some(Jwt(value)))
}

/// What the HTTP sink posts to, resolved from its configuration.
pub(crate) fn write_url(config: &HttpConfig, fleet_cluster: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(&config.url).map_err(|e| format!("url is not a URL: {e}"))?;
    let cluster = config.cluster.as_deref().unwrap_or(fleet_cluster);
    if !cluster.is_empty() && !url.query_pairs().any(|(k, _)| k == "cluster") {
        url.query_pairs_mut().append_pair("cluster", cluster);
    }
    Ok(url)
}

/// The identity of a file's contents as far as `stat` tells: a token rotated by rewriting
/// the file or by renaming a new one over it changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// A running `http` sink.
pub(crate) struct HttpSink {
    name: String,
    client: reqwest::Client,
    url: reqwest::Url,
    jwt: Option<Jwt>,
    /// What `jwt-file` looked like when `jwt` was read from it, to notice a rotated token.
    jwt_stamp: Option<FileStamp>,
    /// Whether the latest attempt to re-read `jwt-file` failed (logged once per spell).
    jwt_unreadable: bool,
    config: HttpConfig,
}

impl HttpSink {
    /// The sink `name` of `config`; `fleet_cluster` is the default `cluster`.
    pub(crate) fn new(
        name: &str,
        config: &HttpConfig,
        fleet_cluster: &str,
    ) -> Result<HttpSink, String> {
        let jwt_stamp = config.jwt_file.as_deref().and_then(FileStamp::of);
        let jwt = read_jwt(name, config)?;
        let url = write_url(config, fleet_cluster).map_err(|e| format!("sinks.{name}: {e}"))?;
        if jwt.is_none() {
            tracing::warn!(sink = %name, "no jwt-file or jwt-env: cc-metric-store answers 401 unless its authentication is off");
        }
        // Trust anchors read at the first TLS handshake, not here.
        let client = ccfleet::tls::http_client_builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| format!("sinks.{name}: HTTP client: {e}"))?;
        tracing::info!(sink = %name, host = url.host_str().unwrap_or(""), "metrics go to cc-metric-store");
        Ok(HttpSink {
            name: name.to_owned(),
            client,
            url,
            jwt,
            jwt_stamp,
            jwt_unreadable: false,
            config: config.clone(),
        })
    }
}

impl Writer for HttpSink {
    fn receiver(&self) -> &'static str {
        "cc-metric-store"
    }

    fn shown_url(&self) -> String {
        batch::shown_url(&self.url)
    }

    fn encode(&self, lines: Vec<u8>) -> (Vec<u8>, usize) {
        numeric_only(lines)
    }

    /// Takes a rotated token from `jwt-file`: JWTs expire, and an operator who replaces the
    /// file must not have to restart the agent. One `stat` per request; the file is read
    /// again only when it changed. An unreadable or invalid file keeps the previous token.
    fn prepare(&mut self) {
        let Some(file) = &self.config.jwt_file else {
            return;
        };
        let stamp = FileStamp::of(file);
        if stamp.is_some() && stamp == self.jwt_stamp {
            return;
        }
        match read_jwt(&self.name, &self.config) {
            Ok(jwt) => {
                if self.jwt_unreadable || self.jwt_stamp.is_some() {
                    tracing::info!(sink = %self.name, "read the JWT again from jwt-file (it changed)");
                }
                self.jwt = jwt;
                self.jwt_stamp = stamp;
                self.jwt_unreadable = false;
            }
            Err(error) => {
                if !self.jwt_unreadable {
                    tracing::warn!(sink = %self.name, %error, "keeping the previous JWT");
                    self.jwt_unreadable = true;
                }
            }
        }
    }

    async fn post(&self, body: bytes::Bytes) -> Outcome {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(body);
        if let Some(jwt) = &self.jwt {
            request = request.header(AUTHORIZATION, jwt.0.clone());
        }
        if self.config.gzip {
            request = request.header(CONTENT_ENCODING, "gzip");
        }
        // A token from a file may be replaced while the batch waits: 401 and 403 keep it
        // (within the bounded buffer) when the token can change without a restart.
        let token_may_change = self.config.jwt_file.is_some();
        batch::send(request, |status| {
            (token_may_change
                && matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN))
            .then(|| {
                format!(
                    "status {status}: cc-metric-store refused the JWT; replace jwt-file and it is read again"
                )
            })
        })
        .await
    }
}

/// The lines cc-metric-store takes: it keeps float and integer values only, and a point with
/// a string or boolean value (the `nvidia` collector's `nv_ecc_mode="ON"`, as
/// cc-metric-collector's) makes it refuse the rest of the request with 400, so one such point
/// would cost every point behind it. Those points are left out and counted as refused.
fn numeric_only(lines: Vec<u8>) -> (Vec<u8>, usize) {
    let numeric = |line: &[u8]| {
        ccfleet::lineproto::Decoder::new(line).all(|parsed| {
            parsed.is_ok_and(|p| {
                p.fields().all(|(_, v)| {
                    matches!(
                        v,
                        FieldValue::Float(_) | FieldValue::Int(_) | FieldValue::Uint(_)
                    )
                })
            })
        })
    };
    let lines_of = || lines.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    if lines_of().all(numeric) {
        return (lines, 0);
    }
    let mut kept = Vec::with_capacity(lines.len());
    let mut left_out = 0;
    for line in lines_of() {
        if numeric(line) {
            kept.extend_from_slice(line);
            kept.push(b'\n');
        } else {
            left_out += 1;
        }
    }
    (kept, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_cc_metric_store_refuses_are_left_out_and_counted() {
        let lines = b"nv_temp,type=accelerator,type-id=0 value=41 1\n\
nv_ecc_mode,type=accelerator,type-id=0 value=\"ON\" 1\n\
nv_power_usage,type=accelerator,type-id=0 value=70.5 1\n\
flag,type=node value=true 1\n\
nv_mem_util,type=accelerator,type-id=0 value=3u 1\n"
            .to_vec();
        let (kept, left_out) = numeric_only(lines);
        assert_eq!(left_out, 2);
        assert_eq!(
            String::from_utf8(kept).unwrap(),
            "nv_temp,type=accelerator,type-id=0 value=41 1\n\
nv_power_usage,type=accelerator,type-id=0 value=70.5 1\n\
nv_mem_util,type=accelerator,type-id=0 value=3u 1\n"
        );
        // All numeric: the batch is passed on as it is.
        let plain = b"a value=1 1\nb value=2i 1\n".to_vec();
        assert_eq!(numeric_only(plain.clone()), (plain, 0));
    }

    #[test]
    fn the_cluster_query_defaults_to_the_fleet_cluster_and_is_not_doubled() {
        let mut config = HttpConfig::new("http://ms:8082/api/write");
        assert_eq!(
            write_url(&config, "fritz").unwrap().as_str(),
            "http://ms:8082/api/write?cluster=fritz"
        );
        config.cluster = Some("alex".to_owned());
        assert_eq!(
            write_url(&config, "fritz").unwrap().as_str(),
            "http://ms:8082/api/write?cluster=alex"
        );
        config.url = "http://ms:8082/api/write?cluster=woody".to_owned();
        assert_eq!(
            write_url(&config, "fritz").unwrap().as_str(),
            "http://ms:8082/api/write?cluster=woody"
        );
    }

    #[test]
    fn a_jwt_never_shows_in_debug_output_or_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jwt");
        std::fs::write(&file, "eyJ.s3cr3t.sig\n").unwrap();
        let mut config = HttpConfig::new("http://ms/api/write");
        config.jwt_file = Some(file.clone());
        let jwt = read_jwt("store", &config).unwrap().unwrap();
        assert!(!format!("{jwt:?}").contains("s3cr3t"));
        assert_eq!(jwt.0.to_str().unwrap(), "Bearer eyJ.s3cr3t.sig");
        std::fs::write(&file, "bad\ntoken").unwrap();
        let err = read_jwt("store", &config).unwrap_err();
        assert!(!err.contains("bad") && err.contains("header"), "{err}");
    }
}
