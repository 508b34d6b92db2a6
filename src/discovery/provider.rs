//! Selecting a discoverer from configuration.
//!
//! The settings are read from environment variables under a caller-chosen prefix, so one
//! process can hold several providers (say `SD_ORCHESTRATOR_` and `SD_EDGE_`):
//!
//! | variable | meaning | used by |
//! |---|---|---|
//! | `PROVIDER` (required) | `DNS`, `K8S-PODS`, `NOMAD`, `NOMAD+K8S-PODS` or `STATIC`, any case | all |
//! | `PORT` (default 5008) | the port instances listen on | all |
//! | `DNS_QUERY` | comma-separated names to resolve | `DNS` |
//! | `DNS_RESOLVER_ADDRESS` | resolver as `ip[:port]` or `host[:port]` (port 53 if omitted) | `DNS` |
//! | `K8S_API_ENDPOINT` | `https://` API server, reached on Google Application Default Credentials; empty uses the pod's service account (token and CA) and only works inside the cluster | `K8S-PODS` |
//! | `K8S_API_INSECURE` | `true` allows an `http://` `K8S_API_ENDPOINT` (e.g. `kubectl proxy`), sent no credentials | `K8S-PODS` |
//! | `POD_NAMESPACE`, `POD_LABELS` | namespace and label selector of the pods | `K8S-PODS` |
//! | `HOST_IP` | `true` to report the host IP instead of the pod IP | `K8S-PODS` |
//! | `STATIC` | comma-separated `host[:port]` entries | `STATIC` |
//! | `NOMAD_ENDPOINT`, `NOMAD_TOKEN` | Nomad agent URL (any path is ignored) and ACL token | `NOMAD` |
//!
//! `NOMAD+K8S-PODS` unions the two single-platform providers and needs the settings of both;
//! Nomad is the primary, so its entries win a deduplication conflict.
//!
//! There is no `LOCAL` provider: [`Local`](super::Local) and [`Remote`](super::Remote) are
//! listers a program builds itself. One fixed address is `PROVIDER=STATIC` with
//! `STATIC=host:port`.
//!
//! Google credentials are found the standard way (`GOOGLE_APPLICATION_CREDENTIALS` naming a
//! service-account key, gcloud's application-default credentials, or the metadata server on
//! Google Cloud), not under the prefix. `K8S_API_INSECURE` has no counterpart in the Go
//! configuration this follows, which has no way to reach an API server over plain HTTP; it
//! exists so that `kubectl proxy` and test servers stay usable without ever sending a
//! credential in the clear.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserialize;

use super::{
    Cached, DEFAULT_PORT, Discoverer, DiscoveryError, Dns,
    FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS, Merged, NomadAllocations, NomadClient, Static,
};

/// The provider key selecting DNS A records.
pub const DNS_PROVIDER: &str = "DNS";
/// The provider key selecting Kubernetes pods.
pub const K8S_PODS_PROVIDER: &str = "K8S-PODS";
/// The provider key selecting Nomad allocations.
pub const NOMAD_PROVIDER: &str = "NOMAD";
/// The provider key selecting Nomad allocations unioned with Kubernetes pods.
pub const NOMAD_K8S_PODS_PROVIDER: &str = "NOMAD+K8S-PODS";
/// The provider key selecting a static list.
pub const STATIC_PROVIDER: &str = "STATIC";

/// Environment variable (after the prefix) selecting the provider.
pub const ENV_PROVIDER: &str = "PROVIDER";
/// Environment variable (after the prefix) holding the instances' port.
pub const ENV_PORT: &str = "PORT";
/// Environment variable (after the prefix) holding the DNS names to resolve.
pub const ENV_DNS_QUERY: &str = "DNS_QUERY";
/// Environment variable (after the prefix) holding the DNS resolver address.
pub const ENV_DNS_RESOLVER_ADDRESS: &str = "DNS_RESOLVER_ADDRESS";
/// Environment variable (after the prefix) holding the Kubernetes API endpoint.
pub const ENV_K8S_API_ENDPOINT: &str = "K8S_API_ENDPOINT";
/// Environment variable (after the prefix) allowing a plain-HTTP Kubernetes endpoint.
pub const ENV_K8S_API_INSECURE: &str = "K8S_API_INSECURE";
/// Environment variable (after the prefix) holding the pods' namespace.
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
/// Environment variable (after the prefix) holding the pods' label selector.
pub const ENV_POD_LABELS: &str = "POD_LABELS";
/// Environment variable (after the prefix) choosing host IPs over pod IPs.
pub const ENV_HOST_IP: &str = "HOST_IP";
/// Environment variable (after the prefix) holding the static entries.
pub const ENV_STATIC: &str = "STATIC";
/// Environment variable (after the prefix) holding the Nomad endpoint.
pub const ENV_NOMAD_ENDPOINT: &str = "NOMAD_ENDPOINT";
/// Environment variable (after the prefix) holding the Nomad ACL token.
pub const ENV_NOMAD_TOKEN: &str = "NOMAD_TOKEN";

