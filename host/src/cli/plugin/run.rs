//! `ccfleet plugin run`: one plugin, no fleet. What it emits goes to standard output as line
//! protocol, what it logs to standard error; the exit status is 1 when the plugin fails.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use ccfleet::duration;
use ccfleet_host::plugin::{CallResult, Instance};
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::types::{ConfigUpdate, Source};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};

/// Flags of `ccfleet plugin run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The component (`.wasm`).
    file: PathBuf,
    /// The plugin's own configuration (JSON), handed to its `init`.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    config: String,
    /// A file the plugin may read through `cc:fleet/files` (a path or pattern, as in
    /// `capabilities.read-files`); repeatable.
    #[arg(long = "read", value_name = "PATTERN")]
    read: Vec<String>,
    /// Serve the granted files from this directory of fixtures (`capabilities.files-root`).
    #[arg(long, value_name = "DIR")]
    files_root: Option<PathBuf>,
    /// Grant the mount table and per-mount statistics (`capabilities.mount-info`), for
    /// `diskstat` and `nfsiostat`.
    #[arg(long)]
    mount_info: bool,
    /// Grant WASI (needed by plugins that link std).
    #[arg(long)]
    wasi: bool,
    /// Capabilities as an agent configuration grants them (JSON: `run`, `nvml`,
    /// `read-files`, ...); `--read`, `--files-root`, `--mount-info` and `--wasi` add to them.
    /// Command collectors need their `run` grants, e.g.
    /// `{"run": {"ps-top": {"path": "/usr/bin/ps", "args": ["-Ao", "comm", "--sort=-pcpu"]}}}`.
    #[arg(long, value_name = "JSON")]
    capabilities: Option<String>,
    /// A service configuration (JSON) handed to `on-config` before collecting.
    #[arg(long, value_name = "JSON")]
    service_config: Option<String>,
    /// A roster as the fleet server publishes it (a file), handed to `on-roster`.
    #[arg(long, value_name = "FILE")]
    roster: Option<PathBuf>,
    /// How many times to call `collect` (0: only `init` and the snapshots).
    #[arg(long, value_name = "N", default_value_t = 1)]
    collect: u32,
    /// The pause between two `collect` calls (Go syntax: `500ms`, `10s`).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    duration::parse(text).map_err(|e| e.to_string())
}

/// Runs `ccfleet plugin run`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config: serde_json::Value =
        serde_json::from_str(&args.config).context("--config is not JSON")?;
    let service_config = match &args.service_config {
        Some(text) => {
            serde_json::from_str::<serde_json::Value>(text)
                .context("--service-config is not JSON")?;
            Some(text.clone())
        }
        None => None,
    };
    let providers = match &args.roster {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let roster = ccfleet::wire::decode_roster(&bytes)
                .with_context(|| format!("{} is not a roster", path.display()))?;
            Some(
                roster
                    .iter()
                    .map(ccfleet_host::agent::provider)
                    .collect::<Vec<_>>(),
            )
        }
        None => None,
    };

    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })?;
    let mut spec = PluginSpec::new(&args.file);
    spec.config = config;
    if let Some(text) = &args.capabilities {
        spec.capabilities =
            serde_json::from_str(text).map_err(|e| anyhow::anyhow!("--capabilities: {e}"))?;
    }
    spec.capabilities.read_files.extend(args.read);
    if args.files_root.is_some() {
        spec.capabilities.files_root = args.files_root;
    }
    spec.capabilities.wasi |= args.wasi;
    spec.capabilities.mount_info |= args.mount_info;
    spec.validate()
        .map_err(|e| anyhow::anyhow!("--capabilities: {e}"))?;
    for grant in ccfleet_host::plugin::commands::check(&spec.capabilities.run) {
        if let Some(error) = grant.error {
            anyhow::bail!("--capabilities: run.{}: {error}", grant.name);
        }
    }
    let loaded = match runtime.load(&spec).await {
        Ok(loaded) => loaded,
        Err(error @ ccfleet_host::HostError::WasiNotGranted { .. }) => {
            return Err(anyhow::Error::new(error).context(format!(
                "loading {} (grant WASI with --wasi)",
                args.file.display()
            )));
        }
        Err(error) => {
            return Err(
                anyhow::Error::new(error).context(format!("loading {}", args.file.display()))
            );
        }
    };
    let (sink, mut batches) = sink::channel(1024);
    let mut instance = match loaded.instantiate(&runtime, &spec, sink).await {
        Ok(instance) => instance,
        Err(failure) => return failed(&mut batches, &failure),
    };
    if let Some(text) = service_config {
        let update = ConfigUpdate {
            config: Some(text),
            revision: "0".to_owned(),
            source: Source::Fleet,
        };
        let outcome = instance.on_config(&update).await;
        if let Some(code) = outcome_of(&mut batches, "on-config", outcome)? {
            return Ok(code);
        }
    }
    if let Some(providers) = providers {
        let outcome = instance.on_roster(&providers).await;
        if let Some(code) = outcome_of(&mut batches, "on-roster", outcome)? {
            return Ok(code);
        }
    }
    for n in 0..args.collect {
        if n > 0 {
            tokio::time::sleep(args.interval).await;
        }
        let outcome = collect(&mut instance).await;
        if let Some(code) = outcome_of(&mut batches, "collect", outcome)? {
            return Ok(code);
        }
    }
    print_batches(&mut batches)?;
    Ok(ExitCode::SUCCESS)
}

async fn collect(instance: &mut Instance) -> CallResult {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    instance.collect(now_ns).await
}

/// Prints what the call emitted; `Some` exit status when the plugin failed.
fn outcome_of(
    batches: &mut BatchReceiver,
    call: &str,
    outcome: CallResult,
) -> anyhow::Result<Option<ExitCode>> {
    match outcome {
        Ok(Ok(())) => {
            print_batches(batches)?;
            Ok(None)
        }
        Ok(Err(message)) => failed(
            batches,
            &format_args!("{call} failed: {}", ccfleet::untrusted::Untrusted(&message)),
        )
        .map(Some),
        Err(failure) => failed(batches, &failure).map(Some),
    }
}

fn failed(batches: &mut BatchReceiver, why: &dyn std::fmt::Display) -> anyhow::Result<ExitCode> {
    print_batches(batches)?;
    let _ = writeln!(std::io::stderr(), "ccfleet: the plugin failed: {why}");
    Ok(ExitCode::from(1))
}

fn print_batches(batches: &mut BatchReceiver) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    while let Ok(batch) = batches.try_recv() {
        out.write_all(&batch.lines)
            .context("writing to standard output")?;
    }
    out.flush().context("writing to standard output")
}
