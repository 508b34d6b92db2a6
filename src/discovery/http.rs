//! HTTP plumbing shared by the backends that speak JSON over HTTP (Nomad, remote edge API).

use std::time::Duration;

use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::de::DeserializeOwned;

use super::DiscoveryError;

/// Connecting to a source may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One request may take this long, so a lister used without [`Cached`](super::Cached) is
/// still bounded; it matches the cache's refresh timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error answer is read for its message; the message shown is capped shorter
/// still (see [`crate::untrusted`]).
const ERROR_BODY_LIMIT: usize = 4096;

/// Redirects followed in a row before the last one is answered as it is (Go's
/// `net/http` client stops after as many).
const MAX_REDIRECTS: usize = 10;

/// Builds the HTTP client of a source.
///
/// Redirects are followed, as Go's `net/http` client follows them, but only within the
/// origin (scheme, host and port) of the first request: the sources authenticate with
/// custom headers (`X-Nomad-Token`, `X-API-Key`) that an HTTP client does not strip when a
/// redirect changes the host, so following one elsewhere could hand the credential to
/// another origin. Go forwards such headers; ccfleet answers a redirect to another origin
/// as the unexpected status it is.
pub(crate) fn client() -> Result<reqwest::Client, DiscoveryError> {
    client_builder()
        .redirect(reqwest::redirect::Policy::custom(same_origin_redirects))
        .build()
        .map_err(|error| DiscoveryError::HttpClient { error })
}

/// The settings of [`client`] but for redirects, which it never follows, for a source that
/// adds its own (trust anchors).
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
}

fn same_origin_redirects(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let Some(first) = attempt.previous().first() else {
        return attempt.stop();
    };
    let next = attempt.url();
    let same_origin = next.scheme() == first.scheme()
        && next.host_str() == first.host_str()
        && next.port_or_known_default() == first.port_or_known_default();
    if same_origin && attempt.previous().len() <= MAX_REDIRECTS {
        attempt.follow()
    } else {
        attempt.stop()
    }
}

/// Parses an endpoint setting; the error never echoes the value, which may carry credentials.
pub(crate) fn endpoint(name: &'static str, raw: &str) -> Result<Url, DiscoveryError> {
    let invalid = |reason: &str| DiscoveryError::InvalidSetting {
        name,
        reason: reason.to_owned(),
    };
    let url = Url::parse(raw.trim()).map_err(|_| invalid("not an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("the URL has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("the URL must not have a query or a fragment"));
    }
    Ok(url)
}

/// A credential as a header value, marked sensitive so that it is never printed.
pub(crate) fn secret_header(
    name: &'static str,
    value: &str,
) -> Result<HeaderValue, DiscoveryError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| DiscoveryError::InvalidSetting {
        name,
        reason: "contains characters not allowed in an HTTP header".to_owned(),
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// `base` with `segments` appended to its path, each percent-encoded as one segment.
pub(crate) fn join(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

/// Sends `request` and decodes a 2xx JSON body; anything else is an error naming `operation`.
pub(crate) async fn get_json<T: DeserializeOwned>(
    request: reqwest::RequestBuilder,
    operation: impl Fn() -> String,
) -> Result<T, DiscoveryError> {
    let response = request
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| DiscoveryError::request(operation(), e))?;
    let status = response.status();
    if !status.is_success() {
        let body = error_body(response).await;
        return Err(DiscoveryError::Status {
            operation: operation(),
            status: status.as_u16(),
            message: error_message(&body),
        });
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| DiscoveryError::request(operation(), e))?;
    serde_json::from_slice(&body).map_err(|error| DiscoveryError::Decode {
        operation: operation(),
        error,
    })
}

/// Reads at most [`ERROR_BODY_LIMIT`] bytes of an error answer; a failure to read it leaves
/// the message empty rather than hiding the status.
pub(crate) async fn error_body(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(ERROR_BODY_LIMIT);
    body
}

/// The message of an error answer: a JSON `message` (or `error`) field where the source
/// sends one (Kubernetes `Status`, many gateways), else the whole body as text, trimmed. `None`
/// when there is nothing to show. The text is the peer's: it is escaped and capped only
/// where it is displayed.
pub(crate) fn error_message(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Message {
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        error: Option<String>,
    }
    let text = serde_json::from_slice::<Message>(body)
        .ok()
        .and_then(|m| m.message.or(m.error))
        .filter(|m| !m.trim().is_empty())
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::error_message;

    #[test]
    fn error_messages_come_from_json_or_the_text() {
        assert_eq!(
            error_message(br#"{"kind":"Status","message":"pods is forbidden"}"#).as_deref(),
            Some("pods is forbidden")
        );
        assert_eq!(
            error_message(br#"{"error":"invalid_grant"}"#).as_deref(),
            Some("invalid_grant")
        );
        assert_eq!(
            error_message(br#"{"code":503}"#).as_deref(),
            Some(r#"{"code":503}"#)
        );
        assert_eq!(
            error_message(b"ACL token not found\n").as_deref(),
            Some("ACL token not found")
        );
        assert_eq!(error_message(b"  \n"), None);
    }
}
