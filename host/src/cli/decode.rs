//! `ccfleet decode`: line protocol in, one JSON object per point out, for operators who pipe
//! NATS captures (`nats sub --raw`) or files through it.
//!
//! Files and standard input are decoded as they are read, a line at a time, and each point
//! is printed as soon as the input has no more bytes ready, so a live subscription shows
//! its messages and a file of any size needs the memory of its longest line only. Points
//! are written to the output token by token, so memory stays in proportion to the longest
//! line however many fields it has.

use std::borrow::Cow;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use ccfleet::lineproto::{DecodeError, Decoder, DecoderOptions, FieldValue, Line, Precision};
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
    /// Also interpret fleet heartbeats (instance ids) and discovery rosters (providers); a
    /// line the fleet cannot interpret counts as bad. Instance ids are abbreviated
    /// everywhere in the output, the raw fields included.
    #[arg(long)]
    pub fleet: bool,
    /// With --fleet, print instance ids in full instead of abbreviated (they are credentials).
    #[arg(long, requires = "fleet")]
    pub show_ids: bool,
}

/// Decodes every input; returns whether any line was bad. Output to a reader that went away
/// (`| head`) ends the command quietly.
pub fn run(args: DecodeArgs) -> anyhow::Result<bool> {
    let options = DecoderOptions {
        precision: args.precision,
        default_time: Some(args.default_time.unwrap_or_else(wire::now_ns)),
        max_line_len: args.max_line_len,
    };
    let stdout = io::stdout();
    let mut printer = Printer::new(BufWriter::new(stdout.lock()), &args);
    match decode_all(&args, options, &mut printer) {
        Err(e) if is_broken_pipe(&e) => Ok(false),
        Err(e) => Err(e),
        Ok(()) => Ok(printer.any_bad),
    }
}

fn decode_all(
    args: &DecodeArgs,
    options: DecoderOptions,
    printer: &mut Printer<'_, impl Write>,
) -> anyhow::Result<()> {
    let stdin_only = [PathBuf::from("-")];
    let files = if args.files.is_empty() {
        &stdin_only[..]
    } else {
        &args.files[..]
    };
    for path in files {
        // Reads of this size bypass the lock's own buffer, so `buffer()` tells whether
        // input is waiting.
        if path.as_os_str() == "-" {
            let input = io::BufReader::with_capacity(INPUT_BUFFER, io::stdin().lock());
            decode_stream(input, None, options, printer)?;
        } else {
            let shown = path.display().to_string();
            let file = std::fs::File::open(path).with_context(|| format!("reading {shown}"))?;
            let input = io::BufReader::with_capacity(INPUT_BUFFER, file);
            decode_stream(input, Some(&shown), options, printer)?;
        }
    }
    printer.out.flush().context("writing to standard output")?;
    Ok(())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Bytes read from the input at a time.
const INPUT_BUFFER: usize = 64 << 10;

/// Decodes input as it arrives, line by line, holding no more than the line being decoded
/// (files as well as pipes: a 1 GB capture costs the memory of its longest line). A string
/// field may hold raw newlines, so a line whose string is still open waits for more input
/// (up to the line limit) before it is judged. `file` names the input in the output.
fn decode_stream(
    mut input: io::BufReader<impl io::Read>,
    file: Option<&str>,
    options: DecoderOptions,
    printer: &mut Printer<'_, impl Write>,
) -> anyhow::Result<()> {
    let reading = || match file {
        Some(name) => format!("reading {name}"),
        None => "reading standard input".to_owned(),
    };
    let mut pending = Vec::new();
    let mut line_no = 1;
    // While an entry waits for its string to close, the bytes it held when last tried.
    let mut waiting = None;
    loop {
        let before = pending.len();
        let read = input
            .read_until(b'\n', &mut pending)
            .with_context(reading)?;
        let at_end = read == 0;
        if let Some(tried) = waiting
            && !at_end
            && !may_close_a_string(&pending[before..])
            && pending.len() < 2 * tried
        {
            // Nothing new can end the wait; trying again on every line of a long string
            // would cost time quadratic in its length.
            if input.buffer().is_empty() {
                printer.out.flush().context("writing to standard output")?;
            }
            continue;
        }
        waiting = None;
        let mut decoder = Decoder::resume_at(&pending, 0, line_no, options);
        let consumed = loop {
            let (start, start_line) = (decoder.position(), decoder.line_number());
            match decoder.next() {
                None => {
                    line_no = decoder.line_number();
                    break pending.len();
                }
                Some(Err(_))
                    if !at_end
                        && pending.len() - start <= options.max_line_len
                        && needs_more_input(&pending[start..], start_line, options) =>
                {
                    line_no = start_line;
                    waiting = Some(pending.len() - start);
                    break start;
                }
                Some(item) => printer
                    .print(item, file)
                    .context("writing to standard output")?,
            }
        };
        pending.drain(..consumed);
        if at_end {
            return Ok(());
        }
        if input.buffer().is_empty() {
            // Nothing more is waiting: show what there is before blocking on the pipe.
            printer.out.flush().context("writing to standard output")?;
        }
    }
}

/// Whether a line read while a string is open may close it: it holds a quote after an even
/// run of backslashes (a line starts outside any escape, as the newline before it took the
/// place of an escaped byte).
fn may_close_a_string(line: &[u8]) -> bool {
    let mut backslashes = 0;
    for &b in line {
        match b {
            b'"' if backslashes % 2 == 0 => return true,
            b'\\' => backslashes += 1,
            _ => backslashes = 0,
        }
    }
    false
}

/// Whether the failed entry at the start of `rest` was judged on input that has not arrived:
/// a string still open at its end (unclosed, or with bad UTF-8 that is only reported once
/// the string is whole). Decoding it again with a closing quote and a newline appended then
/// reads into those bytes.
fn needs_more_input(rest: &[u8], line_no: usize, options: DecoderOptions) -> bool {
    let mut extended = Vec::with_capacity(rest.len() + 2);
    extended.extend_from_slice(rest);
    extended.extend_from_slice(b"\"\n");
    let mut decoder = Decoder::resume_at(&extended, 0, line_no, options);
    decoder.next();
    decoder.position() > rest.len()
}

/// Writes points and errors as JSON objects, one a line, straight from the decoded tokens.
struct Printer<'a, W: Write> {
    out: W,
    args: &'a DecodeArgs,
    scratch: String,
    any_bad: bool,
}

