//! Discovery rosters between the project's fleet server and client over a real nats-server:
//! signed by the server's key pair, checked by a client configured with its public key,
//! capped in size and provider count, with the roster bytes exactly what cc-lib's Go client
//! decodes, and provider types this version does not know kept whole.

#[path = "support/nats.rs"]
mod nats;
#[path = "support/wait.rs"]
mod wait;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ccfleet::client::{Client, Config, Options, RosterStats};
use ccfleet::server::auth::Keypair;
use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet::wire::{
    Provider, ROSTER_SIGNATURE_HEADER, ServiceType, decode_roster_timed, encode_roster, now_ns,
    roster_signing_input,
};
use futures::StreamExt;
use nats::NatsServer;
use serde_json::json;
use wait::eventually;

const SUBJECT: &str = "cc.fleet.discovery.fritz.ccmc";
const WAIT: Duration = Duration::from_secs(10);
const MAX_BYTES: usize = 64 * 1024;
const MAX_PROVIDERS: usize = 50;

struct Setup {
    nats: NatsServer,
    keys: Keypair,
    token: String,
    server: RunningServer,
    http: reqwest::Client,
}

async fn setup() -> Setup {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nats = NatsServer::start();
    let keys = Keypair::generate();
    let token = keys.sign_token("fleetbot", &["api"], None);
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": keys.public_key_base64(),
        "jwt-private-key": keys.private_key_base64(),
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "300ms", "discovery-debounce": "50ms"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("server starts");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Setup {
        nats,
        keys,
        token,
        server,
        http,
    }
}

impl Setup {
    async fn connect(&self) -> async_nats::Client {
        async_nats::connect(self.nats.url()).await.unwrap()
    }

    /// A ccmc member on fritz; `signed` configures the server's public key.
    async fn member(&self, host: &str, signed: bool) -> Client {
        let mut config = Config::new(self.server.base_url());
        config.token = self.token.clone();
        config.cluster = "fritz".into();
        config.hostname = host.into();
        config.heartbeat_interval = Duration::from_secs(3600);
        config.config_poll_interval = Duration::from_secs(3600);
        config.roster_max_bytes = MAX_BYTES;
        config.roster_max_providers = MAX_PROVIDERS;
        if signed {
            config.roster_public_key = self.keys.public_key_base64();
        }
        let nats = self.connect().await;
        let mut options = Options::new(config, ServiceType::MetricCollector);
        options.nats = Some(Arc::new(move || Some(nats.clone())));
        let client = Client::new(options).unwrap();
        let runner = client.clone();
        tokio::spawn(async move { runner.run().await });
        client
    }

