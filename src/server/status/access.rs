//! Who may read the fleet's status: cc-backend's `admin` and `support` roles.
//!
//! Every node of a fleet holds a token with the `api` role, so `api` alone must not open
//! the view of the whole fleet: a token is let in when its roles include `admin` or
//! `support` (cc-backend's names for its administrators and its support staff), whatever
//! else it carries. `GET /api/fleet/instances` checks the token of each request like the
//! other fleet routes (allowlist first, then the token; 401 for no or a bad token, 403 for
//! a token without either role); the web page checks the token once, at login.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::super::api_error::{ApiError, internal_error};
use super::super::app::AppState;
use super::super::auth::{self, AuthError, Claims, Verifier};
use super::super::metrics::Metrics;

/// cc-backend's role of administrators.
pub const ADMIN_ROLE: &str = "admin";
/// cc-backend's role of support staff.
pub const SUPPORT_ROLE: &str = "support";
/// The answer to a valid token without either role.
pub const MISSING_ROLE: &str = "missing role: admin or support";

/// Whether `roles` may read the fleet's status.
pub fn roles_grant_status(roles: &[String]) -> bool {
    roles.iter().any(|r| r == ADMIN_ROLE || r == SUPPORT_ROLE)
}

/// Why a token does not open the status view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No token, or one that does not verify (401).
    Token(AuthError),
    /// A valid token without `admin` or `support` (403).
    Role,
}

/// Checks `token` for the status view; the claims of an accepted token.
pub fn check_token(verifier: &Verifier, token: Option<&str>) -> Result<Arc<Claims>, Refused> {
    let token = token.ok_or(Refused::Token(AuthError::MissingToken))?;
    let claims = verifier.verify(token).map_err(Refused::Token)?;
    if roles_grant_status(&claims.roles) {
        Ok(claims)
    } else {
        Err(Refused::Role)
    }
}

/// Proof that an API request may read the fleet's status (see the module documentation).
pub(crate) struct StatusReader;

impl FromRequestParts<Arc<AppState>> for StatusReader {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Response> {
        let Some(&ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            tracing::error!("fleet: a status request without the peer's address");
            return Err(internal_error());
        };
        let metrics = &state.metrics;
        if !state.allowlist.allows(&parts.headers, peer) {
            Metrics::add(&metrics.refused_allowlist, 1);
            tracing::debug!("fleet: rejected status request from {peer}: unauthorized by IP");
            return Err(ApiError::Unauthorized(AuthError::IpNotAllowed).into_response());
        }
        let Some(verifier) = &state.verifier else {
            return Ok(StatusReader);
        };
        match check_token(verifier, auth::token_from_headers(&parts.headers)) {
            Ok(_) => Ok(StatusReader),
            Err(Refused::Token(e)) => {
                Metrics::add(&metrics.refused_token, 1);
                tracing::debug!("fleet: rejected status request from {peer}: {e}");
                Err(ApiError::Unauthorized(e).into_response())
            }
            Err(Refused::Role) => {
                Metrics::add(&metrics.refused_role, 1);
                tracing::debug!("fleet: refused status request from {peer}: {MISSING_ROLE}");
                Err(ApiError::Forbidden(MISSING_ROLE).into_response())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::auth::Keypair;

    #[test]
    fn admin_or_support_reads_the_status_and_api_alone_does_not() {
        let r =
            |v: &[&str]| roles_grant_status(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(r(&["admin"]));
        assert!(r(&["support"]));
        assert!(r(&["admin", "api"]));
        assert!(r(&["api", "support", "user"]));
        assert!(!r(&["api"]));
        assert!(!r(&["user", "manager"]));
        assert!(!r(&[]));
        assert!(
            !r(&["Admin", "SUPPORT"]),
            "role names are exact, as in cc-backend"
        );
    }

    #[test]
    fn tokens_are_checked_for_signature_then_role() {
        let kp = Keypair::generate();
        let verifier = kp.verifier();
        assert_eq!(
            check_token(&verifier, None).unwrap_err(),
            Refused::Token(AuthError::MissingToken)
        );
        let api = kp.sign_token("node", &["api"], None);
        assert_eq!(
            check_token(&verifier, Some(&api)).unwrap_err(),
            Refused::Role
        );
        let support = kp.sign_token("helpdesk", &["support"], None);
        assert_eq!(
            check_token(&verifier, Some(&support)).unwrap().sub,
            "helpdesk"
        );
        let foreign = Keypair::generate().sign_token("x", &["admin"], None);
        assert_eq!(
            check_token(&verifier, Some(&foreign)).unwrap_err(),
            Refused::Token(AuthError::BadSignature)
        );
    }
}