impl<'a, W: Write> Printer<'a, W> {
    fn new(out: W, args: &'a DecodeArgs) -> Self {
        Printer {
            out,
            args,
            scratch: String::new(),
            any_bad: false,
        }
    }

    fn print(&mut self, item: Result<Line<'_>, DecodeError>, file: Option<&str>) -> io::Result<()> {
        match item {
            Ok(line) => self.print_point(&line, file),
            Err(e) => {
                self.any_bad = true;
                let mut object = json!({ "line": e.line, "error": e.to_string() });
                if let Some(file) = file {
                    object["file"] = Value::from(file);
                }
                serde_json::to_writer(&mut self.out, &object)?;
                self.out.write_all(b"\n")
            }
        }
    }

    /// `{"fields":[...],"file":...,"fleet":...,"name":...,"tags":[...],"time":...}`: the
    /// corpus shape, keys in the order earlier versions printed them.
    fn print_point(&mut self, line: &Line<'_>, file: Option<&str>) -> io::Result<()> {
        let fleet = self
            .args
            .fleet
            .then(|| interpret_fleet(line, self.args.show_ids))
            .flatten();
        if fleet.as_ref().is_some_and(|f| f.bad) {
            self.any_bad = true;
        }
        let hide = fleet.as_ref().and_then(|f| f.hide.as_ref());
        let out = &mut self.out;
        out.write_all(b"{\"fields\":[")?;
        for (i, (key, value)) in line.fields().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(b"{\"key\":")?;
            write_str(out, key.unescape_with(&mut self.scratch))?;
            out.write_all(b",\"value\":{")?;
            match value {
                FieldValue::Float(v) => write_tagged(out, "float", &v)?,
                FieldValue::Int(v) => write_tagged(out, "int", &v)?,
                FieldValue::Uint(v) => write_tagged(out, "uint", &v)?,
                FieldValue::Bool(v) => write_tagged(out, "bool", &v)?,
                FieldValue::String(token) => {
                    let text = token.unescape_with(&mut self.scratch);
                    write_tagged(out, "string", &*hidden(text, hide))?;
                }
            }
            out.write_all(b"}}")?;
        }
        out.write_all(b"]")?;
        if let Some(file) = file {
            out.write_all(b",\"file\":")?;
            write_str(out, file)?;
        }
        if let Some(fleet) = &fleet {
            out.write_all(b",\"fleet\":")?;
            serde_json::to_writer(&mut *out, &fleet.value)?;
        }
        out.write_all(b",\"name\":")?;
        write_str(out, line.measurement().unescape_with(&mut self.scratch))?;
        out.write_all(b",\"tags\":[")?;
        for (i, (key, value)) in line.tags().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(b"{\"key\":")?;
            write_str(out, key.unescape_with(&mut self.scratch))?;
            out.write_all(b",\"value\":")?;
            write_str(out, value.unescape_with(&mut self.scratch))?;
            out.write_all(b"}")?;
        }
        out.write_all(b"],\"time\":")?;
        serde_json::to_writer(&mut *out, &line.time_or_default())?;
        out.write_all(b"}\n")
    }
}

