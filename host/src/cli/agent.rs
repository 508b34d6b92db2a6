//! `ccfleet agent`: runs the agent from a configuration file until SIGINT or SIGTERM, or only
//! checks the configuration (`--check-config`); `ccfleet agent import-ccmc` writes one from a
//! cc-metric-collector configuration.
//!
//! The agent runs on one thread by default (a current-thread tokio runtime): what it does
//! between collect rounds is little, every plugin call yields at each epoch tick, and each
//! further worker thread would cost resident memory (its stack and the allocator's
//! per-thread heap) for work one thread keeps up with. `--threads N` gives it N workers.

use std::path::PathBuf;
use std::process::ExitCode;

use ccfleet_host::agent::{self, AgentConfig};

/// Flags of `ccfleet agent`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    /// What else than running the agent.
    #[command(subcommand)]
    action: Option<Action>,
    /// The agent configuration (JSON: fleet, nats, discovery, metrics, plugins). Relative
    /// paths in it are resolved against the file's directory.
    #[arg(long, short, value_name = "FILE", required = true)]
    config: Option<PathBuf>,
    /// Validate the configuration (keys, fleet section, token, NATS files, metric sink,
    /// plugins compile) and exit without starting: status 0 when usable, 1 when not.
    #[arg(long)]
    check_config: bool,
    /// Runtime worker threads: 1 runs the whole agent on one thread; more suit an agent
    /// with many plugins or busy sinks. Compiling and loading plugins takes at most
    /// `--blocking-threads` threads besides.
    #[arg(long, value_name = "N", default_value_t = 1, env = "CCFLEET_AGENT_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Threads for blocking work (compiling and loading plugins, file system calls, name
    /// lookups). Plugins are loaded one at a time with the default of 1, which bounds the
    /// memory a start-up takes; compiling a component uses every core on its own.
    #[arg(long, value_name = "N", default_value_t = 1, env = "CCFLEET_AGENT_BLOCKING_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    blocking_threads: u16,
}

/// Subcommands of `ccfleet agent`.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Write an agent configuration from a cc-metric-collector configuration (config.json
    /// with collectors.json, sinks.json, router.json, receivers.json, or one file).
    ImportCcmc(super::import_ccmc::Args),
}

impl Args {
    /// Whether only the configuration is checked, or another one converted (the report is
    /// the output, not the logs).
    pub fn checks_only(&self) -> bool {
        self.check_config || self.action.is_some()
    }

    /// The tokio runtime the agent runs on (`--threads`, `--blocking-threads`).
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = if self.threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(usize::from(self.threads));
            builder
        };
        builder
            .max_blocking_threads(usize::from(self.blocking_threads.max(1)))
            .enable_all()
            .build()
    }
}

/// Runs `ccfleet agent`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = match (args.action, args.config) {
        (Some(Action::ImportCcmc(import)), _) => return super::import_ccmc::run(import),
        (None, Some(path)) => path,
        // clap requires --config without a subcommand.
        (None, None) => anyhow::bail!("--config FILE is required"),
    };
    if args.check_config {
        return super::check_config::agent(&path).await;
    }
    let config = AgentConfig::load(&path)?;
    agent::run(config).await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use tokio::runtime::RuntimeFlavor;

    use super::Args;
    use crate::cli::{Cli, Command};

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        let line = ["ccfleet", "agent", "--config", "agent.json"];
        let cli = Cli::try_parse_from(line.iter().chain(extra))?;
        match cli.command {
            Command::Agent(args) => Ok(args),
            other => panic!("parsed as another command: {other:?}"),
        }
    }

    /// The thread each of two blocking tasks ran on, the second spawned while the first
    /// still runs.
    fn blocking_threads_of(runtime: &tokio::runtime::Runtime) -> [std::thread::ThreadId; 2] {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let first = runtime.spawn_blocking(move || {
            wait.recv().unwrap();
            std::thread::current().id()
        });
        let second = runtime.spawn_blocking(|| std::thread::current().id());
        // With a second blocking thread allowed, the second task ends while the first waits;
        // with one, it can only start after the first.
        release.send(()).unwrap();
        runtime.block_on(async { [first.await.unwrap(), second.await.unwrap()] })
    }

    #[test]
    fn the_agent_runs_on_one_thread_with_one_blocking_thread_by_default() {
        let runtime = args(&[]).unwrap().runtime().unwrap();
        assert_eq!(
            runtime.handle().runtime_flavor(),
            RuntimeFlavor::CurrentThread
        );
        let [first, second] = blocking_threads_of(&runtime);
        assert_eq!(first, second, "blocking work ran on more than one thread");
    }

    #[test]
    fn threads_and_blocking_threads_can_be_raised() {
        let runtime = args(&["--threads", "3", "--blocking-threads", "2"])
            .unwrap()
            .runtime()
            .unwrap();
        assert_eq!(
            runtime.handle().runtime_flavor(),
            RuntimeFlavor::MultiThread
        );
        assert_eq!(runtime.metrics().num_workers(), 3);
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let first = runtime.spawn_blocking(move || {
            wait.recv().unwrap();
            std::thread::current().id()
        });
        // The second task runs and ends while the first still waits: a second thread.
        let second = runtime
            .block_on(runtime.spawn_blocking(|| std::thread::current().id()))
            .unwrap();
        release.send(()).unwrap();
        let first = runtime.block_on(first).unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn zero_threads_is_refused() {
        for flag in ["--threads", "--blocking-threads"] {
            let err = args(&[flag, "0"]).expect_err("0 was accepted");
            assert!(err.to_string().contains("0"), "{err}");
        }
    }
}
