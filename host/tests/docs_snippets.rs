//! Every snippet of `README.md`, `guest/README.md` and the book (`docs/src/**/*.md`) is
//! checked here, so the docs cannot drift from the code:
//!
//! - a JSON block is preceded by `<!-- file: PATH -->` and must equal that file, which must
//!   parse with the real parser (server or agent configuration, configuration tree layer);
//!   `<!-- merged: DIR SCOPE CLUSTER TYPE HOST -->` blocks must equal what the server's
//!   configuration tree serves;
//! - Rust and TOML blocks of the guest README equal the files of `guest/plugins/hello`, which
//!   the guest build compiles and this test loads; the Rust of the main README and of the
//!   book runs as doc tests of the `ccfleet` crate;
//! - the shell block marked `<!-- test: run -->` (the quickstart) runs against the built
//!   `ccfleet`, a server on a free loopback port and the example plugins; every other shell
//!   line that invokes `ccfleet`, `cargo` or a script is checked against the real command
//!   line, the workspace's packages, targets and features, and the files in the repository.
//!
//! It also runs the systemd units through `systemd-analyze verify` and checks that the docs
//! stand alone (no paths outside the repository).

mod support {
    pub mod guests;
}

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ccfleet::server::ServerConfig;
use ccfleet::server::configtree::ConfigTree;
use ccfleet::wire::{Scope, ServiceType};
use ccfleet_host::agent::AgentConfig;
use serde_json::Value;

use support::guests::repo_root;

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");

/// One fenced code block of a Markdown file.
#[derive(Debug)]
struct Block {
    /// The document and the line of the opening fence, for messages.
    origin: String,
    /// The fence's info string (`json`, `sh`, ...).
    lang: String,
    /// The `<!-- ... -->` comment on the line before the fence, without the delimiters.
    marker: Option<String>,
    /// The block's text, with a trailing newline.
    text: String,
}

fn blocks(doc: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo_root().join(doc)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let marker = i
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|l| l.strip_prefix("<!--"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|l| l.trim().to_owned());
        let start = i + 1;
        let end = (start..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or_else(|| panic!("{doc}:{}: unclosed code block", i + 1));
        let mut body = lines[start..end].join("\n");
        body.push('\n');
        out.push(Block {
            origin: format!("{doc}:{}", i + 1),
            lang: lang.trim().to_owned(),
            marker,
            text: body,
        });
        i = end + 1;
    }
    out
}

/// The pages of the book, relative to the repository, in a stable order.
fn book_pages() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(repo_root()).unwrap();
                out.push(rel.to_str().unwrap().to_owned());
            }
        }
    }
    let mut pages = Vec::new();
    walk(&repo_root().join("docs/src"), &mut pages);
    pages.sort();
    pages
}

fn all_blocks() -> Vec<Block> {
    let mut all = blocks("README.md");
    all.extend(blocks("guest/README.md"));
    for page in book_pages() {
        all.extend(blocks(&page));
    }
    all
}

fn marked<'a>(block: &'a Block, key: &str) -> Option<&'a str> {
    block
        .marker
        .as_deref()
        .and_then(|m| m.strip_prefix(key))
        .map(str::trim)
}

