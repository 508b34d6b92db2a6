//! The operator-facing behaviour of the `ccfleet` command: exit status and one-line errors,
//! log format and filter, `--check-config`, the warnings where a guess goes wrong,
//! completions and manual pages. Each test runs the built binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use ccfleet::server::auth::Keypair;

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");

/// A command with a clean environment for the variables ccfleet reads.
fn ccfleet() -> Command {
    let mut cmd = Command::new(BIN);
    for var in [
        "RUST_LOG",
        "NO_COLOR",
        "CCFLEET_LOG_FORMAT",
        "JWT_PUBLIC_KEY",
        "JWT_PRIVATE_KEY",
        "CC_FLEET_TOKEN",
        "CC_FLEET_TOKEN_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null());
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn status(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn write(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn an_error_is_one_line_with_status_2() {
    let out = ccfleet()
        .args(["server", "--config", "/nonexistent/server.json"])
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("ccfleet: reading /nonexistent/server.json: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_cause_repeated_by_its_error_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "server.json", r#"{"bogus": 1}"#);
    let out = ccfleet()
        .args(["server", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.matches("unknown field `bogus`").count(),
        1,
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_bad_line_in_decode_is_status_1() {
    let mut child = ccfleet()
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"cpu value=1 1\nnot line protocol\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(status(&out), 1, "{}", text(&out.stderr));
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let mut child = ccfleet()
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // More than any pipe buffers: decode must still be writing when the reader leaves.
        let line = b"cpu,host=a value=1 1\n".repeat(50_000);
        let _ = stdin.write_all(&line);
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    writer.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

/// `ccfleet token` with a role that grants neither the API nor the status views: it prints a
/// token and logs a warning.
fn token_with_a_warning(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let pair = Keypair::generate();
    let mut cmd = ccfleet();
    cmd.args(extra)
        .args(["token", "--sub", "ops", "--role", "user", "--ttl", "1h"])
        .env("JWT_PRIVATE_KEY", pair.private_key_base64());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// A status reader's token (`admin`) is what the status views need: no warning.
#[test]
fn an_admin_token_is_minted_without_a_warning() {
    let pair = Keypair::generate();
    let out = ccfleet()
        .args(["token", "--sub", "ops", "--role", "admin", "--ttl", "1h"])
        .env("JWT_PRIVATE_KEY", pair.private_key_base64())
        .output()
        .unwrap();
    assert_eq!(status(&out), 0);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn logs_to_a_pipe_are_plain_text() {
    let out = token_with_a_warning(&[], &[]);
    assert_eq!(status(&out), 0);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("WARN") && stderr.contains("grant neither"),
        "{stderr}"
    );
    assert!(!stderr.contains('\x1b'), "colour codes in {stderr:?}");
}

#[test]
fn logs_are_json_lines_when_asked() {
    for out in [
        token_with_a_warning(&["--log-format", "json"], &[]),
        token_with_a_warning(&[], &[("CCFLEET_LOG_FORMAT", "json")]),
    ] {
        assert_eq!(status(&out), 0);
        let stderr = text(&out.stderr);
        let line = stderr.lines().next().expect("a log line");
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(event["level"], "WARN", "{line}");
        assert!(
            event["message"].as_str().unwrap().contains("grant neither"),
            "{line}"
        );
    }
}

#[test]
fn an_invalid_rust_log_is_an_error() {
    let out = ccfleet()
        .arg("keygen")
        .env("RUST_LOG", "info,ccfleet=loud")
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("ccfleet: RUST_LOG=\"info,ccfleet=loud\" is not a valid filter"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no key pair after an error");
}

#[test]
fn a_public_key_given_as_jwt_private_key_is_refused() {
    let pair = Keypair::generate();
    let out = ccfleet()
        .args(["token", "--sub", "ops", "--ttl", "1h"])
        .env("JWT_PRIVATE_KEY", pair.public_key_base64())
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    assert!(out.stdout.is_empty(), "no token: {}", text(&out.stdout));
    assert!(text(&out.stderr).contains("looks like the JWT_PUBLIC_KEY"));
}

fn check_server(dir: &Path, config: &str, env: &[(&str, &str)]) -> (i32, String) {
    let path = write(dir, "server.json", config);
    let mut cmd = ccfleet();
    // Run from elsewhere: relative paths must start at the file's directory.
    cmd.args(["server", "--check-config", "--config"])
        .arg(&path)
        .current_dir("/");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (status(&out), text(&out.stdout))
}

#[test]
fn check_config_warns_about_a_config_dir_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{"disable-authentication": true, "fleet": {"config-dir": "tree"}}"#;
    let (code, report) = check_server(dir.path(), config, &[]);
    assert_eq!(code, 0, "{report}");
    let missing = dir.path().join("tree");
    assert!(
        report.contains(&format!(
            "warning: fleet.config-dir {} does not exist",
            missing.display()
        )),
        "{report}"
    );
    // Created beside the configuration file (not in the working directory), it is found.
    std::fs::create_dir(&missing).unwrap();
    std::fs::write(missing.join("defaults.json"), "{}").unwrap();
    let (code, report) = check_server(dir.path(), config, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(!report.contains("does not exist"), "{report}");
    assert!(report.ends_with("server.json: ok\n"), "{report}");
}

#[test]
fn check_config_finds_the_key_problems() {
    let dir = tempfile::tempdir().unwrap();
    let pair = Keypair::generate();
    let (code, report) = check_server(dir.path(), "{}", &[]);
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("error: no JWT public key"), "{report}");

    let (code, report) = check_server(
        dir.path(),
        "{}",
        &[("JWT_PUBLIC_KEY", &pair.private_key_base64())],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("JWT_PUBLIC_KEY holds 64 bytes, the length of a private key"),
        "{report}"
    );

    let (code, report) = check_server(
        dir.path(),
        "{}",
        &[("JWT_PUBLIC_KEY", &pair.public_key_base64())],
    );
    assert_eq!(code, 0, "{report}");
}

#[test]
fn check_config_reports_a_broken_file_with_status_1_and_a_missing_one_with_2() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = check_server(
        dir.path(),
        r#"{"disable-authentication": true, "api-allowed-ips": ["10.0.0.0/99"]}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("10.0.0.0/99"), "{report}");
    let (code, report) = check_server(dir.path(), r#"{"adress": "x"}"#, &[]);
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("unknown field `adress`"), "{report}");

    let out = ccfleet()
        .args([
            "agent",
            "--check-config",
            "--config",
            "/nonexistent/agent.json",
        ])
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
}

fn check_agent(dir: &Path, config: &str, env: &[(&str, &str)]) -> (i32, String) {
    let path = write(dir, "agent.json", config);
    let mut cmd = ccfleet();
    cmd.args(["agent", "--check-config", "--config"])
        .arg(&path)
        .current_dir("/");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (status(&out), text(&out.stdout))
}

#[test]
fn check_config_tells_the_agent_sink_and_a_missing_token() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:1"}}"#,
        &[],
    );
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("warning: no token"), "{report}");
    assert!(
        report.contains("note: metrics go to standard output (there is no nats section)"),
        "{report}"
    );

    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:1", "cluster": "fritz"},
            "nats": {"address": "nats://127.0.0.1:1"}}"#,
        &[("CC_FLEET_TOKEN", "t")],
    );
    assert_eq!(code, 0, "{report}");
    assert!(!report.contains("no token"), "{report}");
    assert!(
        report.contains("note: metrics go to NATS subject cc.metric.fritz"),
        "{report}"
    );
}

#[test]
fn check_config_refuses_the_old_readme_agent_example() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:8080"},
            "plugins": [{"name": "loadavg", "path": "plugins/loadavg.wasm",
                         "wasi": {"read-only-dirs": ["/proc"]}}]}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("unknown field `wasi`"), "{report}");

    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:8080"},
            "plugins": [{"path": "plugins/loadavg.wasm"}]}"#,
        &[("CC_FLEET_TOKEN", "t")],
    );
    assert_eq!(code, 1, "{report}");
    let expected = dir.path().join("plugins/loadavg.wasm");
    assert!(
        report.contains(&format!("{} does not exist", expected.display())),
        "{report}"
    );
}

