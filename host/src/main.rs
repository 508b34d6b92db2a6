//! The `ccfleet` command line (see `cli` for the subcommands and the exit status).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use clap::error::ErrorKind;

mod cli;

/// mimalloc (version 2) instead of the C library's malloc: a fleet server allocates and
/// frees small objects per request on every worker thread, and glibc's malloc took up to
/// a sixth of the server's CPU time in a registration storm (`benches/registration_storm.rs`,
/// which allocates the same way), for the same resident memory per registered instance.
/// The `ccfleet` library leaves the choice of allocator to its users. Not in the binary's
/// unit tests, which count allocations with an allocator of their own.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status of an error that stopped the command.
const ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    let format = cli.log.log_format;
    if let Err(err) = cli::logging::init(&cli.log, cli.command.default_log_filter()) {
        return report(format, &err);
    }
    // The agent picks its own runtime (one thread by default: see `cli::agent`); every other
    // command runs on tokio's default multi-threaded runtime.
    let runtime = match &cli.command {
        cli::Command::Agent(args) => {
            no_transparent_huge_pages();
            args.runtime()
        }
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            return report(
                format,
                &anyhow::Error::new(err).context("cannot start the runtime"),
            );
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(err) => report(format, &err),
    }
}

/// A command line clap refused (or `--help`, `--version`). With JSON logs asked for, on the
/// command line or in the environment, a refusal is one JSON event like every other fatal
/// error, so that a log shipper parsing the output does not meet a line of plain text.
fn usage_error(err: clap::Error) -> ExitCode {
    let refused = !matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !(refused
        && cli::logging::json_requested(
            std::env::args_os(),
            std::env::var_os(cli::logging::ENV_FORMAT),
        ))
    {
        err.exit();
    }
    let message = err.render().to_string();
    // clap's message ends with a usage block and a hint; one line keeps the essentials.
    let message: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    let line = cli::logging::fatal_line(cli::logging::Format::Json, message);
    let _ = writeln!(std::io::stderr(), "{line}");
    ExitCode::from(ERROR)
}

/// Turns transparent huge pages off for this process (and the commands it starts). mimalloc
/// advises the kernel to back its arenas with 2 MiB pages, so every arena region the agent
/// touches at all became resident whole: half of a small agent's anonymous memory (the book,
/// "Node cost beside cc-metric-collector"). Its allocations are small and few, and a page
/// fault more now and then costs it nothing measurable. Done before the runtime starts, so
/// almost nothing has been touched yet; a failure (a kernel without the option) leaves
/// things as they were.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Prints the error on one line of standard error, in the log format (`--log-format json`
/// makes it a JSON event like the log lines before it).
fn report(format: cli::logging::Format, err: &anyhow::Error) -> ExitCode {
    // `ccfleet decode big.lp | head`: the reader has what it wanted.
    if cli::is_broken_pipe(err) {
        return ExitCode::SUCCESS;
    }
    let line = cli::logging::fatal_line(format, &cli::one_line(err));
    let _ = writeln!(std::io::stderr(), "{line}");
    ExitCode::from(ERROR)
}
