//! The NATS connection settings of ClusterCockpit services (cc-lib's `nats` package keys),
//! shared by the fleet server and the agent.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::secret::{self, SecretError};

/// The variable that overrides `username` (or `CC_NATS_USERNAME_FILE`, naming a file).
pub const ENV_NATS_USERNAME: &str = "CC_NATS_USERNAME";
/// The variable that overrides `password` (or `CC_NATS_PASSWORD_FILE`, naming a file).
pub const ENV_NATS_PASSWORD: &str = "CC_NATS_PASSWORD";

/// The `nats` section: `address`, `username`, `password`, `creds-file-path`,
/// `nkey-seed-file`. Its `Debug` output never shows the credentials, including those an
/// address may carry (`nats://user:password@host`).
#[derive(Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NatsConfig {
    /// The server, e.g. `nats://127.0.0.1:4222`; required in the section. Credentials in it
    /// (`nats://user:password@host`, `nats://token@host`) are used as in Go's client unless
    /// `username` and `password` are set, and never appear in logs or errors.
    pub address: String,
    /// User name (used together with `password`); `CC_NATS_USERNAME`, or the file
    /// `CC_NATS_USERNAME_FILE` names, overrides it. Default: empty.
    #[serde(default)]
    pub username: String,
    /// Password (used together with `username`); `CC_NATS_PASSWORD`, or the file
    /// `CC_NATS_PASSWORD_FILE` names, overrides it. Default: empty.
    #[serde(default)]
    pub password: String,
    /// A `.creds` file (JWT and nkey seed). Default: none.
    #[serde(default)]
    pub creds_file_path: String,
    /// A file holding an nkey seed. Default: none.
    #[serde(default)]
    pub nkey_seed_file: String,
}

/// Settings that cannot be turned into a connection.
#[derive(Debug, thiserror::Error)]
pub enum NatsConfigError {
    /// A credential named through the environment cannot be read.
    #[error("NATS credentials: {0}")]
    Secret(#[from] SecretError),
    /// The `.creds` file cannot be read or parsed.
    #[error("cannot read the NATS credentials file {path}: {message}")]
    CredsFile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The nkey seed file cannot be read.
    #[error("cannot read the NATS nkey seed file {path}: {source}")]
    NkeySeed {
        /// The file.
        path: String,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("address", &display_address(&self.address))
            .field("username", &(!self.username.is_empty()))
            .field("password", &(!self.password.is_empty()))
            .field("creds_file_path", &self.creds_file_path)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .finish()
    }
}

impl NatsConfig {
    /// The server address as logs may show it: `scheme://host:port`, without the user name,
    /// password or token an address may carry (see [`display_address`]).
    pub fn display_address(&self) -> String {
        display_address(&self.address)
    }

    /// Connection options as cc-lib sets them up: credentials from the section or the
    /// environment, the first connection retried and reconnects forever (a service starts
    /// while NATS is down), and reconnect attempts backing off from 100 ms to 2 s so a
    /// restarted nats-server is found again quickly. Callers add their event handling and
    /// connect to [`NatsConfig::address`].
    pub async fn connect_options(
        &self,
        client_name: &str,
    ) -> Result<async_nats::ConnectOptions, NatsConfigError> {
        let mut options = async_nats::ConnectOptions::new()
            .name(client_name)
            .retry_on_initial_connect()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| match attempts {
                0 | 1 => Duration::ZERO,
                n => Duration::from_millis(100u64 << (n - 2).min(5)).min(Duration::from_secs(2)),
            });
        let username = secret::from_env(ENV_NATS_USERNAME, &self.username)?;
        let password = secret::from_env(ENV_NATS_PASSWORD, &self.password)?;
        if !username.is_empty() && !password.is_empty() {
            options = options.user_and_password(username, password);
        } else {
            // Credentials in the address count as in Go's client: `user:password@` is a user
            // and password, `token@` a token. async-nats itself ignores them, and the address
            // handed to it has them removed (see `NatsConfig::connect`).
            match url_credentials(&self.address) {
                Some((user, Some(pass))) => options = options.user_and_password(user, pass),
                Some((token, None)) => options = options.token(token),
                None => {}
            }
        }
        if !self.creds_file_path.is_empty() {
            options = options
                .credentials_file(&self.creds_file_path)
                .await
                .map_err(|e| NatsConfigError::CredsFile {
                    path: self.creds_file_path.clone(),
                    message: e.to_string(),
                })?;
        }
        if !self.nkey_seed_file.is_empty() {
            let seed = tokio::fs::read_to_string(&self.nkey_seed_file)
                .await
                .map_err(|source| NatsConfigError::NkeySeed {
                    path: self.nkey_seed_file.clone(),
                    source,
                })?;
            options = options.nkey(seed.trim().to_owned());
        }
        Ok(options)
    }
}

