//! `ccfleet agent import-ccmc` over NHR@FAU's published cc-metric-collector configurations
//! (`fixtures/ccmc-fau/`, one directory per cluster as published, JWTs and passwords already
//! replaced there): each converts, names what it cannot carry over, refuses to write without
//! `--partial`, and with it writes a configuration `agent --check-config` accepts. The
//! grants it writes are enough for every plugin to collect over recorded `/proc` and `/sys`
//! trees, and a JWT moves into a private file without being printed.

#[path = "support/guests.rs"]
mod guests;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ccfleet_host::plugin::sink;
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");
const FLEET_URL: &str = "http://backend.example:8080";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fau(site: &str) -> PathBuf {
    fixtures().join("ccmc-fau").join(site)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `ccfleet agent import-ccmc INPUT -o OUTPUT --fleet-url ... EXTRA...`.
fn import(input: &Path, output: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["agent", "import-ccmc"])
        .arg(input)
        .arg("-o")
        .arg(output)
        .args(["--fleet-url", FLEET_URL, "--plugin-dir"])
        .arg(guests::components())
        .args(extra)
        .output()
        .expect("running ccfleet")
}

fn check_config(config: &Path) -> Output {
    Command::new(BIN)
        .args(["agent", "--check-config", "--config"])
        .arg(config)
        .env_remove("CC_FLEET_TOKEN")
        .env_remove("CC_FLEET_TOKEN_FILE")
        .output()
        .expect("running ccfleet")
}

/// The keys a report names as left out, in order.
fn left_out(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("left out: "))
        .map(|l| l.split(": ").next().unwrap_or_default().to_owned())
        .collect()
}

/// Each published configuration (with the collectors file of each node type where a site
/// keeps several) and what it cannot carry over: nothing. Every InfluxDB and Ganglia sink
/// and every LIKWID section carries over.
const SITES: &[(&str, Option<&str>, &[&str])] = &[
    ("alex", None, &[]),
    ("fritz", None, &[]),
    ("fritz.spr", None, &[]),
    ("meggie-ng", None, &[]),
    ("tinyfat", Some("collectors.bdw.json"), &[]),
    ("tinyfat", Some("collectors.rome.json"), &[]),
    ("tinygpu", Some("collectors.rome.a100.json"), &[]),
    ("tinygpu", Some("collectors.skx.2080.json"), &[]),
    ("tinygpu", Some("collectors.skx.3080.json"), &[]),
    ("tinygpu", Some("collectors.skx.v100.json"), &[]),
    ("woody-ng", Some("collectors.icx.json"), &[]),
    ("woody-ng", Some("collectors.skl.json"), &[]),
];

