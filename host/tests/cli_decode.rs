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

#[test]
fn an_unterminated_string_near_the_end_is_a_bad_line_not_a_crash() {
    // Once a panic (exit status 101) in the string scanner.
    let (status, lines) = decode(&[], b"m f=\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert_eq!(status, 1);
    assert_eq!(lines.len(), 1);
    assert!(lines[0]["error"].as_str().unwrap().contains("unterminated"));
    let heartbeat = b"fleet,function=heartbeat event=\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let (status, lines) = decode(&["--fleet"], heartbeat);
    assert_eq!(status, 1);
    assert_eq!(lines.len(), 1);
}

#[test]
fn fleet_mode_abbreviates_ids_in_the_raw_fields_too_and_counts_uninterpretable_lines_as_bad() {
    let id = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
    let good = ccfleet::wire::encode_heartbeat(1, &[id]).unwrap();
    let (status, lines) = decode(&["--fleet"], &good);
    assert_eq!(status, 0);
    let printed = serde_json::to_string(&lines).unwrap();
    assert!(!printed.contains(id), "{printed}");
    assert_eq!(
        lines[0]["fields"][0]["value"]["string"],
        r#"{"instanceId":"3f1c…6b7c"}"#
    );
    let (_, shown) = decode(&["--fleet", "--show-ids"], &good);
    assert!(serde_json::to_string(&shown).unwrap().contains(id));

    // A heartbeat with a key the fleet does not know is refused: a bad line, id hidden.
    let unknown = format!(
        "fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{id}\\\",\\\"x\\\":1}}\" 1\n"
    );
    let (status, lines) = decode(&["--fleet"], unknown.as_bytes());
    assert_eq!(status, 1, "{lines:?}");
    assert!(lines[0]["fleet"]["heartbeat"]["error"].is_string());
    assert!(!serde_json::to_string(&lines).unwrap().contains(id));
    // Without --fleet the same line is plain, valid line protocol.
    let (status, _) = decode(&[], unknown.as_bytes());
    assert_eq!(status, 0);
}

#[test]
fn a_line_on_an_open_pipe_is_printed_before_the_input_ends() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::Duration;

    let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run ccfleet");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    // A string field with a raw newline arrives in two writes and is still one point.
    stdin.write_all(b"m v=1 5\nm s=\"a\n").unwrap();
    stdin.flush().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the first point is printed while standard input stays open");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["time"], 5);
    stdin.write_all(b"b\" 6\n").unwrap();
    stdin.flush().unwrap();
    let second = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let second: serde_json::Value = serde_json::from_str(&second).unwrap();
    assert_eq!(second["fields"][0]["value"]["string"], "a\nb");
    assert_eq!(second["time"], 6);
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert!(rx.recv().is_err(), "nothing more");
}

#[test]
fn output_to_a_closed_pipe_ends_quietly_with_status_zero() {
    use std::io::{BufRead, BufReader};

    let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ccfleet");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // Far more output than a pipe holds; the write fails once ccfleet is gone.
        let lines = b"cpu,host=node01 value=0.5,jobs=3i 1700000000000000000\n".repeat(200_000);
        let _ = stdin.write_all(&lines);
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"cpu\""));
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn on_a_pipe_a_string_with_bad_utf8_is_judged_once_it_is_whole() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::Duration;

    let mut child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .args(["decode", "--default-time", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run ccfleet");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    // The string opened on line 2 closes on line 3: everything up to the quote is inside
    // it, whatever arrives in between.
    stdin.write_all(b"m v=1 5\nm s=\"\xff\n").unwrap();
    stdin.flush().unwrap();
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(first.contains("\"time\":5"), "{first}");
    stdin.write_all(b"x y=1\" 6\nm v=1 7\n").unwrap();
    drop(stdin);
    let rest: Vec<serde_json::Value> = rx
        .iter()
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert_eq!(rest[0]["line"], 2);
    assert_eq!(rest[1]["time"], 7);
    assert_eq!(child.wait().unwrap().code(), Some(1));
}

#[test]
fn a_file_is_decoded_with_its_name_and_line_numbers_across_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capture.lp");
    // A string with a raw newline straddles the decoder's 64 KiB reads.
    let mut input = Vec::new();
    input.extend_from_slice(b"m v=1 1\n");
    input.extend_from_slice(b"s text=\"");
    input.extend(std::iter::repeat_n(b'x', 70_000));
    input.extend_from_slice(b"\nsecond half\" 2\n");
    input.extend_from_slice(b"not line protocol\n");
    input.extend_from_slice(b"m v=3 3\n");
    std::fs::write(&path, &input).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("decode")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a bad line is status 1");
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let shown = path.display().to_string();
    assert!(
        lines.iter().all(|l| l["file"] == shown.as_str()),
        "{lines:?}"
    );
    let text = lines[1]["fields"][0]["value"]["string"].as_str().unwrap();
    assert_eq!(text.len(), 70_000 + "\nsecond half".len());
    assert_eq!(lines[2]["line"], 4, "{:?}", lines[2]);
    assert_eq!(lines[3]["time"], 3);
}

/// Runs `ccfleet decode FILE` with its output discarded; returns the child's peak resident
/// memory in KiB (`ru_maxrss` of that child alone, from `wait4`).
#[cfg(target_os = "linux")]
// The child is reaped by `wait4` below, which also reports its peak memory.
#[allow(clippy::zombie_processes)]
fn decode_peak_kib(path: &std::path::Path) -> i64 {
    let child = Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .arg("decode")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not reaped yet (the `Child` never waits for it); both
    // pointers are to live locals.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    usage.ru_maxrss
}

#[cfg(target_os = "linux")]
#[test]
fn a_large_file_is_streamed_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let line = {
        let mut line = b"m,host=a s=\"".to_vec();
        line.extend(std::iter::repeat_n(b'y', 60_000));
        line.extend_from_slice(b"\" 1\n");
        line
    };
    let small = dir.path().join("small.lp");
    std::fs::write(&small, &line).unwrap();
    // 48 MiB: read whole, it would show in the peak at once.
    let big = dir.path().join("big.lp");
    {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        for _ in 0..(48 << 20) / line.len() {
            file.write_all(&line).unwrap();
        }
        file.flush().unwrap();
    }
    let baseline = decode_peak_kib(&small);
    let peak = decode_peak_kib(&big);
    assert!(
        peak < baseline + 16 * 1024,
        "decoding 48 MiB peaked at {peak} KiB against {baseline} KiB for one line"
    );
}