/// Every variable [`Config::from_env`] reads, after the prefix. Consumers document these
/// under their own prefix; a rename here would silently leave a setting unread there.
pub const ENV_NAMES: [&str; 12] = [
    ENV_PROVIDER,
    ENV_PORT,
    ENV_DNS_QUERY,
    ENV_DNS_RESOLVER_ADDRESS,
    ENV_K8S_API_ENDPOINT,
    ENV_K8S_API_INSECURE,
    ENV_POD_NAMESPACE,
    ENV_POD_LABELS,
    ENV_HOST_IP,
    ENV_STATIC,
    ENV_NOMAD_ENDPOINT,
    ENV_NOMAD_TOKEN,
];

/// The backends a [`Config`] can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `DNS`: A records through a resolver.
    Dns,
    /// `K8S-PODS`: Kubernetes pods by label selector.
    K8sPods,
    /// `NOMAD`: Nomad allocations.
    Nomad,
    /// `NOMAD+K8S-PODS`: Nomad as primary, Kubernetes as fallback.
    NomadK8sPods,
    /// `STATIC`: a fixed list.
    Static,
}

impl Kind {
    /// Every kind, in documentation order.
    pub const ALL: [Kind; 5] = [
        Kind::Dns,
        Kind::K8sPods,
        Kind::Nomad,
        Kind::NomadK8sPods,
        Kind::Static,
    ];

    /// The provider key, e.g. `NOMAD+K8S-PODS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Dns => DNS_PROVIDER,
            Kind::K8sPods => K8S_PODS_PROVIDER,
            Kind::Nomad => NOMAD_PROVIDER,
            Kind::NomadK8sPods => NOMAD_K8S_PODS_PROVIDER,
            Kind::Static => STATIC_PROVIDER,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = DiscoveryError;

    /// Parses a provider key, ignoring case.
    fn from_str(s: &str) -> Result<Kind, DiscoveryError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| DiscoveryError::UnsupportedProvider(s.to_owned()))
    }
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

/// The settings of [`new`]; see the [module documentation](self) for what each one means.
///
/// Read from the environment with [`Config::from_env`] (or from any lookup with
/// [`Config::from_lookup`]), or deserialized from a config file section with kebab-case keys.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// The provider key (`PROVIDER`), matched case-insensitively.
    pub provider: String,
    /// The port instances listen on (`PORT`, default 5008).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Names to resolve (`DNS_QUERY`).
    #[serde(default)]
    pub dns_query: Vec<String>,
    /// `ip[:port]` or `host[:port]` of the DNS resolver (`DNS_RESOLVER_ADDRESS`).
    #[serde(default)]
    pub dns_resolver_address: String,
    /// Kubernetes API endpoint (`K8S_API_ENDPOINT`), `https://` and reached on Google
    /// Application Default Credentials; empty uses the pod's own service account and only
    /// works inside the cluster.
    #[serde(default)]
    pub k8s_api_endpoint: String,
    /// Allow a plain `http://` Kubernetes endpoint, reached without credentials
    /// (`K8S_API_INSECURE`).
    #[serde(default)]
    pub k8s_api_insecure: bool,
    /// Namespace of the pods (`POD_NAMESPACE`).
    #[serde(default)]
    pub pod_namespace: String,
    /// Label selector of the pods (`POD_LABELS`), e.g. `app=cc-metric-store`.
    #[serde(default)]
    pub pod_labels: String,
    /// Report the pod's host IP instead of the pod IP (`HOST_IP`).
    #[serde(default)]
    pub host_ip: bool,
    /// `host[:port]` entries (`STATIC`).
    #[serde(default)]
    pub static_endpoints: Vec<String>,
    /// Nomad agent URL (`NOMAD_ENDPOINT`).
    #[serde(default)]
    pub nomad_endpoint: String,
    /// Nomad ACL token (`NOMAD_TOKEN`); never printed.
    #[serde(default)]
    pub nomad_token: String,
}

