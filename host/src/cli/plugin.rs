//! `ccfleet plugin`: tools for plugin components.

use std::path::PathBuf;

use anyhow::Context as _;
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};

/// Flags of `ccfleet plugin`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Turns a core module built with wit-bindgen into a component (adding the WASI
    /// preview 1 adapter when the module imports WASI); a component is copied unchanged.
    Componentize {
        /// The core module (`.wasm`).
        input: PathBuf,
        /// Where to write the component.
        output: PathBuf,
    },
    /// Compiles a component and checks it against the cc:fleet plugin world.
    Check {
        /// The component.
        path: PathBuf,
        /// Check it as a plugin granted WASI.
        #[arg(long)]
        wasi: bool,
    },
}

/// Runs `ccfleet plugin`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Componentize { input, output } => {
            ccfleet_host::componentize::componentize_file(&input, &output)?;
            Ok(())
        }
        Command::Check { path, wasi } => {
            let runtime = Runtime::new(RuntimeOptions {
                cache_dir: None,
                ..RuntimeOptions::default()
            })?;
            let mut spec = PluginSpec::new(&path);
            spec.capabilities.wasi = wasi;
            let loaded = runtime
                .load(&spec)
                .await
                .with_context(|| format!("checking {}", path.display()))?;
            println!("{}: ok (sha256 {})", path.display(), loaded.hash);
            Ok(())
        }
    }
}