#[test]
fn every_fau_configuration_converts_and_passes_check_config() {
    for (site, variant, expected) in SITES {
        let what = format!("{site} {variant:?}");
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("agent.json");
        let collectors = variant.map(|v| fau(site).join(v));
        let mut extra: Vec<&str> = Vec::new();
        if let Some(file) = &collectors {
            extra.extend(["--collectors", file.to_str().unwrap()]);
        }

        // Without --partial: the losses are named, nothing is written, status 1; a
        // configuration that loses nothing is written as it is, status 0.
        let refused = import(&fau(site), &output, &extra);
        let stdout = text(&refused.stdout);
        let mut named = left_out(&stdout);
        named.sort();
        let mut want: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        assert_eq!(named, want, "{what}: {stdout}");
        if expected.is_empty() {
            assert_eq!(refused.status.code(), Some(0), "{what}: {stdout}");
            assert!(output.exists(), "{what}: written without --partial");
            std::fs::remove_file(&output).unwrap();
            std::fs::remove_dir_all(dir.path().join("credentials")).ok();
        } else {
            assert_eq!(refused.status.code(), Some(1), "{what}: {stdout}");
            assert!(stdout.contains("give --partial"), "{what}: {stdout}");
            assert!(!output.exists(), "{what}: nothing is written");
            assert!(!dir.path().join("credentials").exists(), "{what}");
        }

        // With --partial: written, private, and the agent accepts it.
        extra.push("--partial");
        let written = import(&fau(site), &output, &extra);
        let stdout = text(&written.stdout);
        assert!(
            written.status.success(),
            "{what}: {stdout}{}",
            text(&written.stderr)
        );
        let mode = std::fs::metadata(&output).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{what}");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
        let source_collectors: Value = serde_json::from_str(
            &std::fs::read_to_string(
                collectors
                    .clone()
                    .unwrap_or_else(|| fau(site).join("collectors.json")),
            )
            .unwrap(),
        )
        .unwrap();
        let mut plugins: Vec<String> = config["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        plugins.sort();
        let mut carried: Vec<String> = source_collectors
            .as_object()
            .unwrap()
            .keys()
            .filter(|name| !expected.contains(&format!("collectors.{name}").as_str()))
            .cloned()
            .collect();
        carried.sort();
        assert_eq!(plugins, carried, "{what}: one plugin per carried collector");
        for plugin in config["plugins"].as_array().unwrap() {
            assert_eq!(
                plugin["collect-interval"], "60s",
                "{what}: config.json's interval"
            );
        }
        assert_eq!(config["fleet"]["url"], FLEET_URL);
        // Every sink not named above carries over, InfluxDB's with its password in a file.
        let source_sinks: Value =
            serde_json::from_str(&std::fs::read_to_string(fau(site).join("sinks.json")).unwrap())
                .unwrap();
        for (name, sink) in source_sinks.as_object().unwrap() {
            if expected.contains(&format!("sinks.{name}").as_str()) {
                continue;
            }
            let written = &config["sinks"][name];
            assert_eq!(written["type"], sink["type"], "{what}: sinks.{name}");
            if sink["type"] == "influxasync" || sink["type"] == "influxdb" {
                for key in ["host", "port", "database", "organization", "ssl"] {
                    assert_eq!(written[key], sink[key], "{what}: sinks.{name}.{key}");
                }
                let file = dir.path().join(written["password_file"].as_str().unwrap());
                assert_eq!(
                    std::fs::read_to_string(file).unwrap(),
                    sink["password"].as_str().unwrap(),
                    "{what}"
                );
                assert!(
                    !std::fs::read_to_string(&output)
                        .unwrap()
                        .contains("\"password\"")
                );
            }
        }
        if *site == "woody-ng" {
            // Its http sink sends unit as a tag and its InfluxDB sink does not.
            assert_eq!(config["sinks"]["nhrinflux"]["meta_as_tags"], json!([]));
            assert!(config["sinks"]["woodystore"].get("meta_as_tags").is_none());
        }
        // The cluster every metric is tagged with by the site's router.
        let cluster = match *site {
            "fritz.spr" => "fritz",
            "meggie-ng" => "meggie",
            "woody-ng" => "woodyng",
            other => other,
        };
        assert_eq!(config["fleet"]["cluster"], cluster, "{what}");

        // The vendor tools the command collectors run are not on this machine: their
        // grants point at a stand-in so the check (which opens each granted executable)
        // covers everything else.
        let mut config = config;
        for plugin in config["plugins"].as_array_mut().unwrap() {
            if let Some(run) = plugin["capabilities"]
                .get_mut("run")
                .and_then(Value::as_object_mut)
            {
                for grant in run.values_mut() {
                    assert!(grant["path"].as_str().unwrap().starts_with('/'), "{what}");
                    grant["path"] = json!("/bin/true");
                }
            }
        }
        std::fs::write(&output, config.to_string()).unwrap();
        let checked = check_config(&output);
        let report = text(&checked.stdout);
        assert!(checked.status.success(), "{what}: {report}");
        assert!(report.trim_end().ends_with(": ok"), "{what}: {report}");
        for name in &plugins {
            assert!(
                report.contains(&format!("plugin {name}: ")) && report.contains("compiles"),
                "{what}: {name} compiles: {report}"
            );
        }
    }
}

#[test]
fn a_missing_section_file_names_the_variants_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("agent.json");
    let result = import(&fau("tinyfat"), &output, &["--partial"]);
    let stderr = text(&result.stderr);
    assert!(!result.status.success());
    assert!(
        stderr.contains("collectors.bdw.json, collectors.rome.json")
            && stderr.contains("--collectors FILE"),
        "{stderr}"
    );
    assert!(!output.exists());
}

#[test]
fn an_existing_output_is_kept_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("agent.json");
    std::fs::write(&output, "keep me").unwrap();
    let result = import(&fau("meggie-ng"), &output, &["--partial"]);
    assert!(!result.status.success());
    assert!(
        text(&result.stderr).contains("--force"),
        "{}",
        text(&result.stderr)
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "keep me");
    assert!(
        !dir.path().join("credentials").exists(),
        "no secret written either"
    );
    let forced = import(&fau("meggie-ng"), &output, &["--partial", "--force"]);
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    assert!(
        std::fs::read_to_string(&output)
            .unwrap()
            .contains("plugins")
    );
}

