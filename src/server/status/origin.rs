//! Cross-site request forgery defence of the status page's state-changing requests (login
//! and logout). The session cookie is `SameSite=Lax`, so that a link to the page from an
//! alert or a wiki opens it in the live session; Lax keeps the cookie off cross-site
//! `POST`s, and this check refuses them besides.
//!
//! A `POST` is accepted only when the browser says it comes from this site: its `Origin`
//! (or, without one, its `Referer`) must name the scheme, host and port the request was
//! sent to, and `Sec-Fetch-Site`, when present, must not be `cross-site` or `same-site`. A
//! request that names no origin at all is refused too: every browser sends `Origin` with a
//! form `POST`, and other clients use tokens on the API instead of the page.
//!
//! Whether the request came over TLS decides the scheme expected here and the cookie's
//! `Secure` attribute. The server speaks plain HTTP itself, so a request counts as TLS only
//! when a peer listed in `trusted-proxies` says so (`X-Forwarded-Proto: https`, or
//! `Forwarded: proto=https`); from any other peer these headers are ignored.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};

use super::super::allowlist::TrustedProxies;

/// Whether the request reached a TLS-terminating trusted proxy over HTTPS.
pub fn came_over_tls(headers: &HeaderMap, peer: SocketAddr, proxies: &TrustedProxies) -> bool {
    if !proxies.contains(peer.ip()) {
        return false;
    }
    let forwarded_proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().eq_ignore_ascii_case("https"));
    if let Some(https) = forwarded_proto {
        return https;
    }
    headers
        .get(header::FORWARDED)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .into_iter()
        .flat_map(|first| first.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(key, value)| {
            key.eq_ignore_ascii_case("proto")
                && value.trim_matches('"').eq_ignore_ascii_case("https")
        })
}

/// Why a state-changing request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossSite {
    /// `Sec-Fetch-Site` says another site sent it.
    FetchSite,
    /// Neither `Origin` nor `Referer` is present (or `Origin` is `null`).
    NoOrigin,
    /// The origin is another one.
    OtherOrigin,
}

impl CrossSite {
    /// The reason, for the 403 answer.
    pub fn message(self) -> &'static str {
        match self {
            CrossSite::FetchSite => "cross-site request rejected",
            CrossSite::NoOrigin => {
                "request names no origin (Origin or Referer): log in from the page"
            }
            CrossSite::OtherOrigin => "request comes from another origin",
        }
    }
}

/// `scheme://host[:port]` of a URL (an `Origin` value is nothing else), lower-cased, with
/// the scheme's default port left out.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(normalize(&scheme, authority))
}

