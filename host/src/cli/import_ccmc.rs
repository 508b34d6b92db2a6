//! `ccfleet agent import-ccmc DIR`: converts a cc-metric-collector configuration
//! ([`ccfleet_host::agent::import_ccmc`]) and writes the agent configuration.
//!
//! The report goes to standard output, one line per finding (`left out: KEY: why`,
//! `note: KEY: what`). Anything left out makes the status 1 and nothing is written, unless
//! `--partial` accepts the loss: a configuration that silently lost a collector or a sink
//! would be found missing only by the people looking at the metrics. The configuration is
//! written with mode 0600 and JWTs go to files of their own, mode 0600, in a directory
//! beside it; no secret is printed.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use ccfleet_host::agent::import_ccmc::{self, DEFAULT_PLUGIN_DIR, ImportOptions};

/// The directory beside the written configuration that holds its secret files.
const SECRETS_DIR: &str = "credentials";

/// Flags of `ccfleet agent import-ccmc`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cc-metric-collector configuration: a directory holding config.json, or the main
    /// file itself. Files it names that do not exist (paths of the node it came from) are
    /// looked up beside it.
    #[arg(value_name = "DIR")]
    input: PathBuf,
    /// Where to write the agent configuration.
    #[arg(long, short, value_name = "FILE")]
    output: PathBuf,
    /// The fleet server's URL (cc-metric-collector has no fleet to take it from).
    #[arg(long, value_name = "URL")]
    fleet_url: String,
    /// The cluster; by default the router's unconditional `cluster` tag, or an http sink's
    /// `cluster=` parameter.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// Where the plugins (`<collector>.wasm`) are installed.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// The collectors section from this file instead of the one config.json names (for
    /// sites with one file per node type, such as collectors.rome.json).
    #[arg(long, value_name = "FILE")]
    collectors: Option<PathBuf>,
    /// The sinks section from this file.
    #[arg(long, value_name = "FILE")]
    sinks: Option<PathBuf>,
    /// The router section from this file.
    #[arg(long, value_name = "FILE")]
    router: Option<PathBuf>,
    /// The receivers section from this file.
    #[arg(long, value_name = "FILE")]
    receivers: Option<PathBuf>,
    /// Write the configuration even though something could not be carried over (status 0).
    #[arg(long)]
    partial: bool,
    /// Replace an existing output file (and its secret files).
    #[arg(long)]
    force: bool,
}

/// Creates `path` with mode 0600 and `contents`; `force` replaces an existing file.
fn write_private(path: &Path, contents: &[u8], force: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!("{} exists; give --force to replace it", path.display())
        } else {
            anyhow::Error::new(e).context(format!("creating {}", path.display()))
        }
    })?;
    file.write_all(contents)
        .with_context(|| format!("writing {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", path.display()))
}

/// Runs `ccfleet agent import-ccmc`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let overrides = [
        ("collectors", &args.collectors),
        ("sinks", &args.sinks),
        ("router", &args.router),
        ("receivers", &args.receivers),
    ]
    .into_iter()
    .filter_map(|(section, file)| file.clone().map(|f| (section, f)))
    .collect();
    let plugin_dir = if args.plugin_dir.is_relative() {
        std::env::current_dir()
            .context("reading the current directory")?
            .join(&args.plugin_dir)
    } else {
        args.plugin_dir.clone()
    };
    let options = ImportOptions {
        fleet_url: args.fleet_url.clone(),
        cluster: args.cluster.clone(),
        plugin_dir,
        overrides,
        secrets_dir: SECRETS_DIR.to_owned(),
    };
    let import = import_ccmc::import(&args.input, &options)?;

    let mut out = std::io::stdout().lock();
    for (section, path) in &import.read {
        writeln!(out, "read {section}: {}", path.display())?;
    }
    for finding in &import.notes {
        writeln!(out, "note: {finding}")?;
    }
    for finding in &import.left_out {
        writeln!(out, "left out: {finding}")?;
    }
    let plugins = import.config["plugins"].as_array().map_or(0, Vec::len);
    if !import.left_out.is_empty() && !args.partial {
        writeln!(
            out,
            "nothing written: {} thing(s) cannot be carried over; give --partial to write the configuration without them",
            import.left_out.len()
        )?;
        return Ok(ExitCode::from(1));
    }

    let text = serde_json::to_string_pretty(&import.config)? + "\n";
    // Checked as the agent will read it: a configuration this command writes starts.
    let dir = match args.output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !args.force && args.output.exists() {
        anyhow::bail!(
            "{} exists; give --force to replace it",
            args.output.display()
        );
    }
    if !import.secrets.is_empty() {
        let secrets = dir.join(SECRETS_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&secrets)
            .with_context(|| format!("creating {}", secrets.display()))?;
        for secret in &import.secrets {
            write_private(
                &dir.join(&secret.path),
                secret.contents.as_bytes(),
                args.force,
            )?;
        }
    }
    ccfleet_host::agent::AgentConfig::from_json(&text, &dir)
        .context("the converted configuration does not load (a defect of this command)")?;
    write_private(&args.output, text.as_bytes(), args.force)?;
    for secret in &import.secrets {
        writeln!(
            out,
            "wrote {} (mode 0600)",
            dir.join(&secret.path).display()
        )?;
    }
    writeln!(
        out,
        "wrote {}: {plugins} plugin(s), {} left out; check it with: ccfleet agent --check-config --config {}",
        args.output.display(),
        import.left_out.len(),
        args.output.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