impl Config {
    /// A configuration selecting `provider`, every other setting at its default.
    pub fn new(provider: impl Into<String>) -> Config {
        Config {
            provider: provider.into(),
            port: DEFAULT_PORT,
            dns_query: Vec::new(),
            dns_resolver_address: String::new(),
            k8s_api_endpoint: String::new(),
            k8s_api_insecure: false,
            pod_namespace: String::new(),
            pod_labels: String::new(),
            host_ip: false,
            static_endpoints: Vec::new(),
            nomad_endpoint: String::new(),
            nomad_token: String::new(),
        }
    }

    /// Reads the settings from the process environment, each name preceded by `prefix`
    /// (e.g. `SD_` reads `SD_PROVIDER`, `SD_PORT`, ...).
    pub fn from_env(prefix: &str) -> Result<Config, DiscoveryError> {
        Config::from_lookup(prefix, |name| std::env::var(name).ok())
    }

    /// Reads the settings from `vars` as if they were the environment, so tests and callers
    /// with their own configuration source need not touch the process environment.
    pub fn from_env_map<K, V>(
        prefix: &str,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Config, DiscoveryError>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let vars: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Config::from_lookup(prefix, |name| vars.get(name).cloned())
    }

    /// Reads the settings through `lookup`, which is given each full variable name (prefix
    /// included) and returns its value if set. An empty value counts as unset; lists are
    /// comma-separated with blanks dropped; `HOST_IP` takes Go's boolean spellings.
    pub fn from_lookup(
        prefix: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, DiscoveryError> {
        let get = |name: &str| {
            lookup(&format!("{prefix}{name}"))
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let list = |name: &str| {
            get(name)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let provider = get(ENV_PROVIDER).ok_or_else(|| DiscoveryError::MissingProvider {
            name: format!("{prefix}{ENV_PROVIDER}"),
        })?;
        let port = match get(ENV_PORT) {
            None => DEFAULT_PORT,
            Some(v) => v.parse().map_err(|_| DiscoveryError::InvalidSetting {
                name: ENV_PORT,
                reason: format!("{v:?} is not a port number"),
            })?,
        };
        let boolean = |name: &'static str| match get(name) {
            None => Ok(false),
            Some(v) => parse_go_bool(&v).ok_or_else(|| DiscoveryError::InvalidSetting {
                name,
                reason: format!("{v:?} is not a boolean"),
            }),
        };
        let host_ip = boolean(ENV_HOST_IP)?;
        let k8s_api_insecure = boolean(ENV_K8S_API_INSECURE)?;
        Ok(Config {
            provider,
            port,
            dns_query: list(ENV_DNS_QUERY),
            dns_resolver_address: get(ENV_DNS_RESOLVER_ADDRESS).unwrap_or_default(),
            k8s_api_endpoint: get(ENV_K8S_API_ENDPOINT).unwrap_or_default(),
            k8s_api_insecure,
            pod_namespace: get(ENV_POD_NAMESPACE).unwrap_or_default(),
            pod_labels: get(ENV_POD_LABELS).unwrap_or_default(),
            host_ip,
            static_endpoints: list(ENV_STATIC),
            nomad_endpoint: get(ENV_NOMAD_ENDPOINT).unwrap_or_default(),
            nomad_token: get(ENV_NOMAD_TOKEN).unwrap_or_default(),
        })
    }

    /// The selected backend.
    pub fn kind(&self) -> Result<Kind, DiscoveryError> {
        self.provider.parse()
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("provider", &self.provider)
            .field("port", &self.port)
            .field("dns_query", &self.dns_query)
            .field("dns_resolver_address", &self.dns_resolver_address)
            .field("k8s_api_endpoint", &redacted(&self.k8s_api_endpoint))
            .field("k8s_api_insecure", &self.k8s_api_insecure)
            .field("pod_namespace", &self.pod_namespace)
            .field("pod_labels", &self.pod_labels)
            .field("host_ip", &self.host_ip)
            .field("static_endpoints", &self.static_endpoints)
            .field("nomad_endpoint", &redacted(&self.nomad_endpoint))
            .field("nomad_token", &redacted(&self.nomad_token))
            .finish()
    }
}

/// Endpoints may carry credentials in their URL, so only their presence is shown.
fn redacted(value: &str) -> &'static str {
    if value.is_empty() { "" } else { "<set>" }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Builds the discoverer `config` selects.
///
/// Every provider but `STATIC` is wrapped in [`Cached`] (for `NOMAD+K8S-PODS`, each side has
/// its own cache), so it reports [`DiscoveryError::NotYetSynced`] until
/// [`start`](Discoverer::start) has completed a first refresh. Each missing setting is a
/// named error; nothing is contacted here. A Kubernetes provider without `K8S_API_ENDPOINT`
/// reads the in-cluster service account now and fails outside a cluster.
pub fn new(config: &Config) -> Result<Arc<dyn Discoverer>, DiscoveryError> {
    let cached =
        |lister: Arc<dyn Discoverer>| -> Arc<dyn Discoverer> { Arc::new(Cached::new(lister)) };
    Ok(match config.kind()? {
        Kind::Dns => cached(dns(config)?),
        Kind::K8sPods => cached(kubernetes(config, Kind::K8sPods)?),
        Kind::Nomad => cached(nomad(config)?),
        Kind::NomadK8sPods => {
            // Nomad's settings are checked first, so its errors come first.
            let primary = cached(nomad(config)?);
            let fallback = cached(kubernetes(config, Kind::NomadK8sPods)?);
            Arc::new(Merged::new(primary, fallback))
        }
        Kind::Static => {
            if config.static_endpoints.is_empty() {
                return Err(DiscoveryError::MissingStaticEndpoints);
            }
            Arc::new(Static::new(&config.static_endpoints, config.port)?)
        }
    })
}

fn dns(config: &Config) -> Result<Arc<dyn Discoverer>, DiscoveryError> {
    if config.dns_resolver_address.is_empty() {
        return Err(DiscoveryError::MissingDnsResolver);
    }
    if config.dns_query.is_empty() {
        return Err(DiscoveryError::MissingDnsQuery);
    }
    let resolver = Dns::parse_resolver(&config.dns_resolver_address)?;
    Ok(Arc::new(Dns::new(
        config.dns_query.clone(),
        resolver,
        config.port,
    )))
}

fn nomad(config: &Config) -> Result<Arc<dyn Discoverer>, DiscoveryError> {
    if config.nomad_endpoint.is_empty() {
        return Err(DiscoveryError::MissingNomadEndpoint);
    }
    if config.nomad_token.is_empty() {
        return Err(DiscoveryError::MissingNomadToken);
    }
    let client = NomadClient::new(&config.nomad_endpoint, Some(&config.nomad_token))?;
    Ok(Arc::new(NomadAllocations::new(
        client,
        FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS,
        config.port,
    )))
}

fn kubernetes(config: &Config, kind: Kind) -> Result<Arc<dyn Discoverer>, DiscoveryError> {
    if config.pod_namespace.is_empty() {
        return Err(DiscoveryError::MissingPodNamespace);
    }
    if config.pod_labels.is_empty() {
        return Err(DiscoveryError::MissingPodLabels);
    }
    #[cfg(feature = "kubernetes")]
    {
        use super::{KubernetesApi, KubernetesPods};
        let _ = kind;
        let api = if config.k8s_api_endpoint.is_empty() {
            KubernetesApi::in_cluster()?
        } else if config.k8s_api_insecure {
            KubernetesApi::insecure(&config.k8s_api_endpoint)?
        } else {
            KubernetesApi::google(&config.k8s_api_endpoint)?
        };
        Ok(Arc::new(KubernetesPods::new(
            api,
            &config.pod_namespace,
            &config.pod_labels,
            config.port,
            config.host_ip,
        )))
    }
    #[cfg(not(feature = "kubernetes"))]
    Err(DiscoveryError::KubernetesUnavailable(kind.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_booleans() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_go_bool("yes"), None);
    }

    #[test]
    fn debug_never_shows_the_token() {
        let mut c = Config::new("NOMAD");
        c.nomad_token = "s3cr3t-token".into();
        c.nomad_endpoint = "http://user:pw@nomad:4646".into();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(!shown.contains("pw@"), "{shown}");
    }
}
