//! A registration storm through the real HTTP API into a SQLite registry file: how many
//! registrations per second the server acknowledges, their latency (p50, p99, max), the
//! bytes this process wrote to storage per registration (`write_bytes` of `/proc/self/io`,
//! which includes the WAL checkpoints), how large the write-ahead log grows (sampled every
//! 10 ms while the storm runs), and the resident memory a server needs per registered
//! instance.
//!
//! ```text
//! cargo bench -p ccfleet --bench registration_storm --features server,client
//! STORM_REGISTRATIONS=100000 STORM_CONCURRENCY=512 cargo bench -p ccfleet --bench registration_storm --features server,client
//! STORM_NAMES=random cargo bench -p ccfleet --bench registration_storm --features server,client
//! ```
//!
//! The load generator is a minimal HTTP/1.1 client on keep-alive connections, one request
//! in flight per connection (as each agent does), so that the server, not the client, is
//! what the figures measure: it writes each request from reused buffers and checks each
//! answer by its status line, `content-length` and a 32-hex-digit `instanceId`, without a
//! JSON parser. It shares the process (and the machine's cores) with the server but runs
//! on a runtime of its own (threads `storm-client`; the server's are `fleet-server`), so
//! the CPU time each side used is reported apart (`/proc/self/task/*/schedstat`). Every
//! request carries an Ed25519 token (the same one, as a fleet's agents do) unless
//! `STORM_AUTH=off`.
//!
//! Rust code allocates with mimalloc, as the `ccfleet` binary does
//! (`STORM_ALLOCATOR=system`: with the C library's malloc instead).
//!
//! Host names are sequential (`n0000000`, `n0000001`, ...) unless `STORM_NAMES=random`.
//! `STORM_DIR` puts the database in a given directory (default: a temporary one). Every
//! registration must answer 201 with an instance id and be a row afterwards; the run fails
//! otherwise.
//!
//! Memory: after the storm the bench starts itself again as a separate process that only
//! opens the registry file (loading every row into the in-memory index, as a server does at
//! start) and reports its resident memory (`VmRSS`) before and after, per instance.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::ServerConfig;
use ccfleet::server::auth::Keypair;
use ccfleet::server::registry::{JOURNAL_SIZE_LIMIT, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Set in the environment of the child process that measures the registry's memory.
const RSS_CHILD: &str = "STORM_RSS_CHILD_DB";

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a positive integer")),
        Err(_) => default,
    }
}

/// A field of `/proc/self/<file>` in the units the kernel gives (Linux; 0 elsewhere).
fn proc_self(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/self/{file}"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Bytes this process caused to be written to storage so far.
fn written_bytes() -> u64 {
    proc_self("io", "write_bytes:")
}

/// Resident memory of this process, bytes.
fn resident_bytes() -> u64 {
    proc_self("status", "VmRSS:") * 1024
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn main() {
    if let Some(db) = std::env::var_os(RSS_CHILD) {
        resident_child(Path::new(&db));
        return;
    }
    let total = env_usize("STORM_REGISTRATIONS", 20_000);
    let random = match std::env::var("STORM_NAMES").as_deref() {
        Ok("random") => true,
        Ok("sequential") | Err(_) => false,
        Ok(other) => panic!("STORM_NAMES={other:?}: use sequential or random"),
    };
    let auth = match std::env::var("STORM_AUTH").as_deref() {
        Ok("on") | Err(_) => true,
        Ok("off") => false,
        Ok(other) => panic!("STORM_AUTH={other:?}: use on or off"),
    };
    let concurrency = env_usize("STORM_CONCURRENCY", 512).max(1);
    let threads = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(name)
            .build()
            .expect("tokio runtime")
    };
    storm(
        &threads(SERVER_THREADS),
        &threads(CLIENT_THREADS),
        total,
        concurrency,
        random,
        auth,
    );
}

/// The name of the server runtime's threads (workers and blocking pool).
const SERVER_THREADS: &str = "fleet-server";
/// The name of the load generator's threads.
const CLIENT_THREADS: &str = "storm-client";

/// CPU time the threads of this process named `name` have used so far (threads that
/// exited are not counted; the runtimes keep theirs until the storm is over).
fn thread_cpu(name: &str) -> Duration {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        // The first field is the time spent on a CPU, in nanoseconds.
        nanos += std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
    }
    Duration::from_nanos(nanos)
}

