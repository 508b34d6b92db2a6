//! Every way a section converts, is left out or is refused.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Finding, Import, ImportError, ImportOptions, import};

fn options() -> ImportOptions {
    ImportOptions {
        fleet_url: "http://backend:8080".to_owned(),
        cluster: Some("c1".to_owned()),
        plugin_dir: PathBuf::from("/plugins"),
        overrides: Vec::new(),
        secrets_dir: "credentials".to_owned(),
    }
}

/// A one-file configuration (sections inline) in a temporary directory.
fn inline(main: Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    std::fs::write(&file, main.to_string()).unwrap();
    (dir, file)
}

fn run(main: Value) -> Import {
    let (_dir, file) = inline(main);
    import(&file, &options()).expect("imports")
}

fn run_err(main: Value, options: &ImportOptions) -> ImportError {
    let (_dir, file) = inline(main);
    import(&file, options).expect_err("refused")
}

fn keys(findings: &[Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.at.as_str()).collect()
}

fn reason<'a>(findings: &'a [Finding], at: &str) -> &'a str {
    &findings
        .iter()
        .find(|f| f.at == at)
        .unwrap_or_else(|| panic!("nothing about {at}: {findings:?}"))
        .reason
}

fn plugin<'a>(import: &'a Import, name: &str) -> &'a Value {
    import.config["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no plugin {name}"))
}

#[test]
fn a_nats_sink_becomes_the_nats_section_and_a_subject() {
    let import = run(json!({"interval": "10s", "sinks": {
        "bus": {"type": "nats", "host": "nats1", "port": "4223", "database": "ccmetrics",
                "user": "u", "password": "p", "flush_delay": "1s"}}}));
    assert!(import.left_out.is_empty(), "{:?}", import.left_out);
    assert_eq!(
        import.config["nats"],
        json!({"address": "nats://nats1:4223", "username": "u", "password": "p"})
    );
    assert_eq!(
        import.config["sinks"]["bus"],
        json!({"type": "nats", "subject": "ccmetrics"})
    );
    assert!(keys(&import.notes).contains(&"sinks.bus.flush_delay"));
}

#[test]
fn a_second_nats_server_is_left_out_but_the_same_one_twice_is_not() {
    let import = run(json!({"sinks": {
        "a": {"type": "nats", "host": "n1", "subject": "x"},
        "b": {"type": "nats", "host": "n1", "subject": "y"},
        "c": {"type": "nats", "host": "n2", "subject": "z"}}}));
    assert_eq!(keys(&import.left_out), ["sinks.c"]);
    assert!(reason(&import.left_out, "sinks.c").contains("one NATS connection"));
    assert_eq!(import.config["sinks"]["b"]["subject"], "y");
}

#[test]
fn an_nkey_file_becomes_the_credentials_file() {
    let import = run(json!({"sinks": {
        "a": {"type": "nats", "host": "n1", "subject": "x", "nkey_file": "/etc/n.creds"}}}));
    assert_eq!(import.config["nats"]["creds-file-path"], "/etc/n.creds");
}

#[test]
fn sinks_the_agent_lacks_are_left_out_with_their_reason() {
    let import = run(json!({"sinks": {
        "influx": {"type": "influxasync", "host": "h"},
        "ganglia": {"type": "libganglia"},
        "prom": {"type": "prometheus"},
        "file": {"type": "stdout", "output_file": "/tmp/out"},
        "basic": {"type": "http", "url": "http://ms:8082/api/write", "username": "u", "password": "p"},
        "nourl": {"type": "http"},
        "odd": {"type": "carrier-pigeon"},
        "notype": {"url": "x"},
        "notobject": 3}}));
    let mut left = keys(&import.left_out);
    left.sort();
    assert_eq!(
        left,
        [
            "sinks.basic",
            "sinks.file",
            "sinks.influx",
            "sinks.notobject",
            "sinks.notype",
            "sinks.nourl",
            "sinks.odd",
            "sinks.prom"
        ]
    );
    // An InfluxDB sink the agent's parser refuses is left out with the parser's reason.
    assert!(
        reason(&import.left_out, "sinks.influx").contains("missing field `port`"),
        "{:?}",
        import.left_out
    );
    assert!(reason(&import.left_out, "sinks.prom").contains("missing field `port`"));
    assert!(reason(&import.left_out, "sinks.basic").contains("basic authentication"));
    assert!(reason(&import.left_out, "sinks.odd").contains("\"carrier-pigeon\""));
    assert!(reason(&import.left_out, "sinks.file").contains("output_file"));
    assert_eq!(
        import.config["sinks"]["ganglia"],
        json!({"type": "libganglia"})
    );
}

