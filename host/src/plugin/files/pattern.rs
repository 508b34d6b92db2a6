//! Grant patterns of `capabilities.read-files`, and the paths no grant reaches.

use ccfleet::untrusted::Untrusted;

use super::MAX_PATH;

/// Entries of `/proc` that expose kernel memory or its layout, or consume the kernel log.
const KERNEL_ENTRIES: [&str; 7] = [
    "kallsyms",
    "kcore",
    "kmsg",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
];

/// One component of a grant pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `**`: any number of components, including none.
    Deep,
    /// A name, possibly with `*` wildcards.
    Name(String),
}

/// A parsed `capabilities.read-files` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    parts: Vec<Part>,
}

impl Pattern {
    /// Parses a pattern: absolute, plain components, `**` only as a whole component.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let names = plain_components(text)
            .map_err(|why| format!("read-files entry {}: {why}", Untrusted(text)))?;
        let mut parts = Vec::with_capacity(names.len());
        for name in names {
            if name == "**" {
                parts.push(Part::Deep);
            } else if name.contains("**") {
                return Err(format!(
                    "read-files entry {}: `**` must be a whole path component",
                    Untrusted(text)
                ));
            } else {
                parts.push(Part::Name(name.to_owned()));
            }
        }
        // A pattern without wildcards that is refused anyway is a configuration mistake.
        if parts
            .iter()
            .all(|p| matches!(p, Part::Name(n) if !n.contains('*')))
        {
            let names: Vec<&str> = parts
                .iter()
                .map(|p| match p {
                    Part::Name(n) => n.as_str(),
                    Part::Deep => "**",
                })
                .collect();
            if let Some(why) = denied(&names, false) {
                return Err(format!("read-files entry {}: {why}", Untrusted(text)));
            }
        }
        Ok(Pattern { parts })
    }

    /// Whether the pattern matches the whole path.
    pub(super) fn matches(&self, path: &[&str]) -> bool {
        match_parts(&self.parts, path, false)
    }

    /// Whether the pattern matches something strictly below the directory `path`.
    pub(super) fn leads_below(&self, path: &[&str]) -> bool {
        match_parts(&self.parts, path, true)
    }
}

fn match_parts(parts: &[Part], path: &[&str], below: bool) -> bool {
    match (parts.split_first(), path.split_first()) {
        // The path is used up: a file matches if only `**` remain; a directory leads to
        // matches if anything remains.
        (None, None) => !below,
        (Some(_), None) => below || parts.iter().all(|p| *p == Part::Deep),
        (None, Some(_)) => false,
        (Some((Part::Deep, rest)), Some((_, tail))) => {
            match_parts(rest, path, below) || match_parts(parts, tail, below)
        }
        (Some((Part::Name(name), rest)), Some((head, tail))) => {
            glob(name, head) && match_parts(rest, tail, below)
        }
    }
}

/// `*` matches any run of characters within one name.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The components of an absolute, plain path; empty components (`//`, a trailing `/`) are
/// skipped.
pub(super) fn plain_components(path: &str) -> Result<Vec<&str>, &'static str> {
    if path.len() > MAX_PATH {
        return Err("the path is too long");
    }
    if path.contains('\0') {
        return Err("the path contains NUL");
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err("the path must be absolute");
    };
    let mut names = Vec::new();
    for name in rest.split('/') {
        match name {
            "" => {}
            "." | ".." => return Err("`.` and `..` are not allowed in paths"),
            name => names.push(name),
        }
    }
    Ok(names)
}

/// Why a path (as components under the file root) is never readable, if it is not.
/// `via_proc_net` admits the per-process network view that `/proc/net` links to.
pub(crate) fn denied(path: &[&str], via_proc_net: bool) -> Option<&'static str> {
    match path {
        ["dev", ..] => Some("device files are never readable by plugins"),
        ["proc", entry, rest @ ..] => {
            let per_process = *entry == "self"
                || *entry == "thread-self"
                || (!entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()));
            if per_process {
                if via_proc_net && rest.first() == Some(&"net") {
                    None
                } else {
                    Some("the per-process entries of /proc are never readable by plugins")
                }
            } else if KERNEL_ENTRIES.contains(entry) {
                Some("kernel memory and log entries of /proc are never readable by plugins")
            } else {
                None
            }
        }
        _ => None,
    }
}
