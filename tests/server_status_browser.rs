//! The fleet status page in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, started here on a free port). A person logs in with a token, sees an
//! instance appear, turn active, go stale and disappear, and a hostile host name and
//! roster metadata are shown as text, never as markup. Another lists the stale members of
//! one cluster from the summary, searches a host, opens a shared URL, and the page stops
//! asking while its tab is hidden.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/test.sh` installs them);
//! `CHROMEDRIVER` and `CHROMIUM` name other binaries.
#![cfg(feature = "server")]

mod server_common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ccfleet::server::auth::Keypair;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use server_common::*;

/// How long any one thing the test waits for may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);
/// A host name a registration accepts (no whitespace, no `/`) that is markup all the same.
const HOSTILE_HOST: &str = "<img>x<b>bold";
/// Roster metadata is free text: a classic script injection.
const HOSTILE_META: &str = "<img src=x onerror=\"window.pwned=1\">";

/// chromedriver, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

async fn start_driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let program = binary("CHROMEDRIVER", "/usr/bin/chromedriver");
    let child = Command::new(&program)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {program}: {e} (install chromium and chromium-driver: scripts/test.sh does)")
        });
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let client = http();
    let status = format!("{}/status", driver.url);
    eventually("chromedriver to answer", PATIENCE, || {
        let client = client.clone();
        let status = status.clone();
        async move {
            match client.get(&status).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            }
        }
    })
    .await;
    driver
}

async fn browser(driver: &Driver, profile: &std::path::Path) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": binary("CHROMIUM", "/usr/bin/chromium"),
            // As root Chromium needs --no-sandbox; the profile is the test's own.
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     format!("--user-data-dir={}", profile.display())],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

/// What the page's script reports about itself, evaluated in the page.
async fn page_value(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.unwrap_or(Value::Null)
}

/// The state the page shows for `host`, or `null` when it lists no such row.
async fn shown_state(client: &Client, host: &str) -> Value {
    client
        .execute(
            "const row = [...document.querySelectorAll('tr.instance')]
                 .find(r => r.cells[0].textContent === arguments[0]);
             return row ? row.dataset.state : null;",
            vec![json!(host)],
        )
        .await
        .unwrap_or(Value::Null)
}

async fn wait_for_state(client: &Client, host: &str, want: Value) {
    let what = format!("the page to show {host} as {want}");
    eventually(&what, PATIENCE, || {
        let want = want.clone();
        async move { shown_state(client, host).await == want }
    })
    .await;
}

