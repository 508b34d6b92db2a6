//! `ccfleet completions SHELL`: a completion script generated from the command definitions,
//! so it always knows every subcommand and flag.

use std::process::ExitCode;

use clap::CommandFactory as _;

/// Flags of `ccfleet completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Prints the completion script to standard output.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut command = super::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "ccfleet", &mut out);
    super::write_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
