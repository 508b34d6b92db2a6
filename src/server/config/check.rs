//! Checks of the listen address and NATS subjects the configuration names.

use crate::server::error::ServerError;
use crate::untrusted::Untrusted;

/// Checks `addr` is what the listener binds: `host:port`, the host a name, an IPv4 address
/// or a bracketed IPv6 address, the port a number (0 picks a free one).
pub(super) fn check_addr(addr: &str) -> Result<(), ServerError> {
    let refuse = |why: &str| {
        Err(ServerError::InvalidValue(format!(
            "addr \"{}\" {why}; write \"host:port\", e.g. \"127.0.0.1:8080\", \"0.0.0.0:8080\" (every IPv4 address) or \"[::]:8080\"",
            Untrusted(addr)
        )))
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return refuse("has no port");
    };
    if port.parse::<u16>().is_err() {
        return refuse(if port.is_empty() {
            "has no port"
        } else {
            "has no valid port (0 to 65535)"
        });
    }
    if host.is_empty() {
        return refuse("has no host (Go's \":8080\" form is not accepted)");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return refuse("holds an IPv6 address without brackets");
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return refuse("is not a host name or address");
    }
    Ok(())
}

/// Whether `prefix` is literal NATS subject tokens: non-empty tokens joined by `.`, without
/// wildcards, whitespace or control characters, and short enough to leave room in
/// nats-server's 4 KiB control line for the bucket and type that follow.
pub(super) fn is_subject_prefix(prefix: &str) -> bool {
    prefix.len() <= 1024
        && prefix.split('.').all(|token| {
            !token.is_empty()
                && !token
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
        })
}

/// Whether nats-server accepts `subject` in a subscription: non-empty tokens joined by `.`,
/// without whitespace or control characters, where a wildcard is a whole token (`*`, or `>`
/// as the last one), at most 1024 bytes.
pub(super) fn is_subscription_subject(subject: &str) -> bool {
    let mut tokens = subject.split('.').peekable();
    subject.len() <= 1024
        && std::iter::from_fn(|| tokens.next().map(|t| (t, tokens.peek().is_none()))).all(
            |(token, last)| {
                !token.is_empty()
                    && !token.chars().any(|c| c.is_whitespace() || c.is_control())
                    && match token {
                        "*" => true,
                        ">" => last,
                        _ => !token.contains(['*', '>']),
                    }
            },
        )
}
