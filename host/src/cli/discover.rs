//! `ccfleet discover`: builds a service-discovery provider from the environment (or flags)
//! and prints the instances it sees, once or as they appear and vanish.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ccfleet::discovery::provider::{self, Config};
use ccfleet::discovery::{Discoverer, DiscoveryError, Instance};
use serde::Serialize;

/// How often the first refresh is checked for while waiting on it.
const SYNC_POLL: Duration = Duration::from_millis(50);

/// Flags of `ccfleet discover`. Each setting flag overrides the environment variable of the
/// same name under `--env-prefix`; the Nomad token is read from the environment only, so it
/// never appears in a process listing.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Prefix of the environment variables to read (`SD_` reads `SD_PROVIDER`, `SD_PORT`, ...).
    #[arg(long, default_value = "")]
    env_prefix: String,
    /// DNS, K8S-PODS, NOMAD, NOMAD+K8S-PODS or STATIC (overrides `PROVIDER`).
    #[arg(long)]
    provider: Option<String>,
    /// The port instances listen on (overrides `PORT`; default 5008).
    #[arg(long)]
    port: Option<u16>,
    /// Comma-separated names to resolve (overrides `DNS_QUERY`).
    #[arg(long)]
    dns_query: Option<String>,
    /// `ip[:port]` or `host[:port]` of the DNS resolver (overrides `DNS_RESOLVER_ADDRESS`).
    #[arg(long)]
    dns_resolver_address: Option<String>,
    /// `https://` Kubernetes API endpoint, reached on Google Application Default Credentials
    /// (overrides `K8S_API_ENDPOINT`; unset uses the pod's service account).
    #[arg(long)]
    k8s_api_endpoint: Option<String>,
    /// Allow an `http://` Kubernetes endpoint, sent no credentials (overrides
    /// `K8S_API_INSECURE`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    k8s_api_insecure: Option<bool>,
    /// Namespace of the pods (overrides `POD_NAMESPACE`).
    #[arg(long)]
    pod_namespace: Option<String>,
    /// Label selector of the pods (overrides `POD_LABELS`).
    #[arg(long)]
    pod_labels: Option<String>,
    /// Report host IPs instead of pod IPs (overrides `HOST_IP`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    host_ip: Option<bool>,
    /// Comma-separated `host[:port]` entries (overrides `STATIC`).
    #[arg(long = "static")]
    static_endpoints: Option<String>,
    /// Nomad agent URL, any path ignored (overrides `NOMAD_ENDPOINT`); the token comes from
    /// `NOMAD_TOKEN`.
    #[arg(long)]
    nomad_endpoint: Option<String>,
    /// Print JSON instead of a table (with `--watch`, one JSON event per line).
    #[arg(long)]
    json: bool,
    /// Keep listing on an interval and print what appeared and vanished.
    #[arg(long)]
    watch: bool,
    /// How often `--watch` lists, as a Go duration.
    #[arg(long, default_value = "10s", value_parser = super::positive_duration)]
    interval: Duration,
    /// How long to wait for the provider's first refresh, as a Go duration.
    #[arg(long, default_value = "15s", value_parser = super::positive_duration)]
    timeout: Duration,
}

impl Args {
    /// The provider configuration: flags first, then the prefixed environment.
    fn config(&self) -> Result<Config, DiscoveryError> {
        let overrides: BTreeMap<&str, String> = [
            (provider::ENV_PROVIDER, self.provider.clone()),
            (provider::ENV_PORT, self.port.map(|p| p.to_string())),
            (provider::ENV_DNS_QUERY, self.dns_query.clone()),
            (
                provider::ENV_DNS_RESOLVER_ADDRESS,
                self.dns_resolver_address.clone(),
            ),
            (
                provider::ENV_K8S_API_ENDPOINT,
                self.k8s_api_endpoint.clone(),
            ),
            (
                provider::ENV_K8S_API_INSECURE,
                self.k8s_api_insecure.map(|b| b.to_string()),
            ),
            (provider::ENV_POD_NAMESPACE, self.pod_namespace.clone()),
            (provider::ENV_POD_LABELS, self.pod_labels.clone()),
            (provider::ENV_HOST_IP, self.host_ip.map(|b| b.to_string())),
            (provider::ENV_STATIC, self.static_endpoints.clone()),
            (provider::ENV_NOMAD_ENDPOINT, self.nomad_endpoint.clone()),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect();
        let prefix = self.env_prefix.as_str();
        Config::from_lookup(prefix, |name| {
            name.strip_prefix(prefix)
                .and_then(|short| overrides.get(short).cloned())
                .or_else(|| std::env::var(name).ok())
        })
    }
}

/// Runs `ccfleet discover`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = match args.config() {
        Err(DiscoveryError::MissingProvider { name }) => bail!("{}", missing_provider(&name)),
        other => other.context("reading the discovery settings")?,
    };
    let discoverer = provider::new(&config)
        .with_context(|| format!("building the {} discovery provider", config.provider))?;
    // Errors name the provider as well as the source inside it that failed.
    let label = config.kind()?.to_string();
    discoverer.start().await;
    let result = if args.watch {
        tokio::select! {
            r = watch(&args, &label, discoverer.as_ref()) => r,
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        }
    } else {
        once(&args, &label, discoverer.as_ref()).await
    };
    discoverer.stop().await;
    result
}

