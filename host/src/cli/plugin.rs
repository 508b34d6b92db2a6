//! `ccfleet plugin`: tools for plugin components and their authors.
//!
//! A first plugin in four commands: `ccfleet plugin new hello`, edit `hello/src/lib.rs`,
//! `ccfleet plugin build hello`, `ccfleet plugin run hello/target/components/hello.wasm`.

mod build;
mod new;
mod run;
mod sign;

use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Creates a plugin crate (with the SDK beside it) that builds outside this repository.
    New(new::Args),
    /// Builds every plugin crate of a workspace (or one crate) into components.
    Build(build::Args),
    /// Runs one plugin without a fleet: prints what it emits (line protocol) and logs, and
    /// exits with 1 when the plugin fails.
    Run(run::Args),
    /// Turns a core module built with wit-bindgen into a component (adding the WASI
    /// preview 1 adapter when the module imports WASI); a component is copied unchanged.
    Componentize {
        /// The core module (`.wasm`).
        input: PathBuf,
        /// Where to write the component.
        output: PathBuf,
    },
    /// Writes a fresh Ed25519 signing key for the site's plugins (mode 0600; never over an
    /// existing file) and prints its public key, for the agents' `plugin-public-keys`.
    Keygen(sign::KeygenArgs),
    /// Signs components with the site's key (wasmsign2's embedded signature) and prints
    /// each signed file's SHA-256, the value a fleet plugin entry names.
    Sign(sign::SignArgs),
    /// Checks that components carry a valid signature by one of the given public keys.
    Verify(sign::VerifyArgs),
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
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::New(args) => new::run(args),
        Command::Build(args) => build::run(args),
        Command::Run(args) => run::run(args).await,
        Command::Keygen(args) => sign::keygen(args),
        Command::Sign(args) => sign::sign(args),
        Command::Verify(args) => sign::verify(args),
        Command::Componentize { input, output } => {
            ccfleet_host::componentize::componentize_file(&input, &output)?;
            Ok(ExitCode::SUCCESS)
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
            Ok(ExitCode::SUCCESS)
        }
    }
}
