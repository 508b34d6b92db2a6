//! The fleet status view over real sockets: `GET /api/fleet/instances` (roles, filters,
//! abbreviated ids), the page's login (cookie attributes, cross-site refusal, logout) and
//! its data (rosters, plugin rollouts counted from what was served).
#![cfg(feature = "server")]

mod server_common;

use std::time::Duration;

use ccfleet::server::auth::Keypair;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_common::*;

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// A server with authentication, its key pair and a client that does not follow redirects.
struct Fleet {
    server: ccfleet::server::RunningServer,
    keys: Keypair,
    client: reqwest::Client,
    node: String,
}

impl Fleet {
    async fn start(extra: Value) -> Fleet {
        let keys = Keypair::generate();
        let mut config = json!({"jwt-public-key": keys.public_key_base64()});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let server = start(config).await;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let node = keys.sign_token("node", &["api"], None);
        Fleet {
            server,
            keys,
            client,
            node,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.base_url())
    }

    fn token(&self, roles: &[&str]) -> String {
        self.keys.sign_token("operator", roles, None)
    }

    /// Registers as a node and returns the full instance id.
    async fn register(&self, body: Value) -> String {
        let scope = if body.get("cluster").is_some() {
            "cluster"
        } else {
            "infra"
        };
        let response = self
            .client
            .post(self.url(&format!("/api/fleet/register/{scope}/")))
            .header("X-Auth-Token", &self.node)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let answer: Value = response.json().await.unwrap();
        answer["instanceId"].as_str().unwrap().to_owned()
    }

    async fn node_call(&self, method: reqwest::Method, path: &str) -> StatusCode {
        self.client
            .request(method, self.url(path))
            .header("X-Auth-Token", &self.node)
            .send()
            .await
            .unwrap()
            .status()
    }