/// A configuration of the given sections in cc-metric-collector's older form (the main file
/// names each section's file).
fn older_form(dir: &Path, sections: &[(&str, Value)]) {
    let mut main = serde_json::Map::new();
    main.insert("interval".into(), json!("30s"));
    for (name, value) in sections {
        let file = format!("/etc/cc-metric-collector/{name}.json");
        std::fs::write(dir.join(format!("{name}.json")), value.to_string()).unwrap();
        main.insert((*name).into(), json!(file));
    }
    std::fs::write(dir.join("config.json"), Value::Object(main).to_string()).unwrap();
}

const JWT: &str = "eyJhbGciOiJFZERTQSJ9.c2VjcmV0LWp3dC12YWx1ZQ.c2lnbmF0dXJl";

fn sample_sections() -> Vec<(&'static str, Value)> {
    vec![
        (
            "collectors",
            json!({"loadavg": {}, "netstat": {"include_devices": ["eth0"]}}),
        ),
        (
            "sinks",
            json!({"store": {"type": "http", "url": "http://ms1:8082/api/write?cluster=testcluster",
                             "jwt": JWT, "meta_as_tags": ["unit"]}}),
        ),
        (
            "router",
            json!({"add_tags": [{"key": "cluster", "value": "testcluster", "if": "*"}],
                   "rename_metrics": {"load_one": "cpu_load"}}),
        ),
        ("receivers", json!({})),
    ]
}

#[test]
fn a_jwt_moves_to_a_private_file_and_is_never_printed() {
    let input = tempfile::tempdir().unwrap();
    older_form(input.path(), &sample_sections());
    let out = tempfile::tempdir().unwrap();
    let output = out.path().join("agent.json");
    let result = import(input.path(), &output, &[]);
    let printed = text(&result.stdout) + &text(&result.stderr);
    assert!(result.status.success(), "{printed}");
    assert!(!printed.contains(JWT), "the JWT is printed: {printed}");
    let config_text = std::fs::read_to_string(&output).unwrap();
    assert!(
        !config_text.contains(JWT),
        "the JWT stays in the configuration"
    );
    let config: Value = serde_json::from_str(&config_text).unwrap();
    assert_eq!(
        config["sinks"]["store"]["jwt-file"],
        "credentials/store.jwt"
    );
    let jwt_file = out.path().join("credentials/store.jwt");
    assert_eq!(std::fs::read_to_string(&jwt_file).unwrap(), JWT);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&jwt_file), 0o600);
    assert_eq!(mode(&out.path().join("credentials")), 0o700);
    let checked = check_config(&output);
    assert!(checked.status.success(), "{}", text(&checked.stdout));
    assert!(!text(&checked.stdout).contains(JWT));
}