/// Parses a repository file with the parser that reads it in production.
fn parse_with_real_parser(rel: &str, text: &str) {
    let path = repo_root().join(rel);
    let name = path.file_name().unwrap().to_str().unwrap();
    if rel.contains("config-tree/") {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(value.is_object(), "{rel}: a tree layer must be an object");
    } else if name.ends_with("server.json") {
        ServerConfig::from_json(text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    } else if name.ends_with("agent.json") {
        let config = AgentConfig::from_json(text, path.parent().unwrap())
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        ccfleet::client::Config::from_value(config.fleet.clone())
            .and_then(|fleet| fleet.validate())
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
    } else if name.ends_with(".json") {
        serde_json::from_str::<Value>(text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    }
}

#[test]
fn every_json_toml_and_guest_rust_block_is_a_checked_file() {
    let lib = std::fs::read_to_string(repo_root().join("src/lib.rs")).unwrap();
    let host_lib = std::fs::read_to_string(repo_root().join("host/src/lib.rs")).unwrap();
    let mut checked = 0;
    for block in all_blocks() {
        // The Rust of the main README and of the book runs as doc tests (`src/lib.rs`),
        // unless it is a copy of a guest file.
        if block.lang.starts_with("rust")
            && marked(&block, "file:").is_none()
            && (block.origin.starts_with("README") || block.origin.starts_with("docs/"))
        {
            let page = block.origin.split(':').next().unwrap();
            assert!(
                page == "README.md"
                    || lib.contains(&format!("include_str!(\"../{page}\")"))
                    || host_lib.contains(&format!("include_str!(\"../../{page}\")")),
                "{}: a Rust block of the book runs as a doc test: include {page} in src/lib.rs \
                 or host/src/lib.rs",
                block.origin
            );
            continue;
        }
        if !matches!(block.lang.as_str(), "json" | "toml" | "rust") {
            continue;
        }
        if let Some(rel) = marked(&block, "file:") {
            let file = std::fs::read_to_string(repo_root().join(rel))
                .unwrap_or_else(|e| panic!("{}: {rel}: {e}", block.origin));
            assert_eq!(
                block.text, file,
                "{}: the block differs from {rel}; copy the file into the page",
                block.origin
            );
            parse_with_real_parser(rel, &file);
        } else if let Some(spec) = marked(&block, "merged:") {
            check_merged(&block, spec);
        } else if marked(&block, "fragment:") == Some("agent") {
            check_agent_fragment(&block);
        } else {
            panic!(
                "{}: a {} block needs <!-- file: PATH --> (or merged:, fragment:) so it is checked",
                block.origin, block.lang
            );
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} blocks were checked");
}

/// A part of an agent configuration whose `<... PUBLIC_KEY ...>` placeholders stand for a
/// real public key: with one filled in, it must parse.
fn check_agent_fragment(block: &Block) {
    let key = ccfleet::server::auth::Keypair::generate().public_key_base64();
    let mut text = block.text.clone();
    while let Some(start) = text.find("\"<") {
        let len = text[start..].find(">\"").expect("a closed placeholder") + 2;
        let placeholder = &text[start..start + len];
        assert!(
            placeholder.contains("PUBLIC_KEY"),
            "{}: unknown placeholder {placeholder}",
            block.origin
        );
        text.replace_range(start..start + len, &format!("\"{key}\""));
    }
    let config = AgentConfig::from_json(&text, Path::new("/etc/ccfleet"))
        .unwrap_or_else(|e| panic!("{}: {e}", block.origin));
    ccfleet::client::Config::from_value(config.fleet.clone())
        .and_then(|fleet| fleet.validate())
        .unwrap_or_else(|e| panic!("{}: {e}", block.origin));
}

fn check_merged(block: &Block, spec: &str) {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let [dir, scope, cluster, ty, host] = words[..] else {
        panic!("{}: merged: DIR SCOPE CLUSTER TYPE HOST", block.origin);
    };
    let scope = match scope {
        "cluster" => Scope::Cluster,
        "infra" => Scope::Infra,
        other => panic!("{}: unknown scope {other}", block.origin),
    };
    let ty: ServiceType = ty.parse().unwrap();
    let tree = ConfigTree::load(&repo_root().join(dir)).unwrap();
    let served = tree
        .resolve(scope, cluster, ty, host)
        .unwrap_or_else(|| panic!("{}: nothing is served", block.origin));
    let served: Value = serde_json::from_slice(&served.blob).unwrap();
    let shown: Value = serde_json::from_str(&block.text).unwrap();
    assert_eq!(
        shown, served,
        "{}: the page shows a merge the server does not serve",
        block.origin
    );
}

#[test]
fn the_example_configurations_parse_with_the_real_parsers() {
    let examples = repo_root().join("examples");
    for rel in [
        "examples/server.json",
        "examples/agent.json",
        "examples/etc/ccfleet/server.json",
        "examples/etc/ccfleet/agent.json",
    ] {
        let text = std::fs::read_to_string(repo_root().join(rel)).unwrap();
        parse_with_real_parser(rel, &text);
    }
    // Every layer of the sample tree, and the tree as a whole.
    ConfigTree::load(&examples.join("etc/ccfleet/config-tree")).unwrap();
    // The JSON in the fleet client example's docs is its config file's shape.
    let source = std::fs::read_to_string(examples.join("fleet_client.rs")).unwrap();
    let doc: String = source
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    let json = doc
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("fleet_client.rs documents its config file");
    let value: Value = serde_json::from_str(json).unwrap();
    ccfleet::client::Config::from_value(value["fleet"].clone()).unwrap();
    serde_json::from_value::<ccfleet::nats::NatsConfig>(value["nats"].clone()).unwrap();
}

#[test]
fn the_guest_readme_plugin_builds_and_fits_the_plugin_world() {
    let component = support::guests::component("hello");
    let out = Command::new(BIN)
        .args(["plugin", "check"])
        .arg(&component)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cargo metadata` of the workspace: packages with their targets and features.
fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Checks a documented `cargo` command against the workspace: the package it selects
/// (`-p`, else the default members) must have the named example, bench or binary and the
/// named features.
fn check_cargo_command(origin: &str, words: &[&str], meta: &Value) -> Result<(), String> {
    let packages = meta["packages"].as_array().unwrap();
    let mut selected: Vec<&str> = Vec::new();
    let mut targets: Vec<(&str, &str)> = Vec::new();
    let mut features: Vec<&str> = Vec::new();
    let mut it = words.iter().skip(2);
    while let Some(&w) = it.next() {
        match w {
            "--" => break,
            "-p" | "--package" => selected.push(it.next().copied().unwrap_or_default()),
            "--example" | "--bench" | "--bin" | "--test" => targets.push((
                w.trim_start_matches('-'),
                it.next().copied().unwrap_or_default(),
            )),
            "--features" | "-F" => {
                features.extend(it.next().copied().unwrap_or_default().split(','))
            }
            _ => {}
        }
    }
    let candidates: Vec<&Value> = if selected.is_empty() {
        let defaults: Vec<&str> = meta["workspace_default_members"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        packages
            .iter()
            .filter(|p| defaults.contains(&p["id"].as_str().unwrap()))
            .collect()
    } else {
        packages
            .iter()
            .filter(|p| selected.contains(&p["name"].as_str().unwrap()))
            .collect()
    };
    if candidates.len() != selected.len().max(1) && !selected.is_empty() {
        return Err(format!("{origin}: `{}`: unknown package", words.join(" ")));
    }
    for (kind, name) in targets {
        let found = candidates.iter().any(|p| {
            p["targets"].as_array().unwrap().iter().any(|t| {
                t["name"] == name && t["kind"].as_array().unwrap().iter().any(|k| k == kind)
            })
        });
        if !found {
            return Err(format!(
                "{origin}: `{}`: the selected package has no {kind} `{name}` (add -p)",
                words.join(" ")
            ));
        }
    }
    for feature in features {
        if !candidates
            .iter()
            .all(|p| p["features"].get(feature).is_some())
        {
            return Err(format!(
                "{origin}: `{}`: the selected package has no feature `{feature}`",
                words.join(" ")
            ));
        }
    }
    Ok(())
}

#[test]
fn a_cargo_command_for_another_package_is_refused() {
    let meta = metadata();
    let old = "cargo run --example fleet_client --features client -- config.json";
    let words: Vec<&str> = old.split_whitespace().collect();
    let err = check_cargo_command("old docs", &words, &meta).unwrap_err();
    assert!(err.contains("no example `fleet_client`"), "{err}");
    let fixed = "cargo run -p ccfleet --example fleet_client --features client -- config.json";
    let words: Vec<&str> = fixed.split_whitespace().collect();
    check_cargo_command("new docs", &words, &meta).unwrap();
}

/// The words of a shell line up to the first redirection, pipe, `&` or comment, after the
/// leading `NAME=value` assignments.
fn command_words(line: &str) -> Vec<&str> {
    let line = line
        .split(['|', '>', '&', '#', ';'])
        .next()
        .unwrap_or_default();
    line.split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'))
        .collect()
}

/// Every shell line of the docs (README blocks, the cargo lines of the examples' and
/// benches' docs) that runs `ccfleet`, `cargo` or a script of the repository.
fn documented_commands() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for block in all_blocks() {
        if block.lang != "sh" {
            continue;
        }
        for (n, line) in block.text.lines().enumerate() {
            lines.push((format!("{} +{}", block.origin, n + 1), line.to_owned()));
        }
    }
    for dir in ["examples", "benches", "host/benches"] {
        for entry in std::fs::read_dir(repo_root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let Some(doc) = line.strip_prefix("//!") else {
                        continue;
                    };
                    if let Some(at) = doc.find("cargo ") {
                        // Up to the end of an inline code span.
                        let cmd = doc[at..].split('`').next().unwrap_or_default();
                        lines.push((format!("{}:{}", path.display(), n + 1), cmd.to_owned()));
                    }
                }
            }
        }
    }
    lines
}