/// Counts the bytes Rust code allocated and not yet freed (SQLite allocates through libc
/// directly), so the child can tell what the index holds. Allocates with mimalloc, as the
/// `ccfleet` binary does (`STORM_ALLOCATOR=system`: with the C library's malloc instead).
struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
/// Which allocator Rust allocations go to: 0 before the first allocation, then
/// [`MIMALLOC`] or [`SYSTEM`] for the rest of the process.
static CHOICE: AtomicU8 = AtomicU8::new(0);
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

impl Counting {
    /// Whether the C library's malloc serves this process, decided once, at the first
    /// allocation (before `main`), from `STORM_ALLOCATOR`.
    fn system() -> bool {
        match CHOICE.load(Ordering::Relaxed) {
            MIMALLOC => false,
            SYSTEM => true,
            _ => {
                unsafe extern "C" {
                    fn getenv(name: *const std::ffi::c_char) -> *const std::ffi::c_char;
                }
                // SAFETY: a NUL-terminated name; getenv allocates nothing, and the value,
                // if any, is a NUL-terminated string the environment keeps.
                let system = unsafe {
                    let value = getenv(c"STORM_ALLOCATOR".as_ptr());
                    !value.is_null() && std::ffi::CStr::from_ptr(value).to_bytes() == b"system"
                };
                let choice = if system { SYSTEM } else { MIMALLOC };
                // Threads racing on the first allocation read the same environment.
                CHOICE.store(choice, Ordering::Relaxed);
                system
            }
        }
    }
}