#[test]
fn prometheus_and_ganglia_sinks_carry_over_with_cc_libs_keys() {
    let import = run(json!({"sinks": {
        "prom": {"type": "prometheus", "host": "", "port": "9091", "path": "metrics",
                 "group_as_namespace": true, "meta_as_tags": []},
        "gm": {"type": "ganglia", "gmetric_path": "/usr/bin/gmetric",
               "gmetric_config": "/etc/ganglia/gmond.conf", "add_ganglia_group": true,
               "add_tags_as_desc": false, "cluster_name": "fritz", "add_type_to_name": true,
               "add_units": true},
        "lib": {"type": "libganglia", "gmond_config": "/etc/ganglia/gmond.conf",
                "libganglia_path": "libganglia.so.0", "add_ganglia_group": true}}}));
    assert!(import.left_out.is_empty(), "{:?}", import.left_out);
    assert_eq!(
        import.config["sinks"]["prom"],
        json!({"type": "prometheus", "port": "9091", "path": "metrics",
               "group_as_namespace": true, "meta_as_tags": []})
    );
    assert_eq!(
        import.config["sinks"]["gm"],
        json!({"type": "ganglia", "gmetric_path": "/usr/bin/gmetric",
               "gmetric_config": "/etc/ganglia/gmond.conf", "add_ganglia_group": true,
               "add_tags_as_desc": false, "cluster_name": "fritz", "add_type_to_name": true,
               "add_units": true})
    );
    assert_eq!(
        import.config["sinks"]["lib"],
        json!({"type": "libganglia", "gmond_config": "/etc/ganglia/gmond.conf",
               "libganglia_path": "libganglia.so.0", "add_ganglia_group": true})
    );
}

#[test]
fn http_settings_carry_over_and_the_jwt_becomes_a_file() {
    let import = run(json!({"sinks": {"ms": {"type": "http",
        "url": "http://ms:8082/api/write?cluster=c1", "jwt": "secret-jwt", "timeout": "5s",
        "flush_delay": "2s", "precision": "ms", "bogus": 1}}}));
    assert_eq!(
        import.config["sinks"]["ms"],
        json!({"type": "http", "url": "http://ms:8082/api/write?cluster=c1",
               "jwt-file": "credentials/ms.jwt", "timeout": "5s", "flush-delay": "2s"})
    );
    assert_eq!(import.secrets.len(), 1);
    assert_eq!(import.secrets[0].contents, "secret-jwt");
    assert!(
        !format!("{import:?}").contains("secret-jwt"),
        "Debug shows no secret"
    );
    assert!(keys(&import.notes).contains(&"sinks.ms.precision"));
    assert!(keys(&import.notes).contains(&"sinks.ms.bogus"));
}

#[test]
fn per_sink_message_rules_are_left_out() {
    let import = run(json!({"sinks": {"o": {"type": "stdout",
        "process_messages": {"drop_messages": ["x"]}}}}));
    assert_eq!(keys(&import.left_out), ["sinks.o.process_messages"]);
    assert_eq!(import.config["sinks"]["o"], json!({"type": "stdout"}));
}