fn write_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::from)
}

/// `"tag":value`.
fn write_tagged<T: serde::Serialize + ?Sized>(
    out: &mut impl Write,
    tag: &str,
    value: &T,
) -> io::Result<()> {
    write_str(out, tag)?;
    out.write_all(b":")?;
    serde_json::to_writer(out, value).map_err(io::Error::from)
}

/// `text` with an instance id replaced by its abbreviation, as it stands and JSON-escaped.
fn hidden<'t>(text: &'t str, hide: Option<&Hide>) -> Cow<'t, str> {
    match hide {
        Some(hide) if text.contains(&hide.id) || text.contains(&hide.json) => Cow::Owned(
            text.replace(&hide.id, &hide.shown)
                .replace(&hide.json, &hide.shown),
        ),
        _ => Cow::Borrowed(text),
    }
}

/// What the fleet makes of a line.
struct Fleet {
    value: Value,
    /// The fleet could not interpret the line.
    bad: bool,
    /// An instance id to abbreviate wherever it appears.
    hide: Option<Hide>,
}

struct Hide {
    id: String,
    json: String,
    shown: String,
}

impl Hide {
    fn new(id: &str, show: bool) -> Option<Hide> {
        let shown = display_id(id, show);
        if shown == id {
            return None;
        }
        let quoted = serde_json::to_string(id).ok()?;
        Some(Hide {
            id: id.to_owned(),
            json: quoted[1..quoted.len() - 1].to_owned(),
            shown,
        })
    }
}

/// What the fleet makes of a heartbeat or roster line; `None` for other measurements.
fn interpret_fleet(line: &Line<'_>, show_ids: bool) -> Option<Fleet> {
    let measurement = line.measurement();
    if measurement.eq_unescaped(wire::HEARTBEAT_MEASUREMENT) {
        return Some(match wire::parse_heartbeat(line) {
            Ok(id) => Fleet {
                value: json!({ "heartbeat": { "instanceId": display_id(&id, show_ids) } }),
                bad: false,
                hide: Hide::new(&id, show_ids),
            },
            Err(e) => Fleet {
                value: json!({ "heartbeat": { "error": e.to_string() } }),
                bad: true,
                // A payload the fleet refuses may still carry an id.
                hide: loose_instance_id(line).and_then(|id| Hide::new(&id, show_ids)),
            },
        });
    }
    if measurement.eq_unescaped(wire::DISCOVERY_MEASUREMENT) {
        let bucket = line.tag("cluster").map(|t| t.unescape().into_owned());
        let consumer = line.tag("type").map(|t| t.unescape().into_owned());
        let (roster, bad) = match wire::decode_roster(line.raw().as_bytes()) {
            Ok(providers) => (
                json!({ "bucket": bucket, "consumer": consumer, "providers": providers }),
                false,
            ),
            Err(e) => (
                json!({ "bucket": bucket, "consumer": consumer, "error": e.to_string() }),
                true,
            ),
        };
        return Some(Fleet {
            value: json!({ "roster": roster }),
            bad,
            hide: None,
        });
    }
    None
}