/// Reads the child's stderr until a line contains `needle` (a minute at most), then stops
/// the child.
fn stderr_until(mut child: Child, needle: &str) -> String {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    let mut found = false;
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(needle) {
            found = true;
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert!(found, "no line with {needle:?} in:\n{seen}");
    seen
}

#[test]
fn an_agent_without_a_token_says_so_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "agent.json",
        r#"{"fleet": {"url": "http://127.0.0.1:1"}}"#,
    );
    let child = ccfleet()
        .args(["agent", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = stderr_until(child, "no token");
    assert!(seen.contains("CC_FLEET_TOKEN_FILE"), "{seen}");
}

#[test]
fn a_server_whose_config_dir_does_not_exist_says_so_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "server.json",
        r#"{"addr": "127.0.0.1:0", "disable-authentication": true,
            "fleet": {"config-dir": "no-such-tree"}}"#,
    );
    let child = ccfleet()
        .args(["server", "--config"])
        .arg(&config)
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = stderr_until(child, "does not exist");
    let missing = dir.path().join("no-such-tree");
    assert!(seen.contains(&missing.display().to_string()), "{seen}");
}

#[test]
fn completions_and_manual_pages_come_from_the_command_definitions() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = ccfleet().args(["completions", shell]).output().unwrap();
        assert_eq!(status(&out), 0, "{shell}");
        let script = text(&out.stdout);
        assert!(
            script.contains("check-config") && script.contains("log-format"),
            "{shell}"
        );
    }
    let out = ccfleet().arg("manpage").output().unwrap();
    assert_eq!(status(&out), 0);
    let page = text(&out.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH ccfleet"),
        "{page}"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = ccfleet()
        .args(["manpage", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    for page in [
        "ccfleet.1",
        "ccfleet-server.1",
        "ccfleet-agent.1",
        "ccfleet-token.1",
    ] {
        assert!(dir.path().join(page).is_file(), "{page}");
    }
    let server = std::fs::read_to_string(dir.path().join("ccfleet-server.1")).unwrap();
    assert!(server.contains("check\\-config"), "{server}");
    // The server's and the agent's pages carry the reference an operator reaches for.
    let agent = std::fs::read_to_string(dir.path().join("ccfleet-agent.1")).unwrap();
    for (page, text, keys) in [
        (
            "ccfleet-server.1",
            &server,
            &[
                "\\fBaddr\\fR",
                "\\fBfleet.stale\\-after\\fR",
                "JWT_PUBLIC_KEY",
            ][..],
        ),
        (
            "ccfleet-agent.1",
            &agent,
            &[
                "\\fBfleet.url\\fR",
                "\\fBsinks.<name>.url\\fR",
                "CC_FLEET_TOKEN_FILE",
            ][..],
        ),
    ] {
        let mut at = 0;
        // In the conventional order, after the options.
        for title in [
            "OPTIONS",
            "CONFIGURATION",
            "EXIT STATUS",
            "ENVIRONMENT",
            "EXAMPLES",
        ] {
            let found = text[at..]
                .find(&format!(".SH {title}\n"))
                .unwrap_or_else(|| panic!("{page}: no {title} section after byte {at}:\n{text}"));
            at += found;
        }
        for key in keys {
            assert!(text.contains(key), "{page}: {key} missing");
        }
    }
    // Every other page is clap_mangen's.
    let token = std::fs::read_to_string(dir.path().join("ccfleet-token.1")).unwrap();
    assert!(!token.contains(".SH CONFIGURATION"), "{token}");
}

/// The claims of a token (its middle part), decoded.
fn claims(token: &str) -> serde_json::Value {
    use base64::Engine as _;
    let middle = token.trim().split('.').nth(1).expect("three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(middle)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn a_token_needs_a_lifetime_or_no_expiry_by_name_and_a_subject() {
    let pair = Keypair::generate();
    let token = |args: &[&str]| {
        ccfleet()
            .arg("token")
            .args(args)
            .env("JWT_PRIVATE_KEY", pair.private_key_base64())
            .output()
            .unwrap()
    };
    let out = token(&["--sub", "ops"]);
    assert_eq!(status(&out), 2);
    assert!(out.stdout.is_empty(), "no token: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--ttl") && stderr.contains("--no-expiry"),
        "{stderr}"
    );

    let out = token(&["--sub", "ops", "--ttl", "2h"]);
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    let c = claims(&text(&out.stdout));
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        7200
    );
    let out = token(&["--sub", "ops", "--no-expiry"]);
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    assert!(claims(&text(&out.stdout)).get("exp").is_none());
    let out = token(&["--sub", "ops", "--ttl", "1h", "--no-expiry"]);
    assert_eq!(status(&out), 2, "both at once: {}", text(&out.stdout));

    for empty in ["", "  "] {
        let out = token(&["--sub", empty, "--ttl", "1h"]);
        assert_eq!(status(&out), 2, "{empty:?}: {}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("subject"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_token_without_a_key_names_jwt_private_key() {
    let out = ccfleet()
        .args(["token", "--sub", "ops", "--ttl", "1h"])
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("ccfleet: ") && stderr.contains("JWT_PRIVATE_KEY"),
        "{stderr}"
    );
    assert!(stderr.contains("ccfleet keygen"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn keygen_out_writes_a_file_only_its_owner_reads() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.env");
    // A file that exists with a wider mode is replaced, not reused.
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = ccfleet()
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "the keys are not printed");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");
    let written = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 2, "{written}");
    assert!(lines[0].starts_with("JWT_PUBLIC_KEY="), "{written}");
    let private = lines[1].strip_prefix("JWT_PRIVATE_KEY=").unwrap();
    // The pair works: a token signed with it is accepted by `ccfleet token`.
    let out = ccfleet()
        .args(["token", "--sub", "ops", "--ttl", "1h"])
        .env("JWT_PRIVATE_KEY", private)
        .env(
            "JWT_PUBLIC_KEY",
            lines[0].strip_prefix("JWT_PUBLIC_KEY=").unwrap(),
        )
        .output()
        .unwrap();
    assert_eq!(status(&out), 0, "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn check_config_refuses_an_addr_without_port_and_a_duration_that_does_not_parse() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = check_server(
        dir.path(),
        r#"{"disable-authentication": true, "addr": "localhost"}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("error:") && report.contains("addr \"localhost\" has no port"),
        "{report}"
    );
    let (code, report) = check_server(
        dir.path(),
        r#"{"disable-authentication": true, "fleet": {"stale-after": "90 seconds"}}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("fleet.stale-after \"90 seconds\" is not a Go duration"),
        "{report}"
    );
}

#[test]
fn a_duration_that_does_not_parse_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "server.json",
        r#"{"addr": "127.0.0.1:0", "disable-authentication": true,
            "fleet": {"sweep-interval": "30 s"}}"#,
    );
    let out = ccfleet()
        .args(["server", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(status(&out), 2, "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("fleet.sweep-interval \"30 s\" is not a Go duration"),
        "{stderr}"
    );
    assert!(!stderr.contains("using"), "no fallback: {stderr}");
}