#[test]
fn every_documented_command_line_is_accepted() {
    let meta = metadata();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (origin, line) in documented_commands() {
        let words = command_words(&line);
        match words.first().copied() {
            Some("ccfleet") => {
                // Parsing stops at --help, after every flag before it has been checked.
                let mut args: Vec<&str> = words[1..].to_vec();
                args.retain(|w| !w.contains('$'));
                args.push("--help");
                let out = Command::new(BIN)
                    .args(&args)
                    .stdout(Stdio::null())
                    .output()
                    .unwrap();
                if !out.status.success() {
                    failures.push(format!(
                        "{origin}: `{line}`: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
            Some("cargo") => {
                if let Err(e) = check_cargo_command(&origin, &words, &meta) {
                    failures.push(e);
                }
            }
            Some(w) if w.starts_with("scripts/") => {
                if !repo_root().join(w).is_file() {
                    failures.push(format!("{origin}: `{w}` does not exist"));
                }
            }
            _ => continue,
        }
        checked += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 15, "only {checked} command lines were checked");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs the quickstart in a scratch copy of `examples/` (the port swapped for a free one):
/// `ccfleet` is the built binary; the backgrounded server is stopped at the end; the agent,
/// which runs until Ctrl-C, gets SIGINT once it has printed its first `load_one` point.
#[test]
fn the_quickstart_runs_as_written() {
    // The README's quickstart and the book's Getting started are the same commands.
    let mut quickstarts = all_blocks()
        .into_iter()
        .filter(|b| b.lang == "sh" && marked(b, "test:") == Some("run"));
    let block = quickstarts
        .next()
        .expect("the README has a quickstart marked <!-- test: run -->");
    for other in quickstarts {
        assert_eq!(
            other.text, block.text,
            "{}: differs from the quickstart at {}",
            other.origin, block.origin
        );
    }
    let components = support::guests::components();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let examples = dir.path().join("examples");
    for file in ["server.json", "agent.json"] {
        let text = std::fs::read_to_string(repo_root().join("examples").join(file)).unwrap();
        assert!(text.contains("127.0.0.1:8080"), "{file}");
        std::fs::create_dir_all(&examples).unwrap();
        std::fs::write(examples.join(file), text.replace("8080", &port)).unwrap();
    }
    copy_tree(&repo_root().join("examples/etc"), &examples.join("etc"));
    std::fs::create_dir(examples.join("var")).unwrap();
    std::fs::create_dir_all(dir.path().join("guest/target")).unwrap();
    std::os::unix::fs::symlink(components, dir.path().join("guest/target/components")).unwrap();

    let prologue = r#"set -euo pipefail
ccfleet() {
    case "$1 ${2:-}" in
    "server --config") exec "$CCFLEET_BIN" "$@" 2> server.err ;;
    "agent --config")
        "$CCFLEET_BIN" "$@" > agent.out 2> agent.err &
        local pid=$!
        for _ in $(seq 1 1200); do grep -q '^load_one' agent.out && break; sleep 0.1; done
        kill -INT "$pid"
        wait "$pid" ;;
    *) "$CCFLEET_BIN" "$@" ;;
    esac
}
"#;
    let epilogue = "\nfor job in $(jobs -p); do kill -INT \"$job\"; done\nwait\n";
    let script = format!("{prologue}{}{epilogue}", block.text.replace("8080", &port));
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("CCFLEET_BIN", BIN)
        .env_remove("JWT_PUBLIC_KEY")
        .env_remove("JWT_PRIVATE_KEY")
        .env_remove("CC_FLEET_TOKEN")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let (server, agent_out, agent_err) = (read("server.err"), read("agent.out"), read("agent.err"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{}\nserver:\n{server}\nagent:\n{agent_err}\n{agent_out}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    // The private key is written readable by its owner only.
    {
        use std::os::unix::fs::PermissionsExt as _;
        let keys = std::fs::metadata(examples.join("var/keys.env")).unwrap();
        assert_eq!(keys.permissions().mode() & 0o777, 0o600, "{context}");
    }
    assert!(stdout.contains("examples/server.json: ok"), "{context}");
    assert!(stdout.contains("examples/agent.json: ok"), "{context}");
    assert!(stdout.contains("\"rack\": \"r1\""), "{context}");
    assert!(server.contains("registered fritz/ccmc/node01"), "{context}");
    assert!(agent_err.contains("joined the fleet"), "{context}");
    assert!(
        agent_err.contains("metrics go to standard output"),
        "the agent names its metric sink: {context}"
    );
    assert!(
        agent_out
            .lines()
            .any(|l| l.starts_with("load_one,") && l.contains("hostname=node01")),
        "{context}"
    );
}

fn has_systemd_analyze() -> bool {
    Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    assert!(
        has_systemd_analyze(),
        "systemd-analyze is missing: scripts/test.sh installs it (apt package systemd)"
    );
    let dir = tempfile::tempdir().unwrap();
    // The man pages the units point at, from `ccfleet manpage`, where `man` finds them.
    let man = dir.path().join("man");
    let status = Command::new(BIN)
        .args(["manpage", "--out-dir"])
        .arg(man.join("man1"))
        .status()
        .unwrap();
    assert!(status.success());
    let mut units = Vec::new();
    for name in ["ccfleet-server.service", "ccfleet-agent.service"] {
        let text =
            std::fs::read_to_string(repo_root().join("examples/systemd").join(name)).unwrap();
        for needed in [
            "DynamicUser=yes",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "LoadCredential=",
            "_FILE=%d/",
            "--check-config",
        ] {
            assert!(text.contains(needed), "{name} lacks {needed}");
        }
        // verify checks that ExecStart= points at an executable: the built one.
        let unit = dir.path().join(name);
        std::fs::write(&unit, text.replace("/usr/local/bin/ccfleet", BIN)).unwrap();
        units.push(unit);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", &man)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Text files of the repository (not build output, not vendored data).
fn repository_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type().unwrap().is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | ".tools" | "data" | "var") {
                repository_files(&path, out);
            }
        } else if [".rs", ".md", ".toml", ".sh", ".json", ".service", ".wit"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            out.push(path);
        }
    }
}

#[test]
fn the_docs_stand_alone() {
    let mut files = Vec::new();
    repository_files(repo_root(), &mut files);
    assert!(files.len() > 50, "{}", files.len());
    // Spelled in pieces so this file does not match itself.
    let outside = [
        ["..", "/shared"].concat(),
        ["shared", "/reference"].concat(),
        ["shared", "/seeds"].concat(),
    ];
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for needle in &outside {
            if text.contains(needle.as_str()) {
                found.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The fixed parts of a troubleshooting entry: `key=<value>` fields dropped, split at
/// `<placeholder>`, `...` and `: `, trimmed, and only those long enough to mean something.
fn fixed_fragments(line: &str) -> Vec<String> {
    let kept: Vec<&str> = line
        .split(' ')
        .filter(|word| {
            !word
                .split_once('=')
                .is_some_and(|(_, v)| v.starts_with('<') || v.starts_with("..."))
        })
        .collect();
    let mut text = kept.join(" ");
    while let Some(start) = text.find('<') {
        let Some(len) = text[start..].find('>') else {
            break;
        };
        text.replace_range(start..start + len + 1, "\u{0}");
    }
    text.replace("...", "\u{0}")
        .replace(": ", "\u{0}")
        .split('\u{0}')
        .map(|f| {
            f.trim_matches([' ', ':', '\'', '"', ',', '.', '(', ')'])
                .to_owned()
        })
        .filter(|f| f.len() >= 8)
        .collect()
}

fn source_text(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_text(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn every_troubleshooting_entry_quotes_a_line_the_code_writes() {
    let section = std::fs::read_to_string(repo_root().join("docs/src/operator/troubleshooting.md"))
        .expect("the book has a troubleshooting page");
    let mut sources = String::new();
    source_text(&repo_root().join("src"), &mut sources);
    source_text(&repo_root().join("host/src"), &mut sources);
    let mut rows = 0;
    let mut missing = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let quoted = row[3..].split('`').next().unwrap();
        let fragments = fixed_fragments(quoted);
        assert!(!fragments.is_empty(), "nothing to check in `{quoted}`");
        for fragment in fragments {
            if !sources.contains(&fragment) {
                missing.push(format!("`{quoted}`: {fragment:?} is in no source file"));
            }
        }
        rows += 1;
    }
    assert!(rows >= 10, "only {rows} entries");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The ```json blocks of the doc comments under `dir`, with their origin.
fn doc_json_blocks(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            doc_json_blocks(&path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut current: Option<(String, String)> = None;
        for (n, line) in text.lines().enumerate() {
            let doc = line.trim_start();
            let Some(doc) = doc.strip_prefix("//!").or_else(|| doc.strip_prefix("///")) else {
                continue;
            };
            let doc = doc.strip_prefix(' ').unwrap_or(doc);
            match &mut current {
                None if doc.trim() == "```json" => {
                    current = Some((format!("{}:{}", path.display(), n + 1), String::new()));
                }
                Some(_) if doc.trim() == "```" => out.push(current.take().unwrap()),
                Some((_, body)) => {
                    body.push_str(doc);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
}

#[test]
fn the_json_in_doc_comments_parses_with_the_real_parsers() {
    let mut blocks = Vec::new();
    doc_json_blocks(&repo_root().join("src"), &mut blocks);
    doc_json_blocks(&repo_root().join("host/src"), &mut blocks);
    assert!(!blocks.is_empty());
    for (origin, text) in blocks {
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{origin}: {e}\n{text}"));
        // An agent configuration, or one plugin entry of it.
        if value.get("fleet").is_some() {
            AgentConfig::from_json(&text, Path::new("/etc/ccfleet"))
                .unwrap_or_else(|e| panic!("{origin}: {e}"));
        } else if value.get("path").is_some() {
            serde_json::from_value::<ccfleet_host::PluginSpec>(value)
                .unwrap_or_else(|e| panic!("{origin}: {e}"))
                .validate()
                .unwrap_or_else(|e| panic!("{origin}: {e}"));
        }
    }
}
