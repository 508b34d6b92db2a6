//! `ccfleet decode`: line protocol in, one JSON object per point out, for operators who pipe
//! NATS captures (`nats sub --raw`) or files through it.

use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use ccfleet::lineproto::{Decoder, DecoderOptions, Line, Point, Precision};
use ccfleet::wire;
use serde_json::{Value, json};

/// Decode line protocol and print each point as JSON.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// Files to read; standard input when none is given (or for `-`).
    pub files: Vec<PathBuf>,
    /// Unit of the timestamps in the input: ns, us, ms or s.
    #[arg(long, default_value = "ns")]
    pub precision: Precision,
    /// Time (Unix nanoseconds) given to lines without a timestamp; default: now.
    #[arg(long, value_name = "NANOSECONDS", allow_hyphen_values = true)]
    pub default_time: Option<i64>,
    /// Longest accepted line in bytes.
    #[arg(long, default_value_t = ccfleet::lineproto::DEFAULT_MAX_LINE_LEN)]
    pub max_line_len: usize,
    /// Also interpret fleet heartbeats (instance ids) and discovery rosters (providers).
    #[arg(long)]
    pub fleet: bool,
    /// With --fleet, print instance ids in full instead of abbreviated (they are credentials).
    #[arg(long, requires = "fleet")]
    pub show_ids: bool,
}

/// Decodes every input; returns whether any line was bad.
pub fn run(args: DecodeArgs) -> anyhow::Result<bool> {
    let options = DecoderOptions {
        precision: args.precision,
        default_time: Some(args.default_time.unwrap_or_else(wire::now_ns)),
        max_line_len: args.max_line_len,
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut any_bad = false;
    let stdin_only = [PathBuf::from("-")];
    let files = if args.files.is_empty() {
        &stdin_only[..]
    } else {
        &args.files[..]
    };
    for path in files {
        let (name, data) = read_input(path)?;
        any_bad |= decode_one(&data, name.as_deref(), options, &args, &mut out)?;
    }
    out.flush().context("writing to standard output")?;
    Ok(any_bad)
}

fn read_input(path: &PathBuf) -> anyhow::Result<(Option<String>, Vec<u8>)> {
    let mut data = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .read_to_end(&mut data)
            .context("reading standard input")?;
        Ok((None, data))
    } else {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Ok((Some(path.display().to_string()), data))
    }
}

fn decode_one(
    data: &[u8],
    file: Option<&str>,
    options: DecoderOptions,
    args: &DecodeArgs,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut any_bad = false;
    for line in Decoder::with_options(data, options) {
        let mut object = match line {
            Ok(line) => {
                let mut object = Point::from_line(&line).to_json();
                if args.fleet
                    && let Some(fleet) = interpret_fleet(&line, args.show_ids)
                {
                    object["fleet"] = fleet;
                }
                object
            }
            Err(e) => {
                any_bad = true;
                json!({ "line": e.line, "error": e.to_string() })
            }
        };
        if let Some(file) = file {
            object["file"] = Value::from(file);
        }
        serde_json::to_writer(&mut *out, &object).context("writing to standard output")?;
        out.write_all(b"\n").context("writing to standard output")?;
    }
    Ok(any_bad)
}

/// What the fleet makes of a heartbeat or roster line; `None` for other measurements.
fn interpret_fleet(line: &Line<'_>, show_ids: bool) -> Option<Value> {
    let measurement = line.measurement();
    if measurement.eq_unescaped(wire::HEARTBEAT_MEASUREMENT) {
        let result = match wire::parse_heartbeat(line) {
            Ok(id) => json!({ "heartbeat": { "instanceId": display_id(&id, show_ids) } }),
            Err(e) => json!({ "heartbeat": { "error": e.to_string() } }),
        };
        return Some(result);
    }
    if measurement.eq_unescaped(wire::DISCOVERY_MEASUREMENT) {
        let bucket = line.tag("cluster").map(|t| t.unescape().into_owned());
        let consumer = line.tag("type").map(|t| t.unescape().into_owned());
        let roster = match wire::decode_roster(line.raw().as_bytes()) {
            Ok(providers) => {
                json!({ "bucket": bucket, "consumer": consumer, "providers": providers })
            }
            Err(e) => json!({ "bucket": bucket, "consumer": consumer, "error": e.to_string() }),
        };
        return Some(json!({ "roster": roster }));
    }
    None
}

/// Instance ids are bearer credentials: shown abbreviated unless the operator asks.
fn display_id(id: &str, show: bool) -> String {
    if show || id.chars().count() <= 8 {
        return id.to_owned();
    }
    let head: String = id.chars().take(4).collect();
    let tail: String = id
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{head}…{tail}")
}
