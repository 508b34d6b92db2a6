//! Issue 26, one server per SQLite file: two servers opened the same `db` and answered
//! differently (404 on one for an instance registered through the other). A second server
//! on a file in use now refuses to start, naming the file and the process holding it; once
//! the first server stops, the file is free again.

#![cfg(feature = "server")]

// Only `start` is used here.
#[allow(unused_imports)]
#[path = "server_common/mod.rs"]
mod server_common;

use ccfleet::server::{RegistryErrorKind, ServerConfig, ServerError};
use serde_json::json;
use server_common::start;

#[tokio::test]
async fn a_second_server_on_a_database_in_use_refuses_to_start_naming_file_and_holder() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.db");
    let config = json!({"addr": "127.0.0.1:0", "disable-authentication": true, "db": db});
    let first = start(config.clone()).await;

    let second =
        ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap()).await;
    let error = match second {
        Ok(_) => panic!("a second server started on {}", db.display()),
        Err(error) => error,
    };
    let ServerError::Registry(registry_error) = &error else {
        panic!("not a registry error: {error}");
    };
    assert_eq!(registry_error.kind(), RegistryErrorKind::Unavailable);
    let text = error.to_string();
    assert!(text.contains(&db.display().to_string()), "{text}");
    assert!(
        text.contains(&format!("process {}", std::process::id())),
        "{text}"
    );
    assert!(text.contains("fleet.db.lock"), "{text}");
    assert!(text.contains("one server per SQLite file"), "{text}");

    // Another spelling of the same file is the same database.
    let dotted = dir.path().join(".").join("fleet.db");
    let spelled = json!({"addr": "127.0.0.1:0", "disable-authentication": true, "db": dotted});
    assert!(
        ccfleet::server::start(ServerConfig::from_json(&spelled.to_string()).unwrap())
            .await
            .is_err()
    );

    first.shutdown().await.unwrap();
    let again = start(config).await;
    again.shutdown().await.unwrap();
}

#[tokio::test]
async fn servers_on_different_files_or_in_memory_run_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(json!({"disable-authentication": true, "db": dir.path().join("a.db")})).await;
    let b = start(json!({"disable-authentication": true, "db": dir.path().join("b.db")})).await;
    let m1 = start(json!({"disable-authentication": true})).await;
    let m2 = start(json!({"disable-authentication": true})).await;
    for server in [a, b, m1, m2] {
        server.shutdown().await.unwrap();
    }
}