#[test]
fn check_config_finds_a_plugin_the_tree_names_that_plugin_dir_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree/ccmc/fritz");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let present = b"a component";
    std::fs::write(dir.path().join("plugins/present.wasm"), present).unwrap();
    let present_hash = ccfleet::server::plugins::sha256_hex(present);
    let missing_hash = ccfleet::server::plugins::sha256_hex(b"another component");
    std::fs::write(
        tree.join("defaults.json"),
        format!(
            r#"{{"plugins": [{{"name": "here", "sha256": "{present_hash}"}},
                             {{"name": "gone", "sha256": "{missing_hash}"}}]}}"#
        ),
    )
    .unwrap();
    let with_dir = r#"{"disable-authentication": true,
        "fleet": {"config-dir": "tree", "plugin-dir": "plugins"}}"#;
    let (code, report) = check_server(dir.path(), with_dir, &[]);
    assert_eq!(code, 1, "{report}");
    let errors: Vec<&str> = report.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "{report}");
    assert!(
        errors[0].contains("ccmc/fritz/defaults.json")
            && errors[0].contains("\"gone\"")
            && errors[0].contains(&missing_hash),
        "{report}"
    );
    // Copied in, it is found.
    std::fs::write(dir.path().join("plugins/gone.wasm"), b"another component").unwrap();
    let (code, report) = check_server(dir.path(), with_dir, &[]);
    assert_eq!(code, 0, "{report}");
    // Without a plugin-dir every named plugin is an error.
    let (code, report) = check_server(
        dir.path(),
        r#"{"disable-authentication": true, "fleet": {"config-dir": "tree"}}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("fleet.plugin-dir is not set"), "{report}");
}