#[test]
fn meta_as_tags_of_the_sinks_reach_every_plugin_and_a_sink_wanting_fewer_keeps_its_list() {
    let none = run(json!({"sinks": {"o": {"type": "stdout"}}, "collectors": {"loadavg": {}}}));
    assert_eq!(
        plugin(&none, "loadavg")["config"]["meta_as_tags"],
        json!([]),
        "cc-lib writes no meta as tags unless told"
    );
    let unit = run(
        json!({"sinks": {"o": {"type": "stdout", "meta_as_tags": ["unit"]}},
                          "collectors": {"loadavg": {}}}),
    );
    assert_eq!(
        plugin(&unit, "loadavg")["config"],
        json!({}),
        "the plugins' default"
    );
    let differ = run(json!({"sinks": {
        "a": {"type": "stdout", "meta_as_tags": ["unit"]},
        "b": {"type": "stdout"}}, "collectors": {"loadavg": {}}}));
    assert!(differ.left_out.is_empty(), "{:?}", differ.left_out);
    // The plugins write the union; b removes what it does not name, as in cc-lib.
    assert_eq!(plugin(&differ, "loadavg")["config"], json!({}));
    assert_eq!(differ.config["sinks"]["a"], json!({"type": "stdout"}));
    assert_eq!(
        differ.config["sinks"]["b"],
        json!({"type": "stdout", "meta_as_tags": []})
    );
}

#[test]
fn a_setting_the_plugin_refuses_leaves_the_collector_out_naming_it() {
    let import = run(json!({"collectors": {
        "netstat": {"include_devices": "eth0"},
        "memstat": {"node_stats": true, "bogus_key": 1},
        "slurm_cgroup": {"use_sudo": true},
        "loadavg": {}}}));
    let mut left = keys(&import.left_out);
    left.sort();
    assert_eq!(
        left,
        [
            "collectors.memstat",
            "collectors.netstat",
            "collectors.slurm_cgroup"
        ]
    );
    assert!(reason(&import.left_out, "collectors.netstat").contains("include_devices"));
    assert!(reason(&import.left_out, "collectors.memstat").contains("bogus_key"));
    assert!(reason(&import.left_out, "collectors.slurm_cgroup").contains("use_sudo"));
    assert_eq!(import.config["plugins"].as_array().unwrap().len(), 1);
}

/// A cgroup directory that is not an absolute path (or holds a pattern's characters) would
/// become a `read-files` pattern the agent refuses or one wider than meant: the collector is
/// left out naming the key, rather than written into a configuration that does not load.
#[test]
fn a_slurm_cgroup_directory_that_is_no_absolute_path_is_left_out_naming_it() {
    for (key, value) in [
        ("cgroup_base", "slurm.slice"),
        ("cgroup_base", ""),
        ("cgroup_base", "/sys/fs/cgroup/*"),
        ("cgroup_base", "/sys/fs/cgroup/../../etc"),
        ("cgroup_v1_root", "sys/fs/cgroup"),
    ] {
        let import = run(json!({"collectors": {
            "slurm_cgroup": {key: value}, "loadavg": {}}}));
        assert_eq!(
            keys(&import.left_out),
            ["collectors.slurm_cgroup"],
            "{key}={value}"
        );
        let why = reason(&import.left_out, "collectors.slurm_cgroup");
        assert!(
            why.contains(key) && why.contains("absolute"),
            "{key}={value}: {why}"
        );
    }
    let import = run(json!({"collectors": {
        "slurm_cgroup": {"cgroup_base": "/sys/fs/cgroup/system.slice/slurmstepd.scope/"}}}));
    assert!(import.left_out.is_empty(), "{:?}", keys(&import.left_out));
}

#[test]
fn unknown_and_unported_collectors_are_left_out_with_their_reason() {
    let import = run(json!({"collectors": {
        "likwid": {}, "made_up": {},
        "loadavg": "not an object"}}));
    // A likwid section without event sets is refused by the plugin's own parser.
    assert!(reason(&import.left_out, "collectors.likwid").contains("eventsets"));
    assert!(reason(&import.left_out, "collectors.made_up").contains("no collector"));
    assert!(reason(&import.left_out, "collectors.loadavg").contains("JSON object"));
    assert_eq!(import.left_out.len(), 3);
}