#[test]
fn the_ccconfig_form_converts_as_the_older_form_does() {
    let older = tempfile::tempdir().unwrap();
    older_form(older.path(), &sample_sections());
    // cc-lib's ccConfig form: `main`, `<section>-file` keys and inline sections.
    let newer = tempfile::tempdir().unwrap();
    let sections = sample_sections();
    let mut main = serde_json::Map::new();
    main.insert("main".into(), json!({"interval": "30s", "duration": "1s"}));
    for (i, (name, value)) in sections.iter().enumerate() {
        if i % 2 == 0 {
            std::fs::write(newer.path().join(format!("{name}.json")), value.to_string()).unwrap();
            main.insert(format!("{name}-file"), json!(format!("./{name}.json")));
        } else {
            main.insert((*name).into(), value.clone());
        }
    }
    let main_file = newer.path().join("main-config.json");
    std::fs::write(&main_file, Value::Object(main).to_string()).unwrap();

    let out = tempfile::tempdir().unwrap();
    let a = out.path().join("a/agent.json");
    let b = out.path().join("b/agent.json");
    std::fs::create_dir_all(a.parent().unwrap()).unwrap();
    std::fs::create_dir_all(b.parent().unwrap()).unwrap();
    let first = import(older.path(), &a, &[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let second = import(&main_file, &b, &[]);
    assert!(
        second.status.success(),
        "{}{}",
        text(&second.stdout),
        text(&second.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap()
    );
}

/// Copies a tree over `to`, replacing files that exist.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs each plugin of an imported configuration over recorded trees for two rounds: its
/// grants, and nothing else, reach the files it reads. Returns each plugin's outcome and the
/// points it sent.
async fn collect_with_written_grants(config: &Value) -> Vec<(String, Result<usize, String>)> {
    let root = tempfile::tempdir().unwrap();
    copy_tree(&fixtures().join("collectors/round1"), root.path());
    copy_tree(&fixtures().join("hpc/round1"), root.path());
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut outcomes = Vec::new();
    for plugin in config["plugins"].as_array().unwrap() {
        let mut spec: PluginSpec = serde_json::from_value(plugin.clone()).unwrap();
        spec.capabilities.files_root = Some(root.path().to_path_buf());
        let name = spec.display_name();
        let loaded = runtime.load(&spec).await.expect("loads");
        let (tx, mut rx) = sink::channel(64);
        let mut instance = match loaded.instantiate(&runtime, &spec, tx).await {
            Ok(instance) => instance,
            Err(e) => {
                outcomes.push((name, Err(e.to_string())));
                continue;
            }
        };
        let mut outcome = Ok(0);
        for (round, now) in [
            (1u8, 1_700_000_000_000_000_000i64),
            (2, 1_700_000_005_000_000_000),
        ] {
            if round == 2 {
                copy_tree(&fixtures().join("collectors/round2"), root.path());
                copy_tree(&fixtures().join("hpc/round2"), root.path());
            }
            match instance.collect(now).await {
                Ok(Ok(())) => {}
                other => {
                    outcome = Err(format!("round {round}: {other:?}"));
                    break;
                }
            }
        }
        if let Ok(points) = &mut outcome {
            while let Ok(batch) = rx.try_recv() {
                *points += batch
                    .lines
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .count();
            }
        }
        outcomes.push((name, outcome));
    }
    outcomes
}

/// Every collector with a plugin, with default settings.
const WITH_PLUGINS: [&str; 17] = [
    "cpustat",
    "cpufreq",
    "cpufreq_cpuinfo",
    "diskstat",
    "ibstat",
    "iostat",
    "loadavg",
    "memstat",
    "netstat",
    "nfs3stat",
    "nfs4stat",
    "nfsiostat",
    "numastats",
    "rapl",
    "schedstat",
    "slurm_cgroup",
    "tempstat",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_written_grants_are_enough_for_every_plugin_and_needed() {
    let input = tempfile::tempdir().unwrap();
    let collectors: serde_json::Map<String, Value> = WITH_PLUGINS
        .iter()
        .map(|name| ((*name).to_owned(), json!({})))
        .collect();
    older_form(
        input.path(),
        &[
            ("collectors", Value::Object(collectors)),
            ("sinks", json!({"out": {"type": "stdout"}})),
        ],
    );
    let out = tempfile::tempdir().unwrap();
    let output = out.path().join("agent.json");
    let result = import(input.path(), &output, &["--cluster", "testcluster"]);
    assert!(result.status.success(), "{}", text(&result.stdout));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(
        config["plugins"].as_array().unwrap().len(),
        WITH_PLUGINS.len()
    );

    for (name, outcome) in collect_with_written_grants(&config).await {
        match outcome {
            Ok(points) => assert!(points > 0, "{name} sent nothing over two rounds"),
            Err(e) => panic!("{name} with the written grants: {e}"),
        }
    }

    // The grants are needed, not merely enough: without its first file, a plugin fails.
    let mut narrowed = config.clone();
    for plugin in narrowed["plugins"].as_array_mut().unwrap() {
        let files = plugin["capabilities"]["read-files"].as_array_mut();
        if let Some(files) = files
            && files.len() > 1
        {
            files.remove(0);
        }
    }
    let outcomes = collect_with_written_grants(&narrowed).await;
    for name in [
        "cpustat",
        "loadavg",
        "memstat",
        "iostat",
        "schedstat",
        "nfs4stat",
    ] {
        let (_, outcome) = outcomes.iter().find(|(n, _)| n == name).unwrap();
        assert!(
            outcome.is_err() || *outcome == Ok(0),
            "{name} without its first grant: {outcome:?}"
        );
    }
}
