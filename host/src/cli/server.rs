//! `ccfleet server`: runs a cc-backend-compatible fleet server, or only checks its
//! configuration (`--check-config`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use ccfleet::server::ServerConfig;

use super::check_config;

/// Flags of `ccfleet server`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The JSON configuration (addr, db, api-allowed-ips, jwt-public-key, nats, fleet).
    /// Relative paths in it are resolved against the file's directory.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// Validate the configuration (keys, key material, allowlist, config tree, database
    /// directory) and exit without starting: status 0 when usable, 1 when not.
    #[arg(long)]
    check_config: bool,
}

impl Args {
    /// Whether only the configuration is checked (its report is the output, not the logs).
    pub fn checks_only(&self) -> bool {
        self.check_config
    }
}

/// Reads and parses a server configuration file, resolving its relative paths against the
/// file's directory.
pub fn load(path: &Path) -> anyhow::Result<ServerConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut config =
        ServerConfig::from_json(&text).with_context(|| format!("parsing {}", path.display()))?;
    config.resolve_paths(&check_config::base_dir(path));
    Ok(config)
}

/// Runs the server until SIGINT or SIGTERM, then shuts it down gracefully.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.check_config {
        return check_config::server(&args.config);
    }
    let config = load(&args.config)?;
    // The same checks as --check-config: refuse what cannot work, warn about what is
    // allowed but probably not meant.
    let report = check_config::check_server(&config);
    for warning in &report.warnings {
        tracing::warn!("fleet: {warning}");
    }
    if let Some(error) = report.errors.first() {
        anyhow::bail!("{}: {error}", args.config.display());
    }
    let server = ccfleet::server::start(config).await?;
    wait_for_signal().await?;
    tracing::info!("fleet: shutting down");
    server.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}