async fn once(args: &Args, label: &str, discoverer: &dyn Discoverer) -> anyhow::Result<()> {
    let mut instances = first_listing(label, discoverer, args.timeout).await?;
    sort(&mut instances);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &instances)?;
        writeln!(out)?;
    } else {
        out.write_all(render_table(&instances).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

async fn watch(args: &Args, label: &str, discoverer: &dyn Discoverer) -> anyhow::Result<()> {
    let mut known = first_listing(label, discoverer, args.timeout).await?;
    sort(&mut known);
    if args.json {
        print_changes(&diff(&[], &known), true)?;
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(render_table(&known).as_bytes())?;
        out.flush()?;
    }
    let mut ticker = tokio::time::interval(args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        match discoverer.list_instances().await {
            Ok(mut current) => {
                sort(&mut current);
                print_changes(&diff(&known, &current), args.json)?;
                known = current;
            }
            // Skip the cycle and keep the last set: an error is never an empty fleet.
            Err(e) => eprintln!("{label} discovery failed: {e}"),
        }
    }
}

/// Lists once the provider has completed its first refresh, or fails after `timeout`.
async fn first_listing(
    label: &str,
    discoverer: &dyn Discoverer,
    timeout: Duration,
) -> anyhow::Result<Vec<Instance>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match discoverer.list_instances().await {
            Err(e) if e.is_not_yet_synced() => {
                if tokio::time::Instant::now() >= deadline {
                    bail!(
                        "{label} discovery completed no refresh within {}",
                        ccfleet::duration::format(timeout)
                    );
                }
                tokio::time::sleep(SYNC_POLL).await;
            }
            Err(e) => bail!("{label} discovery failed: {e}"),
            Ok(instances) => return Ok(instances),
        }
    }
}

/// What to do when no provider is chosen: the flag, the variable and every value.
fn missing_provider(variable: &str) -> String {
    let values = [
        provider::DNS_PROVIDER,
        provider::K8S_PODS_PROVIDER,
        provider::NOMAD_PROVIDER,
        provider::NOMAD_K8S_PODS_PROVIDER,
        provider::STATIC_PROVIDER,
    ]
    .join(", ");
    format!(
        "no discovery provider: pass --provider PROVIDER or set {variable} (PROVIDER is one of {values}; e.g. --provider STATIC --static 10.0.0.1:5008)"
    )
}

fn sort(instances: &mut [Instance]) {
    instances.sort_by(|a, b| {
        (&a.backend, &a.workload_id, a.port).cmp(&(&b.backend, &b.workload_id, b.port))
    });
}

