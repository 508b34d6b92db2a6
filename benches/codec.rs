//! Codec benchmarks: ccfleet's decoder against the crates.io `influxdb-line-protocol` crate
//! (the InfluxDB IOx parser) on the same inputs in the same run, plus the fleet wire paths.
//!
//! Run with `cargo bench -p ccfleet --bench codec`. Each benchmark reports lines/s and bytes/s.
//!
//! With `CODEC_PEER=<command>` it instead runs a side-by-side comparison with another
//! decoder: the inputs are written to files, and in each of `CODEC_ROUNDS` (default 15)
//! interleaved rounds ccfleet decodes every file `CODEC_PASSES` (default 20) times in-process
//! and then `<command> <passes> <file>...` is run, which must decode each file the same
//! number of times (reading every token: measurement, tags, typed field values with strings
//! unescaped, time) and print `<file> <best nanoseconds of one pass>` per file. The table
//! gives the minimum and median over rounds of each side's best pass, per line.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use ccfleet::lineproto::{Decoder, FieldValue};
use ccfleet::wire::{self, Provider, ServiceType};
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, measurement::WallTime};

const T: i64 = 1_734_000_000_000_000_000;

struct Input {
    name: &'static str,
    text: String,
    lines: u64,
}

fn instance_id(i: u64) -> String {
    format!(
        "{:016x}{:016x}",
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        i ^ 0x5bd1_e995
    )
}

fn heartbeats(n: u64) -> Input {
    let mut out = Vec::new();
    for i in 0..n {
        out.extend(wire::encode_heartbeat(T + i as i64, &[&instance_id(i)]).unwrap());
    }
    Input {
        name: "heartbeat",
        text: String::from_utf8(out).unwrap(),
        lines: n,
    }
}

fn providers(n: usize) -> Vec<Provider> {
    (0..n)
        .map(|i| Provider {
            service_type: ServiceType::MetricStore.into(),
            hostname: format!("node{i:04}.cluster.example.org"),
            state: "active".into(),
            meta: BTreeMap::from([
                ("port".to_owned(), "8080".to_owned()),
                ("version".to_owned(), "1.4.0".to_owned()),
            ]),
        })
        .collect()
}

fn rosters(n: u64) -> Input {
    let list = providers(16);
    let mut out = Vec::new();
    for i in 0..n {
        out.extend(
            wire::encode_roster("fritz", ServiceType::MetricCollector, &list, T + i as i64)
                .unwrap(),
        );
    }
    Input {
        name: "roster",
        text: String::from_utf8(out).unwrap(),
        lines: n,
    }
}

fn metrics(n: u64) -> Input {
    let names = ["load_one", "cpu_user", "mem_used", "flops_any", "net_bw"];
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "{},cluster=fritz,hostname=f{:04},type=node value={}.{} {}\n",
            names[i as usize % names.len()],
            i % 1000,
            i % 97,
            i % 1000,
            1_734_000_000 + i
        ));
    }
    Input {
        name: "metric",
        text,
        lines: n,
    }
}

fn long_strings(n: u64) -> Input {
    let line = format!(
        "name,tag1=baz,tag2=asdfvdfsvdsvdfs,tagvdsvd=hello field=\"{}\" 1602841605822791506\n",
        "a".repeat(4500)
    );
    Input {
        name: "long-string",
        text: line.repeat(n as usize),
        lines: n,
    }
}

fn long_escaped_strings(n: u64) -> Input {
    let line = format!(
        "name,ta\\=g1=foo\\ bar\\,baz,tag2=asdfvdfsvdsvdfs,tag\\=vdsvd=hello field=\"{}\" 1602841605822791506\n",
        "\\\"".repeat(4500)
    );
    Input {
        name: "long-escaped-string",
        text: line.repeat(n as usize),
        lines: n,
    }
}

fn many_fields(n: u64) -> Input {
    let mut line = String::from("procstat,exe=bash,process_name=bash ");
    for i in 0..52 {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&format!("field_number_{i}={}i", i * 7919));
    }
    line.push_str(" 1602841605822791506\n");
    Input {
        name: "many-fields",
        text: line.repeat(n as usize),
        lines: n,
    }
}

fn short_lines(n: u64) -> Input {
    Input {
        name: "go-many-short-lines",
        text: "x,t=y y=1 1602841605822791506\n".repeat(n as usize),
        lines: n,
    }
}

/// Reads every token of every line; `unescape` says whether tokens are unescaped (into a
/// reused buffer, as the Go decoder does) or read as views (the zero-copy path).
fn ccfleet_read(text: &[u8], unescape: bool) -> usize {
    let mut scratch = String::new();
    let mut len = |t: ccfleet::lineproto::Token<'_>| {
        if unescape {
            t.unescape_with(&mut scratch).len()
        } else {
            t.raw().len()
        }
    };
    let mut sum = 0;
    for line in Decoder::new(text) {
        let line = line.expect("valid input");
        sum += len(line.measurement());
        for (k, v) in line.tags() {
            sum += len(k) + len(v);
        }
        for (k, v) in line.fields() {
            sum += len(k);
            sum += match v {
                FieldValue::String(s) => len(s),
                FieldValue::Float(f) => f as usize,
                FieldValue::Int(i) => i as usize,
                FieldValue::Uint(u) => u as usize,
                FieldValue::Bool(b) => b as usize,
            };
        }
        sum += line.time().unwrap_or_default() as usize;
    }
    sum
}

