//! Issue 36, the fleet cannot take over a node: whoever writes the configuration tree (a
//! fleet administrator, a compromised server) gets no more on a node than the node's own
//! `fleet-ceiling` allows. Every row of the attack table is played against the
//! `ccfleet agent` binary, running as the test's user (root on the test machines, as on an
//! HPC node), pulling from the project's fleet server, with the guest plugins built from
//! source; legitimate rollouts within the ceiling keep working.

#[path = "support/agent_process.rs"]
mod agent_process;
#[path = "support/ceiling_fleet.rs"]
mod ceiling_fleet;
#[path = "support/guests.rs"]
mod guests;
#[path = "support/rocm_smi_standin.rs"]
mod rocm_smi_standin;

use std::path::Path;

use ceiling_fleet::{
    Fleet, Receiver, build_evil_library, marker, metrics_addr, rollouts, wait_for,
};
use serde_json::json;

/// `collect-interval` of the plugins the tests roll out.
const EVERY: &str = "200ms";

fn sh_attack(dir: &Path) -> serde_json::Value {
    json!({"path": "/bin/sh",
           "args": ["-c", format!("id > {}/pwned; head -c 40 /etc/shadow", dir.display())],
           "user": "root", "timeout": "24h"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_fleet_defines_never_runs_and_the_refusal_is_reported() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let run_command = fleet.publish("run-command");
    let ipmistat = fleet.publish("ipmistat");
    let loadavg = fleet.publish("loadavg");
    fleet
        .serve(json!([
            {"name": "pwn", "sha256": run_command, "collect-interval": EVERY, "config": "pwn",
             "capabilities": {"run": {"pwn": sh_attack(root)}}},
            {"name": "ipmi", "sha256": ipmistat, "collect-interval": EVERY,
             "config": {"hostname": "node01", "cluster": "fritz"},
             "capabilities": {"run": {"ipmi-sensors": sh_attack(root)}}},
            {"name": "load", "sha256": loadavg, "collect-interval": EVERY,
             "config": {"hostname": "node01", "cluster": "fritz"},
             "capabilities": {"read-files": ["/proc/loadavg"]}},
        ]))
        .await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, json!({}), &[]);
    let metrics = metrics_addr(&mut agent);
    for name in ["pwn", "ipmi"] {
        wait_for(&format!("{name} refused"), async || {
            rollouts(metrics, name, "beyond_ceiling").await >= 1.0
        })
        .await;
    }
    // The plugin within the default ceiling runs: the agent went through the whole list.
    wait_for("loadavg's points", async || {
        sink.text().contains("load_one")
    })
    .await;
    // Reported with the agent's next configuration poll, with the grant's key as the
    // reason and never the fleet's definition.
    wait_for("the refusal in the agent's report", async || {
        fleet.reports().iter().any(|r| {
            r.contains("pwn@")
                && r.contains(":refused")
                && r.contains("pwn:beyond_ceiling/capabilities.run")
                && r.contains("ipmi:beyond_ceiling/capabilities.run")
        })
    })
    .await;
    assert!(
        fleet.reports().iter().all(|r| !r.contains("/bin/sh")),
        "{:?}",
        fleet.reports()
    );
    let log = agent.log().join("\n");
    assert!(
        log.contains("capabilities.run.pwn is beyond this node's fleet-ceiling"),
        "{log}"
    );
    assert_eq!(
        log.matches("capabilities.run.pwn is beyond").count(),
        1,
        "the refusal is logged once: {log}"
    );
    assert!(!root.join("pwned").exists(), "the fleet's command ran");
    // Counted once, not at every poll.
    assert_eq!(rollouts(metrics, "pwn", "beyond_ceiling").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_node_defines_is_what_runs_when_the_fleet_names_it() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let run_command = fleet.publish("run-command");
    let ceiling = json!({"fleet-ceiling": {
        "run": {"report": {"path": "/bin/echo", "args": ["node-defined-report"]}}}});
    // The fleet names the command; a definition of its own for the same name is refused.
    fleet
        .serve(json!([
            {"name": "report", "sha256": run_command, "collect-interval": EVERY,
             "config": "report", "capabilities": {"run": ["report"]}},
            {"name": "hijack", "sha256": run_command, "collect-interval": EVERY,
             "config": "report", "capabilities": {"run": {"report": sh_attack(root)}}},
        ]))
        .await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, ceiling, &[]);
    let metrics = metrics_addr(&mut agent);
    // The point carries the output as a string field, which the http sink leaves out; the
    // plugin's log line carries the output's first line.
    wait_for("the node's command's output", async || {
        agent
            .log()
            .iter()
            .any(|l| l.contains("run report: status 0: node-defined-report"))
    })
    .await;
    wait_for("the hijack refused", async || {
        rollouts(metrics, "hijack", "beyond_ceiling").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("definition of its own"), "{log}");
    assert!(!root.join("pwned").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_library_of_the_fleet_is_ever_loaded() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let (evil, ran) = build_evil_library(root);
    let nvidia = fleet.publish("nvidia");
    // The ELF itself published as a plugin: its download is refused and never kept.
    let elf = fleet.publish_file(&evil);
    fleet
        .serve(json!([
            {"name": "gpu", "sha256": nvidia, "collect-interval": EVERY,
             "config": {"hostname": "node01"},
             "capabilities": {"nvml": true, "nvml-library": evil}},
            {"name": "elf", "sha256": elf, "collect-interval": EVERY},
        ]))
        .await;
    let sink = Receiver::start().await;
    // The node grants NVML, so only the library is beyond it.
    let mut agent = fleet.agent(&sink, json!({"fleet-ceiling": {"nvml": true}}), &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("the library refused", async || {
        rollouts(metrics, "gpu", "beyond_ceiling").await >= 1.0
    })
    .await;
    wait_for("the ELF refused", async || {
        rollouts(metrics, "elf", "not_a_component").await >= 1.0
    })
    .await;
    let kept = root.join("node").join("fleet-plugins");
    assert!(
        !kept.join(format!("{elf}.wasm")).exists(),
        "the ELF was kept"
    );
    let log = agent.log().join("\n");
    assert!(log.contains("nvml-library"), "{log}");
    assert!(log.contains("not a WebAssembly component"), "{log}");
    drop(agent);

    // Even the node's own configuration cannot load a library from the download directory.
    std::fs::create_dir_all(&kept).unwrap();
    let planted = kept.join("libnvidia-ml.so.1");
    std::fs::copy(&evil, &planted).unwrap();
    fleet
        .serve(
            json!([{"name": "gpu", "sha256": nvidia, "collect-interval": EVERY,
                       "config": {"hostname": "node01"}, "capabilities": {"nvml": true}}]),
        )
        .await;
    let mut agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"nvml": true, "nvml-library": planted}}),
        &[],
    );
    let metrics = metrics_addr(&mut agent);
    wait_for("the planted library refused", async || {
        rollouts(metrics, "gpu", "instantiate_failed").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("lies in the agent's state directory"), "{log}");
    assert!(!ran.exists(), "a library constructor ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_directories_never_reach_the_agents_secrets() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let probe = fleet.publish("hostile-proc-probe");
    let node = root.join("node");
    let token = fleet.token();
    let probe_entry = |dirs: serde_json::Value| {
        json!({"name": "probe", "sha256": probe,
               "config": {"wasi": [node.join("agent.json")]},
               "capabilities": {"wasi": true, "read-dirs": dirs}})
    };
    fleet
        .serve(json!([probe_entry(json!(["/etc", node]))]))
        .await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, json!({}), &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("WASI refused by the default ceiling", async || {
        rollouts(metrics, "probe", "beyond_ceiling").await >= 1.0
    })
    .await;
    drop(agent);
    // A node that lets the fleet's plugins read its agent directory through WASI still
    // keeps the configuration (and its token) there out of reach: the directory is refused.
    fleet.serve(json!([probe_entry(json!([node]))])).await;
    let ceiling = json!({"fleet-ceiling": {"wasi": true, "read-dirs": [node]}});
    let mut agent = fleet.agent(&sink, ceiling, &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("the preopen refused", async || {
        rollouts(metrics, "probe", "instantiate_failed").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("which plugins never read"), "{log}");
    assert!(
        !log.contains("read ") || !log.contains("probe wasi"),
        "{log}"
    );
    assert!(!log.contains(&token) && !sink.text().contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_everything_reads_no_secret() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let customcmd = fleet.publish("customcmd");
    let node = root.join("node");
    let password = root.join("nats.password");
    let decoy = marker();
    std::fs::write(&password, format!("{decoy} value=1\n")).unwrap();
    let credentials = root.join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    let credential = marker();
    std::fs::write(credentials.join("token"), format!("{credential} value=1\n")).unwrap();
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let shadow_line = shadow.lines().next().unwrap_or("root:").to_owned();
    let files = json!([
        "/etc/shadow",
        node.join("agent.json"),
        password,
        credentials.join("token"),
        "/etc/gshadow"
    ]);
    let entries = json!([
        {"name": "custom", "sha256": customcmd, "collect-interval": EVERY,
         "config": {"hostname": "node01", "files": files},
         "capabilities": {"read-files": ["/**"]}},
    ]);
    fleet.serve(entries).await;
    let sink = Receiver::start().await;
    let env = [
        ("CC_NATS_PASSWORD_FILE", password.to_str().unwrap()),
        ("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap()),
    ];
    // The default ceiling refuses `/**`.
    let mut agent = fleet.agent(&sink, json!({}), &env);
    let metrics = metrics_addr(&mut agent);
    wait_for("/** refused", async || {
        rollouts(metrics, "custom", "beyond_ceiling").await >= 1.0
    })
    .await;
    drop(agent);
    // A node that grants the fleet `/**` still keeps its secrets and the agent's.
    let agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"read-files": ["/**"]}}),
        &env,
    );
    wait_for("customcmd's failed rounds", async || {
        agent
            .log()
            .iter()
            .any(|l| l.contains("custom") && l.contains("never readable"))
    })
    .await;
    let log = agent.log().join("\n");
    for refused in [
        "/etc/shadow: ",
        "agent.json: ",
        "nats.password: ",
        "/etc/gshadow: ",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(refused) && l.contains("never readable")),
            "{refused} not refused: {log}"
        );
    }
    let sent = sink.text();
    for secret in [
        decoy.as_str(),
        credential.as_str(),
        &fleet.token(),
        &shadow_line,
    ] {
        assert!(!log.contains(secret), "a secret in the log: {log}");
        assert!(!sent.contains(secret), "a secret sent: {sent}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_beyond_the_ceiling_are_refused() {
    let fleet = Fleet::start().await;
    let bomb = fleet.publish("hostile-memory-bomb");
    let flood = fleet.publish("hostile-log-flood");
    fleet
        .serve(json!([
            {"name": "bomb", "sha256": bomb, "limits": {"memory-mb": 768}},
            {"name": "flood", "sha256": flood, "collect-interval": EVERY,
             "config": {"lines": 1000, "line-bytes": 100},
             "limits": {"log-lines-per-second": 100000, "log-burst": 100000}},
            {"name": "fast", "sha256": flood, "collect-interval": "1ms",
             "config": {"lines": 1}},
        ]))
        .await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, json!({}), &[]);
    let metrics = metrics_addr(&mut agent);
    for name in ["bomb", "flood", "fast"] {
        wait_for(&format!("{name} refused"), async || {
            rollouts(metrics, name, "beyond_ceiling").await >= 1.0
        })
        .await;
    }
    let log = agent.log().join("\n");
    assert!(log.contains("limits.memory-mb 768"), "{log}");
    assert!(!log.contains("allocating without bound"), "{log}");
    let peak = peak_rss_mb(agent.pid());
    assert!(peak < 768, "the agent's peak RSS is {peak} MB");
}

/// `VmHWM` of a process, in MB.
fn peak_rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cached_configuration_obeys_the_ceiling_on_every_start() {
    let mut fleet = Fleet::start().await;
    let root = fleet.dir().to_path_buf();
    let run_command = fleet.publish("run-command");
    fleet
        .serve(
            json!([{"name": "pwn", "sha256": run_command, "collect-interval": EVERY,
                       "config": "pwn", "capabilities": {"run": {"pwn": sh_attack(&root)}}}]),
        )
        .await;
    let sink = Receiver::start().await;
    let cached = json!({"cache-path": root.join("fleet-cache.json")});
    let mut agent = fleet.agent_with_fleet(&sink, json!({}), &[], cached.clone());
    let metrics = metrics_addr(&mut agent);
    wait_for("refused", async || {
        rollouts(metrics, "pwn", "beyond_ceiling").await >= 1.0
    })
    .await;
    drop(agent);
    // The server is gone: the agent starts from what it cached, and refuses it again.
    fleet.stop_server().await;
    let mut agent = fleet.agent_with_fleet(&sink, json!({}), &[], cached);
    let metrics = metrics_addr(&mut agent);
    wait_for("refused from the cache", async || {
        rollouts(metrics, "pwn", "beyond_ceiling").await >= 1.0
    })
    .await;
    assert!(!root.join("pwned").exists(), "the cached attack ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_runs_with_the_nodes_library() {
    let fleet = Fleet::start().await;
    let nvidia = fleet.publish("nvidia");
    let library = ceiling_fleet::nvml_standin(fleet.dir());
    fleet
        .serve(
            json!([{"name": "gpu", "sha256": nvidia, "collect-interval": EVERY,
                       "config": {"hostname": "node01"}, "capabilities": {"nvml": true}}]),
        )
        .await;
    let sink = Receiver::start().await;
    let _agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"nvml": true, "nvml-library": library}}),
        &[],
    );
    wait_for("nvidia's points", async || sink.text().contains("nv_")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn likwid_runs_only_with_the_nodes_library() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let (evil, ran) = build_evil_library(root);
    let likwid = fleet.publish("likwid");
    let config = ceiling_fleet::likwid_config(root);
    let entry = |caps: serde_json::Value| {
        json!([{"name": "counters", "sha256": likwid, "collect-interval": "1s",
                "config": config, "capabilities": caps}])
    };
    // The fleet naming a library, even with the node granting LIKWID, is refused.
    fleet
        .serve(entry(json!({"likwid": true, "likwid-library": evil})))
        .await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, json!({"fleet-ceiling": {"likwid": true}}), &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("the fleet's library refused", async || {
        rollouts(metrics, "counters", "beyond_ceiling").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("likwid-library"), "{log}");
    drop(agent);

    // The node's own library in the download directory is refused before it is loaded.
    let kept = root.join("node").join("fleet-plugins");
    std::fs::create_dir_all(&kept).unwrap();
    let planted = kept.join("liblikwid.so.5");
    std::fs::copy(&evil, &planted).unwrap();
    fleet.serve(entry(json!({"likwid": true}))).await;
    let mut agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"likwid": true, "likwid-library": planted}}),
        &[],
    );
    let metrics = metrics_addr(&mut agent);
    wait_for("the planted library refused", async || {
        rollouts(metrics, "counters", "instantiate_failed").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("lies in the agent's state directory"), "{log}");
    assert!(!ran.exists(), "a library constructor ran");
    drop(agent);

    // The node's library elsewhere is the one the fleet's plugin measures with.
    let library = ceiling_fleet::likwid_standin(root);
    let _agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"likwid": true, "likwid-library": library}}),
        &[],
    );
    wait_for("likwid's points", async || {
        sink.text().contains("flops_any")
    })
    .await;
    assert!(!ran.exists(), "a library constructor ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocm_smi_runs_only_with_the_nodes_library() {
    let fleet = Fleet::start().await;
    let root = fleet.dir();
    let (evil, ran) = build_evil_library(root);
    let amd = fleet.publish("rocm_smi");
    let entry = |caps: serde_json::Value| {
        json!([{"name": "amd", "sha256": amd, "collect-interval": EVERY,
                "config": {"hostname": "node01"}, "capabilities": caps}])
    };
    // Beyond the default ceiling, which grants no native library.
    fleet.serve(entry(json!({"rocm-smi": true}))).await;
    let sink = Receiver::start().await;
    let mut agent = fleet.agent(&sink, json!({}), &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("rocm-smi beyond the default ceiling", async || {
        rollouts(metrics, "amd", "beyond_ceiling").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("capabilities.rocm-smi is beyond"), "{log}");
    drop(agent);

    // The fleet naming a library, even with the node granting ROCm SMI, is refused.
    fleet
        .serve(entry(json!({"rocm-smi": true, "rocm-smi-library": evil})))
        .await;
    let mut agent = fleet.agent(&sink, json!({"fleet-ceiling": {"rocm-smi": true}}), &[]);
    let metrics = metrics_addr(&mut agent);
    wait_for("the fleet's library refused", async || {
        rollouts(metrics, "amd", "beyond_ceiling").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("rocm-smi-library"), "{log}");
    drop(agent);

    // The node's own library in the download directory is refused before it is loaded.
    let kept = root.join("node").join("fleet-plugins");
    std::fs::create_dir_all(&kept).unwrap();
    let planted = kept.join("librocm_smi64.so.1");
    std::fs::copy(&evil, &planted).unwrap();
    fleet.serve(entry(json!({"rocm-smi": true}))).await;
    let mut agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"rocm-smi": true, "rocm-smi-library": planted}}),
        &[],
    );
    let metrics = metrics_addr(&mut agent);
    wait_for("the planted library refused", async || {
        rollouts(metrics, "amd", "instantiate_failed").await >= 1.0
    })
    .await;
    let log = agent.log().join("\n");
    assert!(log.contains("lies in the agent's state directory"), "{log}");
    drop(agent);

    // The node's library elsewhere is the one the fleet's plugin reads the GPUs with.
    let library = rocm_smi_standin::build(
        root,
        rocm_smi_standin::Variant::Recorded,
        "librocm_smi64.so.1",
    );
    let _agent = fleet.agent(
        &sink,
        json!({"fleet-ceiling": {"rocm-smi": true, "rocm-smi-library": library}}),
        &[],
    );
    wait_for("rocm_smi's points", async || {
        sink.text().contains("rocm_gfx_util,")
    })
    .await;
    assert!(!ran.exists(), "a library constructor ran");
}
