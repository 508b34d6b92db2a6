//! JSON answers of the status routes, with an entity tag so that an unchanged view costs
//! a `304 Not Modified` and no body.
//!
//! Every answer carries the server's clock (`now`, ages are computed against it), which
//! changes each second; the tag is computed over the rest of the answer, so it changes only
//! when what is shown changes. A client that gets 304 keeps its copy and may take the
//! clock from the `Date` header. Tags are weak (`W/"…"`): the same view is sent plain or
//! compressed.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The tag of a body: the first 16 bytes of its SHA-256, in hex.
fn tag_of(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("W/\"{hex}\"")
}

/// Whether `If-None-Match` names `tag` (or is `*`), compared weakly.
fn unchanged(headers: &HeaderMap, tag: &str) -> bool {
    let strip = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let want = strip(tag);
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == "*" || strip(t) == want)
}

/// `value` as a JSON object with `"now": now` in front, tagged; `304` without a body when
/// the request's `If-None-Match` names the tag. `value` must serialize to a JSON object.
pub(crate) fn tagged_json(headers: &HeaderMap, now: i64, value: &impl Serialize) -> Response {
    let rest = serde_json::to_vec(value).expect("the status serializes");
    let tag = tag_of(&rest);
    let tag_header = HeaderValue::from_str(&tag).expect("hex is a header value");
    if unchanged(headers, &tag) {
        return (
            StatusCode::NOT_MODIFIED,
            [
                (header::ETAG, tag_header),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
        )
            .into_response();
    }
    let mut body = format!("{{\"now\":{now}").into_bytes();
    match rest.strip_prefix(b"{") {
        Some(b"}") | None => body.push(b'}'),
        Some(fields) => {
            body.push(b',');
            body.extend_from_slice(fields);
        }
    }
    body.push(b'\n');
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::ETAG, tag_header),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct View {
        a: u32,
    }

    async fn body(r: Response) -> Vec<u8> {
        axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec()
    }

    #[tokio::test]
    async fn the_clock_leads_and_the_tag_ignores_it() {
        let none = HeaderMap::new();
        let first = tagged_json(&none, 5, &View { a: 1 });
        let tag = first.headers()[header::ETAG].clone();
        assert_eq!(body(first).await, b"{\"now\":5,\"a\":1}\n");
        let later = tagged_json(&none, 6, &View { a: 1 });
        assert_eq!(later.headers()[header::ETAG], tag);
        let changed = tagged_json(&none, 6, &View { a: 2 });
        assert_ne!(changed.headers()[header::ETAG], tag);

        let mut asking = HeaderMap::new();
        asking.insert(header::IF_NONE_MATCH, tag.clone());
        let again = tagged_json(&asking, 7, &View { a: 1 });
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body(again).await.is_empty());
        let mut strong = HeaderMap::new();
        let bare = tag.to_str().unwrap().trim_start_matches("W/").to_owned();
        strong.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&format!("\"x\", {bare}")).unwrap(),
        );
        assert_eq!(
            tagged_json(&strong, 7, &View { a: 1 }).status(),
            StatusCode::NOT_MODIFIED
        );
        assert_eq!(
            tagged_json(&asking, 7, &View { a: 2 }).status(),
            StatusCode::OK
        );

        #[derive(Serialize)]
        struct Empty {}
        assert_eq!(
            body(tagged_json(&none, 1, &Empty {})).await,
            b"{\"now\":1}\n"
        );
    }
}