// SAFETY: every call is forwarded unchanged to one allocator, the same one for the whole
// process (chosen at its first allocation); only a counter is kept.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe {
            if Self::system() {
                std::alloc::System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe {
            if Self::system() {
                std::alloc::System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        LIVE.fetch_add(size as u64, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe {
            if Self::system() {
                std::alloc::System.realloc(ptr, layout, size)
            } else {
                mimalloc::MiMalloc.realloc(ptr, layout, size)
            }
        }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Gives the free pages of both allocators back to the kernel: what loading the rows
/// allocated and freed again is not the server's to keep.
fn release_free_memory() {
    if !Counting::system() {
        unsafe extern "C" {
            fn mi_collect(force: bool);
        }
        // SAFETY: mimalloc's own call, linked in with the allocator; it only frees.
        unsafe { mi_collect(true) };
    }
    // SQLite allocates with the C library's malloc whichever serves Rust.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only returns free pages to the kernel.
        unsafe { malloc_trim(0) };
    }
}

/// The child process: opens the registry and reports what its index costs in memory.
fn resident_child(db: &Path) {
    let rss_before = resident_bytes();
    let live_before = LIVE.load(Ordering::Relaxed);
    let registry = Registry::open(Some(db)).expect("open registry");
    let counts = registry.counts();
    let instances = counts.pending + counts.active + counts.stale + counts.deregistered;
    release_free_memory();
    let rss = resident_bytes().saturating_sub(rss_before);
    let live = LIVE.load(Ordering::Relaxed).saturating_sub(live_before);
    // SAFETY: a plain counter read of the bundled SQLite.
    let sqlite = u64::try_from(unsafe { rusqlite::ffi::sqlite3_memory_used() }).unwrap_or(0);
    let per = |bytes: u64| bytes as f64 / instances.max(1) as f64;
    println!(
        "server memory with {instances} instances loaded: resident {} = {:.0} bytes per instance (VmRSS growth of a process that only opened the registry); of it the in-memory index {:.0} bytes per instance (Rust heap held) and SQLite {} (page cache and statements)",
        mib(rss),
        per(rss),
        per(live),
        mib(sqlite),
    );
    drop(registry);
}

/// Registers host after host on one keep-alive connection until `next` reaches `total`;
/// returns each registration's latency.
async fn client(
    addr: std::net::SocketAddr,
    next: Arc<AtomicU64>,
    total: u64,
    random: bool,
    authorization: Arc<str>,
) -> Vec<Duration> {
    use std::io::Write;

    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut latencies = Vec::new();
    let mut body = Vec::with_capacity(256);
    let mut request = Vec::with_capacity(1024);
    let mut response = Vec::with_capacity(1024);
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return latencies;
        }
        body.clear();
        if random {
            // Distinct, but scattered over the unique index like real host names.
            write!(
                body,
                r#"{{"cluster":"storm{}","hostname":"n{:016x}","serviceType":"ccmc","metaData":{{"rack":"r{}"}}}}"#,
                i % 16,
                i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                i % 64
            )
        } else {
            write!(
                body,
                r#"{{"cluster":"storm{}","hostname":"n{i:07}","serviceType":"ccmc","metaData":{{"rack":"r{}"}}}}"#,
                i % 16,
                i % 64
            )
        }
        .expect("writing to a Vec");
        request.clear();
        write!(
            request,
            "POST /api/fleet/register/cluster/ HTTP/1.1\r\nhost: storm\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{authorization}\r\n",
            body.len()
        )
        .expect("writing to a Vec");
        request.extend_from_slice(&body);
        let sent = Instant::now();
        stream.write_all(&request).await.expect("send request");
        let (status, answer) = read_response(&mut stream, &mut response).await;
        assert_eq!(
            status,
            201,
            "registration {i}: {}",
            String::from_utf8_lossy(answer)
        );
        assert!(
            has_instance_id(answer),
            "registration {i}: no instance id in {}",
            String::from_utf8_lossy(answer)
        );
        latencies.push(sent.elapsed());
    }
}

/// Whether a registration answer holds `"instanceId":"` and 32 lowercase hex digits.
fn has_instance_id(answer: &[u8]) -> bool {
    const FIELD: &[u8] = b"\"instanceId\":\"";
    memchr::memmem::find(answer, FIELD)
        .and_then(|at| answer.get(at + FIELD.len()..at + FIELD.len() + 33))
        .is_some_and(|id| {
            id[..32]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                && id[32] == b'"'
        })
}

/// Reads one HTTP/1.1 response with a `content-length` into `buf`; returns its status and
/// body.
async fn read_response<'a>(stream: &mut TcpStream, buf: &'a mut Vec<u8>) -> (u16, &'a [u8]) {
    buf.clear();
    let (head_end, length) = loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(4096);
        }
        let n = stream.read_buf(buf).await.expect("read response");
        assert!(n > 0, "the server closed the connection");
        if let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") {
            break (end + 4, content_length(&buf[..end]));
        }
    };
    while buf.len() < head_end + length {
        buf.reserve(head_end + length - buf.len());
        let n = stream.read_buf(buf).await.expect("read body");
        assert!(n > 0, "the server closed the connection");
    }
    assert!(
        buf.len() == head_end + length,
        "bytes after the response: the server answered more than was asked"
    );
    let status = buf
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, &buf[head_end..])
}

/// The `content-length` of a response head (lines after the status line).
fn content_length(head: &[u8]) -> usize {
    head.split(|&b| b == b'\n')
        .skip(1)
        .find_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let (name, value) = line.split_at(colon);
            name.eq_ignore_ascii_case(b"content-length").then(|| {
                std::str::from_utf8(&value[1..])
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
            })?
        })
        .expect("a content-length")
}

