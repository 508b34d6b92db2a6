//! The HTTP client tests talk to a fleet server with directly (no proxies from the
//! environment), and the TLS provider reqwest is built to expect.
#![allow(dead_code)]

use std::time::Duration;

/// Installs the TLS provider reqwest is built to expect.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A plain HTTP client (no proxies from the environment, a 10 s timeout).
pub fn http() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}
