//! Browser sessions of the status page.
//!
//! A token pasted into the login form is checked once and then forgotten: the browser gets
//! a random session id in a cookie (`HttpOnly`, `SameSite=Lax`, `Path=/fleet`, `Secure`
//! when the request came over TLS), and the server keeps the session: who logged in and
//! when the session ends. The table holds the SHA-256 of each id, never the id itself, so
//! nothing in memory can be replayed as a cookie. A session ends after
//! [`SESSION_TTL`] or when the token it was opened with expires, whichever comes first, and
//! at logout. At most [`MAX_SESSIONS`] are kept: ended sessions are dropped first, then the
//! one ending soonest.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The longest a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;
/// The name of the session cookie.
pub const COOKIE_NAME: &str = "ccfleet_session";
/// The path the cookie is sent for: the page and its data, never the fleet API.
pub const COOKIE_PATH: &str = "/fleet";

/// A logged-in browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The token's subject.
    pub user: String,
    /// Unix seconds at which the session ends.
    pub expires: i64,
}

/// The session table; see the module documentation.
pub struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Session>>,
    capacity: usize,
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions::with_capacity(MAX_SESSIONS)
    }
}

fn digest(id: &str) -> [u8; 32] {
    let mut key = [0u8; 32];
    key.copy_from_slice(&Sha256::digest(id.as_bytes()));
    key
}

/// A fresh session id: 32 bytes of the operating system's random source, as hex.
fn new_id() -> String {
    let bytes: [u8; 32] = rand::random();
    let mut id = String::with_capacity(64);
    for b in bytes {
        use std::fmt::Write;
        let _ = write!(id, "{b:02x}");
    }
    id
}

