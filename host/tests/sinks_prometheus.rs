//! The `prometheus` sink: points go in through the agent's sink, the endpoint is scraped
//! over real HTTP and parsed with a Prometheus text-format parser: cc-lib's names, labels
//! and gauge type, the latest value of each series.

#[path = "support/receivers.rs"]
mod receivers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccfleet_host::agent::sinks::{SinkConfig, start_standalone};
use ccfleet_host::sink::Batch;
use serde_json::json;

fn batch(lines: &str) -> Batch {
    Batch {
        plugin: Arc::from("test"),
        points: lines.lines().count(),
        lines: lines.to_owned().into(),
    }
}

async fn fetch(url: &str) -> prometheus_parse::Scrape {
    let client = ccfleet::tls::http_client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let response = client.get(url).send().await.expect("scraping");
    assert!(response.status().is_success(), "{}", response.status());
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("the text format")
}

fn gauge(sample: &prometheus_parse::Sample) -> f64 {
    match sample.value {
        prometheus_parse::Value::Gauge(v) => v,
        ref other => panic!("{} is not a gauge: {other:?}", sample.metric),
    }
}

/// Polls until the scrape holds `samples` samples.
async fn scrape_until(url: &str, samples: usize) -> prometheus_parse::Scrape {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let scrape = fetch(url).await;
        if scrape.samples.len() >= samples {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{:?}", scrape.samples);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_values_are_served_with_cc_libs_names_and_labels() {
    let port = receivers::free_port();
    let config: SinkConfig = serde_json::from_value(json!({
        "type": "prometheus",
        "host": "127.0.0.1",
        "port": port.to_string(),
        "path": "metrics",
        "group_as_namespace": true,
    }))
    .unwrap();
    let sink = start_standalone("prom", &config, "fritz").expect("the sink starts");
    let url = format!("http://127.0.0.1:{port}/metrics");
    sink.tx
        .send(batch(
            "cpu_load,hostname=n1,cluster=fritz,type=node value=1.5 1\n\
             flops_any,hostname=n1,type=socket,type-id=0,group=FLOPS,unit=MFLOP/s value=10i 1\n\
             flops_any,hostname=n1,type=socket,type-id=1,group=FLOPS,unit=MFLOP/s value=11i 1\n\
             nv_util,hostname=n1,type=accelerator,type-id=0000:3b:00.0,device=gpu0 value=7u 1\n\
             slurm_state,hostname=n1,type=node value=\"idle\" 1\n",
        ))
        .await
        .unwrap();
    let scrape = scrape_until(&url, 4).await;
    assert_eq!(scrape.samples.len(), 4, "{:?}", scrape.samples);
    let find = |name: &str, label: Option<(&str, &str)>| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("{name} {label:?}: {:?}", scrape.samples))
    };
    let load = find("cpu_load", None);
    assert_eq!(gauge(load), 1.5);
    assert!(
        load.labels.is_empty(),
        "no tag but cc-lib's become labels: {load:?}"
    );
    assert_eq!(gauge(find("flops_flops_any", Some(("socket", "0")))), 10.0);
    let one = find("flops_flops_any", Some(("socket", "1")));
    assert_eq!(gauge(one), 11.0);
    assert_eq!(one.labels.len(), 1, "{one:?}");
    let util = find("nv_util", Some(("accelerator", "0000:3b:00.0")));
    assert_eq!(util.labels.get("device"), Some("gpu0"));
    assert_eq!(gauge(util), 7.0);

    // A new value replaces the old one.
    sink.tx
        .send(batch("cpu_load,hostname=n1,type=node value=2.25 2\n"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = fetch(&url).await;
        let load = now.samples.iter().find(|s| s.metric == "cpu_load").unwrap();
        if gauge(load) == 2.25 {
            assert_eq!(now.samples.len(), 4);
            break;
        }
        assert!(Instant::now() < deadline, "the new value is not served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sink.counters
            .dropped_rejected
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the string value is not served"
    );

    // Closing the sink closes the endpoint.
    drop(sink.tx);
    tokio::time::timeout(Duration::from_secs(120), sink.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still listening after the sink ended"
    );
}

#[tokio::test]
async fn a_port_in_use_fails_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config: SinkConfig = serde_json::from_value(json!({
        "type": "prometheus", "host": "127.0.0.1", "port": port
    }))
    .unwrap();
    let err = match start_standalone("prom", &config, "fritz") {
        Ok(_) => panic!("started on a port in use"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("cannot listen"), "{err}");
}
