//! The `ganglia` and `libganglia` sinks against Debian's `gmond` (ganglia-monitor), started
//! with its own configuration on free loopback ports: points go through the agent's sink
//! as gmond's UDP messages and are read back from gmond's XML with their names, values,
//! types, units, slopes, groups and clusters.

#[path = "support/gmond.rs"]
mod gmond;
#[path = "support/receivers.rs"]
mod receivers;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ccfleet_host::agent::sinks::{SinkConfig, start_standalone};
use ccfleet_host::sink::Batch;
use gmond::{Gmond, Metric};
use serde_json::{Value, json};

fn batch(lines: &str) -> Batch {
    Batch {
        plugin: Arc::from("test"),
        points: lines.lines().count(),
        lines: lines.to_owned().into(),
    }
}

async fn send(config: Value, lines: &str) -> (u64, u64) {
    let config: SinkConfig = serde_json::from_value(config).expect("a sink configuration");
    let sink = start_standalone("ganglia", &config, "fritz").expect("the sink starts");
    sink.tx.send(batch(lines)).await.unwrap();
    let counters = sink.counters.clone();
    drop(sink.tx);
    tokio::time::timeout(Duration::from_secs(120), sink.task)
        .await
        .expect("the sink ends")
        .unwrap();
    (
        counters.sent.load(Relaxed),
        counters.dropped_rejected.load(Relaxed),
    )
}

fn find<'a>(metrics: &'a [Metric], name: &str) -> &'a Metric {
    metrics
        .iter()
        .find(|m| m.get("NAME") == Some(name))
        .unwrap_or_else(|| panic!("{name} not reported: {metrics:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libganglia_sends_through_the_send_channels_of_its_gmond_conf() {
    let gmond = Gmond::start();
    let config = json!({
        "type": "libganglia",
        "gmond_config": gmond.client_config(),
        "libganglia_path": "libganglia.so.0",
        "add_ganglia_group": true,
        "add_type_to_name": true,
        "cluster_name": "fritz",
    });
    let lines = "load_one,hostname=n1,type=node value=0.25 1700000000000000000\n\
                 net_bytes_in,hostname=n1,type=node,unit=bytes/s value=1234.5 1700000000000000000\n\
                 flops_any,hostname=n1,type=socket,type-id=1,unit=MFLOP/s,group=FLOPS value=42i 1700000000000000000\n\
                 nv_util,hostname=n1,type=accelerator,device=0000:3b:00.0,unit=percent value=7u 1700000000000000000\n\
                 slurm_state,hostname=n1,type=node value=\"idle\" 1700000000000000000\n\
                 up,hostname=n1,type=node value=true 1700000000000000000\n";
    let (sent, dropped) = send(config, lines).await;
    assert_eq!((sent, dropped), (5, 1), "the boolean cannot be sent");
    let metrics = gmond.wait_for(&[
        "load_one",
        "net_bytes_in",
        "socket1_flops_any",
        // gmond writes `_` for a colon in a name.
        "nv_util_0000_3b_00.0",
        "slurm_state",
    ]);

    // A metric Ganglia knows: its own group, type, tmax and units.
    let load = find(&metrics, "load_one");
    assert_eq!(load.get("TYPE"), Some("float"));
    assert_eq!(
        load.get("VAL").map(|v| v.parse::<f64>().unwrap()),
        Some(0.25)
    );
    assert_eq!(load.get("TMAX"), Some("70"));
    assert_eq!(load.get("SLOPE"), Some("both"));
    assert_eq!(load.extra("GROUP"), Some("load"));
    assert_eq!(load.extra("CLUSTER"), Some("fritz"));
    // add_type_to_name keeps cc-metric-collector's name (the rename applies without it).
    let bytes = find(&metrics, "net_bytes_in");
    assert_eq!(bytes.get("UNITS"), Some("bytes/sec"));
    assert_eq!(bytes.extra("GROUP"), Some("network"));
    // Others: the value's type, the unit and group tags, tmax 300.
    let flops = find(&metrics, "socket1_flops_any");
    assert_eq!(flops.get("TYPE"), Some("int32"));
    assert_eq!(flops.get("VAL"), Some("42"));
    assert_eq!(flops.get("UNITS"), Some("MFLOP/s"));
    assert_eq!(flops.get("TMAX"), Some("300"));
    assert_eq!(flops.extra("GROUP"), Some("FLOPS"));
    let util = find(&metrics, "nv_util_0000_3b_00.0");
    assert_eq!(util.get("TYPE"), Some("uint32"));
    assert_eq!(util.get("VAL"), Some("7"));
    assert_eq!(util.get("UNITS"), Some("percent"));
    assert_eq!(util.extra("GROUP"), None, "no group tag: no group");
    let state = find(&metrics, "slurm_state");
    assert_eq!(state.get("TYPE"), Some("string"));
    assert_eq!(state.get("VAL"), Some("idle"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ganglia_sends_to_host_and_port_with_cc_libs_defaults() {
    let gmond = Gmond::start();
    let config = json!({
        "type": "ganglia",
        "gmetric_path": "/usr/bin/gmetric",
        "host": "127.0.0.1",
        "port": gmond.udp_port.to_string(),
    });
    let lines = "net_bytes_out,hostname=n1,type=node,unit=bytes/s value=10.5 1700000000000000000\n\
                 mem_used,hostname=n1,type=node,unit=GB,group=memory value=3.5 1700000000000000000\n";
    let (sent, dropped) = send(config, lines).await;
    assert_eq!((sent, dropped), (2, 0));
    let metrics = gmond.wait_for(&["bytes_out", "mem_used"]);
    // Renamed to Ganglia's name; no units, group or cluster by default.
    let bytes = find(&metrics, "bytes_out");
    assert_eq!(bytes.get("TYPE"), Some("float"));
    assert_eq!(
        bytes.get("VAL").map(|v| v.parse::<f64>().unwrap()),
        Some(10.5)
    );
    assert_eq!(bytes.get("UNITS"), Some(""));
    assert!(bytes.extra.is_empty(), "{bytes:?}");
    let used = find(&metrics, "mem_used");
    assert_eq!(used.get("TYPE"), Some("double"));
    assert_eq!(
        used.get("VAL").map(|v| v.parse::<f64>().unwrap()),
        Some(3.5)
    );
    assert_eq!(used.get("UNITS"), Some(""));
}

#[tokio::test]
async fn a_missing_gmond_conf_fails_the_start_naming_the_file() {
    let config: SinkConfig = serde_json::from_value(json!({
        "type": "libganglia",
        "gmond_config": "/nonexistent/gmond.conf",
    }))
    .unwrap();
    let err = match start_standalone("g", &config, "fritz") {
        Ok(_) => panic!("started without its gmond.conf"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("/nonexistent/gmond.conf"), "{err}");
    let refused = serde_json::from_value::<SinkConfig>(json!({
        "type": "ganglia", "gmond_config": "/etc/ganglia/gmond.conf"
    }))
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("unknown field `gmond_config`"),
        "{refused}"
    );
}
