//! NATS credentials carried in the address (`nats://user:password@host`, `nats://token@host`)
//! reach no log line and no error message, even with debug logging (where async-nats prints
//! every server address it tries), and they authenticate as they do with Go's client. Real
//! processes: the project's fleet server and a real nats-server.

#[path = "support/nats.rs"]
mod nats;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ccfleet::nats::NatsConfig;
use ccfleet::server::ServerConfig;
use nats::NatsServer;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// Every log line of this test binary, at debug level and including async-nats's own. A
/// global subscriber: a per-thread one could miss events of callsites first hit elsewhere.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Capture(writer.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        logs
    })
    .clone()
}

fn text(logs: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&logs.lock().unwrap()).into_owned()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn wait_for_log(logs: &Mutex<Vec<u8>>, needle: &str) {
    let deadline = Instant::now() + WAIT;
    while !text(logs).contains(needle) {
        assert!(Instant::now() < deadline, "no log line with {needle:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_nats_address_reaches_no_log_line_even_at_debug_level() {
    let logs = logs();
    let port = closed_port();
    let config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "nats": {"address": format!("nats://ccfleet:pw-in-url-1@127.0.0.1:{port}")}
    });
    // Starts without NATS (it is unreachable) and keeps trying in the background.
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("the server starts while NATS is down");
    wait_for_log(&logs, "NATS unreachable").await;
    // async-nats's own debug line for an attempt, which names the address it tries.
    wait_for_log(&logs, &format!("127.0.0.1:{port}")).await;
    let _ = server.shutdown().await;

    let all = text(&logs);
    assert!(all.contains("attempting connection"), "{all}");
    assert!(!all.contains("pw-in-url-1"), "password logged:\n{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_nats_address_is_refused_without_quoting_its_password() {
    let logs = logs();
    let config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "nats": {"address": "nats://ccfleet:pw-in-url-2@127.0.0.1:notaport"}
    });
    let err = ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect_err("an address without a valid port");
    let shown = err.to_string();
    assert!(shown.starts_with("nats: "), "{shown}");
    assert!(!shown.contains("pw-in-url-2"), "{shown}");
    assert!(!format!("{err:?}").contains("pw-in-url-2"), "{err:?}");
    assert!(!text(&logs).contains("pw-in-url-2"));
}

async fn connected_within(config: &NatsConfig, wait: Duration) -> bool {
    let options = config
        .connect_options("ccfleet-test")
        .await
        .expect("options");
    let client = config.connect(options).await.expect("connect");
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if client.connection_state() == async_nats::connection::State::Connected {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_nats_address_authenticate_as_with_go() {
    let logs = logs();
    let nats = NatsServer::start_with_config(
        r#"authorization { users = [ { user: "cc", password: "pw-in-url-3" } ] }"#,
    );
    let with = |userinfo: &str| NatsConfig {
        address: format!("nats://{userinfo}@127.0.0.1:{}", nats.port()),
        ..NatsConfig::default()
    };
    assert!(connected_within(&with("cc:pw-in-url-3"), WAIT).await);
    // A wrong password in the address does not get in.
    assert!(!connected_within(&with("cc:wrong-pw"), Duration::from_secs(1)).await);
    // The section's own user and password take precedence over the address's.
    let mut both = with("cc:wrong-pw");
    both.username = "cc".into();
    both.password = "pw-in-url-3".into();
    assert!(connected_within(&both, WAIT).await);
    assert!(!text(&logs).contains("pw-in-url-3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_nats_address_authenticates() {
    let nats = NatsServer::start_with_config(r#"authorization { token: "t0ken-in-url" }"#);
    let config = |token: &str| NatsConfig {
        address: format!("nats://{token}@127.0.0.1:{}", nats.port()),
        ..NatsConfig::default()
    };
    assert!(connected_within(&config("t0ken-in-url"), WAIT).await);
    assert!(!connected_within(&config("other-token"), Duration::from_secs(1)).await);
}