#[test]
fn a_value_of_the_wrong_type_names_its_key_and_form() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = check_server(
        dir.path(),
        "{\n  \"addr\": 18081,\n  \"disable-authentication\": true\n}",
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("addr: invalid type: integer `18081`, expected a string"),
        "{report}"
    );
    assert!(report.contains("\"host:port\""), "{report}");

    let (code, report) = check_agent(
        dir.path(),
        r#"{"service-type": "ccmx", "fleet": {"url": "http://127.0.0.1:1"}}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("service-type: unknown serviceType \"ccmx\"")
            && report.contains("ccms, ccmc, ccb, cces, ccsa, ccnc, ccem"),
        "{report}"
    );

    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:1", "heartbeat-interval": 30}}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("fleet.heartbeat-interval: invalid type: integer `30`")
            && report.contains("Go duration"),
        "{report}"
    );

    let (code, report) = check_agent(
        dir.path(),
        r#"{"fleet": {"url": "http://127.0.0.1:1"},
            "plugins": [{"path": "a.wasm", "collect-interval": 10}]}"#,
        &[],
    );
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("plugins[0].collect-interval: invalid type"),
        "{report}"
    );
}

#[test]
fn discover_without_a_provider_names_the_flag_and_the_values() {
    let out = ccfleet()
        .args(["discover", "--env-prefix", "CCFLEET_TEST_UNSET_"])
        .output()
        .unwrap();
    assert_eq!(status(&out), 2);
    let stderr = text(&out.stderr);
    for needle in [
        "--provider",
        "CCFLEET_TEST_UNSET_PROVIDER",
        "DNS",
        "K8S-PODS",
        "NOMAD+K8S-PODS",
        "STATIC",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
}

#[test]
fn with_json_logs_the_error_that_ends_the_command_is_json_too() {
    for out in [
        ccfleet()
            .args([
                "--log-format",
                "json",
                "server",
                "--config",
                "/nonexistent/s.json",
            ])
            .output()
            .unwrap(),
        ccfleet()
            .args(["token", "--sub", "ops", "--ttl", "1h"])
            .env("CCFLEET_LOG_FORMAT", "json")
            .output()
            .unwrap(),
        // Command lines clap refuses (issue 26): plain usage text before.
        ccfleet()
            .args(["--log-format", "json", "server", "--no-such-flag"])
            .output()
            .unwrap(),
        ccfleet()
            .args(["agnet", "--config", "a.json"])
            .env("CCFLEET_LOG_FORMAT", "json")
            .output()
            .unwrap(),
    ] {
        assert_eq!(status(&out), 2);
        let stderr = text(&out.stderr);
        assert!(!stderr.is_empty());
        for line in stderr.lines() {
            let event: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            assert_eq!(event["level"], "ERROR", "{line}");
            assert_eq!(event["fatal"], true, "{line}");
            assert!(event["timestamp"].is_string(), "{line}");
        }
    }
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (a minute at most, for a loaded machine) until something accepts connections on
/// the loopback `port`.
fn wait_listening(port: u16) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < until,
            "nothing listens on port {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn with_json_logs_every_revision_is_a_string() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree/ccmc");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(
        tree.join("defaults.json"),
        r#"{"loadavg": {"tags": {"rack": "r1"}}}"#,
    )
    .unwrap();
    let port = free_port();
    let server_config = write(
        dir.path(),
        "server.json",
        &format!(
            r#"{{"addr": "127.0.0.1:{port}", "disable-authentication": true,
                "fleet": {{"config-dir": "tree"}}}}"#
        ),
    );
    let mut server = ccfleet()
        .args(["server", "--config"])
        .arg(&server_config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The agent's bootstrap tries once: an agent that started before the server listened
    // would run from its local configuration and never log "joined the fleet".
    wait_listening(port);
    let agent_config = write(
        dir.path(),
        "agent.json",
        &format!(
            r#"{{"fleet": {{"url": "http://127.0.0.1:{port}", "cluster": "fritz",
                "hostname": "node01", "token": "unused"}}}}"#
        ),
    );
    let agent = ccfleet()
        .args(["--log-format", "json", "agent", "--config"])
        .arg(&agent_config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = stderr_until(agent, "joined the fleet");
    let _ = server.kill();
    let _ = server.wait();
    let mut revisions = 0;
    for line in seen.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for (key, value) in event.as_object().unwrap() {
            if key.contains("revision") {
                revisions += 1;
                assert!(value.is_string(), "{key} is not a string: {line}");
            }
        }
    }
    // The registration's and the configuration's.
    assert!(revisions >= 2, "{seen}");
}
