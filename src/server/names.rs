//! Validation of the names a registration brings in.
//!
//! A registration's cluster becomes a NATS subject token (`<prefix>.<cluster>.<type>`, the
//! roster subject every member of that cluster subscribes to) and a directory name of the
//! config tree; its hostname becomes a file name of the config tree (`<hostname>.json`) and
//! is shown in rosters. A name that breaks either use is refused with a message naming the
//! rule, so one registration cannot make the roster publisher fail for the whole fleet
//! (a subject longer than nats-server's control line, a wildcard or a `.` that changes which
//! subscribers match) or reach outside the tree.
//!
//! The rules keep every name cc-backend's own registration check accepts for real hosts:
//! FQDN hostnames (`h1.example.org`), underscores, upper case and non-ASCII letters pass.

use crate::untrusted::Untrusted;
use crate::wire::INFRA_BUCKET;

/// The longest cluster name, in bytes: the column width of cc-backend's registry schema, and
/// short enough that `<prefix>.<cluster>.<type>` stays far below nats-server's 4 KiB control
/// line for any sensible prefix.
pub const MAX_CLUSTER_LEN: usize = 255;
/// The longest hostname, in bytes, as DNS allows (RFC 1035, without the trailing dot).
pub const MAX_HOSTNAME_LEN: usize = 253;
/// The longest label of a hostname (the part between dots), in bytes, as DNS allows.
pub const MAX_LABEL_LEN: usize = 63;
/// How much of a refused name an error message quotes.
const QUOTE_CAP: usize = 64;

/// Checks a cluster name (non-empty; emptiness is reported by the caller with cc-backend's
/// own message). The error is the complete message for the 400 answer.
pub fn check_cluster(cluster: &str) -> Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "invalid cluster {:?}: {why}",
            Untrusted(cluster).capped(QUOTE_CAP)
        ))
    };
    if cluster.len() > MAX_CLUSTER_LEN {
        return refuse(&format!(
            "longer than {MAX_CLUSTER_LEN} bytes ({} bytes)",
            cluster.len()
        ));
    }
    // The infra roster goes to `<prefix>.infra.<type>`: a cluster of that name would receive
    // (and overwrite) the infra roster.
    if cluster == INFRA_BUCKET {
        return refuse("the name is reserved for the infra roster");
    }
    if let Some(c) = cluster.chars().find(|c| c.is_control()) {
        return refuse(&format!(
            "must not contain control characters (found U+{:04X})",
            c as u32
        ));
    }
    if cluster.chars().any(char::is_whitespace) {
        return refuse("must not contain whitespace");
    }
    if cluster.contains(['*', '>']) {
        return refuse("must not contain the NATS wildcards '*' or '>'");
    }
    if cluster.contains('.') {
        return refuse("must not contain '.' (it is a NATS subject token)");
    }
    if cluster.contains(['/', '\\']) {
        return refuse("must not contain '/' or '\\'");
    }
    Ok(())
}

/// Checks a hostname (non-empty; emptiness is reported by the caller). Dots separate DNS
/// labels, which must be non-empty and at most [`MAX_LABEL_LEN`] bytes.
pub fn check_hostname(hostname: &str) -> Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "invalid hostname {:?}: {why}",
            Untrusted(hostname).capped(QUOTE_CAP)
        ))
    };
    if hostname.len() > MAX_HOSTNAME_LEN {
        return refuse(&format!(
            "longer than {MAX_HOSTNAME_LEN} bytes ({} bytes)",
            hostname.len()
        ));
    }
    if let Some(c) = hostname.chars().find(|c| c.is_control()) {
        return refuse(&format!(
            "must not contain control characters (found U+{:04X})",
            c as u32
        ));
    }
    if hostname.chars().any(char::is_whitespace) {
        return refuse("must not contain whitespace");
    }
    if hostname.contains(['/', '\\']) {
        return refuse("must not contain '/' or '\\'");
    }
    for label in hostname.split('.') {
        if label.is_empty() {
            return refuse("must not be '.', contain '..' or start or end with '.'");
        }
        if label.len() > MAX_LABEL_LEN {
            return refuse(&format!(
                "a label (the part between dots) is longer than {MAX_LABEL_LEN} bytes"
            ));
        }
    }
    Ok(())
}

/// The message for a `serviceType` that names no service type, quoting at most a short
/// prefix of what was sent.
pub fn unknown_service_type(raw: &str) -> String {
    if raw.len() <= QUOTE_CAP && !raw.chars().any(char::is_control) {
        format!("unknown serviceType {raw:?}")
    } else {
        format!("unknown serviceType {:?}", Untrusted(raw).capped(QUOTE_CAP))
    }
}

