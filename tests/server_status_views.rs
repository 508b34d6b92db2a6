//! The status views of a larger fleet over real sockets: `GET /api/fleet/summary` (counts
//! and host lists per cluster and type), the instance list's host lists, patterns, report
//! filters, order and pages, entity tags (304 for an unchanged view), gzip when the client
//! accepts it, and the page's data routes behind the session.
#![cfg(feature = "server")]

mod server_common;

use std::io::Read as _;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use server_common::*;

/// A client that neither decompresses nor follows redirects: the test sees the wire.
fn raw_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200, "{url}");
    response.json().await.unwrap()
}

/// Registers `host` in `cluster` as a collector; returns its id.
async fn member(client: &reqwest::Client, base: &str, cluster: &str, host: &str) -> String {
    let response = client
        .post(format!("{base}/api/fleet/register/cluster/"))
        .body(json!({"cluster": cluster, "hostname": host, "serviceType": "ccmc"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let answer: Value = response.json().await.unwrap();
    answer["instanceId"].as_str().unwrap().to_owned()
}

async fn beat(client: &reqwest::Client, base: &str, id: &str) {
    let status = client
        .post(format!("{base}/api/fleet/heartbeat/{id}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_filters_pages_tags_and_compression() {
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"stale-after": "3s", "sweep-interval": "100ms"}
    }))
    .await;
    let base = server.base_url();
    let client = raw_client();

    // fritz: f0001..f0030; f0003-f0005 and f0009 go stale, f0012 stays pending, the rest
    // keep beating. alex: a1, beating.
    let mut ids = Vec::new();
    for n in 1..=30 {
        ids.push((
            n,
            member(&client, &base, "fritz", &format!("f{n:04}")).await,
        ));
    }
    let alex = member(&client, &base, "alex", "a1").await;
    for (n, id) in &ids {
        if *n != 12 {
            beat(&client, &base, id).await;
        }
    }
    let beating: Vec<String> = ids
        .iter()
        .filter(|(n, _)| ![3, 4, 5, 9, 12].contains(n))
        .map(|(_, id)| id.clone())
        .chain([alex.clone()])
        .collect();
    let beats = {
        let client = client.clone();
        let base = base.clone();
        tokio::spawn(async move {
            loop {
                for id in &beating {
                    beat(&client, &base, id).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // One member reports a quarantined plugin with its configuration poll.
    let reporter = &ids[7].1; // f0008
    let status = client
        .get(format!("{base}/api/fleet/config/{reporter}"))
        .header(
            "X-CCFleet-Report",
            "applied=0; plugins=loadavg@aaaaaaaaaaaaaaaa:quarantined,cpu@bbbbbbbbbbbbbbbb:running",
        )
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");

    let summary_url = format!("{base}/api/fleet/summary");
    eventually(
        "four fritz members to go stale",
        Duration::from_secs(30),
        || async { get_json(&client, &summary_url).await["total"]["stale"] == 4 },
    )
    .await;
    // The compact form: zeros and empty lists left out, a state needing attention as
    // [count, hosts] (the stale ones with the oldest one's last sign of life).
    let summary = get_json(&client, &summary_url).await;
    assert_eq!(summary["v"], 2);
    assert_eq!(summary["staleAfterSeconds"], 3);
    assert_eq!(
        summary["total"],
        json!({"pending": 1, "active": 26, "stale": 4, "failing": 1})
    );
    let groups = summary["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(
        groups[0],
        json!({"cluster": "alex", "type": "ccmc", "active": 1})
    );
    let fritz = &groups[1];
    let oldest = fritz["stale"][2].as_i64().unwrap();
    assert!(oldest <= summary["now"].as_i64().unwrap() - 3);
    assert_eq!(
        fritz,
        &json!({"cluster": "fritz", "type": "ccmc", "active": 25,
                "stale": [4, "f[0003-0005,0009]", oldest], "pending": [1, "f0012"],
                "failing": [1, "f0008"]})
    );
    // The full form, as before the compact one, for readers written against it.
    let full = get_json(&client, &format!("{summary_url}?v=1")).await;
    assert!(full.get("v").is_none());
    assert_eq!(
        full["total"],
        json!({"pending": 1, "active": 26, "stale": 4, "duplicate": 0, "failing": 1})
    );
    let fritz = &full["groups"][1];
    assert_eq!(fritz["serviceType"], "ccmc");
    assert_eq!(
        fritz["hosts"],
        json!({"pending": "f0012", "stale": "f[0003-0005,0009]", "duplicate": "",
               "failing": "f0008"})
    );
    assert_eq!(fritz["oldestStaleSince"], oldest);
    let refused = client
        .get(format!("{summary_url}?v=3"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("v=3: expected 1"));

    // The instance list takes host lists and patterns, report filters, order and pages.
    let hosts = |answer: &Value| -> Vec<String> {
        answer["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["hostname"].as_str().unwrap().to_owned())
            .collect()
    };
    let list = |query: &str| {
        let url = format!("{base}/api/fleet/instances?{query}");
        let client = client.clone();
        async move { get_json(&client, &url).await }
    };
    assert_eq!(
        hosts(&list("host=f[0001-0002,0029]").await),
        ["f0001", "f0002", "f0029"]
    );
    assert_eq!(hosts(&list("host=a*").await), ["a1"]);
    assert_eq!(
        hosts(&list("cluster=fritz&state=stale").await),
        ["f0003", "f0004", "f0005", "f0009"]
    );
    assert_eq!(hosts(&list("failing=true").await), ["f0008"]);
    assert_eq!(hosts(&list("version=bbbbbbbb").await), ["f0008"]);
    let failing = list("failing=true").await;
    assert_eq!(
        failing["instances"][0]["plugins"],
        json!([{"name": "loadavg", "sha256": "aaaaaaaaaaaaaaaa", "health": "quarantined"},
               {"name": "cpu", "sha256": "bbbbbbbbbbbbbbbb", "health": "running"}])
    );
    // What needs attention first: the stale, the failing, the pending, then the rest.
    let first = list("sort=state&limit=6").await;
    assert_eq!(
        hosts(&first),
        ["f0003", "f0004", "f0005", "f0009", "f0008", "f0012"]
    );
    assert_eq!(
        (first["total"].clone(), first["offset"].clone()),
        (json!(31), json!(0))
    );
    let page = list("sort=state&offset=29&limit=6").await;
    assert_eq!(hosts(&page), ["f0029", "f0030"]);
    assert_eq!(page["total"], 31);
    let refused = client
        .get(format!("{base}/api/fleet/summary?host=f[9-1]"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("runs backwards"));

    // An unchanged summary costs a 304 and no body, though the server's clock moved on.
    let first = client.get(&summary_url).send().await.unwrap();
    let tag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(tag.starts_with("W/\""), "{tag}");
    let again = client
        .get(&summary_url)
        .header("If-None-Match", &tag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(again.headers()["etag"], tag.as_str());
    assert!(again.bytes().await.unwrap().is_empty());
    // A change is a new tag: f0012 beats and is active.
    beat(&client, &base, &ids[11].1).await;
    eventually("the summary to change", Duration::from_secs(30), || async {
        let r = client
            .get(&summary_url)
            .header("If-None-Match", &tag)
            .send()
            .await
            .unwrap();
        r.status() == StatusCode::OK && r.headers()["etag"] != tag.as_str()
    })
    .await;

    // Compressed when asked, plain otherwise; the same document either way.
    let all = format!("{base}/api/fleet/instances");
    let plain = client.get(&all).send().await.unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    let plain: Value = plain.json().await.unwrap();
    let zipped = client
        .get(&all)
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(zipped.headers()["content-encoding"], "gzip");
    let bytes = zipped.bytes().await.unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_string(&mut text)
        .unwrap();
    let unzipped: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(hosts(&unzipped), hosts(&plain));
    assert!(
        bytes.len() < text.len() / 3,
        "{} of {}",
        bytes.len(),
        text.len()
    );

    // The page's routes answer the same, and the old whole-view route still does.
    let page_summary = get_json(&client, &format!("{base}/fleet/summary.json?cluster=alex")).await;
    assert_eq!(page_summary["total"]["active"], 1);
    let page_rows = get_json(
        &client,
        &format!("{base}/fleet/instances.json?host=f0008&sort=state"),
    )
    .await;
    assert_eq!(hosts(&page_rows), ["f0008"]);
    let overview = get_json(&client, &format!("{base}/fleet/overview.json")).await;
    assert_eq!(overview["publishesRosters"], false, "no NATS, no rosters");
    let loadavg = overview["rollouts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["plugin"] == "loadavg")
        .expect("the reported plugin")
        .clone();
    assert_eq!(
        loadavg["versions"],
        json!([{"sha256": "aaaaaaaaaaaaaaaa", "served": 0, "named": 0, "reporting": 1,
                "running": 0, "failed": 1}])
    );
    let whole = get_json(&client, &format!("{base}/fleet/status.json")).await;
    assert_eq!(whole["instances"].as_array().unwrap().len(), 31);
    assert_eq!(whole["publishesRosters"], false);

    beats.abort();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_routes_need_a_session() {
    let keys = ccfleet::server::auth::Keypair::generate();
    let server = start(json!({"jwt-public-key": keys.public_key_base64()})).await;
    let base = server.base_url();
    let client = raw_client();
    for route in [
        "summary.json",
        "instances.json?state=stale",
        "overview.json",
    ] {
        let response = client
            .get(format!("{base}/fleet/{route}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{route}");
    }
    // The API's summary takes a status reader's token, never a node's.
    let summary = |token: String| {
        client
            .get(format!("{base}/api/fleet/summary"))
            .header("X-Auth-Token", token)
            .send()
    };
    assert_eq!(
        summary(keys.sign_token("node", &["api"], None))
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        summary(keys.sign_token("ops", &["support"], None))
            .await
            .unwrap()
            .status(),
        200
    );
    server.shutdown().await.unwrap();
}