fn normalize(scheme: &str, authority: &str) -> String {
    let authority = authority.to_ascii_lowercase();
    let default_port = match scheme {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    let authority = if !default_port.is_empty() && authority.ends_with(default_port) {
        &authority[..authority.len() - default_port.len()]
    } else {
        authority.as_str()
    };
    format!("{scheme}://{authority}")
}

/// Checks that a state-changing request comes from this site (see the module
/// documentation); `tls` is [`came_over_tls`].
pub fn check_same_origin(headers: &HeaderMap, tls: bool) -> Result<(), CrossSite> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && (site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site"))
    {
        return Err(CrossSite::FetchSite);
    }
    let claimed = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        Some("null") => return Err(CrossSite::NoOrigin),
        Some(origin) => origin_of(origin).ok_or(CrossSite::OtherOrigin)?,
        None => {
            let referer = headers
                .get(header::REFERER)
                .and_then(|v| v.to_str().ok())
                .ok_or(CrossSite::NoOrigin)?;
            origin_of(referer).ok_or(CrossSite::OtherOrigin)?
        }
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .ok_or(CrossSite::OtherOrigin)?;
    let own = normalize(if tls { "https" } else { "http" }, host);
    if claimed == own {
        Ok(())
    } else {
        Err(CrossSite::OtherOrigin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_this_sites_origin_passes() {
        let ok = |pairs: &[(&'static str, &str)], tls| check_same_origin(&headers(pairs), tls);
        assert_eq!(
            ok(
                &[
                    ("host", "127.0.0.1:8080"),
                    ("origin", "http://127.0.0.1:8080")
                ],
                false
            ),
            Ok(())
        );
        assert_eq!(
            ok(
                &[
                    ("host", "Fleet.example:443"),
                    ("origin", "https://fleet.example")
                ],
                true
            ),
            Ok(())
        );
        assert_eq!(
            ok(
                &[
                    ("host", "127.0.0.1:8080"),
                    ("referer", "http://127.0.0.1:8080/fleet/login?x=1")
                ],
                false
            ),
            Ok(())
        );
        assert_eq!(
            ok(
                &[
                    ("host", "127.0.0.1:8080"),
                    ("origin", "http://evil.example")
                ],
                false
            ),
            Err(CrossSite::OtherOrigin)
        );
        assert_eq!(
            ok(
                &[
                    ("host", "127.0.0.1:8080"),
                    ("origin", "http://127.0.0.1:8081")
                ],
                false
            ),
            Err(CrossSite::OtherOrigin)
        );
        assert_eq!(
            ok(
                &[
                    ("host", "fleet.example"),
                    ("origin", "http://fleet.example")
                ],
                true
            ),
            Err(CrossSite::OtherOrigin),
            "plain HTTP is another origin than HTTPS"
        );
        assert_eq!(
            ok(&[("host", "h"), ("origin", "null")], false),
            Err(CrossSite::NoOrigin)
        );
        assert_eq!(ok(&[("host", "h")], false), Err(CrossSite::NoOrigin));
        assert_eq!(
            ok(
                &[
                    ("host", "h"),
                    ("origin", "http://h"),
                    ("sec-fetch-site", "cross-site")
                ],
                false
            ),
            Err(CrossSite::FetchSite)
        );
        assert_eq!(
            ok(&[("host", "h"), ("origin", "http://user@h")], false),
            Err(CrossSite::OtherOrigin)
        );
        assert_eq!(
            ok(&[("origin", "http://h")], false),
            Err(CrossSite::OtherOrigin)
        );
    }

    proptest::proptest! {
        /// Any header text is answered without a panic, and only the request's own origin
        /// passes.
        #[test]
        fn arbitrary_headers_never_panic_and_only_the_own_origin_passes(
            host in "\\PC{0,40}",
            origin in "\\PC{0,60}",
            referer in "\\PC{0,60}",
            tls: bool,
        ) {
            let mut h = HeaderMap::new();
            for (name, value) in [("host", &host), ("origin", &origin), ("referer", &referer)] {
                if let Ok(v) = axum::http::HeaderValue::from_str(value) {
                    h.insert(name, v);
                }
            }
            if check_same_origin(&h, tls).is_ok() {
                let scheme = if tls { "https" } else { "http" };
                let claimed = h.get("origin").or(h.get("referer")).unwrap().to_str().unwrap();
                proptest::prop_assert_eq!(
                    origin_of(claimed),
                    Some(normalize(scheme, h.get("host").unwrap().to_str().unwrap()))
                );
            }
        }
    }

    #[test]
    fn tls_is_believed_from_trusted_proxies_only() {
        let proxies = TrustedProxies::new(&["10.0.0.0/8".to_owned()]).unwrap();
        let proxy: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let stranger: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let https = headers(&[("x-forwarded-proto", "https")]);
        assert!(came_over_tls(&https, proxy, &proxies));
        assert!(!came_over_tls(&https, stranger, &proxies));
        assert!(!came_over_tls(
            &headers(&[("x-forwarded-proto", "http")]),
            proxy,
            &proxies
        ));
        assert!(came_over_tls(
            &headers(&[("forwarded", "for=192.0.2.60;proto=https;by=203.0.113.43")]),
            proxy,
            &proxies
        ));
        assert!(!came_over_tls(&HeaderMap::new(), proxy, &proxies));
    }
}