/// The most `metaData` entries one registration may carry.
pub const MAX_META_ENTRIES: usize = 32;
/// The most bytes of `metaData` (keys and values together) one registration may carry.
///
/// A member's metadata is repeated in every roster of its cluster, and agents refuse a
/// roster over their `roster-max-bytes` (1 MiB by default): without a cap, one member could
/// make its whole cluster's rosters unusable for as long as it stays registered. 4 KiB is
/// far more than the ports, versions and URLs services announce.
pub const MAX_META_BYTES: usize = 4096;

/// Checks a registration's `metaData` against [`MAX_META_ENTRIES`] and [`MAX_META_BYTES`].
/// The error is the complete message for the 400 answer and quotes none of the data.
pub fn check_meta<'a>(
    meta: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), String> {
    let entries = meta.len();
    if entries > MAX_META_ENTRIES {
        return Err(format!(
            "metaData has {entries} entries, more than the limit of {MAX_META_ENTRIES}"
        ));
    }
    let bytes: usize = meta.map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_META_BYTES {
        return Err(format!(
            "metaData holds {bytes} bytes of keys and values, more than the limit of {MAX_META_BYTES}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_capped_in_entries_and_bytes() {
        use std::collections::BTreeMap;
        let meta = |n: usize, len: usize| -> BTreeMap<String, String> {
            (0..n)
                .map(|i| (format!("k{i:02}"), "v".repeat(len)))
                .collect()
        };
        assert!(check_meta(meta(MAX_META_ENTRIES, 10).iter()).is_ok());
        let err = check_meta(meta(MAX_META_ENTRIES + 1, 1).iter()).unwrap_err();
        assert!(
            err.contains("33 entries") && err.contains("limit of 32"),
            "{err}"
        );
        // 3 bytes of key each: exactly at the limit, then one byte over.
        assert!(check_meta(meta(1, MAX_META_BYTES - 3).iter()).is_ok());
        let err = check_meta(meta(1, MAX_META_BYTES - 2).iter()).unwrap_err();
        assert!(
            err.contains("4097 bytes") && err.contains("limit of 4096"),
            "{err}"
        );
        assert!(!err.contains("vvv"), "{err}");
    }

    #[test]
    fn ordinary_names_pass() {
        for cluster in [
            "fritz",
            "alex-2",
            "Cluster_A",
            "ünï",
            "c".repeat(255).as_str(),
        ] {
            assert_eq!(check_cluster(cluster), Ok(()), "{cluster}");
        }
        let long_fqdn = format!(
            "{}.{}.{}.example",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63)
        );
        assert!(long_fqdn.len() <= MAX_HOSTNAME_LEN);
        for host in [
            "f0101",
            "h1.example.org",
            "node_7",
            "MGMT01",
            long_fqdn.as_str(),
        ] {
            assert_eq!(check_hostname(host), Ok(()), "{host}");
        }
    }

    #[test]
    fn a_cluster_that_breaks_a_subject_or_a_path_is_refused() {
        for (cluster, why) in [
            ("c".repeat(256).as_str(), "longer than 255 bytes"),
            ("infra", "reserved"),
            ("a.b", "'.'"),
            ("a*", "wildcards"),
            (">", "wildcards"),
            ("a b", "whitespace"),
            ("a\u{a0}b", "whitespace"),
            ("a\nb", "control"),
            ("a\u{1b}b", "control"),
            ("a\0b", "control"),
            ("..", "'.'"),
            ("a/b", "'/'"),
            ("a\\b", "'/'"),
        ] {
            let err = check_cluster(cluster).unwrap_err();
            assert!(err.contains(why), "{cluster:?}: {err}");
            assert!(!err.chars().any(char::is_control), "{err:?}");
        }
    }

    #[test]
    fn a_hostname_outside_what_dns_allows_is_refused() {
        for (host, why) in [
            ("h".repeat(254).as_str(), "longer than 253 bytes"),
            (format!("{}.org", "a".repeat(64)).as_str(), "label"),
            (".", "'..'"),
            ("a..b", "'..'"),
            (".hidden", "'..'"),
            ("h.", "'..'"),
            ("../etc", "'/'"),
            ("a b", "whitespace"),
            ("h\r\nX-Forged: 1", "control"),
        ] {
            let err = check_hostname(host).unwrap_err();
            assert!(err.contains(why), "{host:?}: {err}");
        }
    }

    #[test]
    fn a_refused_name_is_quoted_short_and_escaped() {
        let err = check_cluster(&"x".repeat(5000)).unwrap_err();
        assert!(err.len() < 200, "{err}");
        let err = unknown_service_type(&format!("\u{1b}[2J{}", "y".repeat(5000)));
        assert!(err.len() < 200 && !err.contains('\u{1b}'), "{err}");
        assert_eq!(unknown_service_type("zzz"), r#"unknown serviceType "zzz""#);
    }
}
