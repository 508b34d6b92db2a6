//! Signed plugin components: a site signs its components with a key it keeps offline
//! (`ccfleet plugin sign`), and an agent with `plugin-public-keys` runs a fleet plugin only
//! when its component carries a valid signature by one of them.
//!
//! The signature is embedded as wasmsign2 embeds it ([`format`](mod@format)): a custom section named
//! `signature` first in the binary, over the SHA-256 of everything after it. The signed file
//! is what the fleet publishes and names by SHA-256; a custom section changes nothing of
//! what the component does, so `ccfleet plugin run` and `check` load signed components as
//! they are. Why not the `wasmsign2` crate itself: it sizes its buffers by the lengths the
//! input claims (a ten-byte section can ask for 4 GiB), and the agent reads these bytes from
//! the fleet; this reader takes nothing it does not have. The format is the same, so either
//! tool verifies what the other signs.

pub mod keys;

/// The signature section's bytes (in the `ccfleet` crate, which the fuzz targets build
/// without the plugin host).
pub use ccfleet::wasm_signature as format;

use ed25519_dalek::Signature as Ed25519Signature;
use sha2::{Digest, Sha256};

pub use keys::{PublicKey, PublicKeys, SecretKey};

/// Why a component's signature does not let it run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a WebAssembly binary at all.
    #[error("it is not a WebAssembly module or component")]
    NotWasm,
    /// No `signature` section, or one without a signature.
    #[error("it is not signed")]
    Unsigned,
    /// The `signature` section cannot be read.
    #[error("its signature section is malformed: {0}")]
    Malformed(String),
    /// Signed, but by no configured key (or the signature itself was altered).
    #[error(
        "its signature is by none of this node's plugin-public-keys (another key signed it, or the signature was altered)"
    )]
    UntrustedKey,
    /// A configured key signed a hash, but the component's content no longer has it.
    #[error("it was modified after it was signed (its content does not match the signed hash)")]
    Modified,
}

impl Refusal {
    /// The `result` label of `ccfleet_agent_plugin_rollouts_total` for this refusal.
    pub fn result(&self) -> &'static str {
        match self {
            Refusal::NotWasm | Refusal::Malformed(_) => "signature_malformed",
            Refusal::Unsigned => "unsigned",
            Refusal::UntrustedKey => "signature_untrusted",
            Refusal::Modified => "signature_mismatch",
        }
    }
}

/// Why a component could not be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot sign it: {0}")]
pub struct SignError(String);

/// Checks that `binary` carries a signature by one of `keys` over its content.
pub fn verify(binary: &[u8], keys: &PublicKeys) -> Result<(), Refusal> {
    let split = format::split(binary).map_err(|e| match e {
        format::FormatError::NotWasm => Refusal::NotWasm,
        other => Refusal::Malformed(other.to_string()),
    })?;
    let Some(payload) = split.signature else {
        return Err(Refusal::Unsigned);
    };
    let sets = format::parse(payload).map_err(|e| Refusal::Malformed(e.to_string()))?;
    if sets.iter().all(|s| s.signatures.is_empty()) {
        return Err(Refusal::Unsigned);
    }
    let mut trusted: Vec<&[u8; 32]> = Vec::new();
    for set in &sets {
        let message = set.message();
        let signed_by_a_key = set.signatures.iter().any(|signature| {
            signature.algorithm == format::ED25519
                && Ed25519Signature::from_slice(signature.bytes).is_ok_and(|s| {
                    keys.0
                        .iter()
                        .any(|key| key.0.verify_strict(&message, &s).is_ok())
                })
        });
        if signed_by_a_key {
            trusted.extend(set.hashes.iter().copied());
        }
    }
    if trusted.is_empty() {
        return Err(Refusal::UntrustedKey);
    }
    let hash: [u8; 32] = Sha256::digest(split.signed).into();
    if trusted.iter().any(|h| **h == hash) {
        Ok(())
    } else {
        Err(Refusal::Modified)
    }
}