/// Types `token` into the login form and sends it. A click that submits a form returns
/// before the browser has loaded the answer, so callers wait for what the answer shows
/// rather than look for it at once.
async fn submit_login(client: &Client, token: &str) {
    let wait = || client.wait().at_most(PATIENCE);
    wait()
        .for_element(Locator::Id("token"))
        .await
        .expect("the login form's token field")
        .send_keys(token)
        .await
        .unwrap();
    wait()
        .for_element(Locator::Id("login"))
        .await
        .expect("the login form's button")
        .click()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_logs_in_and_watches_an_instance_come_and_go() {
    let keys = Keypair::generate();
    let server = start(json!({
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"stale-after": "1s", "sweep-interval": "100ms"}
    }))
    .await;
    let base = server.base_url();
    let node_token = keys.sign_token("node", &["api"], None);
    let api = http();
    let node = |method: reqwest::Method, path: String| {
        api.request(method, format!("{base}{path}"))
            .header("X-Auth-Token", &node_token)
    };
    let register = |body: Value| {
        let scope = "cluster";
        node(
            reqwest::Method::POST,
            format!("/api/fleet/register/{scope}/"),
        )
        .body(body.to_string())
    };

    let driver = start_driver().await;
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;

    // Not logged in: the page sends the browser to the login form.
    client.goto(&format!("{base}/fleet/")).await.unwrap();
    let url = client.current_url().await.unwrap();
    assert_eq!(url.path(), "/fleet/login");
    // A node's token does not open the page.
    submit_login(&client, &node_token).await;
    let message = client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("p.message"))
        .await
        .expect("the login form again, with a message")
        .text()
        .await
        .unwrap();
    assert!(
        message.contains("lacks the admin or support role"),
        "{message}"
    );

    let admin = keys.sign_token("operator", &["admin"], Some(Duration::from_secs(3600)));
    submit_login(&client, &admin).await;
    eventually("the page after login", PATIENCE, || async {
        page_value(
            &client,
            "return document.getElementById('summary')?.textContent ?? ''",
        )
        .await
        .as_str()
        .is_some_and(|s| s.contains("instance(s)"))
    })
    .await;
    let url = client.current_url().await.unwrap();
    assert_eq!(url.path(), "/fleet/");
    assert!(url.query().is_none(), "no token in the URL: {url}");
    assert!(!url.as_str().contains(&admin));
    assert_eq!(
        page_value(&client, "return document.cookie").await,
        json!(""),
        "the session cookie is HttpOnly: the page's script cannot read it"
    );
    assert_eq!(
        page_value(
            &client,
            "return document.getElementById('user').textContent"
        )
        .await,
        json!("logged in as operator")
    );

    // A backend with hostile metadata (in the roster) and a node with a hostile name.
    let response = register(
        json!({"cluster": "fritz", "hostname": "web1", "serviceType": "ccb",
                                   "metaData": {"banner": HOSTILE_META}}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 201);
    let backend: Value = response.json().await.unwrap();
    let backend = backend["instanceId"].as_str().unwrap().to_owned();
    // The backend stays active (and so in the roster) while the node below goes stale.
    let keep_beating = |id: &str| {
        let request = node(reqwest::Method::POST, format!("/api/fleet/heartbeat/{id}"));
        tokio::spawn(async move {
            loop {
                let beat = request.try_clone().expect("a bodiless request clones");
                assert_eq!(
                    beat.send().await.map(|r| r.status().as_u16()).unwrap_or(0),
                    204
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let backend_beats = keep_beating(&backend);
    let response =
        register(json!({"cluster": "fritz", "hostname": HOSTILE_HOST, "serviceType": "ccmc"}))
            .send()
            .await
            .unwrap();
    assert_eq!(
        response.status(),
        201,
        "the hostile name is a valid host name"
    );

    // An instance appears: pending, then active with its heartbeat.
    let response =
        register(json!({"cluster": "fritz", "hostname": "f0101", "serviceType": "ccmc"}))
            .send()
            .await
            .unwrap();
    let id: Value = response.json().await.unwrap();
    let id = id["instanceId"].as_str().unwrap().to_owned();
    wait_for_state(&client, "f0101", json!("pending")).await;
    wait_for_state(&client, HOSTILE_HOST, json!("pending")).await;

    // The hostile strings are text: no element was made of them, no handler ran.
    assert_eq!(
        page_value(&client, "return document.querySelectorAll('img').length").await,
        json!(0)
    );
    assert_eq!(
        page_value(
            &client,
            "return document.querySelectorAll('#instances b').length"
        )
        .await,
        json!(0)
    );
    assert_eq!(
        page_value(&client, "return typeof window.pwned").await,
        json!("undefined")
    );
    eventually(
        "the roster to show the backend's metadata as text",
        PATIENCE,
        || async {
            page_value(
                &client,
                "return document.getElementById('rosters').textContent",
            )
            .await
            .as_str()
            .is_some_and(|text| text.contains(&format!("banner={HOSTILE_META}")))
        },
    )
    .await;
    assert_eq!(
        page_value(&client, "return document.querySelectorAll('img').length").await,
        json!(0)
    );
    let body = page_value(&client, "return document.body.textContent").await;
    assert!(
        !body.as_str().unwrap().contains(&id),
        "the whole instance id is never shown"
    );
    assert!(
        body.as_str()
            .unwrap()
            .contains(&format!("{}…{}", &id[..4], &id[28..]))
    );

    // Heartbeats make it active (they go on until the page showed it: stale-after is
    // shorter than the page's refresh period).
    let node_beats = keep_beating(&id);
    wait_for_state(&client, "f0101", json!("active")).await;
    node_beats.abort();

    // Silent for longer than stale-after: stale. Deregistered: gone from the page.
    wait_for_state(&client, "f0101", json!("stale")).await;
    assert_eq!(
        node(
            reqwest::Method::DELETE,
            format!("/api/fleet/deregister/{id}")
        )
        .send()
        .await
        .unwrap()
        .status(),
        204
    );
    wait_for_state(&client, "f0101", Value::Null).await;
    // Each member is one row, however often its row was redrawn (web1 beats all along).
    assert_eq!(
        page_value(
            &client,
            "return [...document.querySelectorAll('tr.instance')].filter(r => r.cells[0].textContent === 'web1').length"
        )
        .await,
        json!(1)
    );
    assert_eq!(
        shown_state(&client, HOSTILE_HOST).await,
        json!("pending"),
        "the others stay"
    );

    // Logout ends the session: the page's data is refused afterwards.
    client
        .find(Locator::Id("logout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    eventually("the login form after logout", PATIENCE, || async {
        client
            .current_url()
            .await
            .is_ok_and(|u| u.path() == "/fleet/login")
    })
    .await;
    let status = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/fleet/status.json').then(r => done(r.status), () => done(0));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(status, json!(401));

    backend_beats.abort();
    client.close().await.unwrap();
    drop(driver);
    server.shutdown().await.unwrap();
}

/// The host names the page lists now, in its order.
async fn shown_hosts(client: &Client) -> Value {
    page_value(
        client,
        "return [...document.querySelectorAll('tr.instance')].map(r => r.cells[0].textContent)",
    )
    .await
}

async fn wait_for_hosts(client: &Client, want: Value) {
    let what = format!("the page to list {want}");
    eventually(&what, PATIENCE, || {
        let want = want.clone();
        async move { shown_hosts(client).await == want }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_finds_stale_hosts_shares_the_view_and_a_hidden_page_asks_nothing() {
    let keys = Keypair::generate();
    let server = start(json!({
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"stale-after": "2s", "sweep-interval": "100ms"}
    }))
    .await;
    let base = server.base_url();
    let node_token = keys.sign_token("node", &["api"], None);
    let api = http();
    // fritz: f0001..f0012, of which f0003, f0004 and f0010 go silent; alex: a1, a2.
    let mut beating = Vec::new();
    for (cluster, host) in (1..=12)
        .map(|n| ("fritz", format!("f{n:04}")))
        .chain([("alex", "a1".to_owned()), ("alex", "a2".to_owned())])
    {
        let response = api
            .post(format!("{base}/api/fleet/register/cluster/"))
            .header("X-Auth-Token", &node_token)
            .body(json!({"cluster": cluster, "hostname": host, "serviceType": "ccmc"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let id: Value = response.json().await.unwrap();
        let id = id["instanceId"].as_str().unwrap().to_owned();
        let silent = ["f0003", "f0004", "f0010"].contains(&host.as_str());
        let beat = api
            .post(format!("{base}/api/fleet/heartbeat/{id}"))
            .header("X-Auth-Token", &node_token);
        assert_eq!(
            beat.try_clone().unwrap().send().await.unwrap().status(),
            204
        );
        if !silent {
            beating.push(beat);
        }
    }
    let beats = tokio::spawn(async move {
        loop {
            for beat in &beating {
                let _ = beat.try_clone().unwrap().send().await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    let driver = start_driver().await;
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    client.goto(&format!("{base}/fleet/")).await.unwrap();
    let admin = keys.sign_token("operator", &["admin"], Some(Duration::from_secs(3600)));
    submit_login(&client, &admin).await;

    // The summary names the silent hosts as a host list; its stale count of fritz is a link
    // to exactly those members (one click).
    eventually("the summary's stale hosts", PATIENCE, || async {
        page_value(
            &client,
            "return document.getElementById('groups').textContent",
        )
        .await
        .as_str()
        .is_some_and(|t| t.contains("f[0003-0004,0010]"))
    })
    .await;
    client
        .find(Locator::Css("tr.group[data-cluster='fritz'] a.state-stale"))
        .await
        .expect("fritz's stale count as a link")
        .click()
        .await
        .unwrap();
    wait_for_hosts(&client, json!(["f0003", "f0004", "f0010"])).await;
    let url = client.current_url().await.unwrap();
    let query: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    assert!(
        query.contains(&("cluster".into(), "fritz".into()))
            && query.contains(&("state".into(), "stale".into())),
        "the view is in the URL: {url}"
    );

    // A search for a name: type it, press Enter.
    let search = client.find(Locator::Id("f-host")).await.unwrap();
    search.clear().await.unwrap();
    search.send_keys("f0010").await.unwrap();
    search
        .send_keys(&fantoccini::key::Key::Enter.to_string())
        .await
        .unwrap();
    wait_for_hosts(&client, json!(["f0010"])).await;

    // A shared URL opens the view it names.
    client
        .goto(&format!("{base}/fleet/?cluster=alex&state=active"))
        .await
        .unwrap();
    wait_for_hosts(&client, json!(["a1", "a2"])).await;
    assert_eq!(
        page_value(&client, "return document.getElementById('f-cluster').value").await,
        json!("alex")
    );

    // Hidden, the page asks nothing; shown again, it asks at once.
    page_value(
        &client,
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
         Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
         document.dispatchEvent(new Event('visibilitychange'));
         return true;",
    )
    .await;
    eventually("the round under way to end", PATIENCE, || async {
        page_value(&client, "return window.ccfleetBusy()").await == json!(false)
    })
    .await;
    let asked = page_value(&client, "return window.ccfleetRequests").await;
    // Several refresh periods (2 s each) pass without a request.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        page_value(&client, "return window.ccfleetRequests").await,
        asked,
        "a hidden page sent requests"
    );
    page_value(
        &client,
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
         Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'visible'});
         document.dispatchEvent(new Event('visibilitychange'));
         return true;",
    )
    .await;
    eventually("the page to ask again when shown", PATIENCE, || async {
        page_value(&client, "return window.ccfleetRequests")
            .await
            .as_u64()
            > asked.as_u64()
    })
    .await;

    beats.abort();
    client.close().await.unwrap();
    drop(driver);
    server.shutdown().await.unwrap();
}
