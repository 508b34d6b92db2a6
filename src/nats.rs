//! The NATS connection settings of ClusterCockpit services (cc-lib's `nats` package keys),
//! shared by the fleet server and the agent.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::secret::{self, SecretError};

/// The variable that overrides `username` (or `CC_NATS_USERNAME_FILE`, naming a file).
pub const ENV_NATS_USERNAME: &str = "CC_NATS_USERNAME";
/// The variable that overrides `password` (or `CC_NATS_PASSWORD_FILE`, naming a file).
pub const ENV_NATS_PASSWORD: &str = "CC_NATS_PASSWORD";

/// The `nats` section: `address`, `username`, `password`, `creds-file-path`,
/// `nkey-seed-file`. Its `Debug` output never shows the credentials.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NatsConfig {
    /// The server, e.g. `nats://localhost:4222`.
    pub address: String,
    /// User name (used together with `password`).
    #[serde(default)]
    pub username: String,
    /// Password (used together with `username`).
    #[serde(default)]
    pub password: String,
    /// A `.creds` file (JWT and nkey seed).
    #[serde(default)]
    pub creds_file_path: String,
    /// A file holding an nkey seed.
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
            .field("address", &self.address)
            .field("username", &(!self.username.is_empty()))
            .field("password", &(!self.password.is_empty()))
            .field("creds_file_path", &self.creds_file_path)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .finish()
    }
}

impl NatsConfig {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(serde_json::from_str::<NatsConfig>(r#"{"address":"x","pasword":"y"}"#).is_err());
    }
}
