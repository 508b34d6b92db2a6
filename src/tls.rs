//! TLS for the project's HTTP clients: server certificates verified against the system's
//! trust anchors, read once per process, at the first TLS handshake.
//!
//! reqwest reads every certificate of the system's store (a `stat` and a parse of each file
//! under `/etc/ssl/certs`) whenever a client is built, whether or not it ever speaks TLS.
//! That was the largest part of the agent's start-up CPU on a node, for a fleet URL that is
//! plain `http://` on most clusters, and it was paid once per client (fleet client, rollout
//! downloads, each HTTP sink). [`http_client_builder`] hands reqwest a TLS configuration
//! whose verifier loads the store only when a server first presents a certificate, and
//! shares it between all clients: the same verification (the platform verifier reqwest
//! uses), paid once and only when needed. A store that changes while the process runs is
//! read again by the next process, as before (each client kept the store it was built with).

use std::sync::{Arc, OnceLock};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// A `reqwest` client builder with this module's TLS configuration: certificates checked
/// against the system's store, read at the first handshake of the process.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    // ring as the process's provider too, for whatever else builds a TLS configuration
    // from the default (reqwest is built without a provider of its own).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().tls_backend_preconfigured(client_config().clone())
}

/// The process's TLS client configuration (ring, TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1 by
/// ALPN, the lazily loaded platform verifier).
pub fn client_config() -> &'static rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(LazyPlatformVerifier {
            provider: provider.clone(),
            loaded: OnceLock::new(),
        });
        // The safe default versions of a ring provider always build.
        let mut config = match rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
        {
            Ok(builder) => builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
            Err(_) => rustls::ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        };
        // What reqwest offers when it builds the configuration itself.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    })
}

/// How often the system's store was read in this process (for the tests: at most once).
pub fn store_loads() -> usize {
    STORE_LOADS.load(std::sync::atomic::Ordering::Relaxed)
}

static STORE_LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The platform verifier, created (reading the system's store) at the first certificate to
/// verify. Signatures are checked with the provider's algorithms, which need no store.
#[derive(Debug)]
struct LazyPlatformVerifier {
    provider: Arc<CryptoProvider>,
    loaded: OnceLock<Result<rustls_platform_verifier::Verifier, String>>,
}

impl LazyPlatformVerifier {
    fn verifier(&self) -> Result<&rustls_platform_verifier::Verifier, rustls::Error> {
        self.loaded
            .get_or_init(|| {
                STORE_LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                rustls_platform_verifier::Verifier::new(self.provider.clone())
                    .map_err(|e| format!("cannot read the system's trust anchors: {e}"))
            })
            .as_ref()
            .map_err(|message| rustls::Error::General(message.clone()))
    }
}

impl ServerCertVerifier for LazyPlatformVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn building_clients_reads_no_trust_anchors_and_a_certificate_reads_them_once() {
        for _ in 0..3 {
            http_client_builder().build().unwrap();
        }
        assert_eq!(store_loads(), 0, "a client build read the system's store");
        // The verifier as the configuration holds it (rustls does not hand it out again).
        let verifier = LazyPlatformVerifier {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            loaded: OnceLock::new(),
        };
        // A certificate no system trusts: refused, after the store was read, and only once.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["fleet.example".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let name = ServerName::try_from("fleet.example").unwrap();
        for _ in 0..2 {
            let refused = verifier.verify_server_cert(cert.der(), &[], &name, &[], UnixTime::now());
            assert!(refused.is_err(), "a self-signed certificate passed");
        }
        assert_eq!(store_loads(), 1);
    }
}
