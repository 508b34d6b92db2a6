//! The site's plugin signing keys: an Ed25519 key pair whose secret half signs components
//! (kept offline, read by `ccfleet plugin sign`) and whose public half the agents trust
//! (`plugin-public-keys` in their configuration).
//!
//! A public key is written as standard base64 of its 32 bytes, as `jwt-public-key` is; the
//! 33-byte form wasmsign2 writes (`0x01` and the key) is read too. A secret key file holds
//! standard base64 of seed ‖ public key (64 bytes, as `ccfleet plugin keygen` writes it) or
//! of the seed alone; wasmsign2's raw secret key file (`0x81`, seed, public key) is read too.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{SigningKey, VerifyingKey};

/// wasmsign2's prefix of a raw Ed25519 public key.
const RAW_PUBLIC: u8 = 0x01;
/// wasmsign2's prefix of a raw Ed25519 key pair.
const RAW_SECRET: u8 = 0x81;

/// A public key components may be signed with.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey(pub(super) VerifyingKey);

impl PublicKey {
    /// Reads standard base64 of the 32-byte key (or of wasmsign2's 33-byte form).
    pub fn from_base64(text: &str) -> Result<PublicKey, String> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| "not standard base64".to_owned())?;
        let raw: [u8; 32] = match bytes.as_slice() {
            [RAW_PUBLIC, rest @ ..] if rest.len() == 32 => rest.try_into().unwrap_or([0; 32]),
            all => all
                .try_into()
                .map_err(|_| format!("{} bytes, not the 32 of an Ed25519 public key", all.len()))?,
        };
        VerifyingKey::from_bytes(&raw)
            .map(PublicKey)
            .map_err(|_| "not a valid Ed25519 public key".to_owned())
    }

    /// The key as `plugin-public-keys` holds it: standard base64 of its 32 bytes.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0.as_bytes())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// The secret half of a site's signing key.
pub struct SecretKey(pub(super) SigningKey);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret half never reaches a log.
        write!(f, "SecretKey(public {})", self.public())
    }
}

impl SecretKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> SecretKey {
        let seed: [u8; 32] = rand::random();
        SecretKey(SigningKey::from_bytes(&seed))
    }

    /// Reads a secret key file's content (see the module's formats). Errors never quote the
    /// content.
    pub fn from_file_bytes(content: &[u8]) -> Result<SecretKey, String> {
        if let [RAW_SECRET, rest @ ..] = content
            && rest.len() == 64
        {
            return pair(rest);
        }
        let text = std::str::from_utf8(content)
            .map_err(|_| "neither base64 text nor a wasmsign2 secret key".to_owned())?;
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| "not standard base64 of an Ed25519 secret key".to_owned())?;
        match bytes.len() {
            64 => pair(&bytes),
            32 => {
                let seed: [u8; 32] = bytes.as_slice().try_into().unwrap_or([0; 32]);
                Ok(SecretKey(SigningKey::from_bytes(&seed)))
            }
            n => Err(format!(
                "{n} bytes, not the 64 (seed and public key) or 32 (seed) of an Ed25519 secret key"
            )),
        }
    }

    /// The file content [`SecretKey::from_file_bytes`] reads: base64 of seed ‖ public key.
    pub fn to_file_text(&self) -> String {
        format!("{}\n", STANDARD.encode(self.0.to_keypair_bytes()))
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }
}

/// A key pair whose public half must belong to its seed.
fn pair(bytes: &[u8]) -> Result<SecretKey, String> {
    let raw: [u8; 64] = bytes
        .try_into()
        .map_err(|_| "not 64 bytes of an Ed25519 key pair".to_owned())?;
    SigningKey::from_keypair_bytes(&raw)
        .map(SecretKey)
        .map_err(|_| "its public key does not belong to its secret key".to_owned())
}

/// `plugin-public-keys`: the keys fleet plugins must be signed with; empty: signing is not
/// enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicKeys(pub Vec<PublicKey>);

impl PublicKeys {
    /// Whether no key is configured (signatures are then not checked).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> serde::Deserialize<'de> for PublicKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let list = Vec::<String>::deserialize(d)?;
        list.iter()
            .enumerate()
            .map(|(i, text)| {
                PublicKey::from_base64(text).map_err(|why| {
                    D::Error::custom(format!(
                        "plugin-public-keys[{i}]: {why} (write standard base64 of the key, as \
                         `ccfleet plugin keygen` prints it)"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(PublicKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_in_every_form_read() {
        let secret = SecretKey::generate();
        let public = secret.public();
        let again = SecretKey::from_file_bytes(secret.to_file_text().as_bytes()).unwrap();
        assert_eq!(again.public(), public);
        let seed = STANDARD.encode(secret.0.to_bytes());
        assert_eq!(
            SecretKey::from_file_bytes(seed.as_bytes())
                .unwrap()
                .public(),
            public
        );
        let mut raw = vec![RAW_SECRET];
        raw.extend_from_slice(&secret.0.to_keypair_bytes());
        assert_eq!(SecretKey::from_file_bytes(&raw).unwrap().public(), public);
        assert_eq!(PublicKey::from_base64(&public.to_base64()).unwrap(), public);
        let mut raw = vec![RAW_PUBLIC];
        raw.extend_from_slice(public.0.as_bytes());
        assert_eq!(
            PublicKey::from_base64(&STANDARD.encode(raw)).unwrap(),
            public
        );
    }

    #[test]
    fn bad_keys_are_named_errors_that_never_quote_the_secret() {
        let secret = SecretKey::generate();
        let mut bytes = secret.0.to_keypair_bytes();
        bytes[40] ^= 1;
        let text = STANDARD.encode(bytes);
        let err = SecretKey::from_file_bytes(text.as_bytes()).unwrap_err();
        assert!(err.contains("does not belong"), "{err}");
        assert!(!err.contains(&text[..20]));
        assert!(SecretKey::from_file_bytes(b"\xff\xfe").is_err());
        assert!(SecretKey::from_file_bytes(b"c2hvcnQ=").is_err());
        assert!(!format!("{secret:?}").contains(&STANDARD.encode(secret.0.to_bytes())));
        for bad in ["", "!!", "c2hvcnQ=", &STANDARD.encode([0x02; 33])] {
            assert!(PublicKey::from_base64(bad).is_err(), "{bad}");
        }
        let err = serde_json::from_value::<PublicKeys>(serde_json::json!(["c2hvcnQ="]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugin-public-keys[0]"), "{err}");
    }
}