impl NatsConfig {
    /// The address as handed to async-nats: without the user information it may carry
    /// (applied by [`NatsConfig::connect_options`] instead), so the library never holds the
    /// credentials in its server list, whose debug logs print each address in full.
    pub fn server_address(&self) -> String {
        match self.address.parse::<async_nats::ServerAddr>() {
            Ok(addr) => {
                let mut url = addr.into_inner();
                // Both only fail for URLs that cannot carry user information.
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.to_string()
            }
            // async-nats refuses it with a message that does not quote it.
            Err(_) => self.address.clone(),
        }
    }

    /// Connects to [`NatsConfig::server_address`] with `options` (from
    /// [`NatsConfig::connect_options`]). The error is the scrubbed text (see
    /// [`NatsConfig::scrub`]).
    pub async fn connect(
        &self,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::Client, String> {
        options
            .connect(self.server_address())
            .await
            .map_err(|e| self.scrub(&e))
    }

    /// The text of a NATS error (or of anything else that may quote the connection) as logs
    /// and error messages may show it: see [`scrub`]; the secrets are this section's password
    /// and the password or token its address carries.
    pub fn scrub(&self, error: &dyn fmt::Display) -> String {
        let mut secrets = address_secrets(&self.address);
        secrets.push(self.password.clone());
        scrub(error, &secrets)
    }
}

/// The one function every NATS error passes before it reaches a log line or an error
/// message: user information of any URL in the text (`scheme://user:password@`,
/// `scheme://token@`) is removed, and every non-empty string of `secrets` (passwords and
/// tokens the caller knows) is replaced with `<redacted>`, wherever it appears.
pub fn scrub(error: &dyn fmt::Display, secrets: &[String]) -> String {
    let mut text = strip_userinfo(&error.to_string());
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "<redacted>");
        }
    }
    text
}

/// Removes the user information from every `scheme://userinfo@host` in `text`.
fn strip_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let authority_start = at + 3;
        out.push_str(&rest[..authority_start]);
        let after = &rest[authority_start..];
        // The authority ends where a path, query, fragment, quote or whitespace begins.
        let end = after
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`')
            })
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(userinfo_end) => out.push_str(&authority[userinfo_end + 1..]),
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The user and password (`user:password@`), or the token (`token@`, no password), of a NATS
/// address, percent-decoded; `None` without user information.
fn url_credentials(address: &str) -> Option<(String, Option<String>)> {
    let addr = address.parse::<async_nats::ServerAddr>().ok()?;
    let user = percent_decode(addr.username()?);
    let password = addr.password().map(percent_decode);
    Some((user, password))
}

/// The secrets an address carries, raw and decoded: its password, or its token.
fn address_secrets(address: &str) -> Vec<String> {
    let secret = match address.parse::<async_nats::ServerAddr>() {
        Ok(addr) => match (addr.username(), addr.password()) {
            (_, Some(password)) => password.to_owned(),
            (Some(token), None) => token.to_owned(),
            (None, None) => return Vec::new(),
        },
        // Not a valid address, but it may still carry credentials: read them textually.
        Err(_) => {
            let after_scheme = address.split_once("://").map_or(address, |(_, rest)| rest);
            let authority = after_scheme
                .split(['/', '?', '#'])
                .next()
                .unwrap_or_default();
            match authority.rsplit_once('@') {
                Some((userinfo, _)) => match userinfo.split_once(':') {
                    Some((_, password)) => password.to_owned(),
                    None => userinfo.to_owned(),
                },
                None => return Vec::new(),
            }
        }
    };
    if secret.is_empty() {
        return Vec::new();
    }
    let decoded = percent_decode(&secret);
    vec![secret, decoded]
}

/// Decodes `%XX` escapes; anything else (including a malformed escape) stays as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `scheme://host:port` of a NATS address, without the credentials (`user:password@` or
/// `token@`) it may carry, its path or its query; for logs and errors.
pub fn display_address(address: &str) -> String {
    match address.parse::<async_nats::ServerAddr>() {
        Ok(addr) => {
            let host = addr.host();
            if host.contains(':') {
                format!("{}://[{host}]:{}", addr.scheme(), addr.port())
            } else {
                format!("{}://{host}:{}", addr.scheme(), addr.port())
            }
        }
        // The text may hold a password: none of it is shown.
        Err(_) => "<an invalid NATS address>".to_owned(),
    }
}

