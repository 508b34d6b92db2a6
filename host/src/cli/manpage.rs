//! `ccfleet manpage`: manual pages (roff) generated from the command definitions.
//!
//! clap_mangen renders the name, synopsis, description and options of every page.
//! `ccfleet-server(1)` and `ccfleet-agent(1)` get what an operator reaches for besides:
//! CONFIGURATION (every key of the file: taken from the book's configuration reference,
//! which is generated from the configuration types, compiled in, so the page and the book
//! cannot tell two stories), EXIT STATUS, ENVIRONMENT and EXAMPLES.

use std::io::Write as _;
use std::path::{Path, PathBuf};
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
    let mut command = command.disable_help_subcommand(true);
    command.build();
    write_pages(&command, &dir)
        .with_context(|| format!("writing manual pages to {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `command` and of each of its visible subcommands, as
/// `clap_mangen::generate_to` names them (`ccfleet-server-migrate.1`).
fn write_pages(command: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(command.clone());
    let path = dir.join(man.get_filename());
    let page = render(&man, command)?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One page: clap_mangen's sections, with the hand-written ones of the server and the agent
/// in the conventional order (after OPTIONS and SUBCOMMANDS, before VERSION).
fn render(man: &clap_mangen::Man, command: &clap::Command) -> anyhow::Result<Vec<u8>> {
    let extra = match command.get_display_name().unwrap_or(command.get_name()) {
        "ccfleet-server" => Some(server_sections()),
        "ccfleet-agent" => Some(agent_sections()),
        _ => None,
    };
    let mut page = Vec::new();
    let Some(extra) = extra else {
        man.render(&mut page)?;
        return Ok(page);
    };
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    if command.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    page.write_all(extra.as_bytes())?;
    if command.get_after_help().is_some() || command.get_after_long_help().is_some() {
        man.render_extra_section(&mut page)?;
    }
    if command.get_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    Ok(page)
}

/// The book's reference pages, whose key tables the pages carry.
const SERVER_REFERENCE: &str = include_str!("../../../docs/src/reference/server.md");
const AGENT_REFERENCE: &str = include_str!("../../../docs/src/reference/agent.md");
const SINKS_REFERENCE: &str = include_str!("../../../docs/src/reference/sinks.md");

/// Text as roff source: backslashes and hyphens escaped, and a line that would start with a
/// control character protected.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|line| {
            if line.starts_with('.') || line.starts_with('\'') {
                format!("\\&{line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A table cell of the book as plain text: code spans lose their backticks, links keep
/// their text, escaped pipes become pipes.
fn plain_cell(cell: &str) -> String {
    let mut out = String::new();
    let mut rest = cell.trim();
    while let Some(start) = rest.find('[') {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        match (from.find("]("), from.find(')')) {
            (Some(mid), Some(end)) if mid < end => {
                out.push_str(&from[1..mid]);
                rest = &from[end + 1..];
            }
            _ => {
                out.push('[');
                rest = &from[1..];
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "").replace("\\|", "|")
}

/// Splits a Markdown table row into cells (a `\|` inside a cell is not a separator).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = Vec::new();
    let mut current = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                current.push_str("\\|");
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    cells.push(current);
    cells
}

/// Every row of the `| key | type | meaning |` tables of a reference page, as roff
/// paragraphs: the key (with `prefix` before it) in bold, then its type and meaning. A key
/// several tables list (each sink kind's `queue-size`) comes once.
fn key_table(page: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut in_table = false;
    for line in page.lines() {
        if line.starts_with("| key |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        let row = cells(line);
        let [key, kind, meaning] = &row[..] else {
            continue;
        };
        let key = plain_cell(key);
        if !seen.insert(key.clone()) {
            continue;
        }
        out.push_str(".TP\n");
        out.push_str(&format!(
            "\\fB{}\\fR\n",
            roff_text(&format!("{prefix}{key}"))
        ));
        out.push_str(&roff_text(&format!(
            "{}. {}",
            plain_cell(kind),
            plain_cell(meaning)
        )));
        out.push('\n');
    }
    out
}

/// A section of plain paragraphs (separated by blank lines in `text`).
fn section(title: &str, text: &str) -> String {
    let mut out = format!(".SH {title}\n");
    for paragraph in text.split("\n\n") {
        out.push_str(".PP\n");
        out.push_str(&roff_text(paragraph.trim()));
        out.push('\n');
    }
    out
}

/// Tagged paragraphs: each `(tag, text)` as `.TP` with the tag in bold.
fn tagged(title: &str, entries: &[(&str, &str)]) -> String {
    let mut out = format!(".SH {title}\n");
    for (tag, text) in entries {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff_text(tag),
            roff_text(text)
        ));
    }
    out
}

/// Example command lines: an explanation, then the commands verbatim.
fn examples(entries: &[(&str, &str)]) -> String {
    let mut out = String::from(".SH EXAMPLES\n");
    for (what, commands) in entries {
        out.push_str(&format!(".PP\n{}\n.PP\n.nf\n.RS 4\n", roff_text(what)));
        out.push_str(&roff_text(commands));
        out.push_str("\n.RE\n.fi\n");
    }
    out
}

const EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "The command did its work: the process stopped after SIGINT or SIGTERM, or --check-config found the configuration usable (warnings allowed).",
    ),
    ("1", "--check-config found an error in the configuration."),
    (
        "2",
        "An error stopped the command (a file that cannot be read or parsed, a value that cannot work, an address that cannot be bound); it is printed on one line as \"ccfleet: what went wrong: why\", or as a JSON event with --log-format json.",
    ),
];

fn server_sections() -> String {
    let mut out = section(
        "CONFIGURATION",
        "The file given with --config holds one JSON object. Unknown keys are errors; a value of the wrong type names its key and the form it takes. Relative paths (db, fleet.config-dir, fleet.plugin-dir) are resolved against the directory of the file. Durations use Go's syntax (30s, 1m30s, 1.5h); one that does not parse, or is not positive, is an error. The keys:",
    );
    out.push_str(&key_table(SERVER_REFERENCE, ""));
    let mut status = EXIT_STATUS.to_vec();
    status.push((
        "128 + N",
        "A second signal (number N: 130 for SIGINT, 143 for SIGTERM) ended the shutdown before it finished; 1 when the shutdown was still not finished 30 s after the first signal.",
    ));
    out.push_str(&tagged("EXIT STATUS", &status));
    out.push_str(&tagged(
        "ENVIRONMENT",
        &[
            (
                "JWT_PUBLIC_KEY",
                "Standard base64 of the Ed25519 public key that checks API tokens (the JWT_PUBLIC_KEY= line of ccfleet keygen); used when jwt-public-key is not set.",
            ),
            (
                "JWT_PRIVATE_KEY",
                "The private key of the same pair; signs the discovery rosters when jwt-private-key is not set.",
            ),
            (
                "CC_NATS_USERNAME, CC_NATS_PASSWORD",
                "NATS user and password; override nats.username and nats.password. CC_NATS_USERNAME_FILE and CC_NATS_PASSWORD_FILE name files holding them.",
            ),
            (
                "RUST_LOG",
                "The log filter, e.g. info or warn,ccfleet::server=debug (refused requests are logged at debug level); a filter that does not parse is an error.",
            ),
            (
                "CCFLEET_LOG_FORMAT",
                "text (the default) or json, as --log-format.",
            ),
            ("NO_COLOR", "When set non-empty, logs are never coloured."),
        ],
    ));
    out.push_str(&examples(&[
        (
            "A key pair, readable only by its owner, and a configuration check before the start:",
            "ccfleet keygen --out /etc/ccfleet/keys.env\nset -a; . /etc/ccfleet/keys.env; set +a\nccfleet server --check-config --config /etc/ccfleet/server.json\nccfleet server --config /etc/ccfleet/server.json",
        ),
        (
            "A token for a node, valid for 30 days:",
            "ccfleet token --sub node01 --role api --ttl 720h > node01.token",
        ),
        (
            "Moving a single server's SQLite registry into the JetStream bucket of a scaled-out configuration:",
            "ccfleet server migrate --config jetstream-server.json --from-sqlite /var/lib/ccfleet-server/fleet.sqlite",
        ),
    ]));
    out
}

fn agent_sections() -> String {
    let mut out = section(
        "CONFIGURATION",
        "The file given with --config holds one JSON object. Unknown keys are errors; a value of the wrong type names its key and the form it takes. Relative paths (plugin path, plugin-cache-dir, fleet-plugin-dir, fleet.cache-path, nats.creds-file-path, nats.nkey-seed-file, sinks.<name>.jwt-file) are resolved against the directory of the file. Durations use Go's syntax (30s, 1m30s, 1.5h). The keys:",
    );
    out.push_str(&key_table(AGENT_REFERENCE, ""));
    out.push_str(&section(
        "METRIC SINKS",
        "The sinks object names outputs; every point goes to every sink, each with its own bounded queue. The keys of one sink:",
    ));
    out.push_str(&key_table(SINKS_REFERENCE, "sinks.<name>."));
    let mut status = EXIT_STATUS.to_vec();
    status.push((
        "128 + N",
        "A second signal (number N: 130 for SIGINT, 143 for SIGTERM) ended the shutdown before it finished; 1 when the shutdown overran shutdown-timeout.",
    ));
    out.push_str(&tagged("EXIT STATUS", &status));
    out.push_str(&tagged(
        "ENVIRONMENT",
        &[
            (
                "CC_FLEET_TOKEN",
                "The JWT (role api) the agent presents to the fleet server; overrides fleet.token.",
            ),
            (
                "CC_FLEET_TOKEN_FILE",
                "A file holding the token, used when CC_FLEET_TOKEN is unset (for example a systemd credential); never readable by plugins.",
            ),
            (
                "CC_NATS_USERNAME, CC_NATS_PASSWORD",
                "NATS user and password; override nats.username and nats.password. CC_NATS_USERNAME_FILE and CC_NATS_PASSWORD_FILE name files holding them.",
            ),
            (
                "XDG_CACHE_HOME",
                "Where compiled plugins are cached (ccfleet/components below it) unless plugin-cache-dir is set.",
            ),
            (
                "RUST_LOG",
                "The log filter, e.g. info or info,ccfleet=debug; a filter that does not parse is an error.",
            ),
            (
                "CCFLEET_LOG_FORMAT",
                "text (the default) or json, as --log-format.",
            ),
            ("NO_COLOR", "When set non-empty, logs are never coloured."),
        ],
    ));
    out.push_str(&examples(&[
        (
            "Check the configuration (the token, the NATS files, the sinks, every plugin compiled against the plugin world), then run the agent; SIGINT or SIGTERM deregisters and stops it:",
            "export CC_FLEET_TOKEN_FILE=/etc/ccfleet/credentials/fleet-token\nccfleet agent --check-config --config /etc/ccfleet/agent.json\nccfleet agent --config /etc/ccfleet/agent.json",
        ),
        (
            "A minimal configuration: join cluster fritz and print the load average every ten seconds:",
            "{\n  \"fleet\": {\"url\": \"http://127.0.0.1:8080\", \"cluster\": \"fritz\"},\n  \"metrics\": {\"type\": \"stdout\"},\n  \"plugins\": [{\"path\": \"loadavg.wasm\", \"collect-interval\": \"10s\",\n               \"capabilities\": {\"read-files\": [\"/proc/loadavg\"]}}]\n}",
        ),
    ]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_page_carries_every_key_of_the_readme_table() {
        let sections = server_sections();
        for key in [
            "addr",
            "fleet.stale\\-after",
            "registry.lease\\-ttl",
            "nats.address",
        ] {
            assert!(
                sections.contains(&format!("\\fB{key}\\fR")),
                "{key} missing:\n{sections}"
            );
        }
        for title in ["CONFIGURATION", "EXIT STATUS", "ENVIRONMENT", "EXAMPLES"] {
            assert!(sections.contains(&format!(".SH {title}\n")), "{title}");
        }
    }

    #[test]
    fn the_agent_page_carries_the_agent_and_sink_keys() {
        let sections = agent_sections();
        for key in [
            "fleet.url",
            "plugins[].capabilities",
            "sinks.<name>.batch\\-size",
            "metrics\\-addr",
        ] {
            assert!(
                sections.contains(&format!("\\fB{key}\\fR")),
                "{key} missing"
            );
        }
        assert!(sections.contains("CC_FLEET_TOKEN_FILE"));
    }

    #[test]
    fn roff_control_characters_are_escaped() {
        assert_eq!(roff_text("a-b\\c"), "a\\-b\\ec");
        assert_eq!(roff_text(".x\n'y"), "\\&.x\n\\&'y");
        assert_eq!(
            plain_cell(" `a` [the tree](#the-configuration-tree) x \\| y "),
            "a the tree x | y"
        );
        assert_eq!(
            cells("| `a` | b \\| c | d |"),
            [" `a` ", " b \\| c ", " d "]
        );
    }
}
