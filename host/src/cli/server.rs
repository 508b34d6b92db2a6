//! `ccfleet server`: runs a cc-backend-compatible fleet server, only checks its
//! configuration (`--check-config`), or copies a SQLite registry into the JetStream bucket
//! the configuration names (`migrate --from-sqlite FILE`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use ccfleet::server::ServerConfig;

use super::check_config;

/// Flags of `ccfleet server`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    /// The JSON configuration (addr, db, registry, api-allowed-ips, jwt-public-key, nats,
    /// fleet). Relative paths in it are resolved against the file's directory.
    #[arg(long, short = 'c', value_name = "FILE", required = true)]
    config: Option<PathBuf>,
    /// Validate the configuration (keys, key material, allowlist, config tree, database
    /// directory) and exit without starting: status 0 when usable, 1 when not.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<ServerCommand>,
}

/// Subcommands of `ccfleet server`.
#[derive(Debug, clap::Subcommand)]
pub enum ServerCommand {
    /// Copy a SQLite registry into the JetStream bucket of the configuration's
    /// `"registry": {"type": "jetstream-kv"}`. Idempotent: members the bucket already holds
    /// are left as they are; prints how many were copied, already present and skipped.
    Migrate(MigrateArgs),
}

/// Flags of `ccfleet server migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// The server configuration: its `registry` names the bucket, its `nats` the connection.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// The SQLite registry file (the `db` of a single server) to copy.
    #[arg(long, value_name = "FILE")]
    from_sqlite: PathBuf,
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
    if let Some(ServerCommand::Migrate(migrate_args)) = args.command {
        return migrate(migrate_args).await;
    }
    let Some(path) = args.config else {
        anyhow::bail!("--config FILE is required");
    };
    if args.check_config {
        return check_config::server(&path);
    }
    let config = load(&path)?;
    // The same checks as --check-config: refuse what cannot work, warn about what is
    // allowed but probably not meant.
    let report = check_config::check_server(&config);
    for warning in &report.warnings {
        tracing::warn!("fleet: {warning}");
    }
    if let Some(error) = report.errors.first() {
        anyhow::bail!("{}: {error}", path.display());
    }
    let server = ccfleet::server::start(config).await?;
    wait_for_signal().await?;
    tracing::info!("fleet: shutting down");
    server.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}

/// How many copies to the bucket are in flight at once.
const MIGRATE_CONCURRENCY: usize = 256;

/// `ccfleet server migrate`: copies every service of a SQLite registry into the bucket,
/// keeping instance ids, states, times and acknowledged revisions.
async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    use ccfleet::server::RegistryConfig;
    use ccfleet::server::registry::jetstream::{CopyOutcome, JetStreamStore};
    use ccfleet::server::registry::{RegistryStore, SqliteStore};
    use futures::StreamExt;

    let config = load(&args.config)?;
    let RegistryConfig::JetStreamKv(settings) = &config.registry else {
        anyhow::bail!(
            "{}: migrate copies into a JetStream bucket: set \"registry\": {{\"type\": \"jetstream-kv\", ...}}",
            args.config.display()
        );
    };
    let nats = config
        .nats
        .as_ref()
        .context("a jetstream-kv registry needs a nats section")?;
    // Opening a missing file would create an empty registry and "migrate" nothing.
    anyhow::ensure!(
        args.from_sqlite.is_file(),
        "{}: no such SQLite registry file",
        args.from_sqlite.display()
    );
    let source = args.from_sqlite.clone();
    let services = tokio::task::spawn_blocking(move || SqliteStore::open(Some(&source))?.load())
        .await
        .context("reading the SQLite registry")?
        .with_context(|| format!("reading {}", args.from_sqlite.display()))?;
    let options = nats.connect_options("ccfleet-migrate").await?;
    let client = nats
        .connect(options)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to NATS at {}: {e}", nats.display_address()))?;
    let store = JetStreamStore::open(client.clone(), settings.clone()).await?;
    let (mut copied, mut present, mut skipped) = (0u64, 0u64, 0u64);
    let mut outcomes = futures::stream::iter(services.iter().map(|s| store.copy_in(s)))
        .buffer_unordered(MIGRATE_CONCURRENCY);
    while let Some(outcome) = outcomes.next().await {
        match outcome? {
            CopyOutcome::Copied => copied += 1,
            CopyOutcome::AlreadyPresent => present += 1,
            CopyOutcome::Differs => skipped += 1,
        }
    }
    drop(outcomes);
    client.flush().await.context("flushing NATS")?;
    println!(
        "{}: {} service(s) into bucket {}: {copied} copied, {present} already present, {skipped} skipped (the bucket holds another registration of the member)",
        args.from_sqlite.display(),
        services.len(),
        settings.bucket
    );
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
