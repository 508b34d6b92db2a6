//! The page's view as its URL holds it (`/fleet/?cluster=fritz&state=stale`), carried
//! through the login: a shared or bookmarked view opened without a session goes to
//! `/fleet/login` with the view's query and, once logged in, back to `/fleet/` with it.
//!
//! Only the view's own keys are carried, each value once and capped, and written anew
//! (percent-encoded) rather than copied: the redirect always leads to `/fleet/` on this
//! server, whatever the query held.

/// The keys of the page's view: its filters, its sort and its page.
pub const VIEW_KEYS: [&str; 9] = [
    "host",
    "state",
    "cluster",
    "type",
    "version",
    "failing",
    "duplicate",
    "sort",
    "page",
];

/// The longest value of a view key carried through the login.
pub const VALUE_CAP: usize = 512;

/// Writes `text` for a URL's query: every byte but the unreserved ones percent-encoded.
fn encode(text: &str, out: &mut String) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// The view named by a request's query pairs, as a query string without its `?` (empty
/// when it names none): the view's keys in their order, the first non-empty value of each,
/// values longer than [`VALUE_CAP`] bytes left out.
pub fn view_query(pairs: &[(String, String)]) -> String {
    let mut out = String::new();
    for key in VIEW_KEYS {
        let Some((_, value)) = pairs
            .iter()
            .find(|(k, v)| k == key && !v.is_empty() && v.len() <= VALUE_CAP)
        else {
            continue;
        };
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(key);
        out.push('=');
        encode(value, &mut out);
    }
    out
}

/// `path` with the view's query, if there is one.
pub fn with_view(path: &str, view: &str) -> String {
    if view.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{view}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_views_keys_are_carried_and_written_anew() {
        assert_eq!(view_query(&[]), "");
        assert_eq!(
            view_query(&pairs(&[
                ("state", "stale"),
                ("cluster", "fritz"),
                ("next", "https://elsewhere.example/"),
                ("host", "f[0101-0188],login*"),
                ("cluster", "alex"),
                ("type", ""),
                ("page", "2"),
            ])),
            "host=f%5B0101-0188%5D%2Clogin%2A&state=stale&cluster=fritz&page=2"
        );
        // Nothing that ends a header or a URL's query survives unencoded.
        let hostile = view_query(&pairs(&[("host", "a\r\nSet-Cookie: x=1#?&/")]));
        assert_eq!(hostile, "host=a%0D%0ASet-Cookie%3A%20x%3D1%23%3F%26%2F");
        assert_eq!(
            view_query(&pairs(&[("host", &"x".repeat(VALUE_CAP + 1))])),
            ""
        );
        assert_eq!(with_view("/fleet/", ""), "/fleet/");
        assert_eq!(with_view("/fleet/", "state=stale"), "/fleet/?state=stale");
    }
}
