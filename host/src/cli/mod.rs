//! The `ccfleet` command line: one file per subcommand, each exporting `Args` and `run`.
//!
//! Exit status, as ripgrep has it: 0 when the command did its work, 1 when it ran and found
//! problems (`decode` met a bad line, `--check-config` found an error), 2 for an error,
//! which is printed as one line `ccfleet: {error}`. A closed standard output (`| head`) is
//! not an error.

pub mod agent;
pub mod check_config;
pub mod completions;
pub mod decode;
pub mod demo;
pub mod discover;
pub mod fleet;
pub mod import_ccmc;
pub mod keygen;
pub mod logging;
pub mod manpage;
pub mod plugin;
pub mod rollout;
pub mod server;
pub mod token;

use std::process::ExitCode;

/// ccfleet: join a ClusterCockpit-style fleet and run sandboxed plugins.
#[derive(Debug, clap::Parser)]
#[command(
    name = "ccfleet",
    version,
    about,
    after_help = "Logging: RUST_LOG sets the filter (e.g. RUST_LOG=info,ccfleet=debug); \
                  an invalid filter is an error. Logs go to standard error, coloured only \
                  when it is a terminal and NO_COLOR is unset."
)]
pub struct Cli {
    /// Logging options (global: they may follow the subcommand).
    #[command(flatten)]
    pub log: logging::Args,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run the agent: join the fleet and run the configured plugins until SIGINT/SIGTERM.
    Agent(agent::Args),
    /// A whole fleet on loopback (server, agent, plugins, NATS: installed if missing), narrated.
    Demo(demo::Args),
    /// Decode line protocol (files or stdin) into one JSON object per point.
    Decode(decode::DecodeArgs),
    /// List the instances a service-discovery provider sees (once, or as they change).
    Discover(discover::Args),
    /// Look at a fleet through its server (`fleet status`: instances, states, ages).
    Fleet(fleet::Args),
    /// Tools for plugin components (componentize, check).
    Plugin(plugin::Args),
    /// Staged rollouts on a fleet server: status, pause, resume, abort.
    Rollout(rollout::Args),
    /// Run a cc-backend-compatible fleet server.
    Server(server::Args),
    /// Print a new Ed25519 key pair as JWT_PUBLIC_KEY= and JWT_PRIVATE_KEY= lines.
    Keygen(keygen::Args),
    /// Print an API token signed with JWT_PRIVATE_KEY.
    Token(token::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::Args),
    /// Print the manual page (roff), or write one page per subcommand into a directory.
    Manpage(manpage::Args),
}

impl Command {
    /// The log filter when `RUST_LOG` is unset.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            // The demo narrates on stdout; its logs would only repeat the story.
            Command::Demo(_) => "error",
            // Their output is the point; a log line would only get in the way.
            Command::Completions(_) | Command::Manpage(_) | Command::Keygen(_) => "warn",
            // The report is the output: the agent's token warning would repeat it as a log
            // line; the server's check logs what it meets on the way (an unreadable plugin file).
            Command::Agent(args) if args.checks_only() => "error",
            Command::Server(args) if args.checks_only() => "warn",
            _ => "info",
        }
    }
}

/// Runs one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let ok = |()| ExitCode::SUCCESS;
    match cli.command {
        Command::Agent(args) => agent::run(args).await,
        Command::Demo(args) => demo::run(args).await.map(ok),
        Command::Decode(args) => {
            // Some line was bad: the output says which; the status tells scripts.
            let any_bad = decode::run(args)?;
            Ok(if any_bad {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Discover(args) => discover::run(args).await.map(ok),
        Command::Fleet(args) => fleet::run(args).await.map(ok),
        Command::Plugin(args) => plugin::run(args).await,
        Command::Rollout(args) => rollout::run(args).await.map(ok),
        Command::Server(args) => server::run(args).await,
        Command::Keygen(args) => keygen::run(args),
        Command::Token(args) => token::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Manpage(args) => manpage::run(args),
    }
}

/// A positive Go duration (`500ms`, `10s`), for the flags of the client commands.
pub fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = ccfleet::duration::parse(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be positive".to_owned());
    }
    Ok(d)
}

/// The error as one line: each cause once. Many errors print their source inside their own
/// message as well as returning it as `source()`, so `{err:#}` alone would repeat it.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    // One line, whatever a cause held (a JSON excerpt, a multi-line message).
    line.replace(['\n', '\r'], " ")
}

/// Writes `bytes` to standard output (a closed pipe surfaces as `BrokenPipe`).
pub fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| anyhow::Error::new(e).context("writing to standard output"))
}

/// Whether the error is standard output having been closed by its reader.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|cause| {
        // serde_json's writer errors wrap the I/O error without exposing it as a source.
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("server config: {0}")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("expected value at line 1 column 2")]
    struct Inner;

    #[test]
    fn an_error_that_repeats_its_source_is_printed_once() {
        let err = anyhow::Error::new(Outer(Inner)).context("parsing server.json");
        assert_eq!(
            format!("{err:#}"),
            "parsing server.json: server config: expected value at line 1 column 2: expected value at line 1 column 2"
        );
        assert_eq!(
            one_line(&err),
            "parsing server.json: server config: expected value at line 1 column 2"
        );
    }

    #[test]
    fn a_multi_line_cause_stays_on_one_line() {
        let err = anyhow::anyhow!("first\nsecond").context("outer");
        assert_eq!(one_line(&err), "outer: first second");
    }

    #[test]
    fn a_broken_pipe_is_found_below_context() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let err = anyhow::Error::new(io).context("writing to standard output");
        assert!(is_broken_pipe(&err));
        let json = serde_json::Error::io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(
            &anyhow::Error::new(json).context("writing to standard output")
        ));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