    /// Registers an infra-scope cc-backend and makes it active.
    async fn activate_backend(&self, host: &str) {
        let response = self
            .http
            .post(format!(
                "{}/api/fleet/register/infra/",
                self.server.base_url()
            ))
            .header("X-Auth-Token", &self.token)
            .json(&json!({"hostname": host, "serviceType": "ccb"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let id = response.json::<serde_json::Value>().await.unwrap()["instanceId"]
            .as_str()
            .unwrap()
            .to_owned();
        let status = self
            .http
            .post(format!(
                "{}/api/fleet/heartbeat/{id}",
                self.server.base_url()
            ))
            .header("X-Auth-Token", &self.token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204);
    }
}

fn backend(host: &str, meta: &[(&str, &str)]) -> Provider {
    Provider {
        service_type: ServiceType::Backend.into(),
        hostname: host.into(),
        state: "active".into(),
        meta: meta
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn roster(providers: &[Provider]) -> Vec<u8> {
    encode_roster("fritz", ServiceType::MetricCollector, providers, now_ns()).unwrap()
}

fn signature(keys: &Keypair, subject: &str, payload: &[u8]) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    let signature = keys.sign(&roster_signing_input(subject, payload));
    headers.insert(ROSTER_SIGNATURE_HEADER, STANDARD.encode(signature).as_str());
    headers
}

/// Waits for a delivered roster that lists `host`.
async fn roster_listing(client: &Client, host: &str) -> Vec<Provider> {
    let mut rosters = client.rosters();
    tokio::time::timeout(WAIT, async {
        loop {
            let providers = rosters.recv().await.expect("client open");
            if providers.iter().any(|p| p.hostname == host) {
                return providers;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no roster listing {host}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_server_key_accepts_signed_rosters_and_rejects_injected_ones() {
    let setup = setup().await;
    let member = setup.member("f0101", true).await;
    let watcher = setup.connect().await;
    let mut genuine = watcher.subscribe(SUBJECT).await.unwrap();
    watcher.flush().await.unwrap();
    setup.activate_backend("mgmt01").await;

    // Signed rosters are accepted.
    let providers = roster_listing(&member, "mgmt01").await;
    assert_eq!(providers.len(), 1);

    // A genuine message, as every subscriber sees it: signature in a header, and the bytes
    // exactly the plain roster line (what cc-lib's Go client decodes).
    let original = tokio::time::timeout(WAIT, async {
        loop {
            let message = genuine.next().await.unwrap();
            let (time, providers) = decode_roster_timed(&message.payload).unwrap();
            if !providers.is_empty() {
                return (message, time, providers);
            }
        }
    })
    .await
    .expect("a genuine roster listing the backend");
    let (message, time, providers) = original;
    let plain = encode_roster("fritz", ServiceType::MetricCollector, &providers, time).unwrap();
    assert_eq!(
        message.payload.as_ref(),
        plain.as_slice(),
        "roster bytes unchanged"
    );
    let headers = message.headers.clone().expect("a signature header");
    assert!(headers.get(ROSTER_SIGNATURE_HEADER).is_some());

    // Let the member accept a newer roster, so the captured one is old news.
    // (The captured one itself may be among the next accepted, hence two.)
    let accepted = member.roster_stats().accepted;
    eventually("a newer roster accepted", WAIT, || async {
        member.roster_stats().accepted > accepted + 1
    })
    .await;

    let attacker = setup.connect().await;
    let evil = [backend("evil01", &[])];
    // Unsigned.
    attacker
        .publish(SUBJECT, roster(&evil).into())
        .await
        .unwrap();
    // Signed with another key.
    let payload = roster(&evil);
    let forged = signature(&Keypair::generate(), SUBJECT, &payload);
    attacker
        .publish_with_headers(SUBJECT, forged, payload.into())
        .await
        .unwrap();
    // A genuine signature on altered bytes.
    let tampered = String::from_utf8(message.payload.to_vec())
        .unwrap()
        .replace("mgmt01", "evil01");
    attacker
        .publish_with_headers(SUBJECT, headers.clone(), tampered.into_bytes().into())
        .await
        .unwrap();
    // The genuine, older message replayed.
    attacker
        .publish_with_headers(SUBJECT, headers, message.payload.clone())
        .await
        .unwrap();
    // Validly signed but beyond the caps: too large, too many providers.
    let huge = roster(&[backend("evil01", &[("pad", &"x".repeat(MAX_BYTES))])]);
    let signed = signature(&setup.keys, SUBJECT, &huge);
    attacker
        .publish_with_headers(SUBJECT, signed, huge.into())
        .await
        .unwrap();
    let many: Vec<Provider> = (0..=MAX_PROVIDERS)
        .map(|i| backend(&format!("evil{i:02}"), &[]))
        .collect();
    let many = roster(&many);
    let signed = signature(&setup.keys, SUBJECT, &many);
    attacker
        .publish_with_headers(SUBJECT, signed, many.into())
        .await
        .unwrap();
    attacker.flush().await.unwrap();

    eventually("every injection rejected and counted", WAIT, || async {
        let stats = member.roster_stats();
        stats.bad_signature == 3
            && stats.stale == 1
            && stats.too_large == 1
            && stats.too_many_providers == 1
    })
    .await;
    let RosterStats {
        accepted,
        malformed,
        ..
    } = member.roster_stats();
    assert!(accepted >= 2);
    assert_eq!(malformed, 0);
    // Whatever the member delivers now still comes from the server.
    let mut rosters = member.rosters();
    let latest = tokio::time::timeout(WAIT, rosters.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest, providers);
    member.close(Duration::from_secs(5)).await.unwrap();
    setup.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_key_takes_signed_and_unsigned_rosters_and_unknown_types_whole() {
    let setup = setup().await;
    let member = setup.member("f0102", false).await;
    let strict = setup.member("f0103", true).await;
    setup.activate_backend("mgmt01").await;
    // The signature header does not disturb a member that does not check it.
    roster_listing(&member, "mgmt01").await;
    roster_listing(&strict, "mgmt01").await;

    // A roster from a newer server, with a provider type this version does not know.
    let publisher = setup.connect().await;
    let newer = br#"fleetdiscovery,cluster=fritz,type=ccmc event="[{\"type\":\"ccb\",\"hostname\":\"mgmt01\",\"state\":\"active\"},{\"type\":\"cc-quantum\",\"hostname\":\"q1\",\"state\":\"active\"}]" 1734000000000000000
"#;
    let mut rosters = member.rosters();
    let providers = tokio::time::timeout(WAIT, async {
        loop {
            // Re-sent until it is seen: the server's own rosters keep replacing it.
            publisher
                .publish(SUBJECT, newer.to_vec().into())
                .await
                .unwrap();
            if let Ok(Some(providers)) =
                tokio::time::timeout(Duration::from_millis(100), rosters.recv()).await
                && providers.iter().any(|p| p.hostname == "q1")
            {
                return providers;
            }
        }
    })
    .await
    .expect("the roster with the unknown type delivered");
    assert_eq!(providers.len(), 2, "nothing skipped");
    assert_eq!(providers[0].service_type, ServiceType::Backend);
    assert_eq!(providers[1].service_type.code(), "cc-quantum");
    assert_eq!(providers[1].service_type.known(), None);
    assert_eq!(member.roster_stats().malformed, 0);
    // The member with the key refuses the unsigned roster.
    eventually("the unsigned roster refused", WAIT, || async {
        strict.roster_stats().bad_signature >= 1
    })
    .await;
    member.close(Duration::from_secs(5)).await.unwrap();
    strict.close(Duration::from_secs(5)).await.unwrap();
    setup.server.shutdown().await.unwrap();
}

/// The nats-server `authorization` block the book recommends, with passwords filled in.
fn documented_permissions() -> String {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/security/rosters.md"
    ))
    .expect("docs/src/security/rosters.md");
    let start = readme
        .find("```text\nauthorization {")
        .expect("the book documents NATS permissions")
        + "```text\n".len();
    let end = start + readme[start..].find("```").expect("end of the block");
    readme[start..end]
        .replace("$SERVER_PASSWORD", "\"pw-server\"")
        .replace("$AGENT_PASSWORD", "\"pw-agent\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_nats_permissions_let_only_the_server_publish_rosters() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nats = NatsServer::start_with_config(&documented_permissions());
    let config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "nats": {"address": nats.url(), "username": "ccfleet-server", "password": "pw-server"},
        "fleet": {"heartbeat-subject": "cc.fleet.event", "discovery-interval": "200ms"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("server starts");
    let agent = |errors: Option<Arc<std::sync::Mutex<Vec<String>>>>| {
        let url = nats.url();
        async move {
            let mut options = async_nats::ConnectOptions::with_user_and_password(
                "ccfleet-agent".into(),
                "pw-agent".into(),
            );
            if let Some(errors) = errors {
                options = options.event_callback(move |event| {
                    let errors = errors.clone();
                    async move {
                        if let async_nats::Event::ServerError(e) = event {
                            errors.lock().unwrap().push(e.to_string());
                        }
                    }
                });
            }
            options.connect(url).await.unwrap()
        }
    };
    let subject = "cc.fleet.discovery.infra.ccmc";
    let watcher = agent(None).await;
    let mut rosters = watcher.subscribe(subject).await.unwrap();
    watcher.flush().await.unwrap();
    // The server's rosters arrive.
    let first = tokio::time::timeout(WAIT, rosters.next())
        .await
        .expect("a roster from the server")
        .unwrap();
    assert!(decode_roster_timed(&first.payload).is_ok());

    // An agent's roster is refused by NATS and reaches nobody.
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attacker = agent(Some(errors.clone())).await;
    attacker
        .publish(subject, roster(&[backend("evil01", &[])]).into())
        .await
        .unwrap();
    attacker.flush().await.unwrap();
    eventually("NATS refuses the agent's publish", WAIT, || async {
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("Permissions Violation for Publish"))
    })
    .await;
    // Heartbeats stay allowed.
    attacker
        .publish(
            "cc.fleet.event",
            "fleet,function=heartbeat event=\"{}\" 1".into(),
        )
        .await
        .unwrap();
    attacker.flush().await.unwrap();
    for _ in 0..3 {
        let message = tokio::time::timeout(WAIT, rosters.next())
            .await
            .expect("server rosters keep coming")
            .unwrap();
        let (_, providers) = decode_roster_timed(&message.payload).unwrap();
        assert!(providers.iter().all(|p| p.hostname != "evil01"));
    }
    eventually("the heartbeat received by the server", WAIT, || async {
        server.heartbeat_stats().messages == 1
    })
    .await;
    let refused = errors.lock().unwrap().clone();
    assert_eq!(refused.len(), 1, "{refused:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_private_key_of_another_pair_than_the_public_key_is_refused_at_start() {
    let (public, private) = (Keypair::generate(), Keypair::generate());
    let config = json!({
        "addr": "127.0.0.1:0",
        "jwt-public-key": public.public_key_base64(),
        "jwt-private-key": private.private_key_base64(),
    });
    let err = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("jwt-private-key"), "{err}");
    assert!(!err.to_string().contains(&private.private_key_base64()));
    let config = json!({"addr": "127.0.0.1:0", "disable-authentication": true,
                        "jwt-private-key": "bm90IGEga2V5"});
    let err = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("JWT private key"), "{err}");
}