/// `binary` signed with `key`: a signature section (replacing any it had) over the rest.
pub fn sign(binary: &[u8], key: &SecretKey) -> Result<Vec<u8>, SignError> {
    use ed25519_dalek::Signer as _;
    let split = format::split(binary).map_err(|e| SignError(e.to_string()))?;
    let hash: [u8; 32] = Sha256::digest(split.signed).into();
    let message = format::message(std::iter::once(hash.as_slice()));
    let signature = key.0.sign(&message).to_bytes();
    let payload = format::encode(&[format::SignedHashes {
        hashes: vec![&hash],
        signatures: vec![format::Signature {
            key_id: &[],
            algorithm: format::ED25519,
            bytes: &signature,
        }],
    }])
    .map_err(|e| SignError(e.to_string()))?;
    format::assemble(split.header, &payload, split.signed).map_err(|e| SignError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal component: the header and one custom section.
    fn component() -> Vec<u8> {
        let mut bytes = format::COMPONENT_HEADER.to_vec();
        bytes.extend_from_slice(&[0, 5, 4, b'n', b'a', b'm', b'e']);
        bytes
    }

    fn keys(of: &[&SecretKey]) -> PublicKeys {
        PublicKeys(of.iter().map(|k| k.public()).collect())
    }

    #[test]
    fn a_signed_component_verifies_and_every_change_is_refused() {
        let site = SecretKey::generate();
        let other = SecretKey::generate();
        let signed = sign(&component(), &site).unwrap();
        verify(&signed, &keys(&[&site])).unwrap();
        verify(&signed, &keys(&[&other, &site])).unwrap();
        assert_eq!(
            verify(&component(), &keys(&[&site])),
            Err(Refusal::Unsigned)
        );
        assert_eq!(
            verify(&signed, &keys(&[&other])),
            Err(Refusal::UntrustedKey)
        );
        let mut tampered = signed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(verify(&tampered, &keys(&[&site])), Err(Refusal::Modified));
        let mut appended = signed.clone();
        appended.extend_from_slice(&[0, 1, 0]);
        assert_eq!(verify(&appended, &keys(&[&site])), Err(Refusal::Modified));
        // A flipped bit of the signature itself.
        let split = format::split(&signed).unwrap();
        let at = signed.len() - split.signed.len() - 1;
        let mut forged = signed.clone();
        forged[at] ^= 1;
        assert_eq!(verify(&forged, &keys(&[&site])), Err(Refusal::UntrustedKey));
    }

    #[test]
    fn signing_again_replaces_the_signature_and_the_content_is_kept() {
        let (first, second) = (SecretKey::generate(), SecretKey::generate());
        let once = sign(&component(), &first).unwrap();
        let twice = sign(&once, &second).unwrap();
        assert_eq!(
            format::split(&twice).unwrap().signed,
            &component()[8..],
            "the signed content is the original's"
        );
        verify(&twice, &keys(&[&second])).unwrap();
        assert_eq!(verify(&twice, &keys(&[&first])), Err(Refusal::UntrustedKey));
        // Signing is deterministic (Ed25519): the same key gives the same file.
        assert_eq!(sign(&once, &first).unwrap(), once);
    }

    #[test]
    fn a_module_signs_too_and_garbage_is_refused_not_signed() {
        let key = SecretKey::generate();
        let mut module = format::MODULE_HEADER.to_vec();
        module.extend_from_slice(&[1, 1, 0]);
        verify(&sign(&module, &key).unwrap(), &keys(&[&key])).unwrap();
        assert!(sign(b"\x7fELF\x02\x01\x01\0", &key).is_err());
        assert_eq!(verify(b"", &keys(&[&key])), Err(Refusal::NotWasm));
    }

    #[test]
    fn an_empty_or_unknown_signature_section_is_refused_by_name() {
        let key = SecretKey::generate();
        let rest = &component()[8..];
        let empty = format::encode(&[]).unwrap();
        let bytes = format::assemble(&format::COMPONENT_HEADER, &empty, rest).unwrap();
        assert_eq!(verify(&bytes, &keys(&[&key])), Err(Refusal::Unsigned));
        let bytes = format::assemble(&format::COMPONENT_HEADER, &[2, 1, 1, 0], rest).unwrap();
        match verify(&bytes, &keys(&[&key])) {
            Err(Refusal::Malformed(why)) => assert!(why.contains("version"), "{why}"),
            other => panic!("{other:?}"),
        }
        // An algorithm other than Ed25519 is no signature by a key of the node.
        let hash: [u8; 32] = Sha256::digest(rest).into();
        let payload = format::encode(&[format::SignedHashes {
            hashes: vec![&hash],
            signatures: vec![format::Signature {
                key_id: &[],
                algorithm: 9,
                bytes: &[0; 64],
            }],
        }])
        .unwrap();
        let bytes = format::assemble(&format::COMPONENT_HEADER, &payload, rest).unwrap();
        assert_eq!(verify(&bytes, &keys(&[&key])), Err(Refusal::UntrustedKey));
    }
}

/// Property: no input panics the reader, and nothing but a signed original verifies.
#[cfg(test)]
mod any_input {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn arbitrary_bytes_never_panic_and_never_verify(tail in proptest::collection::vec(any::<u8>(), 0..256), header in 0u8..3) {
            let key = SecretKey::generate();
            let mut bytes = match header {
                0 => format::COMPONENT_HEADER.to_vec(),
                1 => format::MODULE_HEADER.to_vec(),
                _ => Vec::new(),
            };
            bytes.extend_from_slice(&tail);
            prop_assert!(verify(&bytes, &PublicKeys(vec![key.public()])).is_err());
            if let Ok(split) = format::split(&bytes)
                && let Some(payload) = split.signature
            {
                let _ = format::parse(payload);
            }
        }
    }

    proptest! {
        // Ed25519 in a debug build is slow: fewer cases, each a fresh key, sign and verify.
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn a_changed_byte_of_a_signed_component_never_verifies(
            content in proptest::collection::vec(any::<u8>(), 1..128),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let key = SecretKey::generate();
            let mut component = format::COMPONENT_HEADER.to_vec();
            component.extend_from_slice(&content);
            let Ok(signed) = sign(&component, &key) else {
                return Ok(());
            };
            let keys = PublicKeys(vec![key.public()]);
            prop_assert!(verify(&signed, &keys).is_ok());
            let mut changed = signed.clone();
            let i = at.index(changed.len());
            changed[i] ^= flip;
            // The format leaves the header out of the hash: a component made a module is
            // the one change that verifies, and the agent refuses every module by itself.
            let relabelled = changed.starts_with(&format::MODULE_HEADER);
            prop_assert!(relabelled || verify(&changed, &keys).is_err(), "byte {} changed", i);
        }
    }
}