/// How long [`ConnectionReporter`] tries a plain TCP connection to find out why NATS is
/// unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Logs the events of one NATS connection so an outage costs a few lines instead of one per
/// reconnect attempt: the first failure is a warning naming the address (never its
/// credentials) and the reason, repeats are logged at debug level, and the recovery at info
/// level. Hand [`ConnectionReporter::on_event`] to
/// [`async_nats::ConnectOptions::event_callback`].
///
/// async-nats reports a failed attempt only by its kind (`IO error`); for the reason, the
/// reporter tries one plain TCP connection to the address when an outage begins, which tells
/// `connection refused` from a timeout or an unknown host.
#[derive(Clone)]
pub struct ConnectionReporter {
    inner: Arc<ReporterInner>,
}

struct ReporterInner {
    address: String,
    /// Which of a process's connections this is, when it has more than one to the same
    /// address (the server's fleet and registry connections): without it an outage reads
    /// as the same line twice.
    connection: Option<&'static str>,
    /// The password or token the address carries, scrubbed from every error it logs.
    secrets: Vec<String>,
    /// `host:port` for the TCP probe; `None` when the address does not parse.
    probe: Option<(String, u16)>,
    connected: AtomicBool,
    state: Mutex<Reported>,
}

/// What was reported already.
#[derive(Debug, Default)]
struct Reported {
    link: Link,
    /// The last server error, warned about once; repeats go to debug.
    server_error: Option<String>,
    /// Whether a slow consumer was warned about since the connection came up.
    slow_consumer: bool,
    /// Whether the connection was ever up (a first connection after failures is no return).
    was_up: bool,
}

/// Where the connection stands, as far as logging is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Link {
    /// Not connected yet, nothing reported.
    #[default]
    Starting,
    /// Connected.
    Up,
    /// The connection was lost (reported); no reconnect attempt has failed yet.
    Lost,
    /// Reconnect attempts fail; the first failure was reported.
    Down,
}

