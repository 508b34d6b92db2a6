//! `ccfleet manpage`: manual pages (roff) generated from the command definitions.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;

/// Flags of `ccfleet manpage`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write `ccfleet.1` and one `ccfleet-SUBCOMMAND.1` per subcommand into this directory
    /// instead of printing `ccfleet.1`.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Prints or writes the pages.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let command = super::Cli::command();
    let Some(dir) = args.out_dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command)
            .render(&mut page)
            .context("rendering the manual page")?;
        super::write_stdout(&page)?;
        return Ok(ExitCode::SUCCESS);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(command, &dir)
        .with_context(|| format!("writing manual pages to {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