    async fn instances(&self, query: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut request = self
            .client
            .get(self.url(&format!("/api/fleet/instances{query}")));
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = request.send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn listed(&self, query: &str) -> Vec<Value> {
        let (status, body) = self.instances(query, Some(&self.token(&["admin"]))).await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["instances"].as_array().unwrap().clone()
    }

    /// Posts the login form with `headers`; returns the answer.
    async fn login(&self, token: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .client
            .post(self.url("/fleet/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.send().await.unwrap()
    }

    fn origin(&self) -> String {
        self.server.base_url()
    }

    async fn session(&self) -> String {
        let response = self
            .login(&self.token(&["support"]), &[("origin", &self.origin())])
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let cookie = response.headers()["set-cookie"].to_str().unwrap();
        cookie.split(';').next().unwrap().to_owned()
    }

    async fn page_data(&self, cookie: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(self.url("/fleet/status.json"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instance_list_needs_admin_or_support_and_a_node_token_gets_403() {
    let fleet = Fleet::start(json!({})).await;
    let (status, body) = fleet.instances("", None).await;
    assert_eq!(status, 401);
    assert_eq!(
        body,
        "{\"status\":\"Unauthorized\",\"error\":\"missing token\"}\n"
    );
    let (status, body) = fleet.instances("", Some(&fleet.node)).await;
    assert_eq!(status, 403, "every node holds an api token: {body}");
    assert_eq!(
        body,
        "{\"status\":\"Forbidden\",\"error\":\"missing role: admin or support\"}\n"
    );
    let foreign = Keypair::generate().sign_token("x", &["admin"], None);
    assert_eq!(fleet.instances("", Some(&foreign)).await.0, 401);
    let expired = fleet.keys.sign_token("x", &["admin"], Some(Duration::ZERO));
    assert_eq!(fleet.instances("", Some(&expired)).await.0, 401);
    for roles in [
        &["admin"][..],
        &["support"],
        &["admin", "api"],
        &["user", "support"],
    ] {
        let (status, body) = fleet.instances("", Some(&fleet.token(roles))).await;
        assert_eq!(status, 200, "{roles:?}: {body}");
    }
    let metrics = fleet
        .client
        .get(fleet.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ccfleet_api_refused_total{reason=\"role\"} 1"),
        "{metrics}"
    );
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowlist_applies_to_the_instance_list() {
    let fleet = Fleet::start(json!({"api-allowed-ips": ["192.0.2.1"]})).await;
    let (status, body) = fleet.instances("", Some(&fleet.token(&["admin"]))).await;
    assert_eq!(status, 401);
    assert!(body.contains("unauthorized by IP"), "{body}");
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_are_listed_filtered_and_never_with_their_whole_id() {
    let tree = tempfile::tempdir().unwrap();
    write(tree.path(), "defaults.json", r#"{"log-level":"info"}"#);
    let fleet = Fleet::start(json!({"fleet": {"config-dir": tree.path()}})).await;
    let f1 = fleet
        .register(json!({"cluster": "fritz", "hostname": "f0101", "serviceType": "ccmc"}))
        .await;
    let f2 = fleet
        .register(json!({"cluster": "fritz", "hostname": "f0102", "serviceType": "ccmc"}))
        .await;
    let a1 = fleet
        .register(json!({"cluster": "alex", "hostname": "a0101", "serviceType": "ccmc"}))
        .await;
    let mgmt = fleet
        .register(json!({"hostname": "mgmt", "serviceType": "ccb"}))
        .await;
    let gone = fleet
        .register(json!({"cluster": "fritz", "hostname": "gone", "serviceType": "ccmc"}))
        .await;
    assert_eq!(
        fleet
            .node_call(reqwest::Method::POST, &format!("/api/fleet/heartbeat/{f1}"))
            .await,
        204
    );
    assert_eq!(
        fleet
            .node_call(reqwest::Method::GET, &format!("/api/fleet/config/{f1}"))
            .await,
        200
    );
    assert_eq!(
        fleet
            .node_call(
                reqwest::Method::DELETE,
                &format!("/api/fleet/deregister/{gone}")
            )
            .await,
        204
    );

    let (status, body) = fleet.instances("", Some(&fleet.token(&["admin"]))).await;
    assert_eq!(status, 200);
    for id in [&f1, &f2, &a1, &mgmt, &gone] {
        assert!(!body.contains(id.as_str()), "a whole instance id: {body}");
        assert!(
            !body.contains(&id[..12]),
            "more than the abbreviation: {body}"
        );
    }
    let answer: Value = serde_json::from_str(&body).unwrap();
    let now = answer["now"].as_i64().unwrap();
    let instances = answer["instances"].as_array().unwrap();
    let hosts: Vec<&str> = instances
        .iter()
        .map(|i| i["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(
        hosts,
        ["mgmt", "a0101", "f0101", "f0102"],
        "deregistered ones are gone"
    );
    let f0101 = &instances[2];
    assert_eq!(f0101["cluster"], "fritz");
    assert_eq!(f0101["serviceType"], "ccmc");
    assert_eq!(f0101["state"], "active");
    assert_eq!(f0101["instance"], format!("{}…{}", &f1[..4], &f1[28..]));
    assert_eq!(f0101["duplicate"], false);
    let revision = f0101["configRevision"].as_str().expect("a string revision");
    assert_eq!(
        revision,
        fleet
            .server
            .registry()
            .lookup(&f1)
            .unwrap()
            .config_revision
            .to_string()
    );
    assert!((now - f0101["lastHeartbeat"].as_i64().unwrap()).abs() < 60);
    assert!(f0101["registeredAt"].as_i64().unwrap() <= now);
    assert_eq!(instances[3]["state"], "pending");
    assert_eq!(instances[3]["lastHeartbeat"], Value::Null);
    assert_eq!(instances[3]["configRevision"], Value::Null);
    assert_eq!(instances[0]["cluster"], "");
    assert_eq!(instances[0]["scope"], "infra");

    let hosts = |list: Vec<Value>| -> Vec<String> {
        list.iter()
            .map(|i| i["hostname"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        hosts(fleet.listed("?cluster=fritz").await),
        ["f0101", "f0102"]
    );
    assert_eq!(hosts(fleet.listed("?type=ccb").await), ["mgmt"]);
    assert_eq!(
        hosts(fleet.listed("?state=pending").await),
        ["mgmt", "a0101", "f0102"]
    );
    assert_eq!(
        hosts(fleet.listed("?state=active&state=stale").await),
        ["f0101"]
    );
    assert_eq!(
        hosts(fleet.listed("?hostname=a0101&hostname=f0102").await),
        ["a0101", "f0102"]
    );
    assert_eq!(
        hosts(fleet.listed("?cluster=fritz&state=pending&type=ccmc").await),
        ["f0102"]
    );
    assert!(fleet.listed("?cluster=nowhere").await.is_empty());
    assert_eq!(
        hosts(fleet.listed("?cluster=").await),
        ["mgmt"],
        "infra has no cluster"
    );

    let admin = fleet.token(&["admin"]);
    for (query, needle) in [
        ("?state=deregistered", "expected pending, active or stale"),
        ("?type=ccmx", "expected one of ccms, ccmc, ccb"),
        ("?host2=f0101", "unknown query parameter \\\"host2\\\""),
        ("?host=f[0101", "without its ']'"),
    ] {
        let (status, body) = fleet.instances(query, Some(&admin)).await;
        assert_eq!(status, 400, "{query}");
        assert!(body.contains(needle), "{query}: {body}");
    }
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_instance_turns_stale_in_the_list() {
    let fleet =
        Fleet::start(json!({"fleet": {"stale-after": "1s", "sweep-interval": "100ms"}})).await;
    let id = fleet
        .register(json!({"cluster": "fritz", "hostname": "f0101", "serviceType": "ccmc"}))
        .await;
    assert_eq!(
        fleet
            .node_call(reqwest::Method::POST, &format!("/api/fleet/heartbeat/{id}"))
            .await,
        204
    );
    eventually(
        "the instance to go stale",
        Duration::from_secs(20),
        || async {
            let listed = fleet.listed("?state=stale").await;
            listed.len() == 1 && listed[0]["hostname"] == "f0101"
        },
    )
    .await;
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_gives_a_strict_http_only_cookie_and_logout_ends_the_session() {
    let fleet = Fleet::start(json!({"trusted-proxies": ["127.0.0.1"]})).await;
    let origin = fleet.origin();

    let page = fleet.client.get(fleet.url("/fleet/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    assert_eq!(page.headers()["location"], "/fleet/login");
    let (status, _) = fleet.page_data("").await;
    assert_eq!(status, 401);

    let token = fleet.token(&["admin", "api"]);
    let response = fleet.login(&token, &[("origin", &origin)]).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/fleet/");
    let cookies: Vec<&str> = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let cookie = cookies[0];
    let attributes: Vec<&str> = cookie.split("; ").collect();
    let (name, id) = attributes[0].split_once('=').unwrap();
    assert_eq!(name, "ccfleet_session");
    assert_eq!(id.len(), 64, "a random session id: {cookie}");
    assert!(!cookie.contains(&token) && !cookie.contains(token.split('.').nth(2).unwrap()));
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/fleet"] {
        assert!(
            attributes.contains(&attribute),
            "{attribute} missing: {cookie}"
        );
    }
    assert!(
        !attributes.contains(&"Secure"),
        "plain HTTP: no Secure: {cookie}"
    );
    let max_age: i64 = attributes
        .iter()
        .find_map(|a| a.strip_prefix("Max-Age="))
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=8 * 3600).contains(&max_age), "{cookie}");

    let session = attributes[0].to_owned();
    let (status, data) = fleet.page_data(&session).await;
    assert_eq!(status, 200);
    assert_eq!(data["user"], "operator");
    let page = fleet
        .client
        .get(fleet.url("/fleet/"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    assert!(page.text().await.unwrap().contains("/fleet/fleet.js"));
    for asset in ["/fleet/fleet.js", "/fleet/fleet.css"] {
        let response = fleet.client.get(fleet.url(asset)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{asset}");
        assert!(response.headers().contains_key("content-security-policy"));
    }

    // Behind a trusted TLS proxy the cookie is Secure, and the origin is https.
    let host = origin.trim_start_matches("http://");
    let https_origin = format!("https://{host}");
    let response = fleet
        .login(
            &token,
            &[("origin", &https_origin), ("x-forwarded-proto", "https")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let secure = response.headers()["set-cookie"].to_str().unwrap();
    assert!(secure.split("; ").any(|a| a == "Secure"), "{secure}");

    // Logout (same-origin) ends the session on the server, not only in the browser.
    let response = fleet
        .client
        .post(fleet.url("/fleet/logout"))
        .header("cookie", &session)
        .header("origin", &origin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/fleet/login");
    let removal = response.headers()["set-cookie"].to_str().unwrap();
    assert!(
        removal.starts_with("ccfleet_session=;") && removal.contains("Max-Age=0"),
        "{removal}"
    );
    assert_eq!(fleet.page_data(&session).await.0, 401);
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_refuses_other_sites_node_tokens_and_bad_tokens() {
    let fleet = Fleet::start(json!({})).await;
    let origin = fleet.origin();
    let admin = fleet.token(&["admin"]);
    let referer = format!("{origin}/fleet/login");
    let evil_referer = "http://evil.example/fleet/login".to_owned();
    for (what, headers) in [
        ("another origin", vec![("origin", "http://evil.example")]),
        ("another port", vec![("origin", "http://127.0.0.1:1")]),
        ("no origin at all", vec![]),
        ("origin null", vec![("origin", "null")]),
        (
            "a foreign referer",
            vec![("referer", evil_referer.as_str())],
        ),
        (
            "a cross-site fetch",
            vec![
                ("origin", origin.as_str()),
                ("sec-fetch-site", "cross-site"),
            ],
        ),
    ] {
        let response = fleet.login(&admin, &headers).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{what}");
        assert!(!response.headers().contains_key("set-cookie"), "{what}");
    }
    // A same-origin Referer stands in for a missing Origin.
    let response = fleet.login(&admin, &[("referer", &referer)]).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);

    let response = fleet.login(&fleet.node, &[("origin", &origin)]).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(!response.headers().contains_key("set-cookie"));
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("lacks the admin or support role")
    );
    let response = fleet.login("not-a-token", &[("origin", &origin)]).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(!response.headers().contains_key("set-cookie"));
    let response = fleet.login("", &[("origin", &origin)]).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // A cross-site logout does not end the session.
    let session = fleet.session().await;
    let response = fleet
        .client
        .post(fleet.url("/fleet/logout"))
        .header("cookie", &session)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(fleet.page_data(&session).await.0, 200);
    // The login page itself carries no token and is not cached.
    let page = fleet
        .client
        .get(fleet.url("/fleet/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.headers()["cache-control"], "no-store");
    assert!(page.text().await.unwrap().contains("method=\"post\""));
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_the_page_needs_no_login() {
    let server = start(json!({"disable-authentication": true})).await;
    let client = http();
    let data: Value = client
        .get(format!("{}/fleet/status.json", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(data["user"], Value::Null);
    assert_eq!(data["instances"], json!([]));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_data_shows_rosters_and_counts_each_plugin_version_served() {
    let tree = tempfile::tempdir().unwrap();
    let plugins = |sha: &str| {
        json!({"plugins": [{"name": "loadavg", "sha256": sha}, {"name": "local", "path": "/x.wasm"}]})
            .to_string()
    };
    write(tree.path(), "ccmc/fritz/defaults.json", &plugins(SHA_A));
    let fleet = Fleet::start(json!({"fleet": {"config-dir": tree.path()}})).await;
    let backend = fleet
        .register(
            json!({"cluster": "fritz", "hostname": "web1", "serviceType": "ccb",
                         "metaData": {"port": "8080"}}),
        )
        .await;
    assert_eq!(
        fleet
            .node_call(
                reqwest::Method::POST,
                &format!("/api/fleet/heartbeat/{backend}")
            )
            .await,
        204
    );
    let mut nodes = Vec::new();
    for host in ["f0101", "f0102", "f0103"] {
        nodes.push(
            fleet
                .register(json!({"cluster": "fritz", "hostname": host, "serviceType": "ccmc"}))
                .await,
        );
    }
    for id in &nodes[..2] {
        assert_eq!(
            fleet
                .node_call(reqwest::Method::GET, &format!("/api/fleet/config/{id}"))
                .await,
            200
        );
    }
    // The rollout of a new version: the tree names B; one node has pulled it so far.
    write(tree.path(), "ccmc/fritz/defaults.json", &plugins(SHA_B));
    fleet.server.reload_config().await.unwrap();
    assert_eq!(
        fleet
            .node_call(
                reqwest::Method::GET,
                &format!("/api/fleet/config/{}", nodes[0])
            )
            .await,
        200
    );

    let session = fleet.session().await;
    let (status, data) = fleet.page_data(&session).await;
    assert_eq!(status, 200);
    assert_eq!(
        data["rollouts"],
        json!([{"plugin": "loadavg", "versions": [
            {"sha256": SHA_A, "served": 1, "named": 0, "reporting": 0, "running": 0, "failed": 0},
            {"sha256": SHA_B, "served": 1, "named": 3, "reporting": 0, "running": 0, "failed": 0},
        ]}])
    );
    assert_eq!(data["servedUnknown"], 0);
    let rosters = data["rosters"].as_array().unwrap();
    let fritz_ccmc = rosters
        .iter()
        .find(|r| r["bucket"] == "fritz" && r["consumer"] == "ccmc")
        .expect("the roster fritz's collectors are sent");
    assert_eq!(fritz_ccmc["subject"], "cc.fleet.discovery.fritz.ccmc");
    assert_eq!(
        fritz_ccmc["providers"],
        json!([{"type": "ccb", "hostname": "web1", "state": "active", "meta": {"port": "8080"}}])
    );
    assert_eq!(data["instances"].as_array().unwrap().len(), 4);
    fleet.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_view_opened_without_a_session_survives_the_login() {
    let fleet = Fleet::start(json!({})).await;
    let origin = fleet.origin();
    // A colleague's link: the view's keys go to the login form, anything else is dropped,
    // and the values are written anew.
    let page = fleet
        .client
        .get(fleet.url(
            "/fleet/?cluster=fritz&state=stale&host=f%5B0101-0125%5D&sort=name&page=1&next=%2F%2Fevil.example",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    let view = "host=f%5B0101-0125%5D&state=stale&cluster=fritz&sort=name&page=1";
    let login_url = format!("/fleet/login?{view}");
    assert_eq!(page.headers()["location"], login_url.as_str());
    let form = fleet
        .client
        .get(fleet.url(&login_url))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 200);
    assert!(
        !form.text().await.unwrap().contains("action="),
        "the form posts to the URL it was shown at, view and all"
    );
    // The token posted there opens the session and leads back to the view.
    let response = fleet
        .client
        .post(fleet.url(&login_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", &origin)
        .body(format!("token={}", fleet.token(&["support"])))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()["location"],
        format!("/fleet/?{view}").as_str()
    );
    let session = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    // Logged in already, the login form leads to the view too.
    let again = fleet
        .client
        .get(fleet.url("/fleet/login?state=pending"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["location"], "/fleet/?state=pending");
    // A refused token keeps the URL, so the next try still carries the view.
    let refused = fleet
        .client
        .post(fleet.url(&login_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", &origin)
        .body(format!("token={}", fleet.node))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    fleet.server.shutdown().await.unwrap();
}
