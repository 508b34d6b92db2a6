//! `ccfleet server`: runs a cc-backend-compatible fleet server, only checks its
//! configuration (`--check-config`), or copies a SQLite registry into the JetStream bucket
//! the configuration names (`migrate --from-sqlite FILE`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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
/// How long `migrate` waits for NATS to answer before it gives up, naming the cause: a
/// one-shot command should not sit through the reconnect loop a server runs.
const MIGRATE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often `migrate` reports its progress.
const MIGRATE_PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// `ccfleet server migrate`: copies every service of a SQLite registry into the bucket,
/// keeping instance ids, states, times and acknowledged revisions. NATS is reached first,
/// within [`MIGRATE_CONNECT_TIMEOUT`]; progress is logged while copying.
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
    // NATS first: a wrong address or a NATS that is down is found in seconds, before the
    // registry is read.
    let client = connect_for_migrate(nats).await?;
    let shown = nats.display_address();
    tracing::info!("migrate: connected to NATS at {shown}");
    let source = args.from_sqlite.clone();
    let services = tokio::task::spawn_blocking(move || SqliteStore::open(Some(&source))?.load())
        .await
        .context("reading the SQLite registry")?
        .with_context(|| format!("reading {}", args.from_sqlite.display()))?;
    let total = services.len();
    let store = tokio::time::timeout(
        MIGRATE_CONNECT_TIMEOUT.saturating_mul(2),
        JetStreamStore::open(client.clone(), settings.clone()),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "opening bucket {} on NATS at {shown}: no answer from JetStream within {} (is JetStream enabled on that server?)",
            settings.bucket,
            ccfleet::duration::format(MIGRATE_CONNECT_TIMEOUT.saturating_mul(2))
        )
    })?
    .with_context(|| format!("opening bucket {} on NATS at {shown}", settings.bucket))?;
    tracing::info!(
        "migrate: copying {total} member(s) from {} into bucket {}",
        args.from_sqlite.display(),
        settings.bucket
    );
    let (mut copied, mut present, mut skipped) = (0u64, 0u64, 0u64);
    let mut outcomes = futures::stream::iter(services.iter().map(|s| store.copy_in(s)))
        .buffer_unordered(MIGRATE_CONCURRENCY);
    let mut progress = tokio::time::interval(MIGRATE_PROGRESS_EVERY);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    progress.tick().await;
    loop {
        tokio::select! {
            outcome = outcomes.next() => match outcome {
                None => break,
                Some(outcome) => match outcome.with_context(|| format!("copying into bucket {} on NATS at {shown}", settings.bucket))? {
                    CopyOutcome::Copied => copied += 1,
                    CopyOutcome::AlreadyPresent => present += 1,
                    CopyOutcome::Differs => skipped += 1,
                },
            },
            _ = progress.tick() => {
                let done = copied + present + skipped;
                tracing::info!("migrate: {done} of {total} member(s) done");
            }
        }
    }
    drop(outcomes);
    client.flush().await.context("flushing NATS")?;
    tracing::info!("migrate: {total} of {total} member(s) done");
    println!(
        "{}: {} service(s) into bucket {}: {copied} copied, {present} already present, {skipped} skipped (the bucket holds another registration of the member)",
        args.from_sqlite.display(),
        total,
        settings.bucket
    );
    Ok(ExitCode::SUCCESS)
}

/// Connects to NATS for `migrate`, or fails within [`MIGRATE_CONNECT_TIMEOUT`] naming the
/// address (without credentials) and the cause: the TCP connection's error, or what NATS
/// said while the handshake did not complete (e.g. an authorization violation).
async fn connect_for_migrate(
    nats: &ccfleet::server::NatsConfig,
) -> anyhow::Result<async_nats::Client> {
    use std::sync::{Arc, Mutex};
    let shown = nats.display_address();
    let within = ccfleet::duration::format(MIGRATE_CONNECT_TIMEOUT);
    let target = nats
        .server_address()
        .parse::<async_nats::ServerAddr>()
        .map_err(|_| {
            anyhow::anyhow!("nats.address is not a NATS URL (e.g. nats://127.0.0.1:4222)")
        })?;
    let (host, port) = (target.host().to_owned(), target.port());
    match tokio::time::timeout(
        MIGRATE_CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Err(_) => anyhow::bail!("cannot reach NATS at {shown}: no answer within {within}"),
        Ok(Err(e)) => anyhow::bail!("cannot reach NATS at {shown}: {e}"),
        Ok(Ok(_probe)) => {}
    }
    let last_problem: Arc<Mutex<Option<String>>> = Arc::default();
    let seen = last_problem.clone();
    let section = nats.clone();
    let options = nats
        .connect_options("ccfleet-migrate")
        .await?
        .event_callback(move |event| {
            let seen = seen.clone();
            let text = section.scrub(&event);
            async move {
                if matches!(
                    event,
                    async_nats::Event::ServerError(_) | async_nats::Event::ClientError(_)
                ) {
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
                }
            }
        });
    let client = nats
        .connect(options)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to NATS at {shown}: {e}"))?;
    let deadline = tokio::time::Instant::now() + MIGRATE_CONNECT_TIMEOUT;
    while client.connection_state() != async_nats::connection::State::Connected {
        if tokio::time::Instant::now() >= deadline {
            let cause = last_problem
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_else(|| "the handshake did not complete".to_owned());
            anyhow::bail!("cannot connect to NATS at {shown} within {within}: {cause}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(client)
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
