//! `ccfleet decode` as an operator runs it: line protocol on stdin, JSON lines out.

use std::io::Write;
use std::process::{Command, Stdio};

fn decode(args: &[&str], input: &[u8]) -> (i32, Vec<serde_json::Value>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("decode")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ccfleet");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every output line is JSON"))
        .collect();
    (out.status.code().unwrap(), lines)
}

#[test]
fn prints_points_in_the_corpus_shape_and_goes_on_after_a_bad_line() {
    let input =
        b"cpu,host=a\\ b value=1.5,n=3i,u=4u,ok=t,s=\"x\\\"y\" 1000\nbad line\nmem free=2 2\n";
    let (status, lines) = decode(&[], input);
    assert_eq!(status, 1, "a bad line makes the exit status 1");
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0],
        serde_json::json!({
            "name": "cpu",
            "tags": [{"key": "host", "value": "a b"}],
            "fields": [
                {"key": "value", "value": {"float": 1.5}},
                {"key": "n", "value": {"int": 3}},
                {"key": "u", "value": {"uint": 4}},
                {"key": "ok", "value": {"bool": true}},
                {"key": "s", "value": {"string": "x\"y"}},
            ],
            "time": 1000,
        })
    );
    assert_eq!(lines[1]["line"], 2);
    assert!(lines[1]["error"].as_str().unwrap().contains("at line 2:"));
    assert_eq!(lines[2]["name"], "mem");
}

#[test]
fn precision_and_default_time() {
    let (status, lines) = decode(
        &["--precision", "s", "--default-time", "5000000123"],
        b"m v=1 7\nm v=2\n",
    );
    assert_eq!(status, 0);
    assert_eq!(lines[0]["time"], 7_000_000_000i64);
    assert_eq!(lines[1]["time"], 5_000_000_000i64);
}

#[test]
fn fleet_mode_reads_heartbeats_and_rosters_without_leaking_ids() {
    let id = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
    let mut input = ccfleet::wire::encode_heartbeat(1, &[id]).unwrap();
    input.extend(
        ccfleet::wire::encode_roster(
            "fritz",
            ccfleet::wire::ServiceType::MetricCollector,
            &[ccfleet::wire::Provider {
                service_type: ccfleet::wire::ServiceType::Backend.into(),
                hostname: "mgmt01".into(),
                state: "active".into(),
                meta: Default::default(),
            }],
            2,
        )
        .unwrap(),
    );
    let (status, lines) = decode(&["--fleet"], &input);
    assert_eq!(status, 0);
    assert_eq!(lines[0]["fleet"]["heartbeat"]["instanceId"], "3f1c…6b7c");
    assert_eq!(lines[1]["fleet"]["roster"]["consumer"], "ccmc");
    assert_eq!(
        lines[1]["fleet"]["roster"]["providers"][0]["hostname"],
        "mgmt01"
    );
    let (_, shown) = decode(&["--fleet", "--show-ids"], &input);
    assert_eq!(shown[0]["fleet"]["heartbeat"]["instanceId"], id);
}