#[test]
fn grants_follow_the_settings() {
    let import = run(json!({"collectors": {
        "loadavg": {"hostname": "n1"},
        "cpustat": {},
        "diskstat": {},
        "slurm_cgroup": {"cgroup_base": "/sys/fs/cgroup/slurm.slice/", "cgroup_version": "v2"}}}));
    assert_eq!(
        plugin(&import, "loadavg")["capabilities"],
        json!({"read-files": ["/proc/loadavg"]}),
        "a host name in the settings needs no host name file"
    );
    assert_eq!(
        plugin(&import, "cpustat")["capabilities"],
        json!({"read-files": ["/proc/stat", "/proc/sys/kernel/hostname"]})
    );
    assert_eq!(
        plugin(&import, "diskstat")["capabilities"],
        json!({"mount-info": true, "read-files": ["/proc/sys/kernel/hostname"]})
    );
    assert_eq!(
        plugin(&import, "slurm_cgroup")["capabilities"]["read-files"],
        json!([
            "/sys/devices/system/cpu/online",
            "/sys/fs/cgroup/cgroup.controllers",
            "/sys/fs/cgroup/slurm.slice/**",
            "/proc/sys/kernel/hostname"
        ])
    );
    let v1 = run(
        json!({"collectors": {"slurm_cgroup": {"cgroup_version": "v1",
                                                         "cgroup_v1_root": "/cg"}}}),
    );
    assert_eq!(
        plugin(&v1, "slurm_cgroup")["capabilities"]["read-files"],
        json!([
            "/sys/devices/system/cpu/online",
            "/sys/fs/cgroup/cgroup.controllers",
            "/cg/memory/slurm/**",
            "/cg/cpuacct/slurm/**",
            "/cg/cpuset/slurm/**",
            "/proc/sys/kernel/hostname"
        ])
    );
    assert_eq!(plugin(&import, "cpustat")["path"], "/plugins/cpustat.wasm");
    assert_eq!(plugin(&import, "cpustat")["collect-interval"], "10s");
    assert!(
        keys(&import.notes).contains(&"interval"),
        "the default is said"
    );
}

#[test]
fn self_becomes_the_agents_self_section() {
    let import = run(json!({"interval": "30s", "collectors": {
        "self": {"read_mem_stats": true, "read_rusage": true}}}));
    assert_eq!(
        import.config["self"],
        json!({"read_mem_stats": true, "read_rusage": true, "interval": "30s"})
    );
    assert!(import.config["plugins"].as_array().unwrap().is_empty());
    let bad = run(json!({"collectors": {"self": {"read_everything": true}}}));
    assert!(reason(&bad.left_out, "collectors.self").contains("read_everything"));
}

#[test]
fn receivers_are_left_out_and_an_empty_set_is_not() {
    let none = run(json!({"receivers": {}}));
    assert!(none.left_out.is_empty());
    let some = run(json!({"receivers": {"in": {"type": "nats"}}}));
    assert_eq!(keys(&some.left_out), ["receivers.in"]);
}

#[test]
fn the_router_carries_over_with_the_interval_and_without_unknown_fau_keys() {
    let import = run(json!({"interval": "60s", "router": {
        "rename_metrics": {"load_one": "cpu_load"}, "normalize_metrics": true}}));
    assert_eq!(
        import.config["router"],
        json!({"rename_metrics": {"load_one": "cpu_load"}, "interval": "60s"})
    );
    assert!(reason(&import.notes, "router.normalize_metrics").contains("normalize_units"));
    let bad = run(json!({"router": {"drop_metrics_if": ["name == "]}}));
    assert!(bad.config.get("router").is_none());
    assert!(reason(&bad.left_out, "router").contains("refuses"));
    let unknown = run(json!({"router": {"no_such_option": 1}}));
    assert!(reason(&unknown.left_out, "router").contains("no_such_option"));
}

