//! Error types of the fleet server.
//!
//! Messages name the problem; they never carry tokens, keys or instance ids.

use std::path::PathBuf;

/// Errors of starting, reconfiguring and stopping the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration file is not valid JSON or has unknown or mistyped keys; the error
    /// names the key and the form it takes.
    #[error("server config: {0}")]
    ConfigSyntax(#[source] crate::json_config::KeyError),
    /// The configuration is well-formed but not usable.
    #[error("server config: {0}")]
    InvalidConfig(&'static str),
    /// A value is well-formed JSON of the right type but not usable (a duration that does
    /// not parse, an `addr` without a port); the message names the key and the value.
    #[error("server config: {0}")]
    InvalidValue(String),
    /// An `api-allowed-ips` entry with a `/` that is not a CIDR range.
    #[error("server config: api-allowed-ips entry {0:?} is not a valid CIDR range")]
    InvalidAllowlist(String),
    /// A `trusted-proxies` entry that is neither an address nor a CIDR range.
    #[error("server config: trusted-proxies entry {0:?} is not an IP address or CIDR range")]
    InvalidTrustedProxy(String),
    /// Neither `jwt-public-key` nor `JWT_PUBLIC_KEY` is set and authentication is enabled.
    #[error(
        "no JWT public key: set jwt-public-key or JWT_PUBLIC_KEY, or \"disable-authentication\": true"
    )]
    NoPublicKey,
    /// The configured public key cannot be used.
    #[error("JWT public key: {0}")]
    Key(#[source] AuthError),
    /// The configured private key (which signs rosters) cannot be used, or does not belong
    /// to the configured public key.
    #[error("JWT private key (signs discovery rosters): {0}")]
    PrivateKey(#[source] AuthError),
    /// `fleet.plugin-dir` cannot be read at start-up.
    #[error("{0}")]
    Plugins(String),
    /// The config tree cannot be loaded at start-up.
    #[error(transparent)]
    ConfigTree(#[from] TreeError),
    /// The registry database failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The HTTP listener cannot be bound or failed.
    #[error("http server on {addr}: {source}")]
    Http {
        /// The configured address.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The NATS connection cannot be set up. The text has passed [`crate::nats::scrub`]:
    /// build it with `ServerError::nats`.
    #[error("nats: {0}")]
    Nats(String),
    /// A background task panicked.
    #[error("server task failed: {0}")]
    Task(String),
}

impl ServerError {
    /// A NATS error, scrubbed of the credentials of `config`'s address and password (see
    /// [`crate::nats::scrub`]); `context` says what was being done.
    pub(crate) fn nats(
        config: &crate::nats::NatsConfig,
        context: &str,
        error: &dyn std::fmt::Display,
    ) -> ServerError {
        let text = config.scrub(error);
        if context.is_empty() {
            ServerError::Nats(text)
        } else {
            ServerError::Nats(format!("{context}: {text}"))
        }
    }
}

/// Errors of token and key handling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A key is not valid standard base64.
    #[error("key is not valid base64")]
    KeyEncoding,
    /// A key has the wrong length or is not a valid Ed25519 key.
    #[error("key is not a valid Ed25519 {0} key")]
    InvalidKey(&'static str),
    /// No token in `X-Auth-Token` or `Authorization: Bearer`.
    #[error("missing token")]
    MissingToken,
    /// The token is not three base64url parts with JSON header and claims.
    #[error("malformed token")]
    MalformedToken,
    /// The token uses an algorithm other than EdDSA.
    #[error("only Ed25519/EdDSA supported")]
    UnsupportedAlgorithm,
    /// The signature does not verify against the public key.
    #[error("token signature is invalid")]
    BadSignature,
    /// The token's `exp` has passed.
    #[error("token is expired")]
    Expired,
    /// The token's `nbf` lies in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// The token's roles do not grant API access.
    #[error("missing role: api")]
    MissingRole,
    /// The client address is not in `api-allowed-ips`.
    #[error("unauthorized by IP")]
    IpNotAllowed,
}

/// Errors of loading the config tree.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A file or directory of the tree cannot be read.
    #[error("fleet: reading config tree at {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A layer is not a JSON object.
    #[error("fleet: invalid config {path}: {source}")]
    Invalid {
        /// Path relative to the tree root.
        path: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A `.json` entry of the tree is not a regular file (a FIFO, a device, a socket), which
    /// could block or never end a read.
    #[error("fleet: config tree entry {path} is not a regular file")]
    NotAFile {
        /// The path of the entry.
        path: PathBuf,
    },
    /// A layer is larger than [`MAX_LAYER_BYTES`](super::configtree::MAX_LAYER_BYTES).
    #[error("fleet: config tree layer {path} has {size} bytes, more than the limit of {limit}")]
    TooLarge {
        /// The path of the layer.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Files kept changing while the tree was scanned.
    #[error("fleet: config tree kept changing while it was scanned")]
    Unstable,
    /// The scan task was cancelled or panicked.
    #[error("fleet: config tree scan did not finish")]
    Interrupted,
}

/// What kind of registry failure happened, to match on; the details are in the message
/// and the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegistryErrorKind {
    /// The store cannot take or serve the request now (disk full, I/O error, read-only,
    /// locked, unreachable); retrying later may succeed.
    Unavailable,
    /// The store refused a change that conflicts with what it holds.
    Conflict,
    /// The store holds data the registry cannot read, or that disagrees with its index.
    Corrupt,
    /// The store task was cancelled or panicked.
    Interrupted,
    /// The request names an instance this server does not know, and it could not establish
    /// that its index holds every change of a store shared with other servers (the bucket
    /// did not answer, or its changes did not arrive in time): the instance may have been
    /// registered through another server a moment ago. Retrying later may succeed; the
    /// instance must not be answered as unknown.
    Behind,
}

/// An error of the registry or its store: a [kind](RegistryError::kind) to match on, a
/// message, and the store's own error as the source.
#[derive(Debug, thiserror::Error)]
#[error("fleet registry: {message}")]
pub struct RegistryError {
    kind: RegistryErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl RegistryError {
    /// An error without a source.
    pub fn new(kind: RegistryErrorKind, message: impl Into<String>) -> RegistryError {
        RegistryError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error caused by a store's own error `source`.
    pub fn with_source(
        kind: RegistryErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> RegistryError {
        RegistryError {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The store task did not finish.
    pub(crate) fn interrupted() -> RegistryError {
        RegistryError::new(
            RegistryErrorKind::Interrupted,
            "database task did not finish",
        )
    }

    /// This server cannot tell whether an instance it does not know exists in the shared
    /// store ([`RegistryErrorKind::Behind`]).
    pub(crate) fn behind() -> RegistryError {
        RegistryError::new(
            RegistryErrorKind::Behind,
            "cannot tell whether the instance exists: this server has not caught up with the \
             shared registry (retry later)",
        )
    }

    /// The same kind and message without the source, for each further caller a failure
    /// of a shared write answers.
    pub(crate) fn without_source(&self) -> RegistryError {
        RegistryError::new(self.kind, self.message.clone())
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> RegistryErrorKind {
        self.kind
    }
}