impl Sessions {
    /// A table of at most `capacity` sessions (at least one).
    pub fn with_capacity(capacity: usize) -> Sessions {
        Sessions {
            by_digest: Mutex::default(),
            capacity: capacity.max(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.by_digest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session for `user` at `now` (Unix seconds), ending after [`SESSION_TTL`] or
    /// at `token_expires`, whichever is first; returns the id for the cookie.
    pub fn open(&self, user: &str, now: i64, token_expires: Option<f64>) -> (String, Session) {
        let ttl = i64::try_from(SESSION_TTL.as_secs()).unwrap_or(i64::MAX);
        let mut expires = now.saturating_add(ttl);
        if let Some(exp) = token_expires {
            // `exp` is a float in JWT claims; the session ends no later than the token.
            let exp = exp.floor();
            if exp < expires as f64 {
                expires = exp as i64;
            }
        }
        let session = Session {
            user: user.to_owned(),
            expires,
        };
        let id = new_id();
        let mut table = self.table();
        if table.len() >= self.capacity {
            table.retain(|_, s| s.expires > now);
        }
        if table.len() >= self.capacity
            && let Some(soonest) = table
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(key, _)| *key)
        {
            table.remove(&soonest);
        }
        table.insert(digest(&id), session.clone());
        (id, session)
    }

    /// The live session of `id` at `now`; an ended one is dropped.
    pub fn get(&self, id: &str, now: i64) -> Option<Session> {
        let key = digest(id);
        let mut table = self.table();
        match table.get(&key) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                table.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session of `id`; whether there was one.
    pub fn close(&self, id: &str) -> bool {
        self.table().remove(&digest(id)).is_some()
    }

    /// Sessions in the table (ended ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `Set-Cookie` value that hands `id` to the browser until `max_age` seconds from now.
pub fn cookie(id: &str, max_age: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE_NAME}={id}; Path={COOKIE_PATH}; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
        max_age.max(0)
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn removal_cookie(secure: bool) -> String {
    cookie("", 0, secure)
}

/// The session id among the request's `Cookie` headers, if one is well-formed.
pub fn id_from_headers(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim_matches('"'))
        .find(|value| value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_until_its_ttl_or_its_token_ends() {
        let sessions = Sessions::default();
        let (id, session) = sessions.open("alice", 1_000, None);
        assert_eq!(id.len(), 64);
        assert_eq!(session.expires, 1_000 + SESSION_TTL.as_secs() as i64);
        assert_eq!(sessions.get(&id, 1_001).unwrap().user, "alice");
        assert!(sessions.get(&id, session.expires).is_none());
        assert!(sessions.is_empty(), "an ended session is dropped when met");

        let (id, session) = sessions.open("bob", 1_000, Some(1_060.7));
        assert_eq!(session.expires, 1_060);
        assert!(sessions.get(&id, 1_059).is_some());
        assert!(sessions.get(&id, 1_060).is_none());
    }

    #[test]
    fn ids_are_random_and_only_their_digest_is_kept() {
        let sessions = Sessions::default();
        let (a, _) = sessions.open("alice", 0, None);
        let (b, _) = sessions.open("alice", 0, None);
        assert_ne!(a, b);
        let table = sessions.table();
        assert!(table.contains_key(&digest(&a)));
        let a_bytes = a.as_bytes();
        assert!(
            !table.keys().any(|k| k.as_slice() == a_bytes || hex(k) == a),
            "the table never holds the id itself"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn logout_ends_a_session() {
        let sessions = Sessions::default();
        let (id, _) = sessions.open("alice", 0, None);
        assert!(sessions.close(&id));
        assert!(!sessions.close(&id));
        assert!(sessions.get(&id, 1).is_none());
    }

    #[test]
    fn a_full_table_drops_ended_sessions_then_the_one_ending_soonest() {
        let sessions = Sessions::with_capacity(2);
        let (first, _) = sessions.open("a", 0, Some(10.0));
        let (second, _) = sessions.open("b", 0, Some(100.0));
        let (third, _) = sessions.open("c", 5, None);
        assert_eq!(sessions.len(), 2);
        assert!(sessions.get(&first, 6).is_none(), "the soonest ending went");
        assert!(sessions.get(&second, 6).is_some());
        assert!(sessions.get(&third, 6).is_some());
        let (fourth, _) = sessions.open("d", 200, None);
        assert!(sessions.get(&second, 200).is_none(), "ended, dropped first");
        assert!(sessions.get(&third, 200).is_some());
        assert!(sessions.get(&fourth, 200).is_some());
    }

    #[test]
    fn the_cookie_carries_its_attributes() {
        let id = "ab".repeat(32);
        assert_eq!(
            cookie(&id, 60, false),
            format!("ccfleet_session={id}; Path=/fleet; Max-Age=60; HttpOnly; SameSite=Lax")
        );
        assert!(cookie(&id, 60, true).ends_with("; SameSite=Lax; Secure"));
        assert!(removal_cookie(false).starts_with("ccfleet_session=; Path=/fleet; Max-Age=0;"));
    }

    proptest::proptest! {
        /// Any cookie header is parsed without a panic; what is taken is a well-formed id.
        #[test]
        fn arbitrary_cookie_headers_never_panic(cookies in proptest::collection::vec("\\PC{0,80}", 0..4)) {
            let mut headers = axum::http::HeaderMap::new();
            for c in &cookies {
                if let Ok(v) = axum::http::HeaderValue::from_str(c) {
                    headers.append("cookie", v);
                }
            }
            if let Some(id) = id_from_headers(&headers) {
                proptest::prop_assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }
    }

    #[test]
    fn the_session_id_is_found_among_other_cookies() {
        let id = "0f".repeat(32);
        let mut headers = axum::http::HeaderMap::new();
        headers.append(
            "cookie",
            "theme=dark; ccfleet_session=short".parse().unwrap(),
        );
        assert_eq!(id_from_headers(&headers), None);
        headers.append(
            "cookie",
            format!("a=b; ccfleet_session={id}").parse().unwrap(),
        );
        assert_eq!(id_from_headers(&headers), Some(id));
    }
}
