//! Signed plugins: with `plugin-public-keys` an agent runs a fleet plugin only when its
//! component carries a valid signature by one of them. Played with the `ccfleet` binary
//! (keys made and components signed with `ccfleet plugin keygen` and `sign`, the agent a
//! child process), the project's fleet server and the guest plugins built from source; the
//! format is checked against wasmsign2, the reference implementation.

#[path = "support/agent_process.rs"]
mod agent_process;
#[path = "support/ceiling_fleet.rs"]
mod ceiling_fleet;
#[path = "support/guests.rs"]
mod guests;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ceiling_fleet::{Fleet, Receiver, metrics_addr, readyz_error, rollouts, wait_for};
use serde_json::{Value as Json, json};

/// `collect-interval` of the plugins the tests roll out.
const EVERY: &str = "200ms";

fn ccfleet(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .args(args)
        .output()
        .expect("running ccfleet")
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "ccfleet failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `ccfleet plugin keygen --out DIR/NAME.key`: the key file and the public key printed.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.key"));
    let printed = ok(ccfleet(&[
        "plugin".as_ref(),
        "keygen".as_ref(),
        "--out".as_ref(),
        key.as_os_str(),
    ]));
    let public = printed.lines().next().unwrap().trim().to_owned();
    (key, public)
}

/// `ccfleet plugin sign --key KEY IN -o OUT`; the SHA-256 it prints.
fn sign(key: &Path, input: &Path, out: &Path) -> String {
    let printed = ok(ccfleet(&[
        "plugin".as_ref(),
        "sign".as_ref(),
        "--key".as_ref(),
        key.as_os_str(),
        input.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]));
    let sha = printed
        .split("sha256 ")
        .nth(1)
        .and_then(|s| s.get(..64))
        .unwrap_or_else(|| panic!("no sha256 in {printed}"));
    assert_eq!(
        sha,
        ccfleet::server::plugins::sha256_hex(&std::fs::read(out).unwrap()),
        "the printed hash is the signed file's"
    );
    sha.to_owned()
}

/// `signed` with one byte of its signed content changed (the last: the download is still a
/// component by its header, so only the signature tells).
fn tampered(signed: &Path, out: &Path) {
    let mut bytes = std::fs::read(signed).unwrap();
    *bytes.last_mut().unwrap() ^= 0x01;
    std::fs::write(out, bytes).unwrap();
}

fn loadavg_entry(name: &str, sha: &str) -> Json {
    json!({"name": name, "sha256": sha, "collect-interval": EVERY,
           "config": {"hostname": format!("host-{name}"), "cluster": "fritz"},
           "capabilities": {"read-files": ["/proc/loadavg"]}})
}

/// The lines of `log` giving the grants of the plugin `name`.
fn grant_lines<'a>(log: &'a str, name: &str) -> Vec<&'a str> {
    let field = [format!("plugin={name} "), format!("plugin=\"{name}\"")];
    log.lines()
        .filter(|l| l.contains("plugin grants:") && field.iter().any(|f| l.contains(f.as_str())))
        .collect()
}

/// The health the server's status API shows for `plugin` of the (single) agent.
async fn reported_health(fleet: &Fleet, plugin: &str) -> Option<String> {
    reported(fleet, plugin, "health").await
}

