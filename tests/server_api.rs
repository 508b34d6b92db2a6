//! REST behaviour of the fleet server against cc-backend's own test list, over real sockets.
#![cfg(all(feature = "server", feature = "client"))]

mod server_common;

use std::time::Duration;

use ccfleet::server::auth::Keypair;
use ccfleet::server::registry::State;
use ccfleet::server::{ServerConfig, ServerError};
use ccfleet::wire::Scope;
use serde_json::{Value, json};
use server_common::*;

const FRITZ_CCMC: &str = r#"{"cluster":"fritz","hostname":"f0101","serviceType":"ccmc"}"#;

fn tree_with_defaults() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "defaults.json",
        r#"{"log-level":"info","interval":"10s"}"#,
    );
    write(dir.path(), "ccmc/fritz/f0101.json", r#"{"interval":"5s"}"#);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle() {
    let tree = tree_with_defaults();
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path()}
    }))
    .await;
    let client = http();

    let response = client
        .post(format!("{}/api/fleet/register/cluster/", server.base_url()))
        .body(FRITZ_CCMC)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["content-type"], "application/json");
    let text = response.text().await.unwrap();
    assert!(text.ends_with('\n'));
    let reg: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        reg["configRevision"], 0,
        "a fresh registration has revision 0"
    );
    let id = reg["instanceId"].as_str().unwrap().to_owned();
    assert!(ccfleet::wire::is_instance_id(&id));
    assert_eq!(server.registry().lookup(&id).unwrap().state, State::Pending);

    let response = pull(&client, &server, &id, None).await;
    assert_eq!(response.status(), 200);
    let revision = response.headers()["x-cc-config-revision"]
        .to_str()
        .unwrap()
        .to_owned();
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, format!("\"{revision}\""));
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"interval":"5s","log-level":"info"}"#
    );
    let rev: i64 = revision.parse().unwrap();
    assert!(rev > 0);
    assert_eq!(
        server.registry().lookup(&id).unwrap().config_revision,
        rev,
        "the pull acknowledged the revision"
    );

    for tag in [
        etag.as_str(),
        &format!("W/{etag}"),
        "*",
        &format!("\"1\", {etag}"),
    ] {
        let response = pull(&client, &server, &id, Some(tag)).await;
        assert_eq!(response.status(), 304, "If-None-Match {tag}");
        assert_eq!(response.headers()["etag"], etag.as_str());
        assert!(response.bytes().await.unwrap().is_empty());
    }
    let response = pull(&client, &server, &id, Some("\"12345\"")).await;
    assert_eq!(response.status(), 200, "a stale ETag gets the config");

    assert_eq!(heartbeat(&client, &server, &id).await, 204);
    assert_eq!(server.registry().lookup(&id).unwrap().state, State::Active);

    assert_eq!(deregister(&client, &server, &id).await, 204);
    assert_eq!(deregister(&client, &server, &id).await, 204);
    assert_eq!(
        server.registry().lookup(&id).unwrap().state,
        State::Deregistered
    );
    assert_eq!(heartbeat(&client, &server, &id).await, 404);
    let response = pull(&client, &server, &id, None).await;
    assert_eq!(response.status(), 404);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(
        response.text().await.unwrap(),
        "{\"status\":\"Not Found\",\"error\":\"unknown or deregistered instance id\"}\n",
        "cc-backend's ErrorResponse, field order included"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infra_scope_and_reregistration() {
    let tree = tempfile::tempdir().unwrap();
    write(tree.path(), "ccb/mgmt01.json", r#"{"port":8080}"#);
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path()}
    }))
    .await;
    let client = http();
    let body = r#"{"hostname":"mgmt01","serviceType":"ccb","metaData":{"port":"8080"}}"#;
    let first = register_ok(&client, &server, "infra", body).await;
    let svc = server.registry().lookup(&first).unwrap();
    assert_eq!((svc.scope, svc.cluster.as_str()), (Scope::Infra, ""));
    assert_eq!(svc.meta["port"], "8080");
    let response = pull(&client, &server, &first, None).await;
    assert_eq!(response.status(), 200);
    let rev: i64 = response.headers()["x-cc-config-revision"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(response.text().await.unwrap(), r#"{"port":8080}"#);

    let (status, json) = register(&client, &server, "infra", body, None).await;
    assert_eq!(status, 201);
    let second = json["instanceId"].as_str().unwrap();
    assert_ne!(second, first, "re-registration issues a new id");
    assert_eq!(
        json["configRevision"], rev,
        "and reports the acknowledged revision"
    );
    assert_eq!(
        heartbeat(&client, &server, &first).await,
        404,
        "the old id is dead"
    );
    assert_eq!(heartbeat(&client, &server, second).await, 204);

    let (status, json) = register(
        &client,
        &server,
        "infra",
        r#"{"cluster":"fritz","hostname":"mgmt01","serviceType":"ccb"}"#,
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        json["error"],
        "cluster must be empty for infra registration"
    );
    server.shutdown().await.unwrap();
}

/// A 413 leaves the rest of the body unread, so the connection cannot be reused; without
/// `Connection: close` a pooling client raced the server's close on its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_closes_its_connection_and_the_next_request_succeeds() {
    let server = start(json!({"disable-authentication": true})).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let big = format!(
        r#"{{"cluster":"c","hostname":"h","serviceType":"ccmc","metaData":{{"x":"{}"}}}}"#,
        "a".repeat(2 << 20)
    );
    for _ in 0..5 {
        let response = client
            .post(format!("{}/api/fleet/register/cluster/", server.base_url()))
            .header("content-type", "application/json")
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(
            response.headers().get("connection").map(|v| v.as_bytes()),
            Some(&b"close"[..])
        );
        let next = client
            .get(format!("{}/api/fleet/nothing", server.base_url()))
            .send()
            .await
            .expect("the request after a 413 gets a fresh connection");
        assert_eq!(next.status(), 404);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests() {
    let server = start(json!({"disable-authentication": true})).await;
    let client = http();
    let cases = [
        (
            r#"{"hostname":"h","serviceType":"ccmc"}"#,
            Some("cluster is required"),
        ),
        (
            r#"{"cluster":"c","serviceType":"ccmc"}"#,
            Some("hostname is required"),
        ),
        (
            r#"{"cluster":"c","hostname":"h","serviceType":"zzz"}"#,
            Some(r#"unknown serviceType "zzz""#),
        ),
        (
            r#"{"cluster":"c","hostname":"h"}"#,
            Some(r#"unknown serviceType """#),
        ),
        (
            r#"{"cluster":"c","hostname":"../etc","serviceType":"ccmc"}"#,
            None,
        ),
        (
            r#"{"cluster":"../etc","hostname":"h","serviceType":"ccmc"}"#,
            None,
        ),
        (
            r#"{"cluster":"c","hostname":"a/b","serviceType":"ccmc"}"#,
            None,
        ),
        (
            r#"{"cluster":"c","hostname":".","serviceType":"ccmc"}"#,
            None,
        ),
        (
            r#"{"cluster":"c","hostname":"h","serviceType":"ccmc","bogus":1}"#,
            None,
        ),
        (
            r#"{"cluster":"c","hostname":"h","serviceType":"ccmc","metaData":{"a":1}}"#,
            None,
        ),
        ("{", None),
        ("", None),
        ("[]", None),
    ];
    for (body, message) in cases {
        let (status, json) = register(&client, &server, "cluster", body, None).await;
        assert_eq!(status, 400, "body {body}");
        assert_eq!(json["status"], "Bad Request");
        let error = json["error"].as_str().unwrap();
        assert!(!error.is_empty(), "body {body}");
        if let Some(message) = message {
            assert_eq!(error, message);
        }
    }
    assert_eq!(server.registry().counts().pending, 0);

    // FQDN hostnames are fine.
    register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"c","hostname":"h1.example.org","serviceType":"ccmc"}"#,
    )
    .await;

    for bad in [
        "3F1C9A2B7D4E6F8A0B1C2D3E4F5A6B7C",
        "3f1c9a2b",
        "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7g",
        "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c0",
    ] {
        assert_eq!(heartbeat(&client, &server, bad).await, 400);
        assert_eq!(deregister(&client, &server, bad).await, 400);
        let response = pull(&client, &server, bad, None).await;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"], "malformed instance id");
    }
    let unknown = "0123456789abcdef0123456789abcdef";
    assert_eq!(heartbeat(&client, &server, unknown).await, 404);
    assert_eq!(pull(&client, &server, unknown, None).await.status(), 404);
    assert_eq!(deregister(&client, &server, unknown).await, 204);

    let big = format!(
        r#"{{"cluster":"c","hostname":"h","serviceType":"ccmc","metaData":{{"x":"{}"}}}}"#,
        "a".repeat(2 << 20)
    );
    let (status, json) = register(&client, &server, "cluster", &big, None).await;
    assert_eq!(status, 413);
    assert_eq!(json["status"], "Request Entity Too Large");

    let response = client
        .get(format!("{}/api/fleet/nothing", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "Resource not found");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_config_answers_204_without_etag() {
    let client = http();
    // No config-dir at all.
    let server = start(json!({"disable-authentication": true})).await;
    let id = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let response = pull(&client, &server, &id, None).await;
    assert_eq!(response.status(), 204);
    assert!(response.headers().get("etag").is_none());
    assert!(response.headers().get("x-cc-config-revision").is_none());
    server.shutdown().await.unwrap();

    // A tree where no layer applies to this member.
    let tree = tempfile::tempdir().unwrap();
    write(tree.path(), "ccms/defaults.json", r#"{"a":1}"#);
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path()}
    }))
    .await;
    let id = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let response = pull(&client, &server, &id, None).await;
    assert_eq!(response.status(), 204);
    assert!(response.headers().get("etag").is_none());
    server.shutdown().await.unwrap();
}

async fn metrics_text(client: &reqwest::Client, server: &ccfleet::server::RunningServer) -> String {
    let response = client
        .get(format!("{}/metrics", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_roles_and_allowlist() {
    let keys = Keypair::generate();
    let server = start(json!({
        "jwt-public-key": keys.public_key_base64(),
        "api-allowed-ips": ["127.0.0.0/8", "::1"],
    }))
    .await;
    let client = http();
    let url = format!("{}/api/fleet/register/cluster/", server.base_url());
    let try_token = |header: &'static str, value: String| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let response = client
                .post(&url)
                .header(header, value)
                .body(FRITZ_CCMC)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let token = |roles: &[&str]| keys.sign_token("fleetbot", roles, Some(Duration::from_secs(600)));

    let (status, body) = try_token("x-none", String::new()).await;
    assert_eq!(status, 401);
    assert_eq!(body["status"], "Unauthorized");
    // An authenticated user without the role is forbidden (403, as cc-backend documents
    // it), not unauthenticated.
    for roles in [&["user"][..], &["admin"], &["user", "api"], &[]] {
        let (status, body) = try_token("X-Auth-Token", token(roles)).await;
        assert_eq!(status, 403, "roles {roles:?}");
        assert_eq!(body["status"], "Forbidden");
        assert_eq!(body["error"], "missing role: api");
    }
    let (status, _) = try_token("X-Auth-Token", token(&["api"])).await;
    assert_eq!(status, 201);
    let (status, _) = try_token(
        "Authorization",
        format!("Bearer {}", token(&["admin", "api"])),
    )
    .await;
    assert_eq!(status, 201);

    let forged = Keypair::generate().sign_token("fleetbot", &["api"], None);
    let (status, body) = try_token("X-Auth-Token", forged.clone()).await;
    assert_eq!(status, 401);
    assert!(!body["error"].as_str().unwrap().contains(&forged[..20]));
    let expired = keys.sign_token("fleetbot", &["api"], Some(Duration::ZERO));
    let (status, body) = try_token("X-Auth-Token", expired).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("token is expired"))
    );
    let (status, _) = try_token("X-Auth-Token", "not.a.token".into()).await;
    assert_eq!(status, 401);

    // Health and metrics stay open.
    let health = client
        .get(format!("{}/healthz", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Every refusal is counted by its reason, so an operator sees a misconfigured fleet.
    let metrics = metrics_text(&client, &server).await;
    for line in [
        "ccfleet_api_refused_total{reason=\"token\"} 4\n",
        "ccfleet_api_refused_total{reason=\"role\"} 4\n",
        "ccfleet_api_refused_total{reason=\"allowlist\"} 0\n",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    server.shutdown().await.unwrap();

    // A list that excludes the loopback peer: proxy headers from it are not believed, as
    // any client can send them.
    let server = start(json!({
        "disable-authentication": true,
        "api-allowed-ips": ["10.0.0.0/8"],
    }))
    .await;
    let url = format!("{}/api/fleet/register/cluster/", server.base_url());
    let send = |header: Option<(&'static str, &'static str)>| {
        let mut request = client.post(&url).body(FRITZ_CCMC);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(send(None).await, 401);
    assert_eq!(send(Some(("X-Real-Ip", "10.20.30.40"))).await, 401);
    assert_eq!(
        send(Some(("X-Forwarded-For", "10.1.1.1, 192.168.0.1"))).await,
        401
    );
    let metrics = metrics_text(&client, &server).await;
    assert!(
        metrics.contains("ccfleet_api_refused_total{reason=\"allowlist\"} 3\n"),
        "{metrics}"
    );
    server.shutdown().await.unwrap();

    // The same list behind a proxy on loopback listed in trusted-proxies.
    let server = start(json!({
        "disable-authentication": true,
        "api-allowed-ips": ["10.0.0.0/8"],
        "trusted-proxies": ["127.0.0.0/8", "::1"],
    }))
    .await;
    let url = format!("{}/api/fleet/register/cluster/", server.base_url());
    let send = |header: Option<(&'static str, &'static str)>| {
        let mut request = client.post(&url).body(FRITZ_CCMC);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(send(None).await, 401, "the proxy itself is not allowed");
    assert_eq!(send(Some(("X-Real-Ip", "10.20.30.40"))).await, 201);
    assert_eq!(
        send(Some(("X-Forwarded-For", "192.168.0.1, 10.1.1.1"))).await,
        201
    );
    assert_eq!(
        send(Some(("X-Forwarded-For", "10.1.1.1, 192.168.0.1"))).await,
        401,
        "the right-most untrusted hop is the client; what it claims to forward is not believed"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_without_key_or_with_broken_tree() {
    let config = ServerConfig::from_json(
        r#"{"addr":"127.0.0.1:0","jwt-public-key":"","disable-authentication":false}"#,
    )
    .unwrap();
    // The environment may carry a key; only assert the refusal when it does not.
    if std::env::var_os("JWT_PUBLIC_KEY").is_none() {
        assert!(matches!(
            ccfleet::server::start(config).await,
            Err(ServerError::NoPublicKey)
        ));
    }
    let config =
        ServerConfig::from_json(r#"{"addr":"127.0.0.1:0","jwt-public-key":"c2hvcnQ="}"#).unwrap();
    assert!(matches!(
        ccfleet::server::start(config).await,
        Err(ServerError::Key(_))
    ));

    let tree = tempfile::tempdir().unwrap();
    write(tree.path(), "ccmc/defaults.json", r#"{"a": "#);
    let config = ServerConfig::from_json(
        &json!({"addr": "127.0.0.1:0", "disable-authentication": true,
                "fleet": {"config-dir": tree.path()}})
        .to_string(),
    )
    .unwrap();
    let err = ccfleet::server::start(config).await.unwrap_err();
    assert!(matches!(err, ServerError::ConfigTree(_)), "{err}");
    assert!(err.to_string().contains("ccmc/defaults.json"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_tree_edits() {
    let tree = tree_with_defaults();
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path(), "config-reload-interval": "1h"}
    }))
    .await;
    let client = http();
    let id = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let first = pull(&client, &server, &id, None).await;
    let etag1 = first.headers()["etag"].to_str().unwrap().to_owned();

    // A cosmetic edit (spacing, key order) keeps the revision.
    write(
        tree.path(),
        "defaults.json",
        "{\n  \"interval\": \"10s\",\n  \"log-level\": \"info\"\n}\n",
    );
    server.reload_config().await.unwrap();
    let response = pull(&client, &server, &id, Some(&etag1)).await;
    assert_eq!(response.status(), 304);

    // A real edit changes body and revision.
    write(
        tree.path(),
        "ccmc/defaults.json",
        r#"{"collectors":["cpustat"],"log-level":"debug"}"#,
    );
    server.reload_config().await.unwrap();
    let response = pull(&client, &server, &id, Some(&etag1)).await;
    assert_eq!(response.status(), 200);
    let etag2 = response.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(etag2, etag1);
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"collectors":["cpustat"],"interval":"5s","log-level":"debug"}"#
    );

    // A broken edit is refused and the last good generation keeps being served.
    write(tree.path(), "ccmc/fritz/f0101.json", r#"{"interval": "#);
    assert!(matches!(
        server.reload_config().await,
        Err(ServerError::ConfigTree(_))
    ));
    let response = pull(&client, &server, &id, Some(&etag2)).await;
    assert_eq!(response.status(), 304);
    // Non-object layers are broken too.
    write(tree.path(), "ccmc/fritz/f0101.json", r#"["interval"]"#);
    assert!(server.reload_config().await.is_err());
    assert_eq!(
        pull(&client, &server, &id, Some(&etag2)).await.status(),
        304
    );
    server.shutdown().await.unwrap();

    // The periodic reload picks up edits by itself.
    write(tree.path(), "ccmc/fritz/f0101.json", r#"{"interval":"1s"}"#);
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path(), "config-reload-interval": "100ms"}
    }))
    .await;
    let id = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let etag = pull(&client, &server, &id, None).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    write(
        tree.path(),
        "ccmc/fritz/f0101.json",
        r#"{"interval":"20s"}"#,
    );
    eventually("the periodic reload", Duration::from_secs(10), || {
        let (client, server, id, etag) = (&client, &server, &id, &etag);
        async move { pull(client, server, id, Some(etag)).await.status() == 200 }
    })
    .await;
    let body = pull(&client, &server, &id, None)
        .await
        .text()
        .await
        .unwrap();
    assert!(body.contains(r#""interval":"20s""#), "{body}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_state() {
    let dir = tempfile::tempdir().unwrap();
    let tree = tree_with_defaults();
    let config = json!({
        "disable-authentication": true,
        "db": dir.path().join("fleet.sqlite"),
        "fleet": {"config-dir": tree.path()}
    });
    let client = http();
    let server = start(config.clone()).await;
    let live = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let gone = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01","serviceType":"ccb"}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &live).await, 204);
    let etag = pull(&client, &server, &live, None).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(deregister(&client, &server, &gone).await, 204);
    server.shutdown().await.unwrap();

    let server = start(config).await;
    let svc = server.registry().lookup(&live).unwrap();
    assert_eq!(svc.state, State::Active);
    assert!(svc.last_heartbeat.is_some());
    assert_eq!(format!("\"{}\"", svc.config_revision), etag);
    assert_eq!(
        pull(&client, &server, &live, Some(&etag)).await.status(),
        304
    );
    assert_eq!(heartbeat(&client, &server, &live).await, 204);
    assert_eq!(heartbeat(&client, &server, &gone).await, 404);
    let (status, json) = register(&client, &server, "cluster", FRITZ_CCMC, None).await;
    assert_eq!(status, 201);
    assert_eq!(
        format!("\"{}\"", json["configRevision"]),
        etag,
        "the acknowledged revision survived"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sweep_and_metrics() {
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"stale-after": "1s", "sweep-interval": "100ms"}
    }))
    .await;
    let client = http();
    let id = register_ok(&client, &server, "cluster", FRITZ_CCMC).await;
    let pending = register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"fritz","hostname":"f0102","serviceType":"ccmc"}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &id).await, 204);
    eventually("the stale sweep", Duration::from_secs(10), || async {
        server.registry().lookup(&id).unwrap().state == State::Stale
    })
    .await;
    assert_eq!(
        server.registry().lookup(&pending).unwrap().state,
        State::Pending,
        "pending never goes stale"
    );
    assert_eq!(
        heartbeat(&client, &server, &id).await,
        204,
        "a heartbeat revives"
    );
    assert_eq!(server.registry().lookup(&id).unwrap().state, State::Active);

    let text = client
        .get(format!("{}/metrics", server.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("ccfleet_instances{state=\"active\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("ccfleet_instances{state=\"pending\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("ccfleet_heartbeats_total{source=\"rest\",result=\"applied\"} 2\n"),
        "{text}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_beyond_its_cap_is_refused_naming_the_limit() {
    // A member whose metaData made its cluster's rosters bigger than the agents accept
    // used to break the rosters of everyone in its cluster.
    let server = start(json!({"disable-authentication": true})).await;
    let client = http();
    let body = |meta: Value| {
        json!({"cluster": "c", "hostname": "h", "serviceType": "ccmc", "metaData": meta})
            .to_string()
    };
    let huge = body(json!({"x": "a".repeat(1000 * 1000)}));
    let (status, json) = register(&client, &server, "cluster", &huge, None).await;
    assert_eq!(status, 400);
    let error = json["error"].as_str().unwrap();
    assert!(error.contains("limit of 4096"), "{error}");
    assert!(!error.contains("aaaa"), "{error}");

    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    let (status, json) = register(&client, &server, "cluster", &body(many.into()), None).await;
    assert_eq!(status, 400);
    assert!(
        json["error"].as_str().unwrap().contains("limit of 32"),
        "{json}"
    );
    assert_eq!(server.registry().counts().pending, 0);

    register_ok(&client, &server, "cluster", &body(json!({"port": "8080"}))).await;
    server.shutdown().await.unwrap();
}