/// The `instanceId` of any JSON object in the line's `event` field.
fn loose_instance_id(line: &Line<'_>) -> Option<String> {
    let (_, event) = line
        .fields()
        .filter(|(k, _)| k.eq_unescaped("event"))
        .last()?;
    let event = event.as_str_token()?.unescape();
    let payload: Value = serde_json::from_str(&event).ok()?;
    payload.get("instanceId")?.as_str().map(str::to_owned)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicIsize, Ordering};

    /// Counts the bytes live on threads that asked to be watched, and their peak.
    struct Watching;

    // Signed: memory allocated before watching may be freed while watched.
    static LIVE: AtomicIsize = AtomicIsize::new(0);
    static PEAK: AtomicIsize = AtomicIsize::new(0);
    thread_local! {
        static WATCHED: Cell<bool> = const { Cell::new(false) };
    }

    fn watched() -> bool {
        WATCHED.try_with(Cell::get).unwrap_or(false)
    }

    // SAFETY: every call is passed to the system allocator unchanged; only counters move.
    unsafe impl GlobalAlloc for Watching {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if watched() {
                let size = layout.size() as isize;
                let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
                PEAK.fetch_max(live, Ordering::Relaxed);
            }
            // SAFETY: the caller's layout is passed on as is.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if watched() {
                LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
            }
            // SAFETY: `ptr` came from `System.alloc` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Watching = Watching;

    fn args(fleet: bool) -> DecodeArgs {
        DecodeArgs {
            files: Vec::new(),
            precision: Precision::Nanosecond,
            default_time: Some(0),
            max_line_len: 1 << 20,
            fleet,
            show_ids: false,
        }
    }

    #[test]
    fn printing_a_line_with_many_fields_keeps_memory_bounded() {
        // 20,000 fields in a 200 KB line: printing once kept a JSON tree of ~3 KB a field.
        let mut input = String::from("m ");
        for i in 0..20_000 {
            input.push_str(&format!("f{i}=\"v\\\\{i}\","));
        }
        input.pop();
        let line = Decoder::new(input.as_bytes()).next().unwrap().unwrap();
        let args = args(true);
        let mut printer = Printer::new(BufWriter::new(io::sink()), &args);
        WATCHED.with(|w| w.set(true));
        printer.print(Ok(line), Some("file")).unwrap();
        WATCHED.with(|w| w.set(false));
        let peak = PEAK.load(Ordering::Relaxed);
        assert!(peak < 64 << 10, "printing peaked at {peak} bytes");
    }

    #[test]
    fn only_a_quote_after_an_even_run_of_backslashes_may_close_a_waiting_string() {
        assert!(may_close_a_string(b"abc\" 1\n"));
        assert!(may_close_a_string(b"\\\\\" 1\n"));
        assert!(!may_close_a_string(b"a\\\"b\n"));
        assert!(!may_close_a_string(b"a\\\\\\\"b\n"));
        assert!(!may_close_a_string(b"plain\n"));
    }

    #[test]
    fn printed_points_are_the_corpus_json_shape() {
        let args = args(false);
        let mut printer = Printer::new(Vec::new(), &args);
        let input = b"m,t=a\\ b f=1.5,i=-2i,u=3u,b=t,s=\"x\\\"y\" 7\n";
        let line = Decoder::new(input).next().unwrap().unwrap();
        printer.print(Ok(line), Some("in.lp")).unwrap();
        let printed: Value = serde_json::from_slice(&printer.out).unwrap();
        assert_eq!(
            printed,
            json!({
                "name": "m",
                "tags": [{"key": "t", "value": "a b"}],
                "fields": [
                    {"key": "f", "value": {"float": 1.5}},
                    {"key": "i", "value": {"int": -2}},
                    {"key": "u", "value": {"uint": 3}},
                    {"key": "b", "value": {"bool": true}},
                    {"key": "s", "value": {"string": "x\"y"}},
                ],
                "time": 7,
                "file": "in.lp",
            })
        );
    }
}