/// `key` of what the server's status API shows for `plugin` of the (single) agent.
async fn reported(fleet: &Fleet, plugin: &str, key: &str) -> Option<String> {
    let instances = fleet.instances().await;
    instances["instances"]
        .as_array()?
        .iter()
        .flat_map(|i| i["plugins"].as_array().cloned().unwrap_or_default())
        .find(|p| p["name"] == plugin)
        .and_then(|p| p[key].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_components_signed_by_the_sites_key_run() {
    let fleet = Fleet::start().await;
    let root = fleet.dir().to_path_buf();
    let (site, site_public) = keygen(&root, "site");
    let (other, _) = keygen(&root, "other");
    let plain = guests::component("loadavg");
    let good = sign(&site, &plain, &root.join("good.wasm"));
    let foreign = sign(&other, &plain, &root.join("foreign.wasm"));
    tampered(&root.join("good.wasm"), &root.join("tampered.wasm"));
    assert_eq!(fleet.publish_file(&root.join("good.wasm")), good);
    let unsigned = fleet.publish_file(&plain);
    let foreign_sha = fleet.publish_file(&root.join("foreign.wasm"));
    assert_eq!(foreign_sha, foreign);
    let tampered_sha = fleet.publish_file(&root.join("tampered.wasm"));
    fleet
        .serve(json!([
            loadavg_entry("good", &good),
            loadavg_entry("unsigned", &unsigned),
            loadavg_entry("foreign", &foreign),
            loadavg_entry("tampered", &tampered_sha),
        ]))
        .await;
    let sink = Receiver::start().await;
    // The node administrator's own plugin: an unsigned file, run as it is.
    let own = json!({"name": "own", "path": plain, "collect-interval": EVERY,
                     "config": {"hostname": "host-own", "cluster": "fritz"},
                     "capabilities": {"read-files": ["/proc/loadavg"]}});
    let mut agent = fleet.agent(
        &sink,
        json!({"plugin-public-keys": [site_public], "plugins": [own]}),
        &[],
    );
    let metrics = metrics_addr(&mut agent);
    for (name, result) in [
        ("unsigned", "unsigned"),
        ("foreign", "signature_untrusted"),
        ("tampered", "signature_mismatch"),
    ] {
        wait_for(&format!("{name} refused"), async || {
            rollouts(metrics, name, result).await >= 1.0
        })
        .await;
    }
    wait_for(
        "the signed plugin's and the node's own plugin's points",
        async || {
            let sent = sink.text();
            sent.contains("host-good") && sent.contains("host-own")
        },
    )
    .await;
    // The server hears of each through the agent's report, as of a ceiling refusal, with
    // the reason the agent counts it by.
    for (name, why) in [
        ("unsigned", "unsigned"),
        ("foreign", "signature_untrusted"),
        ("tampered", "signature_mismatch"),
    ] {
        wait_for(&format!("{name} reported refused"), async || {
            reported_health(&fleet, name).await.as_deref() == Some("refused")
                && reported(&fleet, name, "why").await.as_deref() == Some(why)
        })
        .await;
    }
    // The agent's /readyz names each and why.
    for (name, why) in [
        ("unsigned", "refused: it is not signed"),
        (
            "foreign",
            "refused: its signature is by none of this node's plugin-public-keys",
        ),
        ("tampered", "refused: it was modified after it was signed"),
    ] {
        let error = readyz_error(metrics, name).await;
        assert!(
            error.as_deref().is_some_and(|e| e.starts_with(why)),
            "{name}: {error:?}"
        );
    }
    assert_eq!(readyz_error(metrics, "good").await, None);
    wait_for("good reported running", async || {
        reported_health(&fleet, "good").await.as_deref() == Some("running")
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("plugin signatures are enforced"), "{log}");
    for reason in [
        "refused: it is not signed; this node runs only fleet plugins signed by one of its plugin-public-keys",
        "refused: its signature is by none of this node's plugin-public-keys",
        "refused: it was modified after it was signed",
    ] {
        assert_eq!(
            log.matches(reason).count(),
            1,
            "{reason} is logged once: {log}"
        );
    }
    // The grants each plugin runs with, once; none for a plugin that never started.
    for name in ["good", "own"] {
        let grants = grant_lines(&log, name);
        assert_eq!(grants.len(), 1, "{name}: {log}");
        assert!(
            grants[0].contains("read-files [/proc/loadavg]") && grants[0].contains("memory-mb="),
            "{}",
            grants[0]
        );
    }
    for name in ["unsigned", "foreign", "tampered"] {
        assert!(grant_lines(&log, name).is_empty(), "{name} started: {log}");
    }
    let sent = sink.text();
    for refused in ["host-unsigned", "host-foreign", "host-tampered"] {
        assert!(!sent.contains(refused), "{refused} ran: {sent}");
    }
    // Counted once, not at every poll.
    assert_eq!(rollouts(metrics, "unsigned", "unsigned").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_nothing_changes_and_the_cache_obeys_keys_configured_later() {
    let mut fleet = Fleet::start().await;
    let root = fleet.dir().to_path_buf();
    let (_, site_public) = keygen(&root, "site");
    let unsigned = fleet.publish("loadavg");
    fleet
        .serve(json!([loadavg_entry("plain", &unsigned)]))
        .await;
    let sink = Receiver::start().await;
    let cached = json!({"cache-path": root.join("fleet-cache.json")});
    // No keys: an unsigned component runs, as before signing existed.
    let agent = fleet.agent_with_fleet(&sink, json!({}), &[], cached.clone());
    wait_for("the unsigned plugin's points", async || {
        sink.text().contains("host-plain")
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("plugin signatures are not enforced"), "{log}");
    drop(agent);
    // The server is gone and the node now has keys: the agent starts from its cache (the
    // component kept in fleet-plugin-dir) and refuses it.
    fleet.stop_server().await;
    let mut agent = fleet.agent_with_fleet(
        &sink,
        json!({"plugin-public-keys": [site_public]}),
        &[],
        cached,
    );
    let metrics = metrics_addr(&mut agent);
    wait_for("refused from the cache", async || {
        rollouts(metrics, "plain", "unsigned").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(
        log.contains("running from the cached configuration"),
        "{log}"
    );
    assert!(log.contains("refused: it is not signed"), "{log}");
    assert_eq!(rollouts(metrics, "plain", "swapped").await, 0.0);
}

#[test]
fn signed_components_load_run_and_verify_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "site");
    let signed = dir.path().join("loadavg.wasm");
    sign(&key, &guests::component("loadavg"), &signed);
    let checked = ok(ccfleet(&[
        "plugin".as_ref(),
        "check".as_ref(),
        signed.as_os_str(),
    ]));
    assert!(checked.contains(": ok"), "{checked}");
    let emitted = ok(ccfleet(&[
        "plugin".as_ref(),
        "run".as_ref(),
        signed.as_os_str(),
        "--read".as_ref(),
        "/proc/loadavg".as_ref(),
        "--config".as_ref(),
        r#"{"hostname": "signed-run"}"#.as_ref(),
    ]));
    assert!(emitted.contains("load_one"), "{emitted}");
    let verified = ccfleet(&[
        "plugin".as_ref(),
        "verify".as_ref(),
        "--public-key".as_ref(),
        public.as_ref(),
        signed.as_os_str(),
        guests::component("loadavg").as_os_str(),
    ]);
    assert_eq!(verified.status.code(), Some(1));
    let text = String::from_utf8_lossy(&verified.stdout);
    assert!(text.contains("loadavg.wasm: ok"), "{text}");
    assert!(text.contains("error: it is not signed"), "{text}");
    // The key file is the site's secret: private, and never overwritten.
    let again = ccfleet(&[
        "plugin".as_ref(),
        "keygen".as_ref(),
        "--out".as_ref(),
        key.as_os_str(),
    ]);
    assert_eq!(again.status.code(), Some(2));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

#[test]
fn wasmsign2_verifies_what_ccfleet_signs_and_the_other_way_round() {
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::STANDARD;
    let dir = tempfile::tempdir().unwrap();
    let component = guests::component("loadavg");

    // Signed by ccfleet, verified by wasmsign2 with the same key.
    let (key, public) = keygen(dir.path(), "site");
    let signed = dir.path().join("ccfleet-signed.wasm");
    sign(&key, &component, &signed);
    let mut raw = vec![0x01];
    raw.extend(engine.decode(&public).unwrap());
    let pk = wasmsign2::PublicKey::from_bytes(&raw).unwrap();
    let mut reader = std::io::BufReader::new(std::fs::File::open(&signed).unwrap());
    pk.verify(&mut reader, None)
        .expect("wasmsign2 verifies the ccfleet signature");
    let mut reader = std::io::BufReader::new(std::fs::File::open(&component).unwrap());
    assert!(pk.verify(&mut reader, None).is_err());

    // Signed by wasmsign2, verified by ccfleet (and wasmsign2's key files read by it).
    let pair = wasmsign2::KeyPair::generate();
    let module = wasmsign2::Module::deserialize_from_file(&component).unwrap();
    let theirs = dir.path().join("wasmsign2-signed.wasm");
    pair.sk
        .sign(module, None)
        .unwrap()
        .serialize_to_file(&theirs)
        .unwrap();
    let their_public = engine.encode(pair.pk.to_bytes());
    let verified = ok(ccfleet(&[
        "plugin".as_ref(),
        "verify".as_ref(),
        "--public-key".as_ref(),
        their_public.as_ref(),
        theirs.as_os_str(),
    ]));
    assert!(verified.contains(": ok"), "{verified}");
    let their_key = dir.path().join("wasmsign2.key");
    std::fs::write(&their_key, pair.sk.to_bytes()).unwrap();
    let resigned = dir.path().join("resigned.wasm");
    sign(&their_key, &theirs, &resigned);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&resigned).unwrap());
    pair.pk.verify(&mut reader, None).unwrap();
}