#[test]
fn the_cluster_comes_from_the_router_or_an_http_sink_or_must_be_given() {
    let mut options = options();
    options.cluster = None;
    let (_d, file) = inline(json!({"router": {"add_tags": [
        {"key": "cluster", "value": "fromrouter", "if": "*"}]}}));
    assert_eq!(
        import(&file, &options).unwrap().config["fleet"]["cluster"],
        "fromrouter"
    );
    let (_d, file) = inline(json!({"sinks": {"ms": {"type": "http",
        "url": "http://ms:8082/api/write?cluster=fromsink"}}}));
    assert_eq!(
        import(&file, &options).unwrap().config["fleet"]["cluster"],
        "fromsink"
    );
    // A conditional tag is not every metric's cluster.
    let e = run_err(
        json!({"router": {"add_tags": [{"key": "cluster", "value": "x", "if": "name == 'a'"}]}}),
        &options,
    );
    assert!(matches!(e, ImportError::NoCluster));
    assert!(e.to_string().contains("--cluster"));
}

#[test]
fn malformed_files_are_refused_naming_the_file_and_the_problem() {
    let options = options();
    let e = run_err(json!({"interval": 10}), &options);
    assert!(
        e.to_string().contains("`interval` must be a duration"),
        "{e}"
    );
    let e = run_err(json!({"interval": "ten seconds"}), &options);
    assert!(e.to_string().contains("\"ten seconds\""), "{e}");
    let e = run_err(json!({"sinks": 3}), &options);
    assert!(e.to_string().contains("`sinks` must name a file"), "{e}");
    let e = run_err(json!({"main": []}), &options);
    assert!(
        e.to_string().contains("`main` must be a JSON object"),
        "{e}"
    );
    let e = run_err(json!([1, 2]), &options);
    assert!(
        e.to_string()
            .contains("the main file must be a JSON object"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        "{\"sinks\": \"sinks.json\"}",
    )
    .unwrap();
    std::fs::write(dir.path().join("sinks.json"), "{not json").unwrap();
    let e = import(dir.path(), &options).unwrap_err();
    assert!(
        e.to_string().contains("sinks.json") && e.to_string().contains("key must be a string"),
        "{e}"
    );
    let e = import(&dir.path().join("nothing-here.json"), &options).unwrap_err();
    assert!(matches!(e, ImportError::Read { .. }), "{e}");
}

#[test]
fn a_named_file_is_found_as_written_beside_the_main_file_or_by_its_section_name() {
    let dir = tempfile::tempdir().unwrap();
    let write =
        |name: &str, v: Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    write("my-sinks.json", json!({"o": {"type": "stdout"}}));
    write("collectors.json", json!({"loadavg": {}}));
    let other = tempfile::tempdir().unwrap();
    let router = other.path().join("r.json");
    std::fs::write(&router, json!({"rename_metrics": {"a": "b"}}).to_string()).unwrap();
    write(
        "config.json",
        json!({"sinks": "/nonexistent/node/path/my-sinks.json",
               "collectors": "/etc/cc-metric-collector/collectors2.json",
               "router": router.to_str().unwrap()}),
    );
    let import = import(dir.path(), &options()).unwrap();
    let read: Vec<(&str, &Path)> = import.read.iter().map(|(s, p)| (*s, p.as_path())).collect();
    assert!(read.contains(&("sinks", dir.path().join("my-sinks.json").as_path())));
    assert!(read.contains(&("collectors", dir.path().join("collectors.json").as_path())));
    assert!(read.contains(&("router", router.as_path())));
    assert_eq!(import.config["router"]["rename_metrics"], json!({"a": "b"}));
}

/// Any JSON value, a few levels deep, with the keys the import looks at among others.
fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let key = prop_oneof![
        Just("type".to_owned()),
        Just("url".to_owned()),
        Just("jwt".to_owned()),
        Just("host".to_owned()),
        Just("port".to_owned()),
        Just("subject".to_owned()),
        Just("meta_as_tags".to_owned()),
        Just("process_messages".to_owned()),
        Just("add_tags".to_owned()),
        Just("key".to_owned()),
        Just("value".to_owned()),
        Just("if".to_owned()),
        Just("hostname".to_owned()),
        Just("cgroup_base".to_owned()),
        Just("cgroup_version".to_owned()),
        "[a-z_]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        prop_oneof![
            Just("http".to_owned()),
            Just("nats".to_owned()),
            Just("stdout".to_owned()),
            Just("*".to_owned()),
            Just("cluster".to_owned()),
            Just("http://ms:8082/api/write?cluster=c".to_owned()),
            ".{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever the sections hold, the import answers (a configuration or an error) and
    /// never panics; a configuration it returns loads as the agent will load it.
    #[test]
    fn arbitrary_sections_never_panic_and_what_is_returned_loads(
        collectors in any_json(), sinks in any_json(), router in any_json(),
        receivers in any_json(), collector in "(cpustat|slurm_cgroup|self|netstat|likwid)",
    ) {
        let mut main = serde_json::Map::new();
        main.insert("interval".into(), json!("10s"));
        let mut named = serde_json::Map::new();
        named.insert(collector, collectors.clone());
        main.insert("collectors".into(), Value::Object(named));
        main.insert("sinks".into(), sinks);
        main.insert("router".into(), router);
        main.insert("receivers".into(), receivers);
        let (dir, file) = inline(Value::Object(main));
        if let Ok(import) = import(&file, &options()) {
            let text = import.config.to_string();
            let loaded = crate::agent::AgentConfig::from_json(&text, dir.path());
            proptest::prop_assert!(loaded.is_ok(), "{text}: {:?}", loaded.err());
        }
    }
}

#[test]
fn command_collectors_get_their_executables_as_grants() {
    let import = run(json!({"collectors": {
        "ipmistat": {"ipmitool_path": "/opt/ipmi/bin/ipmitool", "ipmisensors_path": "ipmi-sensors",
                     "use_sudo": true, "send_abs_values": true},
        "lustrestat": {"lctl_command": "/usr/bin/lctl", "send_abs_values": true},
        "gpfs": {"send_abs_values": true},
        "topprocs": {"num_procs": 5},
        "customcmd": {"commands": ["/usr/local/bin/getmetrics.pl --all", "relative.sh"],
                      "files": ["/var/run/metrics.lp"]}}}));
    let run = |name: &str| plugin(&import, name)["capabilities"]["run"].clone();
    assert_eq!(
        run("ipmistat"),
        json!({"ipmitool-sensor": {"path": "/opt/ipmi/bin/ipmitool", "args": ["sensor"]},
               "ipmi-sensors": {"path": "/usr/sbin/ipmi-sensors",
                                "args": ["--comma-separated-output", "--sdr-cache-recreate"]}})
    );
    assert_eq!(plugin(&import, "ipmistat")["config"], json!({}));
    assert!(reason(&import.notes, "collectors.ipmistat.ipmisensors_path").contains("PATH"));
    assert!(reason(&import.notes, "collectors.ipmistat.use_sudo").contains("`user`"));
    assert!(keys(&import.notes).contains(&"collectors.ipmistat.send_abs_values"));
    assert_eq!(
        run("lustrestat"),
        json!({"lctl-llite-stats": {"path": "/usr/bin/lctl", "args": ["get_param", "llite.*.stats"]}})
    );
    assert_eq!(
        run("gpfs")["mmpmon-fs-io"]["path"],
        "/usr/lpp/mmfs/bin/mmpmon"
    );
    assert!(reason(&import.notes, "collectors.gpfs.mmpmon_path").contains("fs_io_s"));
    assert_eq!(run("topprocs")["ps-top"]["path"], "/usr/bin/ps");
    assert_eq!(
        run("customcmd"),
        json!({"command1": {"path": "/usr/local/bin/getmetrics.pl", "args": ["--all"]}})
    );
    assert_eq!(
        plugin(&import, "customcmd")["config"]["commands"],
        json!(["command1"])
    );
    assert_eq!(
        plugin(&import, "customcmd")["capabilities"]["read-files"],
        json!(["/var/run/metrics.lp", "/proc/sys/kernel/hostname"])
    );
    assert_eq!(keys(&import.left_out), ["collectors.customcmd.commands[1]"]);
    assert!(reason(&import.left_out, "collectors.customcmd.commands[1]").contains("absolute"));
}

#[test]
fn smartmon_and_beegfs_get_smartctl_and_beegfs_ctl_as_grants() {
    let import = run(json!({"collectors": {
        "smartmon": {"use_sudo": true, "exclude_devices": ["/dev/sda"],
                     "excludeMetrics": ["smartmon_warn_temp_time"],
                     "devices": [{"name": "/dev/nvme0", "type": "nvme"},
                                 {"name": "/dev/sda", "type": "sat"}]},
        "beegfs_meta": {"beegfs_path": "/opt/beegfs/sbin/beegfs-ctl",
                        "exclude_filesystem": ["/mnt/ignore_me"],
                        "exclude_metrics": ["ack", "entInf"]},
        "beegfs_storage": {}}}));
    let capabilities = |name: &str| plugin(&import, name)["capabilities"].clone();
    assert_eq!(
        capabilities("smartmon")["run"],
        json!({"smartctl-nvme0": {"path": "/usr/sbin/smartctl",
                                  "args": ["--json=c", "--device=nvme", "--all", "/dev/nvme0"]}})
    );
    assert_eq!(
        plugin(&import, "smartmon")["config"],
        json!({"exclude_devices": ["/dev/sda"], "excludeMetrics": ["smartmon_warn_temp_time"],
               "devices": [{"name": "/dev/nvme0", "type": "nvme"},
                           {"name": "/dev/sda", "type": "sat"}]})
    );
    assert!(reason(&import.notes, "collectors.smartmon.use_sudo").contains("`user`"));
    assert!(reason(&import.notes, "collectors.smartmon.smartctl").contains("PATH"));
    assert_eq!(
        capabilities("beegfs_meta"),
        json!({"read-files": ["/proc/sys/kernel/hostname"], "mount-info": true,
               "run": {"beegfs-meta-mnt-beeond": {"path": "/opt/beegfs/sbin/beegfs-ctl",
                       "args": ["--clientstats", "--nodetype=meta", "--mount=/mnt/beeond",
                                "--allstats"]}}})
    );
    assert_eq!(
        plugin(&import, "beegfs_meta")["config"],
        json!({"exclude_filesystem": ["/mnt/ignore_me"], "exclude_metrics": ["ack", "entInf"]})
    );
    assert!(
        reason(&import.notes, "collectors.beegfs_meta.beegfs_path").contains("mounted elsewhere")
    );
    assert_eq!(
        capabilities("beegfs_storage")["run"]["beegfs-storage-mnt-beeond"]["args"][1],
        "--nodetype=storage"
    );
    assert_eq!(
        capabilities("beegfs_storage")["run"]["beegfs-storage-mnt-beeond"]["path"],
        "/usr/bin/beegfs-ctl"
    );
    assert_eq!(keys(&import.left_out), Vec::<&str>::new());

    // Without devices the scan is granted, and the note says each disk needs its grant.
    let import = run(json!({"collectors": {"smartmon": {}}}));
    assert_eq!(
        plugin(&import, "smartmon")["capabilities"]["run"],
        json!({"smartctl-scan": {"path": "/usr/sbin/smartctl", "args": ["--scan", "--json=c"]}})
    );
    assert!(reason(&import.notes, "collectors.smartmon.devices").contains("smartctl-nvme0"));
}

#[test]
fn nvidia_gets_the_nvml_grant() {
    let import = run(json!({"collectors": {"nvidia": {"process_mig_devices": true}}}));
    assert!(import.left_out.is_empty(), "{:?}", import.left_out);
    assert_eq!(
        plugin(&import, "nvidia")["capabilities"],
        json!({"nvml": true, "read-files": ["/proc/sys/kernel/hostname"]})
    );
}

#[test]
fn rocm_smi_gets_the_rocm_smi_grant_within_the_nodes_ceiling() {
    let section = json!({"exclude_devices": ["1", "00000000:C6:00.0"],
        "exclude_metrics": ["rocm_mm_util"], "use_pci_info_as_type_id": true,
        "add_pci_info_tag": false, "add_serial_meta": true});
    let import = run(json!({"collectors": {"rocm_smi": section}}));
    assert!(import.left_out.is_empty(), "{:?}", import.left_out);
    let plugin = plugin(&import, "rocm_smi");
    assert_eq!(
        plugin["capabilities"],
        json!({"rocm-smi": true, "read-files": ["/proc/sys/kernel/hostname"]})
    );
    for (key, value) in section.as_object().unwrap() {
        assert_eq!(&plugin["config"][key], value, "{key}");
    }
    // The node's ceiling grants ROCm SMI, so the fleet can roll the collector out too; the
    // library is the node's (cc-metric-collector's section names none).
    let ceiling = &import.config["fleet-ceiling"];
    assert_eq!(ceiling["rocm-smi"], true);
    assert!(ceiling.get("rocm-smi-library").is_none());
    let parsed: crate::plugin::ceiling::Ceiling = serde_json::from_value(ceiling.clone()).unwrap();
    parsed.validate().unwrap();
    // A key cc-metric-collector's collector does not know is refused, as it refuses it.
    let bad = run(json!({"collectors": {"rocm_smi": {"exclude_device": ["1"]}}}));
    assert!(reason(&bad.left_out, "collectors.rocm_smi").contains("exclude_device"));
}

#[test]
fn likwid_keeps_its_event_sets_and_moves_node_settings_to_the_node() {
    let import = run(json!({"duration": "10s", "collectors": {"likwid": {
        "liblikwid_path": "/apps/likwid/lib/liblikwid.so",
        "accessdaemon_path": "/apps/likwid/sbin",
        "access_mode": "accessdaemon",
        "eventsets": [{"events": {"PMC0": "FP_ARITH_INST_RETIRED_SCALAR_DOUBLE"},
            "metrics": [{"name": "flops_dp", "calc": "1E-9*PMC0/time", "type": "hwthread",
                "publish": true, "unit": "GFlops/s"}]}]}}}));
    let plugin = &import.config["plugins"][0];
    assert_eq!(plugin["name"], "likwid");
    assert_eq!(plugin["capabilities"]["likwid"], true);
    assert_eq!(
        plugin["capabilities"]["likwid-library"],
        "/apps/likwid/lib/liblikwid.so"
    );
    assert_eq!(plugin["config"]["duration"], "10s");
    // The node's ceiling names the same library, so the fleet's likwid plugin loads it too.
    let ceiling = &import.config["fleet-ceiling"];
    assert_eq!(ceiling["likwid"], true);
    assert_eq!(ceiling["likwid-library"], "/apps/likwid/lib/liblikwid.so");
    let parsed: crate::plugin::ceiling::Ceiling = serde_json::from_value(ceiling.clone()).unwrap();
    parsed.validate().unwrap();
    assert!(plugin["config"].get("liblikwid_path").is_none());
    assert!(plugin["config"].get("accessdaemon_path").is_none());
    assert!(
        reason(&import.notes, "collectors.likwid.accessdaemon_path")
            .contains("CCFLEET_LIKWID_ACCESSDAEMON_PATH=/apps/likwid/sbin")
    );
    // A formula the agent's expression engine cannot evaluate is reported now.
    let bad = run(
        json!({"collectors": {"likwid": {"eventsets": [{"events": {"PMC0": "X"},
        "metrics": [{"name": "m", "calc": "PMC1", "type": "hwthread", "publish": true}]}]}}}),
    );
    assert!(reason(&bad.left_out, "collectors.likwid").contains("\"PMC1\""));
}