/// The instances as an aligned text table.
fn render_table(instances: &[Instance]) -> String {
    const HEADER: [&str; 4] = ["WORKLOAD ID", "NODE ID", "ADDRESS", "BACKEND"];
    let rows: Vec<[String; 4]> = instances
        .iter()
        .map(|i| {
            [
                i.workload_id.clone(),
                i.node_id.clone(),
                i.address(),
                i.backend.clone(),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 4]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if i + 1 < cells.len() {
                text.extend(std::iter::repeat_n(
                    ' ',
                    w.saturating_sub(cell.chars().count()),
                ));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(HEADER);
    for row in &rows {
        line([&row[0], &row[1], &row[2], &row[3]]);
    }
    out
}

/// How one instance changed between two listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", content = "instance", rename_all = "kebab-case")]
enum Change {
    /// A workload id that was not listed before.
    Appeared(Instance),
    /// A workload id that is no longer listed.
    Vanished(Instance),
    /// A workload id listed before with other details (address, port, node).
    Changed(Instance),
}

/// The changes from `old` to `new`, keyed by workload id, in workload-id order.
fn diff(old: &[Instance], new: &[Instance]) -> Vec<Change> {
    let old: BTreeMap<&str, &Instance> = old.iter().map(|i| (i.workload_id.as_str(), i)).collect();
    let new: BTreeMap<&str, &Instance> = new.iter().map(|i| (i.workload_id.as_str(), i)).collect();
    let mut changes = Vec::new();
    for (id, before) in &old {
        if !new.contains_key(id) {
            changes.push(Change::Vanished((*before).clone()));
        }
    }
    for (id, now) in &new {
        match old.get(id) {
            None => changes.push(Change::Appeared((*now).clone())),
            Some(before) if before != now => changes.push(Change::Changed((*now).clone())),
            Some(_) => {}
        }
    }
    changes
}

fn print_changes(changes: &[Change], json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for change in changes {
        if json {
            serde_json::to_writer(&mut out, change)?;
            writeln!(out)?;
        } else {
            let (mark, i) = match change {
                Change::Appeared(i) => ('+', i),
                Change::Vanished(i) => ('-', i),
                Change::Changed(i) => ('~', i),
            };
            writeln!(
                out,
                "{mark} {}  {}  {}  {}",
                i.workload_id,
                if i.node_id.is_empty() {
                    "-"
                } else {
                    &i.node_id
                },
                i.address(),
                i.backend
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, ip: &str, port: u16) -> Instance {
        Instance {
            workload_id: id.to_owned(),
            node_id: String::new(),
            ip_address: ip.to_owned(),
            port,
            backend: "static".to_owned(),
        }
    }

    #[test]
    fn diff_reports_appeared_vanished_and_changed() {
        let old = [instance("a", "10.0.0.1", 1), instance("b", "10.0.0.2", 1)];
        let new = [instance("b", "10.0.0.9", 1), instance("c", "10.0.0.3", 1)];
        assert_eq!(
            diff(&old, &new),
            vec![
                Change::Vanished(old[0].clone()),
                Change::Changed(new[0].clone()),
                Change::Appeared(new[1].clone()),
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn change_serializes_as_an_event() {
        let json = serde_json::to_value(Change::Appeared(instance("a", "10.0.0.1", 5008))).unwrap();
        assert_eq!(json["event"], "appeared");
        assert_eq!(json["instance"]["workload-id"], "a");
        assert_eq!(json["instance"]["port"], 5008);
    }

    #[test]
    fn table_aligns_columns() {
        let table = render_table(&[
            instance("10.0.0.1:5008", "10.0.0.1", 5008),
            instance("x", "fd00::1", 1),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "WORKLOAD ID    NODE ID  ADDRESS        BACKEND");
        assert_eq!(lines[1], "10.0.0.1:5008           10.0.0.1:5008  static");
        assert_eq!(lines[2], "x                       [fd00::1]:1    static");
    }

    #[test]
    fn flags_override_the_prefixed_environment() {
        let args = Args {
            env_prefix: "CCFLEET_DISCOVER_TEST_UNSET_".to_owned(),
            provider: Some("static".to_owned()),
            port: Some(6123),
            dns_query: None,
            dns_resolver_address: None,
            k8s_api_endpoint: Some("http://127.0.0.1:8001".to_owned()),
            k8s_api_insecure: Some(true),
            pod_namespace: None,
            pod_labels: None,
            host_ip: Some(true),
            static_endpoints: Some("10.0.0.1, 10.0.0.2:7000".to_owned()),
            nomad_endpoint: None,
            json: false,
            watch: false,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(15),
        };
        let config = args.config().unwrap();
        assert_eq!(config.provider, "static");
        assert_eq!(config.port, 6123);
        assert!(config.host_ip);
        assert!(config.k8s_api_insecure);
        assert_eq!(config.static_endpoints, ["10.0.0.1", "10.0.0.2:7000"]);
    }

    #[test]
    fn malformed_static_entries_and_local_are_refused_as_by_the_library() {
        let args = |provider: &str, entries: Option<&str>| Args {
            env_prefix: "CCFLEET_DISCOVER_TEST_UNSET_".to_owned(),
            provider: Some(provider.to_owned()),
            port: None,
            dns_query: None,
            dns_resolver_address: None,
            k8s_api_endpoint: None,
            k8s_api_insecure: None,
            pod_namespace: None,
            pod_labels: None,
            host_ip: None,
            static_endpoints: entries.map(str::to_owned),
            nomad_endpoint: None,
            json: false,
            watch: false,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(15),
        };
        let err = provider::new(&args("STATIC", Some("a:b:c")).config().unwrap())
            .err()
            .expect("a:b:c is refused");
        assert!(err.to_string().contains("too many colons"), "{err}");
        let err = provider::new(&args("LOCAL", Some("10.0.0.1")).config().unwrap())
            .err()
            .expect("LOCAL is no provider");
        assert!(err.to_string().contains("PROVIDER=STATIC"), "{err}");
    }
}