fn storm(
    server_runtime: &tokio::runtime::Runtime,
    client_runtime: &tokio::runtime::Runtime,
    total: usize,
    concurrency: usize,
    random: bool,
    auth: bool,
) {
    let temp = tempfile::tempdir().expect("temporary directory");
    let dir = std::env::var_os("STORM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| temp.path().to_owned());
    let db = dir.join("registration-storm.sqlite");
    let wal = dir.join("registration-storm.sqlite-wal");
    for stale in [&db, &wal] {
        let _ = std::fs::remove_file(stale);
    }
    let keys = Keypair::generate();
    let mut config = serde_json::json!({
        "addr": "127.0.0.1:0",
        "db": db,
        "http-max-connections": concurrency + 64,
    });
    let authorization: Arc<str> = if auth {
        config["jwt-public-key"] = keys.public_key_base64().into();
        format!(
            "authorization: Bearer {}\r\n",
            keys.sign_token("storm", &["api"], None)
        )
        .into()
    } else {
        config["disable-authentication"] = true.into();
        "".into()
    };
    let config = ServerConfig::from_json(&config.to_string()).expect("bench config");
    let server = server_runtime
        .block_on(ccfleet::server::start(config))
        .expect("server starts");

    let done = Arc::new(AtomicBool::new(false));
    let peak_wal = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak_wal, wal) = (done.clone(), peak_wal.clone(), wal.clone());
        std::thread::Builder::new()
            .name("storm-sampler".into())
            .spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    peak_wal.fetch_max(file_len(&wal), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
            .expect("sampler thread")
    };

    println!(
        "registration storm: {total} registrations, {concurrency} concurrent connections, {} host names, authentication {}",
        if random { "random" } else { "sequential" },
        if auth {
            "on (one Ed25519 token)"
        } else {
            "off"
        }
    );
    let next = Arc::new(AtomicU64::new(0));
    let written_before = written_bytes();
    let (server_cpu_before, client_cpu_before) =
        (thread_cpu(SERVER_THREADS), thread_cpu(CLIENT_THREADS));
    let started = Instant::now();
    let mut latencies = client_runtime.block_on(async {
        let mut workers = Vec::new();
        for _ in 0..concurrency {
            workers.push(tokio::spawn(client(
                server.local_addr(),
                next.clone(),
                total as u64,
                random,
                authorization.clone(),
            )));
        }
        let mut latencies = Vec::with_capacity(total);
        for worker in workers {
            latencies.extend(worker.await.expect("worker"));
        }
        latencies
    });
    let elapsed = started.elapsed();
    let server_cpu = thread_cpu(SERVER_THREADS).saturating_sub(server_cpu_before);
    let client_cpu = thread_cpu(CLIENT_THREADS).saturating_sub(client_cpu_before);
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
        latencies[i - 1].as_secs_f64() * 1e3
    };
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    peak_wal.fetch_max(file_len(&wal), Ordering::Relaxed);
    let final_wal = file_len(&wal);
    let db_len = file_len(&db);
    let stored = server.registry().counts().pending;
    server_runtime
        .block_on(server.shutdown())
        .expect("server stops");
    let written = written_bytes().saturating_sub(written_before);
    assert_eq!(stored, total as u64, "every registration is a row");

    let reopened = Registry::open(Some(&db)).expect("reopen registry");
    assert_eq!(reopened.counts().pending, total as u64, "rows after reopen");
    drop(reopened);

    println!(
        "registrations/s: {:.0} ({total} in {:.2} s)",
        total as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(0.50),
        percentile(0.99),
        percentile(1.0)
    );
    let per = |cpu: Duration| cpu.as_secs_f64() * 1e6 / total as f64;
    println!(
        "CPU per registration: server {:.1} µs, load generator {:.1} µs ({:.2} s and {:.2} s of CPU in {:.2} s on {} cores)",
        per(server_cpu),
        per(client_cpu),
        server_cpu.as_secs_f64(),
        client_cpu.as_secs_f64(),
        elapsed.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "bytes written: {:.0} per registration ({} in all, /proc/self/io write_bytes)",
        written as f64 / total as f64,
        mib(written)
    );
    println!(
        "WAL: peak {} (sampled every 10 ms), at the end {}; journal_size_limit {}",
        mib(peak_wal.load(Ordering::Relaxed)),
        mib(final_wal),
        mib(JOURNAL_SIZE_LIMIT as u64)
    );
    println!("database file: {}", mib(db_len));

    let exe = std::env::current_exe().expect("own executable");
    let status = std::process::Command::new(exe)
        .env(RSS_CHILD, &db)
        .status()
        .expect("memory child");
    assert!(status.success(), "memory child failed");
}
