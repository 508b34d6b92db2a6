//! The one error type of service discovery.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::Instance;
use crate::duration::GoDuration;
use crate::untrusted::Untrusted;

/// Why a discoverer could not produce a set of instances, or could not be built.
///
/// Every message is self-contained: it already carries the text of its cause, in the manner of
/// Go's `%w` wrapping, so `to_string()` says which source failed and why. The causes are kept
/// as fields for callers that want to inspect them, and are not repeated through
/// [`std::error::Error::source`], which would print them twice. Messages never contain tokens,
/// API keys or endpoint URLs (which may embed credentials).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// A cached discoverer has not completed a refresh yet: no set has been read, which is not
    /// the same as having read an empty one.
    #[error("service discovery has not completed a refresh yet")]
    NotYetSynced,
    /// The last refresh of a cached discoverer failed. `last_known` is the set the last
    /// successful refresh read (`None` if none has succeeded), kept so that a blip does not
    /// empty the fleet.
    #[error("{}", refresh_failed(last_known.as_deref(), error))]
    RefreshFailed {
        /// The set read by the last successful refresh, if any.
        last_known: Option<Vec<Instance>>,
        /// Why the latest refresh failed.
        error: Arc<DiscoveryError>,
    },
    /// A listing did not finish within the refresh timeout.
    #[error("listing instances did not finish within {}", GoDuration(*after))]
    TimedOut {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The primary side of a [`Merged`](super::Merged) discoverer failed.
    #[error("primary discovery failed: {0}")]
    Primary(Box<DiscoveryError>),
    /// The fallback side of a [`Merged`](super::Merged) discoverer failed.
    #[error("fallback discovery failed: {0}")]
    Fallback(Box<DiscoveryError>),
    /// An HTTP request to a source could not be completed.
    #[error("{operation}: {}", chain(error))]
    Request {
        /// What was being done, e.g. `listing nomad allocations`.
        operation: String,
        /// The transport error, with its URL removed.
        error: reqwest::Error,
    },
    /// A source answered with a non-success HTTP status.
    #[error("{operation}: unexpected HTTP status {status}{}", status_message(message.as_deref()))]
    Status {
        /// What was being done.
        operation: String,
        /// The HTTP status code.
        status: u16,
        /// What the source said about it (e.g. Nomad's `ACL token not found`), as sent;
        /// displayed escaped and capped, since it is the peer's text.
        message: Option<String>,
    },
    /// A source answered with a body that is not what its API documents.
    #[error("{operation}: malformed response: {error}")]
    Decode {
        /// What was being done.
        operation: String,
        /// The JSON error.
        error: serde_json::Error,
    },
    /// A source answered well-formed JSON that lacks what the API promises.
    #[error("{operation}: {reason}")]
    IncompleteResponse {
        /// What was being done.
        operation: String,
        /// What was missing.
        reason: &'static str,
    },
    /// The Kubernetes client could not be configured or built.
    #[error("building the kubernetes client: {reason}")]
    KubernetesClient {
        /// Why (never the endpoint itself).
        reason: String,
    },
    /// No credential for the Kubernetes API could be had (an unreadable service-account
    /// token, no Google credentials, a token endpoint that failed).
    #[error("authenticating to the kubernetes API: {reason}")]
    KubernetesAuth {
        /// Why (never the credential itself).
        reason: String,
    },
    /// The DNS resolver answered a query with a non-success response code.
    #[error("resolving {host:?}: resolver answered {rcode}")]
    DnsResponseCode {
        /// The queried host.
        host: String,
        /// The response code's mnemonic, e.g. `SERVFAIL`.
        rcode: String,
    },
    /// The DNS resolver did not answer within the exchange timeout, on every attempt.
    #[error("resolving {host:?}: no answer from the resolver within {}", GoDuration(*after))]
    DnsTimeout {
        /// The queried host.
        host: String,
        /// The per-attempt timeout.
        after: Duration,
    },
    /// Talking to the DNS resolver failed at the socket level.
    #[error("resolving {host:?}: {error}")]
    DnsIo {
        /// The queried host.
        host: String,
        /// The socket error.
        error: std::io::Error,
    },
    /// A DNS query could not be built (the host is not a valid domain name).
    #[error("resolving {host:?}: {reason}")]
    DnsQuery {
        /// The host that was to be queried.
        host: String,
        /// Why the query could not be built.
        reason: String,
    },
    /// The DNS resolver was given by host name, and looking that name up failed.
    #[error("looking up the DNS resolver {resolver:?}: {reason}")]
    DnsResolverLookup {
        /// The resolver's `host:port`.
        resolver: String,
        /// Why the lookup failed.
        reason: String,
    },
    /// No host resolved and at least one failed; a partial resolution is a success.
    #[error("resolving every discovery host failed: {}", join(.0))]
    DnsAllFailed(Vec<DiscoveryError>),
    /// The fleet client that fed a [`FleetRosters`](super::FleetRosters) source has closed,
    /// so its roster will never change again.
    #[error("the fleet roster source is closed")]
    FleetClosed,
    /// The setting that selects the provider is not set.
    #[error("required setting {name} is not set")]
    MissingProvider {
        /// The variable's full name, prefix included.
        name: String,
    },
    /// The provider names no backend this crate knows.
    #[error("{}", unsupported_provider(.0))]
    UnsupportedProvider(String),
    /// DNS provider without `DNS_RESOLVER_ADDRESS`.
    #[error("missing DNS resolver address (DNS_RESOLVER_ADDRESS)")]
    MissingDnsResolver,
    /// DNS provider without `DNS_QUERY`.
    #[error("missing DNS query (DNS_QUERY)")]
    MissingDnsQuery,
    /// Kubernetes provider without `POD_NAMESPACE`.
    #[error("missing pod namespace (POD_NAMESPACE)")]
    MissingPodNamespace,
    /// Kubernetes provider without `POD_LABELS`.
    #[error("missing pod labels (POD_LABELS)")]
    MissingPodLabels,
    /// Nomad provider without `NOMAD_ENDPOINT`.
    #[error("missing Nomad endpoint (NOMAD_ENDPOINT)")]
    MissingNomadEndpoint,
    /// Nomad provider without `NOMAD_TOKEN`.
    #[error("missing Nomad token (NOMAD_TOKEN)")]
    MissingNomadToken,
    /// Static provider without `STATIC`.
    #[error("missing static endpoints (STATIC)")]
    MissingStaticEndpoints,
    /// The Kubernetes provider was selected in a build without the `kubernetes` feature.
    #[error("provider {0} needs ccfleet built with the `kubernetes` feature")]
    KubernetesUnavailable(String),
    /// A setting has a value that cannot be used.
    #[error("invalid setting {name}: {reason}")]
    InvalidSetting {
        /// The setting's name (without any prefix).
        name: &'static str,
        /// Why the value is unusable; secrets and URLs are not echoed.
        reason: String,
    },
    /// An address given to the local or static backend is not `host[:port]`.
    #[error("{backend} discovery: invalid address {address:?}: {reason}")]
    InvalidAddress {
        /// The backend that was given the address.
        backend: &'static str,
        /// The offending address.
        address: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The HTTP client for a source could not be built.
    #[error("building the HTTP client: {}", chain(error))]
    HttpClient {
        /// The builder error.
        error: reqwest::Error,
    },
}

impl DiscoveryError {
    /// The set a cached discoverer still serves despite this error, if it has one: the
    /// instances of the last successful refresh. A caller that prefers a stale set to none
    /// can keep using it while it reports the error.
    pub fn last_known(&self) -> Option<&[Instance]> {
        match self {
            DiscoveryError::RefreshFailed { last_known, .. } => last_known.as_deref(),
            _ => None,
        }
    }

    /// Whether this is (or, through a cache or a merge, is caused by) a cache that has not
    /// completed its first refresh.
    pub fn is_not_yet_synced(&self) -> bool {
        match self {
            DiscoveryError::NotYetSynced => true,
            DiscoveryError::Primary(e) | DiscoveryError::Fallback(e) => e.is_not_yet_synced(),
            _ => false,
        }
    }

    pub(crate) fn request(operation: impl Into<String>, error: reqwest::Error) -> Self {
        DiscoveryError::Request {
            operation: operation.into(),
            error: error.without_url(),
        }
    }
}

fn refresh_failed(last_known: Option<&[Instance]>, error: &DiscoveryError) -> String {
    match last_known {
        Some(set) => format!(
            "refresh failed, serving the last known set of {} instances: {error}",
            set.len()
        ),
        None => format!("refresh failed before any set was read: {error}"),
    }
}

fn unsupported_provider(provider: &str) -> String {
    let mut text = format!(
        "unsupported service discovery provider: {} (use DNS, K8S-PODS, NOMAD, NOMAD+K8S-PODS or STATIC)",
        Untrusted(provider)
    );
    if provider.trim().eq_ignore_ascii_case("local") {
        // The local lister exists, but as a library type; the provider that does its job is
        // a static list of one.
        text.push_str("; for one fixed address use PROVIDER=STATIC with STATIC=host:port");
    }
    text
}

fn status_message(message: Option<&str>) -> String {
    match message {
        Some(m) => format!(": {}", Untrusted(m)),
        None => String::new(),
    }
}

fn join(errors: &[DiscoveryError]) -> String {
    let mut out = String::new();
    for (i, e) in errors.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        let _ = write!(out, "{e}");
    }
    out
}

/// An error and its causes, joined by `": "`, skipping a cause whose text its parent already
/// ends with (HTTP stacks often repeat themselves).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn chain_joins_causes_and_skips_repeats() {
        let e = Layer(
            "error sending request: connection refused",
            Some(Box::new(Layer(
                "connection refused",
                Some(Box::new(Layer("os error 111", None))),
            ))),
        );
        assert_eq!(
            chain(&e),
            "error sending request: connection refused: os error 111"
        );
    }

    #[test]
    fn wrapped_not_yet_synced_is_still_recognised() {
        let e = DiscoveryError::Fallback(Box::new(DiscoveryError::NotYetSynced));
        assert!(e.is_not_yet_synced());
        assert_eq!(
            e.to_string(),
            "fallback discovery failed: service discovery has not completed a refresh yet"
        );
        assert!(!DiscoveryError::FleetClosed.is_not_yet_synced());
    }

    #[test]
    fn stays_small_enough_to_return_by_value() {
        // Every listing returns Result<Vec<Instance>, DiscoveryError>; a large error would
        // make every successful call pay for it (clippy's result_large_err limit is 128).
        assert!(std::mem::size_of::<DiscoveryError>() <= 96);
    }
}
