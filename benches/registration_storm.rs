//! A registration storm through the real HTTP API into a SQLite registry file: how many
//! registrations per second the server acknowledges, and how large the write-ahead log grows
//! (sampled every 10 ms while the storm runs).
//!
//! ```text
//! cargo bench --bench registration_storm --features server,client
//! STORM_REGISTRATIONS=100000 STORM_CONCURRENCY=32 cargo bench --bench registration_storm --features server,client
//! ```
//!
//! `STORM_DIR` puts the database in a given directory (default: a temporary one). Every
//! registration must answer 201 and be a row afterwards; the run fails otherwise.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::ServerConfig;
use ccfleet::server::registry::{JOURNAL_SIZE_LIMIT, Registry};

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a positive integer")),
        Err(_) => default,
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn main() {
    let total = env_usize("STORM_REGISTRATIONS", 20_000);
    let concurrency = env_usize("STORM_CONCURRENCY", 32).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(storm(total, concurrency));
}

async fn storm(total: usize, concurrency: usize) {
    let temp = tempfile::tempdir().expect("temporary directory");
    let dir = std::env::var_os("STORM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| temp.path().to_owned());
    let db = dir.join("registration-storm.sqlite");
    let wal = dir.join("registration-storm.sqlite-wal");
    for stale in [&db, &wal] {
        let _ = std::fs::remove_file(stale);
    }
    let config = ServerConfig::from_json(
        &serde_json::json!({
            "addr": "127.0.0.1:0",
            "disable-authentication": true,
            "db": db,
        })
        .to_string(),
    )
    .expect("bench config");
    let server = ccfleet::server::start(config).await.expect("server starts");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("http client");
    let url = format!("{}/api/fleet/register/cluster/", server.base_url());

    let done = Arc::new(AtomicBool::new(false));
    let peak_wal = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak_wal, wal) = (done.clone(), peak_wal.clone(), wal.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                peak_wal.fetch_max(file_len(&wal), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    println!("registration storm: {total} registrations, {concurrency} concurrent clients");
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, next) = (client.clone(), url.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total as u64 {
                    return;
                }
                let body = format!(
                    r#"{{"cluster":"storm{}","hostname":"n{i:07}","serviceType":"ccmc","metaData":{{"rack":"r{}"}}}}"#,
                    i % 16,
                    i % 64
                );
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("register request");
                assert_eq!(response.status().as_u16(), 201, "registration {i}");
                response.bytes().await.expect("register response");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    peak_wal.fetch_max(file_len(&wal), Ordering::Relaxed);
    let final_wal = file_len(&wal);
    let db_len = file_len(&db);
    let stored = server.registry().counts().pending;
    server.shutdown().await.expect("server stops");
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
        "WAL: peak {} (sampled every 10 ms), at the end {}; journal_size_limit {}",
        mib(peak_wal.load(Ordering::Relaxed)),
        mib(final_wal),
        mib(JOURNAL_SIZE_LIMIT as u64)
    );
    println!("database file: {}", mib(db_len));
}