fn iox_decode(text: &str) -> usize {
    use influxdb_line_protocol::FieldValue as F;
    let mut sum = 0;
    for line in influxdb_line_protocol::parse_lines(text) {
        let line = line.expect("valid input");
        sum += line.series.measurement.len();
        if let Some(tags) = &line.series.tag_set {
            for (k, v) in tags {
                sum += k.len() + v.len();
            }
        }
        for (k, v) in &line.field_set {
            sum += k.len();
            sum += match v {
                F::String(s) => s.len(),
                F::F64(f) => *f as usize,
                F::I64(i) => *i as usize,
                F::U64(u) => *u as usize,
                F::Boolean(b) => *b as usize,
            };
        }
        sum += line.timestamp.unwrap_or_default() as usize;
    }
    sum
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>, input: &Input) {
    group.throughput(Throughput::ElementsAndBytes {
        elements: input.lines,
        bytes: input.text.len() as u64,
    });
}

fn decode(c: &mut Criterion) {
    for input in [
        heartbeats(10_000),
        rosters(1_000),
        metrics(10_000),
        long_strings(500),
        short_lines(10_000),
        many_fields(1_000),
    ] {
        assert_eq!(
            ccfleet_read(input.text.as_bytes(), true),
            iox_decode(&input.text),
            "{}",
            input.name
        );
        let mut group = c.benchmark_group(format!("decode/{}", input.name));
        configure(&mut group, &input);
        group.bench_function("ccfleet", |b| {
            b.iter(|| ccfleet_read(black_box(input.text.as_bytes()), true))
        });
        group.bench_function("ccfleet-views", |b| {
            b.iter(|| ccfleet_read(black_box(input.text.as_bytes()), false))
        });
        group.bench_function("influxdb-line-protocol", |b| {
            b.iter(|| iox_decode(black_box(&input.text)))
        });
        group.finish();
    }
}

/// Unescaping a roster's payload (a string field whose every JSON quote is escaped), with
/// each implementation this CPU runs.
fn unescape(c: &mut Criterion) {
    let roster = rosters(1);
    let line = Decoder::new(roster.text.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    let payload = line
        .fields()
        .find_map(|(_, v)| v.as_str_token())
        .expect("a roster has a string field");
    let mut group = c.benchmark_group("unescape/roster-payload");
    group.throughput(Throughput::Bytes(payload.raw().len() as u64));
    let mut out = String::new();
    for (name, implementation) in ccfleet::lineproto::unescape_implementations() {
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                implementation(black_box(payload.raw()), payload.kind(), &mut out);
                out.len()
            })
        });
    }
    group.finish();
}

