//! Ed25519 JSON Web Tokens as cc-backend mints and checks them.
//!
//! Tokens are compact JWS with the header `{"alg":"EdDSA","typ":"JWT"}` and the claims
//! `sub`, `roles`, `iat` and optionally `exp`. Keys use cc-backend's environment
//! convention: `JWT_PUBLIC_KEY` is the standard base64 of the 32-byte public key and
//! `JWT_PRIVATE_KEY` the standard base64 of the 64-byte private key (seed followed by the
//! public key).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha512};

pub use super::error::AuthError;

/// The role a token needs to use the fleet API.
pub const API_ROLE: &str = "api";
/// The role that must accompany `api` when a token carries several roles.
pub const ADMIN_ROLE: &str = "admin";

const HEADER_JSON: &str = r#"{"alg":"EdDSA","typ":"JWT"}"#;

/// An Ed25519 key pair that signs tokens.
pub struct Keypair {
    signing: SigningKey,
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private half must never reach logs.
        f.debug_struct("Keypair")
            .field("public", &self.public_key_base64())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct ClaimsOut<'a> {
    sub: &'a str,
    roles: &'a [&'a str],
    iat: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<i64>,
}

/// The claims of a verified token.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Claims {
    /// The subject (user name).
    #[serde(default)]
    pub sub: String,
    /// The roles granted to the subject.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Issued-at time, Unix seconds.
    #[serde(default)]
    pub iat: Option<f64>,
    /// Expiry time, Unix seconds.
    #[serde(default)]
    pub exp: Option<f64>,
    /// Not-before time, Unix seconds.
    #[serde(default)]
    pub nbf: Option<f64>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Keypair {
    /// Generates a fresh key pair from the operating system's random source.
    pub fn generate() -> Keypair {
        let seed: [u8; 32] = rand::random();
        Keypair {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// Decodes a `JWT_PRIVATE_KEY` value: standard base64 of seed || public key (64 bytes).
    /// A bare 32-byte seed is accepted too.
    pub fn from_private_base64(s: &str) -> Result<Keypair, AuthError> {
        let bytes = STANDARD
            .decode(s.trim())
            .map_err(|_| AuthError::KeyEncoding)?;
        let signing = match bytes.len() {
            64 => {
                let raw: [u8; 64] = bytes.as_slice().try_into().expect("length checked");
                SigningKey::from_keypair_bytes(&raw)
                    .map_err(|_| AuthError::InvalidKey("private"))?
            }
            32 => {
                let raw: [u8; 32] = bytes.as_slice().try_into().expect("length checked");
                SigningKey::from_bytes(&raw)
            }
            _ => return Err(AuthError::InvalidKey("private")),
        };
        Ok(Keypair { signing })
    }

    /// The `JWT_PUBLIC_KEY` value: standard base64 of the 32-byte public key.
    pub fn public_key_base64(&self) -> String {
        STANDARD.encode(self.signing.verifying_key().as_bytes())
    }

    /// The `JWT_PRIVATE_KEY` value: standard base64 of seed || public key.
    pub fn private_key_base64(&self) -> String {
        STANDARD.encode(self.signing.to_keypair_bytes())
    }

    /// Signs arbitrary bytes (rosters). Callers domain-separate their input so that such a
    /// signature can never pass as a token signature.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// A verifier for tokens signed by this key pair.
    pub fn verifier(&self) -> Verifier {
        Verifier::new(self.signing.verifying_key())
    }

    /// Signs a token for `sub` with `roles`, issued now and expiring after `ttl` (never
    /// when `None`).
    pub fn sign_token(&self, sub: &str, roles: &[&str], ttl: Option<Duration>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let iat = i64::try_from(now).unwrap_or(i64::MAX);
        let exp = ttl.map(|t| iat.saturating_add(i64::try_from(t.as_secs()).unwrap_or(i64::MAX)));
        let claims = ClaimsOut {
            sub,
            roles,
            iat,
            exp,
        };
        let claims = serde_json::to_vec(&claims).expect("claims serialize");
        let mut token = URL_SAFE_NO_PAD.encode(HEADER_JSON);
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(claims, &mut token);
        let signature = self.signing.sign(token.as_bytes());
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(signature.to_bytes(), &mut token);
        token
    }
}

/// Tokens whose signature was verified, at most.
const VERIFIED_CACHE_MAX: usize = 4096;

/// Checks tokens against one Ed25519 public key.
///
/// Verifying an Ed25519 signature costs tens of microseconds, more than the rest of a
/// registration; a fleet's agents present the same few tokens over and over. So the
/// claims of a token whose signature verified are kept under the SHA-512 digest of the
/// token (never the token itself), in a cache shared by the clones of a verifier and
/// bounded to `VERIFIED_CACHE_MAX` entries (emptied when full). The time claims are
/// checked on every use, so an expired token is refused from the cache too.
#[derive(Clone)]
pub struct Verifier {
    key: VerifyingKey,
    verified: Arc<Mutex<HashMap<[u8; 32], Arc<Claims>>>>,
    /// [`VERIFIED_CACHE_MAX`]; smaller in tests.
    capacity: usize,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("key", &STANDARD.encode(self.key.as_bytes()))
            .finish_non_exhaustive()
    }
}

/// The cache key of a token: the first half of its SHA-512 digest.
fn token_digest(token: &str) -> [u8; 32] {
    let digest = Sha512::digest(token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(&digest[..32]);
    key
}

/// Refuses claims outside their validity window at `now`.
fn check_times(claims: &Claims, now: f64) -> Result<(), AuthError> {
    if claims.exp.is_some_and(|exp| now >= exp) {
        return Err(AuthError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| now < nbf) {
        return Err(AuthError::NotYetValid);
    }
    Ok(())
}

impl Verifier {
    /// Decodes a `JWT_PUBLIC_KEY` value (standard base64 of 32 bytes).
    pub fn from_public_base64(s: &str) -> Result<Verifier, AuthError> {
        let bytes = STANDARD
            .decode(s.trim())
            .map_err(|_| AuthError::KeyEncoding)?;
        let raw: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| AuthError::InvalidKey("public"))?;
        let key = VerifyingKey::from_bytes(&raw).map_err(|_| AuthError::InvalidKey("public"))?;
        Ok(Verifier::new(key))
    }

    fn new(key: VerifyingKey) -> Verifier {
        Verifier {
            key,
            verified: Arc::default(),
            capacity: VERIFIED_CACHE_MAX,
        }
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Arc<Claims>>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Verifies the signature and the time claims of a compact token and returns its claims
    /// (shared with the cache: a request checks them without copying them).
    pub fn verify(&self, token: &str) -> Result<Arc<Claims>, AuthError> {
        let digest = token_digest(token);
        let cached = self.verified().get(&digest).cloned();
        let claims = match cached {
            Some(claims) => claims,
            None => {
                let claims = Arc::new(self.verify_signature(token)?);
                let mut verified = self.verified();
                if verified.len() >= self.capacity {
                    verified.clear();
                }
                verified.insert(digest, claims.clone());
                claims
            }
        };
        check_times(&claims, unix_now())?;
        Ok(claims)
    }

    /// How many verified tokens the cache holds (tests check its bound).
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.verified().len()
    }

    /// Verifies a token's signature and decodes its claims, without the time checks.
    fn verify_signature(&self, token: &str) -> Result<Claims, AuthError> {
        let mut parts = token.split('.');
        let (Some(header_part), Some(claims_part), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::MalformedToken);
        };
        let header_json = URL_SAFE_NO_PAD
            .decode(header_part)
            .map_err(|_| AuthError::MalformedToken)?;
        if !nesting_within(&header_json, MAX_JSON_NESTING) {
            return Err(AuthError::MalformedToken);
        }
        let header: Header =
            serde_json::from_slice(&header_json).map_err(|_| AuthError::MalformedToken)?;
        if header.alg != "EdDSA" {
            return Err(AuthError::UnsupportedAlgorithm);
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| AuthError::MalformedToken)?;
        let signature: [u8; 64] = signature
            .as_slice()
            .try_into()
            .map_err(|_| AuthError::MalformedToken)?;
        let signed = &token[..header_part.len() + 1 + claims_part.len()];
        self.key
            .verify_strict(signed.as_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| AuthError::BadSignature)?;
        let claims_json = URL_SAFE_NO_PAD
            .decode(claims_part)
            .map_err(|_| AuthError::MalformedToken)?;
        if !nesting_within(&claims_json, MAX_JSON_NESTING) {
            return Err(AuthError::MalformedToken);
        }
        serde_json::from_slice(&claims_json).map_err(|_| AuthError::MalformedToken)
    }
}

/// The deepest nesting of arrays and objects a token's JSON may have: Go's `encoding/json`
/// (which cc-backend's JWT parser decodes with) refuses anything deeper. serde_json limits
/// the depth of what it builds, but not of what it skips, and a token's unknown claims are
/// skipped.
const MAX_JSON_NESTING: usize = 10_000;

/// Whether `json` nests arrays and objects at most `max` deep; brackets inside strings
/// (escapes included) do not count. Malformed JSON is left to the parser.
fn nesting_within(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// cc-backend's rule for `/api/`: a single role must be `api`; several roles must include
/// both `admin` and `api`.
pub fn roles_grant_api(roles: &[String]) -> bool {
    match roles {
        [] => false,
        [only] => only == API_ROLE,
        many => many.iter().any(|r| r == API_ROLE) && many.iter().any(|r| r == ADMIN_ROLE),
    }
}

/// Picks the token from `X-Auth-Token`, else from `Authorization` minus a `Bearer ` prefix.
pub fn token_from_headers(headers: &axum::http::HeaderMap) -> Option<&str> {
    let x_auth = headers
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    if x_auth.is_some() {
        return x_auth;
    }
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())?;
    let token = auth.strip_prefix("Bearer ").unwrap_or(auth);
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_key_encodings() {
        let kp = Keypair::generate();
        assert_eq!(STANDARD.decode(kp.public_key_base64()).unwrap().len(), 32);
        let private = STANDARD.decode(kp.private_key_base64()).unwrap();
        assert_eq!(private.len(), 64);
        assert_eq!(
            &private[32..],
            STANDARD.decode(kp.public_key_base64()).unwrap()
        );
        let again = Keypair::from_private_base64(&kp.private_key_base64()).unwrap();
        assert_eq!(again.public_key_base64(), kp.public_key_base64());

        let token = kp.sign_token("fleetbot", &["api"], Some(Duration::from_secs(60)));
        let header = token.split('.').next().unwrap();
        assert_eq!(
            URL_SAFE_NO_PAD.decode(header).unwrap(),
            HEADER_JSON.as_bytes()
        );
        let verifier = Verifier::from_public_base64(&kp.public_key_base64()).unwrap();
        let claims = verifier.verify(&token).unwrap();
        assert_eq!(claims.sub, "fleetbot");
        assert_eq!(claims.roles, ["api"]);
        assert_eq!(claims.exp.unwrap() - claims.iat.unwrap(), 60.0);
    }

    /// A token signed with `kp` whose claims are `claims`, as given.
    fn token_with_claims(kp: &Keypair, claims: &str) -> String {
        let mut token = URL_SAFE_NO_PAD.encode(HEADER_JSON);
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(claims, &mut token);
        let signature = kp.sign(token.as_bytes());
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(signature, &mut token);
        token
    }

    #[test]
    fn claims_nested_deeper_than_go_decodes_are_refused() {
        let kp = Keypair::generate();
        let verifier = kp.verifier();
        let nested = |depth: usize| {
            format!(
                r#"{{"sub":"x","roles":["api"],"extra":{}1{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        // The claims object itself is one level: Go's limit counts it too.
        let fits = token_with_claims(&kp, &nested(MAX_JSON_NESTING - 1));
        assert_eq!(verifier.verify(&fits).unwrap().sub, "x");
        for depth in [MAX_JSON_NESTING, 20_000] {
            let deep = token_with_claims(&kp, &nested(depth));
            assert_eq!(
                verifier.verify(&deep),
                Err(AuthError::MalformedToken),
                "{depth}"
            );
        }
        // Brackets inside strings are text, escaped quotes included.
        let text = format!(
            r#"{{"sub":"x","roles":["api"],"note":"\"{}"}}"#,
            "[".repeat(20_000)
        );
        assert_eq!(
            verifier.verify(&token_with_claims(&kp, &text)).unwrap().sub,
            "x"
        );
    }

    #[test]
    fn rejects_forgeries_and_expired_tokens() {
        let kp = Keypair::generate();
        let other = Keypair::generate();
        let verifier = kp.verifier();
        let foreign = other.sign_token("x", &["api"], None);
        assert_eq!(verifier.verify(&foreign), Err(AuthError::BadSignature));

        let token = kp.sign_token("x", &["api"], None);
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged_claims = URL_SAFE_NO_PAD.encode(r#"{"sub":"x","roles":["admin","api"]}"#);
        parts[1] = &forged_claims;
        assert_eq!(
            verifier.verify(&parts.join(".")),
            Err(AuthError::BadSignature)
        );

        let hs = format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#),
            token.split('.').nth(1).unwrap(),
            token.split('.').nth(2).unwrap()
        );
        assert_eq!(verifier.verify(&hs), Err(AuthError::UnsupportedAlgorithm));
        assert_eq!(verifier.verify("a.b"), Err(AuthError::MalformedToken));

        let expired = kp.sign_token("x", &["api"], Some(Duration::ZERO));
        assert_eq!(verifier.verify(&expired), Err(AuthError::Expired));
    }

    #[test]
    fn a_cached_token_is_refused_once_it_expires_and_a_tampered_one_never_hits_the_cache() {
        let kp = Keypair::generate();
        let verifier = kp.verifier();
        let token = kp.sign_token("x", &["api"], Some(Duration::from_secs(2)));
        let exp = verifier.verify(&token).unwrap().exp.unwrap();
        assert_eq!(verifier.cached(), 1);
        // A clone shares the cache; a changed signature is another token, checked afresh.
        let clone = verifier.clone();
        let mut tampered = token.clone();
        let last = tampered.pop().unwrap();
        tampered.push(if last == 'A' { 'B' } else { 'A' });
        assert!(clone.verify(&tampered).is_err());
        assert_eq!(clone.cached(), 1);
        while unix_now() < exp {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(clone.verify(&token), Err(AuthError::Expired));
    }

    #[test]
    fn the_verified_token_cache_stays_bounded() {
        let kp = Keypair::generate();
        let verifier = Verifier {
            capacity: 8,
            ..kp.verifier()
        };
        for i in 0..20 {
            let token = kp.sign_token(&format!("user{i}"), &["api"], None);
            assert_eq!(verifier.verify(&token).unwrap().sub, format!("user{i}"));
            assert!((1..=8).contains(&verifier.cached()));
        }
    }

    #[test]
    fn role_rules() {
        let r = |v: &[&str]| roles_grant_api(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(r(&["api"]));
        assert!(r(&["admin", "api"]));
        assert!(r(&["user", "api", "admin"]));
        assert!(!r(&[]));
        assert!(!r(&["admin"]));
        assert!(!r(&["user", "api"]));
    }

    #[test]
    fn bad_keys() {
        assert_eq!(
            Verifier::from_public_base64("!!").unwrap_err(),
            AuthError::KeyEncoding
        );
        assert_eq!(
            Verifier::from_public_base64(&STANDARD.encode([1u8; 31])).unwrap_err(),
            AuthError::InvalidKey("public")
        );
        let kp = Keypair::generate();
        let mut raw = STANDARD.decode(kp.private_key_base64()).unwrap();
        raw[40] ^= 1;
        assert!(Keypair::from_private_base64(&STANDARD.encode(raw)).is_err());
    }
}