/// The state lock only guards plain assignments, so a poisoned lock is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl fmt::Debug for ConnectionReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionReporter")
            .field("address", &self.inner.address)
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl ConnectionReporter {
    /// A reporter for the connection to `address` (credentials in it are never shown).
    pub fn new(address: &str) -> ConnectionReporter {
        let probe = address
            .parse::<async_nats::ServerAddr>()
            .ok()
            .map(|addr| (addr.host().to_owned(), addr.port()));
        ConnectionReporter {
            inner: Arc::new(ReporterInner {
                address: display_address(address),
                connection: None,
                secrets: address_secrets(address),
                probe,
                connected: AtomicBool::new(false),
                state: Mutex::new(Reported::default()),
            }),
        }
    }

    /// A reporter whose lines carry `connection = <name>` besides the address, for a
    /// process that keeps several connections to one NATS.
    pub fn named(address: &str, connection: &'static str) -> ConnectionReporter {
        let mut reporter = ConnectionReporter::new(address);
        Arc::get_mut(&mut reporter.inner)
            .expect("not shared yet")
            .connection = Some(connection);
        reporter
    }

    /// The address as the reporter shows it (see [`display_address`]).
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Whether the last event logged said the connection is up (for display; the client's
    /// `connection_state` is authoritative, as async-nats drops events it cannot queue).
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Relaxed)
    }

    /// Logs `event` (see the type's documentation).
    pub async fn on_event(&self, event: async_nats::Event) {
        let address = self.address();
        let connection = self.inner.connection;
        match event {
            async_nats::Event::Connected => {
                self.inner.connected.store(true, Ordering::Relaxed);
                let again = {
                    let mut state = lock(&self.inner.state);
                    state.server_error = None;
                    state.slow_consumer = false;
                    state.link = Link::Up;
                    std::mem::replace(&mut state.was_up, true)
                };
                if again {
                    tracing::info!(address, connection, "NATS connected again");
                } else {
                    tracing::info!(address, connection, "NATS connected");
                }
            }
            async_nats::Event::Disconnected => {
                self.inner.connected.store(false, Ordering::Relaxed);
                lock(&self.inner.state).link = Link::Lost;
                tracing::warn!(address, connection, "NATS disconnected; reconnecting");
            }
            async_nats::Event::ClientError(error) => {
                let error = scrub(&error, &self.inner.secrets);
                let first = {
                    let mut state = lock(&self.inner.state);
                    let first = matches!(state.link, Link::Starting | Link::Lost);
                    if state.link != Link::Up {
                        state.link = Link::Down;
                    }
                    first
                };
                if first {
                    let reason = match self.probe().await {
                        Some(cause) => format!("{error} ({cause})"),
                        None => error.to_string(),
                    };
                    tracing::warn!(address, connection,
                        error = %reason,
                        "NATS unreachable; retrying with backoff (repeats are logged at debug level until it recovers)"
                    );
                } else {
                    tracing::debug!(address, connection, %error, "NATS still unreachable");
                }
            }
            async_nats::Event::ServerError(error) => {
                let error = scrub(&error, &self.inner.secrets);
                let text = error.clone();
                let repeated = {
                    let mut state = lock(&self.inner.state);
                    let repeated = state.server_error.as_deref() == Some(text.as_str());
                    state.server_error = Some(text);
                    repeated
                };
                if repeated {
                    tracing::debug!(address, connection, %error, "NATS server error again");
                } else {
                    tracing::warn!(address, connection, %error, "NATS server error");
                }
            }
            async_nats::Event::SlowConsumer(sid) => {
                let repeated = std::mem::replace(&mut lock(&self.inner.state).slow_consumer, true);
                if repeated {
                    tracing::debug!(
                        address,
                        connection,
                        subscription = sid,
                        "NATS: slow consumer again"
                    );
                } else {
                    tracing::warn!(
                        address,
                        connection,
                        subscription = sid,
                        "NATS: a subscription is not read fast enough; messages are dropped"
                    );
                }
            }
            async_nats::Event::LameDuckMode => {
                tracing::warn!(
                    address,
                    connection,
                    "NATS server is shutting down (lame duck mode)"
                );
            }
            async_nats::Event::Draining | async_nats::Event::Closed => {
                self.inner.connected.store(false, Ordering::Relaxed);
                tracing::debug!(address, connection, %event, "NATS connection closing");
            }
        }
    }

    /// Why a plain TCP connection to the address fails, if it does.
    async fn probe(&self) -> Option<String> {
        let (host, port) = self.inner.probe.as_ref()?;
        match tokio::time::timeout(
            PROBE_TIMEOUT,
            tokio::net::TcpStream::connect((host.as_str(), *port)),
        )
        .await
        {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!(
                "no answer within {}",
                crate::duration::GoDuration(PROBE_TIMEOUT)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log lines written while `f` runs.
    async fn logged(f: impl AsyncFnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                lock(&self.0).extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        f().await;
        String::from_utf8_lossy(&lock(&sink.0)).into_owned()
    }

    #[tokio::test]
    async fn two_connections_to_one_address_say_which_of_them_lost_nats() {
        // The server's fleet and registry connections see one outage: two lines that must
        // not read as the same line logged twice.
        let fleet = ConnectionReporter::named("nats://cc:hunter2@127.0.0.1:4222", "fleet");
        let registry = ConnectionReporter::named("nats://cc:hunter2@127.0.0.1:4222", "registry");
        let text = logged(async || {
            fleet.on_event(async_nats::Event::Disconnected).await;
            registry.on_event(async_nats::Event::Disconnected).await;
        })
        .await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("connection=\"fleet\""), "{text}");
        assert!(lines[1].contains("connection=\"registry\""), "{text}");
        assert!(lines.iter().all(|l| l.contains("nats://127.0.0.1:4222")));
        assert!(!text.contains("hunter2"), "{text}");
        // A process with one connection keeps its lines as they were.
        let single = ConnectionReporter::new("nats://127.0.0.1:4222");
        let text = logged(async || single.on_event(async_nats::Event::Disconnected).await).await;
        assert!(!text.contains("connection="), "{text}");
    }

    #[test]
    fn debug_hides_credentials() {
        let config = NatsConfig {
            address: "nats://127.0.0.1:4222".into(),
            username: "cc".into(),
            password: "hunter2".into(),
            ..NatsConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("\"cc\""),
            "{shown}"
        );
        let in_address = NatsConfig {
            address: "nats://cc:hunter2@127.0.0.1:4222".into(),
            ..NatsConfig::default()
        };
        let shown = format!("{in_address:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(serde_json::from_str::<NatsConfig>(r#"{"address":"x","pasword":"y"}"#).is_err());
    }

    #[test]
    fn scrubbing_removes_user_information_of_every_url_and_the_known_secrets() {
        let text = "cannot reach nats://cc:hunter2@nats01:4222/x and tls://s3cr3t-token@nats02, \
                    \"ws://u:p%40ss@[::1]:80\"; plain https://h/a@b stays";
        let shown = scrub(&text, &[]);
        assert_eq!(
            shown,
            "cannot reach nats://nats01:4222/x and tls://nats02, \
             \"ws://[::1]:80\"; plain https://h/a@b stays"
        );
        let shown = scrub(
            &"auth failed for hunter2 (token s3cr3t)",
            &["hunter2".into(), String::new(), "s3cr3t".into()],
        );
        assert_eq!(shown, "auth failed for <redacted> (token <redacted>)");
        assert_eq!(scrub(&"no URL here: a@b", &[]), "no URL here: a@b");
        assert_eq!(scrub(&"ends with nats://u:p@", &[]), "ends with nats://");
    }

    #[test]
    fn a_section_scrubs_its_address_credentials_and_its_password() {
        let config = NatsConfig {
            address: "nats://cc:hun%74er2@nats01:4222".into(),
            password: "section-pw".into(),
            ..NatsConfig::default()
        };
        let shown = config.scrub(&"hunter2 hun%74er2 section-pw cc");
        assert_eq!(shown, "<redacted> <redacted> <redacted> cc");
        let token = NatsConfig {
            address: "tls://t0ken@nats01".into(),
            ..NatsConfig::default()
        };
        assert_eq!(token.scrub(&"bad t0ken"), "bad <redacted>");
        // An invalid address still has its credentials scrubbed.
        let invalid = NatsConfig {
            address: "nats://cc:hunter2@nats01:port/x".into(),
            ..NatsConfig::default()
        };
        assert_eq!(invalid.scrub(&"hunter2!"), "<redacted>!");
    }

    #[test]
    fn the_address_handed_to_async_nats_has_no_user_information() {
        let server_address = |address: &str| {
            NatsConfig {
                address: address.into(),
                ..NatsConfig::default()
            }
            .server_address()
        };
        assert_eq!(
            server_address("nats://cc:hunter2@nats01:4223"),
            "nats://nats01:4223"
        );
        assert_eq!(server_address("tls://s3cr3t-token@nats01"), "tls://nats01");
        assert_eq!(server_address("cc:hunter2@127.0.0.1"), "nats://127.0.0.1");
        assert_eq!(
            server_address("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
        // Unparseable: passed on for async-nats to refuse (its message does not quote it).
        assert_eq!(server_address("nats://h:port"), "nats://h:port");
    }

    #[test]
    fn credentials_in_the_address_are_a_user_and_password_or_a_token() {
        assert_eq!(
            url_credentials("nats://cc:hunter%202@h"),
            Some(("cc".into(), Some("hunter 2".into())))
        );
        assert_eq!(
            url_credentials("tls://t0ken@h:4443"),
            Some(("t0ken".into(), None))
        );
        assert_eq!(url_credentials("nats://h:4222"), None);
        assert_eq!(url_credentials("nats://h:port"), None);
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn the_reporter_scrubs_the_errors_it_logs() {
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || CaptureWriter(writer.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(async {
                // An unparseable port: the reporter does not probe, it only logs; the
                // credentials are still known to it.
                let reporter = ConnectionReporter::new("nats://cc:hunter2@nats01:port");
                let leaky = "user cc password hunter2 from nats://cc:hunter2@nats01";
                for event in [
                    async_nats::Event::ServerError(async_nats::ServerError::Other(leaky.into())),
                    async_nats::Event::ClientError(async_nats::ClientError::Other(leaky.into())),
                    async_nats::Event::ClientError(async_nats::ClientError::Other(leaky.into())),
                ] {
                    reporter.on_event(event).await;
                }
            });
        });
        let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        assert!(text.contains("NATS server error"), "{text}");
        assert!(text.contains("NATS unreachable"), "{text}");
        assert!(text.contains("NATS still unreachable"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    struct CaptureWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for CaptureWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_displayed_address_never_holds_credentials() {
        assert_eq!(
            display_address("nats://cc:hunter2@nats01:4223"),
            "nats://nats01:4223"
        );
        assert_eq!(
            display_address("tls://s3cr3t-token@nats01"),
            "tls://nats01:4222"
        );
        assert_eq!(
            display_address("cc:hunter2@127.0.0.1"),
            "nats://127.0.0.1:4222"
        );
        assert_eq!(
            display_address("nats://u:p@[::1]:4222/x?password=hunter2"),
            "nats://[::1]:4222"
        );
        let invalid = display_address("nats://cc:hunter2@nats01:notaport");
        assert!(!invalid.contains("hunter2"), "{invalid}");
        let config = NatsConfig {
            address: "nats://cc:hunter2@nats01:4222".into(),
            ..NatsConfig::default()
        };
        assert_eq!(config.display_address(), "nats://nats01:4222");
        let reporter = ConnectionReporter::new(&config.address);
        assert_eq!(reporter.address(), "nats://nats01:4222");
        assert!(!format!("{reporter:?}").contains("hunter2"));
    }
}
