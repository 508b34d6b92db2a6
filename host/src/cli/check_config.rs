//! `--check-config` of `ccfleet server` and `ccfleet agent`: validate a configuration the
//! way start-up would, without starting anything.
//!
//! The report goes to standard output, one finding per line (`FILE: error: ...`,
//! `FILE: warning: ...`, `FILE: note: ...`), then `FILE: ok` or `FILE: N error(s)`. The
//! status is 0 when the configuration is usable (warnings allowed) and 1 when it is not; a
//! file that cannot be read at all is an error (status 2).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use base64::Engine as _;
use ccfleet::server::ServerConfig;
use ccfleet_host::agent::{AgentConfig, SinkKind};

/// What a check found.
#[derive(Debug, Default)]
pub struct Report {
    /// What makes the configuration unusable.
    pub errors: Vec<String>,
    /// What is allowed but probably not meant.
    pub warnings: Vec<String>,
    /// What was chosen where the configuration leaves a choice.
    pub notes: Vec<String>,
}

impl Report {
    /// Prints the report and returns the exit status it stands for.
    fn finish(&self, path: &Path) -> anyhow::Result<ExitCode> {
        let file = path.display();
        let mut out = std::io::stdout().lock();
        let lines = self
            .errors
            .iter()
            .map(|m| ("error", m))
            .chain(self.warnings.iter().map(|m| ("warning", m)))
            .chain(self.notes.iter().map(|m| ("note", m)));
        for (kind, message) in lines {
            writeln!(out, "{file}: {kind}: {message}").context("writing to standard output")?;
        }
        if self.errors.is_empty() {
            writeln!(out, "{file}: ok").context("writing to standard output")?;
            Ok(ExitCode::SUCCESS)
        } else {
            writeln!(out, "{file}: {} error(s)", self.errors.len())
                .context("writing to standard output")?;
            Ok(ExitCode::from(1))
        }
    }
}

/// The directory relative paths of a configuration file are resolved against.
pub fn base_dir(config: &Path) -> PathBuf {
    match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `ccfleet server --check-config`.
pub fn server(path: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut report = Report::default();
    let mut config = match ServerConfig::from_json(&text) {
        Ok(config) => config,
        Err(e) => {
            report.errors.push(super::one_line(&e.into()));
            return report.finish(path);
        }
    };
    config.resolve_paths(&base_dir(path));
    let mut found = check_server(&config);
    // Start-up logs these itself; a check names them too.
    if config.fleet.config_dir.is_none() {
        found.warnings.push(
            "fleet.config-dir is not set: every configuration pull answers 204 (no content)"
                .to_owned(),
        );
    }
    if config.db.is_none() && config.registry == ccfleet::server::RegistryConfig::Sqlite {
        found
            .warnings
            .push("db is not set: the registry lives in memory and is lost on restart".to_owned());
    }
    if config.nats.is_none() && config.fleet.heartbeat_subject.is_some() {
        found.warnings.push(
            "fleet.heartbeat-subject is set but there is no nats section: heartbeats arrive only over REST".to_owned(),
        );
    }
    if config.disable_authentication {
        found.warnings.push(
            "disable-authentication is true: anyone allowed by api-allowed-ips can register, heartbeat and deregister".to_owned(),
        );
    }
    if let Some(dir) = &config.fleet.config_dir {
        found
            .notes
            .push(format!("config tree at {}", dir.display()));
    }
    if let Some(db) = &config.db {
        found
            .notes
            .push(format!("registry database {}", db.display()));
    }
    if let ccfleet::server::RegistryConfig::JetStreamKv(js) = &config.registry {
        found.notes.push(format!(
            "registry in JetStream bucket {} ({} replica(s))",
            js.bucket, js.replicas
        ));
    }
    found.finish(path)
}

/// The checks shared by `--check-config` and start-up (which logs the warnings and refuses
/// the errors).
pub fn check_server(config: &ServerConfig) -> Report {
    let mut report = Report {
        warnings: config.warnings(),
        ..Report::default()
    };
    if let Err(e) = ccfleet::server::allowlist::Allowlist::new(&config.api_allowed_ips) {
        report.errors.push(e.to_string());
    }
    if !config.disable_authentication {
        let key = config
            .jwt_public_key
            .clone()
            .map(|k| ("jwt-public-key", k))
            .or_else(|| {
                std::env::var("JWT_PUBLIC_KEY")
                    .ok()
                    .map(|k| ("JWT_PUBLIC_KEY", k))
            })
            .filter(|(_, k)| !k.trim().is_empty());
        match key {
            None => report.errors.push(
                "no JWT public key: set jwt-public-key or JWT_PUBLIC_KEY (the JWT_PUBLIC_KEY line of `ccfleet keygen`), or \"disable-authentication\": true".to_owned(),
            ),
            Some((source, key)) => {
                let decoded = base64::engine::general_purpose::STANDARD.decode(key.trim());
                if decoded.as_ref().is_ok_and(|b| b.len() == 64) {
                    report.errors.push(format!(
                        "{source} holds 64 bytes, the length of a private key: it looks like the JWT_PRIVATE_KEY value; use the JWT_PUBLIC_KEY line of `ccfleet keygen` (and keep the private key off the server)"
                    ));
                } else if let Err(e) = ccfleet::server::auth::Verifier::from_public_base64(&key) {
                    report.errors.push(format!("{source}: {e}"));
                }
            }
        }
    }
    if let Some(dir) = &config.fleet.config_dir
        && dir.exists()
    {
        match ccfleet::server::configtree::ConfigTree::load(dir) {
            Ok(tree) => {
                check_named_plugins(&tree, config.fleet.plugin_dir.as_deref(), &mut report);
                check_rollouts(&tree, config.fleet.plugin_dir.as_deref(), &mut report);
            }
            Err(e) => report.errors.push(e.to_string()),
        }
    }
    if let Some(db) = &config.db
        && let Some(parent) = db.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        report.errors.push(format!(
            "db {}: the directory {} does not exist",
            db.display(),
            parent.display()
        ));
    }
    if config.nats.is_some() && config.fleet.heartbeat_subject.is_none() {
        report.warnings.push(
            "nats is set but fleet.heartbeat-subject is not: the server consumes no NATS heartbeats (rosters are still published)".to_owned(),
        );
    }
    report
}