fn fleet(c: &mut Criterion) {
    let beats = heartbeats(10_000);
    let mut group = c.benchmark_group("decode_heartbeats");
    configure(&mut group, &beats);
    group.bench_function("scan_heartbeats", |b| {
        b.iter(|| {
            let mut accepted = 0usize;
            wire::scan_heartbeats(black_box(beats.text.as_bytes()), |line| {
                if let wire::HeartbeatLine::Accepted(id) = line {
                    accepted += id.len();
                }
            })
            .unwrap();
            accepted
        })
    });
    group.bench_function("decode_heartbeats", |b| {
        b.iter(|| wire::decode_heartbeats(black_box(beats.text.as_bytes())).unwrap())
    });
    group.finish();

    let roster = rosters(1);
    let mut group = c.benchmark_group("decode_roster");
    configure(&mut group, &roster);
    group.bench_function("16-providers", |b| {
        b.iter(|| wire::decode_roster(black_box(roster.text.as_bytes())).unwrap())
    });
    group.finish();

    let ids: Vec<String> = (0..1_000).map(instance_id).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let encoded = wire::encode_heartbeat(T, &refs).unwrap();
    let mut group = c.benchmark_group("encode_heartbeat");
    group.throughput(Throughput::ElementsAndBytes {
        elements: 1_000,
        bytes: encoded.len() as u64,
    });
    let mut buf = Vec::with_capacity(encoded.len());
    group.bench_function("1000-ids", |b| {
        b.iter(|| {
            buf.clear();
            wire::encode_heartbeat_into(&mut buf, T, black_box(&refs)).unwrap();
            buf.len()
        })
    });
    group.finish();

    let list = providers(16);
    let one = wire::encode_roster("fritz", ServiceType::MetricCollector, &list, T).unwrap();
    let mut group = c.benchmark_group("encode_roster");
    group.throughput(Throughput::ElementsAndBytes {
        elements: 1,
        bytes: one.len() as u64,
    });
    group.bench_function("16-providers", |b| {
        b.iter(|| {
            wire::encode_roster("fritz", ServiceType::MetricCollector, black_box(&list), T).unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = decode, unescape, fleet
}

fn main() {
    if let Ok(peer) = std::env::var("CODEC_PEER") {
        side_by_side(&peer);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect(name))
}

/// The best of `passes` timed runs of `f`, in nanoseconds.
fn best_of(passes: usize, mut f: impl FnMut() -> usize) -> u128 {
    (0..passes)
        .map(|_| {
            let start = std::time::Instant::now();
            black_box(f());
            start.elapsed().as_nanos()
        })
        .min()
        .unwrap()
}

fn min_and_median(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[0], values[values.len() / 2])
}

/// Interleaved rounds of ccfleet and a peer decoder on the same files; see the module docs.
fn side_by_side(peer: &str) {
    let rounds = env_number("CODEC_ROUNDS", 15);
    let passes = env_number("CODEC_PASSES", 20);
    let inputs = [
        heartbeats(10_000),
        rosters(1_000),
        metrics(10_000),
        short_lines(10_000),
        many_fields(1_000),
        long_strings(500),
        long_escaped_strings(200),
    ];
    // `CODEC_ONLY=heartbeat,metric` keeps only those inputs (for profiling one class);
    // the heartbeat and roster inputs are always built, the scan and unescape figures
    // need them.
    let only = std::env::var("CODEC_ONLY").ok();
    let keep: Vec<bool> = inputs
        .iter()
        .map(|input| {
            only.as_deref()
                .is_none_or(|only| only.split(',').any(|name| name == input.name))
        })
        .collect();
    let dir = tempfile::tempdir().expect("temporary directory");
    let files: Vec<String> = inputs
        .iter()
        .map(|input| {
            let path = dir.path().join(format!("{}.lp", input.name));
            std::fs::write(&path, &input.text).expect("write input");
            path.display().to_string()
        })
        .collect();
    let mut ours = vec![Vec::new(); inputs.len()];
    let mut theirs = vec![Vec::new(); inputs.len()];
    let mut scan = Vec::new();
    let beats = &inputs[0];
    // Unescaping a roster's payload alone, with the implementation decoding uses.
    let roster_line = Decoder::new(inputs[1].text.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    let payload = roster_line
        .fields()
        .find_map(|(_, v)| v.as_str_token())
        .expect("a roster has a string field");
    let mut unescape_ns = Vec::new();
    let mut out = String::new();
    for _ in 0..rounds {
        for (i, input) in inputs.iter().enumerate().filter(|&(i, _)| keep[i]) {
            let ns = best_of(passes, || ccfleet_read(input.text.as_bytes(), true));
            ours[i].push(ns as f64 / input.lines as f64);
        }
        let ns = best_of(passes, || {
            let mut accepted = 0usize;
            wire::scan_heartbeats(beats.text.as_bytes(), |line| {
                if let wire::HeartbeatLine::Accepted(id) = line {
                    accepted += id.len();
                }
            })
            .unwrap();
            accepted
        });
        scan.push(ns as f64 / beats.lines as f64);
        // 100 unescapes per timed pass: one takes about a microsecond.
        let ns = best_of(passes, || {
            for _ in 0..100 {
                black_box(payload.unescape_with(black_box(&mut out)));
            }
            out.len()
        });
        unescape_ns.push(ns as f64 / 100.0);
        let output = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{peer} \"$@\""))
            .arg("peer")
            .arg(passes.to_string())
            .args(files.iter().zip(&keep).filter(|&(_, &k)| k).map(|(f, _)| f))
            .output()
            .expect("run the peer");
        assert!(output.status.success(), "peer failed: {output:?}");
        let text = String::from_utf8(output.stdout).expect("peer output");
        for line in text.lines() {
            let (file, ns) = line.rsplit_once(' ').expect("<file> <ns>");
            let i = files
                .iter()
                .position(|f| f == file)
                .expect("a file of ours");
            let ns: f64 = ns.trim().parse().expect("nanoseconds");
            theirs[i].push(ns / inputs[i].lines as f64);
        }
    }
    println!(
        "| input | bytes/line | ccfleet ns/line min / median | peer ns/line min / median | speed-up (min / median) | ccfleet MB/s (median) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (i, input) in inputs.iter().enumerate().filter(|&(i, _)| keep[i]) {
        let per_line = input.text.len() as f64 / input.lines as f64;
        let (our_min, our_med) = min_and_median(&mut ours[i]);
        let (their_min, their_med) = min_and_median(&mut theirs[i]);
        println!(
            "| {} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2}x / {:.2}x | {:.0} |",
            input.name,
            per_line,
            our_min,
            our_med,
            their_min,
            their_med,
            their_min / our_min,
            their_med / our_med,
            per_line / our_med * 1000.0
        );
    }
    let (scan_min, scan_med) = min_and_median(&mut scan);
    println!(
        "\nscan_heartbeats: {scan_min:.1} / {scan_med:.1} ns per heartbeat line (min / median)"
    );
    let (ns_min, ns_med) = min_and_median(&mut unescape_ns);
    let bytes = payload.raw().len() as f64;
    println!(
        "unescape, roster payload ({bytes} bytes): {:.2} / {:.2} GB/s (best / median)",
        bytes / ns_min,
        bytes / ns_med
    );
}