/// Every staged rollout of the tree (`rollouts/*.json`) as the server will take it: its
/// definition, the plugins its change names by SHA-256 in `fleet.plugin-dir`, and no two
/// rollouts covering the same members. The same check the server's rescan makes.
fn check_rollouts(
    tree: &ccfleet::server::configtree::ConfigTree,
    plugin_dir: Option<&Path>,
    report: &mut Report,
) {
    let index = plugin_dir.and_then(|dir| ccfleet::server::plugins::PluginDir::open(dir).ok());
    let known = |sha: &str| index.as_ref().is_some_and(|i| i.find(sha).is_some());
    let rollouts = ccfleet::server::rollout::Rollouts::new();
    report.errors.extend(rollouts.refresh(tree, &known));
    for definition in rollouts.definitions() {
        report.notes.push(format!(
            "rollout {}: {} stage(s) for type {}{}",
            definition.name,
            definition.stages.len(),
            definition.service_type.code(),
            definition
                .cluster
                .as_deref()
                .map(|c| format!(" in cluster {c}"))
                .unwrap_or_default()
        ));
        for (i, stage) in definition.stages.iter().enumerate() {
            report.notes.push(format!(
                "rollout {} stage {i}: {}",
                definition.name,
                stage.describe()
            ));
        }
    }
}

/// Every plugin the tree names by SHA-256 must be in `fleet.plugin-dir`: agents would
/// otherwise fail its download on every poll, and the rollout stalls with nothing on the
/// server's side to say why.
fn check_named_plugins(
    tree: &ccfleet::server::configtree::ConfigTree,
    plugin_dir: Option<&Path>,
    report: &mut Report,
) {
    use ccfleet::server::plugins::{PluginDir, is_sha256};
    let named = tree.named_plugins();
    if named.is_empty() {
        return;
    }
    let index = match plugin_dir {
        None => None,
        Some(dir) => match PluginDir::open(dir) {
            Ok(index) => Some(index),
            Err(e) => {
                report.errors.push(format!(
                    "fleet.plugin-dir {}: cannot be read: {e}",
                    dir.display()
                ));
                return;
            }
        },
    };
    for (layer, name, sha256) in named {
        let shown = ccfleet::untrusted::Untrusted(&sha256).capped(80);
        let plugin = ccfleet::untrusted::Untrusted(&name).capped(80);
        let at = format!("config tree {layer}: plugin \"{plugin}\"");
        if !is_sha256(&sha256) {
            report.errors.push(format!(
                "{at}: sha256 \"{shown}\" is not 64 lowercase hexadecimal digits"
            ));
            continue;
        }
        match (&index, plugin_dir) {
            (Some(index), Some(dir)) => {
                if index.find(&sha256).is_none() {
                    report.errors.push(format!(
                        "{at}: no file in fleet.plugin-dir {} has sha256 {sha256}: copy the component there (`sha256sum FILE` names its hash)",
                        dir.display()
                    ));
                }
            }
            _ => report.errors.push(format!(
                "{at} is named by sha256 {sha256}, but fleet.plugin-dir is not set: every plugin download answers 404"
            )),
        }
    }
}

/// `ccfleet agent --check-config`.
pub async fn agent(path: &Path) -> anyhow::Result<ExitCode> {
    if let Err(e) = std::fs::metadata(path) {
        return Err(e).with_context(|| format!("reading {}", path.display()));
    }
    let mut report = Report::default();
    match AgentConfig::load(path) {
        Ok(config) => check_agent(&config, &mut report).await,
        Err(e) => report.errors.push(super::one_line(&e.into())),
    }
    report.finish(path)
}

async fn check_agent(config: &AgentConfig, report: &mut Report) {
    let fleet = match ccfleet::client::Config::from_value(config.fleet.clone())
        .and_then(|fleet| fleet.validate().map(|()| fleet))
    {
        Ok(fleet) => Some(fleet),
        Err(e) => {
            report.errors.push(e.to_string());
            None
        }
    };
    if let Some(fleet) = &fleet {
        match fleet.resolve_token() {
            Ok(token) if token.is_empty() => report.warnings.push(
                "no token (CC_FLEET_TOKEN, CC_FLEET_TOKEN_FILE or fleet.token): cc-backend answers 401 unless its authentication is disabled".to_owned(),
            ),
            Ok(_) => {}
            Err(e) => report.errors.push(e.to_string()),
        }
        if let Some(cache) = &fleet.cache_path
            && let Some(parent) = cache.parent()
            && !parent.as_os_str().is_empty()
            && !parent.is_dir()
        {
            report.warnings.push(format!(
                "fleet.cache-path {}: the directory {} does not exist, so nothing can be cached",
                cache.display(),
                parent.display()
            ));
        }
    }
    if let Some(nats) = &config.nats {
        for (key, file) in [
            ("nats.creds-file-path", &nats.creds_file_path),
            ("nats.nkey-seed-file", &nats.nkey_seed_file),
        ] {
            if !file.is_empty() && !Path::new(file).is_file() {
                report.errors.push(format!("{key} {file}: no such file"));
            }
        }
    }
    let cluster = fleet.as_ref().map(|f| f.cluster.as_str()).unwrap_or("");
    for (name, sink) in &config.sinks {
        use ccfleet_host::agent::sinks::SinkSettings;
        for file in sink.secret_files() {
            if !file.is_file() {
                let key = match &sink.settings {
                    SinkSettings::Http(_) => "jwt-file",
                    _ => "password_file",
                };
                report.errors.push(format!(
                    "sinks.{name}.{key} {}: no such file",
                    file.display()
                ));
            }
        }
        let note = match &sink.settings {
            SinkSettings::Http(http) => {
                // Without user information, which may be a credential.
                let shown = reqwest::Url::parse(&http.url)
                    .map(|mut u| {
                        let _ = u.set_username("");
                        let _ = u.set_password(None);
                        u.to_string()
                    })
                    .unwrap_or_default();
                format!("sink {name}: cc-metric-store at {shown}")
            }
            SinkSettings::Influx(kind, influx) => {
                let shown = influx
                    .write_url()
                    .map(|mut u| {
                        u.set_query(None);
                        u.to_string()
                    })
                    .unwrap_or_default();
                format!("sink {name}: {} at {shown}", kind.as_str())
            }
            SinkSettings::Nats(_) if config.nats.is_none() => {
                report.errors.push(format!(
                    "sinks.{name} is of type nats but there is no nats section"
                ));
                continue;
            }
            _ => format!("sink {name}: {}", sink.kind().as_str()),
        };
        report.notes.push(note);
    }
    match (config.metrics.kind, &config.nats) {
        _ if !config.sinks.is_empty() => {}
        (Some(SinkKind::Stdout), _) => report
            .notes
            .push("metrics go to standard output (metrics.type is stdout)".to_owned()),
        (None, None) => report
            .notes
            .push("metrics go to standard output (there is no nats section)".to_owned()),
        (_, Some(_)) => {
            let subject = config.metrics.subject.clone().unwrap_or_else(|| {
                if cluster.is_empty() {
                    "cc.metric".to_owned()
                } else {
                    format!("cc.metric.{cluster}")
                }
            });
            report
                .notes
                .push(format!("metrics go to NATS subject {subject}"));
        }
        (Some(SinkKind::Nats), None) => report
            .errors
            .push("metrics.type is nats but there is no nats section".to_owned()),
    }
    check_plugins(config, report).await;
}

async fn check_plugins(config: &AgentConfig, report: &mut Report) {
    if config.plugins.is_empty() {
        report
            .warnings
            .push("no plugins: the agent only joins the fleet".to_owned());
        return;
    }
    // Compiling each plugin shows a component that does not fit the plugin world now, not
    // at the first start; nothing is cached and nothing runs.
    let runtime = match ccfleet_host::Runtime::new(ccfleet_host::RuntimeOptions {
        cache_dir: None,
        ..ccfleet_host::RuntimeOptions::default()
    }) {
        Ok(runtime) => runtime,
        Err(e) => {
            report.errors.push(format!("plugin runtime: {e}"));
            return;
        }
    };
    for spec in &config.plugins {
        let name = spec.display_name();
        // The same checks the plugin's start makes: file, mode, user.
        for grant in ccfleet_host::plugin::commands::check(&spec.capabilities.run) {
            let what = format!("plugin {name}: capabilities.run.{}", grant.name);
            match (grant.error, grant.warning) {
                (Some(error), _) => report.errors.push(format!("{what}: {error}")),
                (None, Some(warning)) => report.warnings.push(format!("{what}: {warning}")),
                (None, None) => {}
            }
        }
        if !spec.path.is_file() {
            report.errors.push(format!(
                "plugin {name}: {} does not exist",
                spec.path.display()
            ));
            continue;
        }
        match runtime.load(spec).await {
            Ok(_) => report
                .notes
                .push(format!("plugin {name}: {} compiles", spec.path.display())),
            Err(e) => report.errors.push(format!("plugin {name}: {e}")),
        }
    }
}
