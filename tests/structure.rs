//! The house's structure, checked: no import circle between the source files of a crate,
//! and no source file over [`MAX_LINES`] lines.
//!
//! Cargo refuses circles between crates, not between the files of one; a circle between
//! files (`a.rs` uses `b.rs`, which uses `a.rs`) is how a crate's layers melt into one, and
//! features keep bringing them back unless something fails on them. This test reads every
//! source file of every crate of the repository, resolves each `crate::`, `super::`,
//! `self::` and child-module path it names (in `use` declarations and in code) to the file
//! that defines the module, and fails on any strongly connected set of files. Code under
//! `#[cfg(test)]` is not read: a test module may use whatever it tests.
//!
//! A module naming an item of one of its own ancestors (`use super::Thing` in
//! `agent/config.rs`, for a `Thing` of `agent/mod.rs` or one it re-exports) is not counted:
//! a folder's `mod.rs` is its facade. Every other path counts, so two sibling files that use
//! each other, or a parent's facade reached through a cousin, make a circle.
//!
//! Exceptions are named below with the reason they stand, as rustc's tidy lists its own;
//! an exception that no longer applies fails the test, so the lists only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a source file may be.
const MAX_LINES: usize = 1000;

/// Source files allowed over [`MAX_LINES`], each with why. Paths from the repository root.
const LONG_FILE_EXCEPTIONS: &[(&str, &str)] = &[];

/// Circles allowed to stand, each as its files in sorted order, with why.
const CIRCLE_EXCEPTIONS: &[(&[&str], &str)] = &[];

/// The crates checked: (name, source root, crate root files).
const CRATES: &[(&str, &str, &[&str])] = &[
    ("ccfleet", "src", &["lib.rs"]),
    ("ccfleet-host", "host/src", &["lib.rs", "main.rs"]),
    ("ccfleet-guest", "guest/sdk/src", &["lib.rs"]),
    ("ccfleet-collectors", "guest/collectors/src", &["lib.rs"]),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A module path (`["agent", "health"]`) for a file below `root`; `None` for a file that is
/// no module of its own (a crate root is the empty path).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("file below its root");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "mod.rs" | "lib.rs" | "main.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_owned()),
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of a file without comments, string literals' contents and `#[cfg(test)]`
/// items, so that only code names modules.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(bytes.len(), |n| i + n + 2);
            i = end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&b| b == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let start = 1 + hashes + 1;
            let end = rest[start..]
                .find(&close)
                .map_or(bytes.len(), |n| i + start + n + close.len());
            out.push_str("\"\"");
            i = end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                if bytes[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = (j + 1).min(bytes.len());
        } else if bytes[i] == b'\'' {
            // A character literal ('a', '\n', '"') or a lifetime ('a): skip a literal whole.
            let lit = rest
                .char_indices()
                .skip(1)
                .take(12)
                .find(|&(_, c)| c == '\'')
                .map(|(n, _)| n);
            match lit {
                Some(n) if n <= 2 || rest[1..].starts_with('\\') => {
                    out.push_str("' '");
                    i += n + 1;
                }
                _ => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().expect("a character");
            out.push(c);
            i += c.len_utf8();
        }
    }
    strip_test_items(&out)
}

/// Removes every item after a `#[cfg(test)]` attribute (up to its closing brace or
/// semicolon).
fn strip_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let bytes = after.as_bytes();
        let mut depth = 0usize;
        let mut end = after.len();
        for (j, &b) in bytes.iter().enumerate().skip("#[cfg(test)]".len()) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path a `use` tree names, expanded (`a::{b, c::d}` gives `a::b`, `a::c::d`).
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
    } else {
        let path = tree.split(" as ").next().unwrap_or("").trim();
        if !path.is_empty() {
            out.push(join(prefix, path));
        }
    }
}

fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}::{path}"),
    }
}

/// Every module path named in `code`: `use` trees and paths in code.
fn named_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let end = after.find(';').unwrap_or(after.len());
        expand_use(&after[..end], "", &mut out);
        rest = &after[end..];
    }
    // Paths in code: a run of `ident::ident::...`.
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = (c.is_ascii_alphabetic() || c == b'_')
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
            && (i < 2 || &bytes[i - 2..i] != b"::");
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut segments = 1;
        loop {
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
                j += 1;
            }
            if bytes[j..].starts_with(b"::")
                && bytes
                    .get(j + 2)
                    .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
            {
                j += 2;
                segments += 1;
            } else {
                break;
            }
        }
        if segments > 1 {
            out.push(code[i..j].to_owned());
        }
        i = j.max(i + 1);
    }
    out
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len());
        let boundary =
            |b: Option<&u8>| b.is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_'));
        if boundary(before.as_ref()) && after.is_some_and(|b| b.is_ascii_whitespace()) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The module a path names, resolved from module `here`, as the longest known module
/// prefix; `None` for other crates and the standard library.
fn resolve(
    path: &str,
    here: &[String],
    modules: &BTreeSet<Vec<String>>,
    crate_name: &str,
) -> Option<Vec<String>> {
    let segments: Vec<&str> = path.split("::").map(str::trim).collect();
    let mut at: Vec<String>;
    let mut rest = &segments[..];
    match rest.first().copied() {
        Some("crate") => {
            at = Vec::new();
            rest = &rest[1..];
        }
        Some(name) if name == crate_name.replace('-', "_") => {
            at = Vec::new();
            rest = &rest[1..];
        }
        Some("self") => {
            at = here.to_vec();
            rest = &rest[1..];
        }
        Some("super") => {
            at = here.to_vec();
            while rest.first() == Some(&"super") {
                at.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A path from a child module of `here` (edition 2018 paths).
            let mut child = here.to_vec();
            child.push(first.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            at = here.to_vec();
        }
        None => return None,
    }
    for segment in rest {
        let mut next = at.clone();
        next.push((*segment).to_owned());
        if modules.contains(&next) {
            at = next;
        } else {
            break;
        }
    }
    Some(at)
}

struct Crate {
    files: BTreeMap<Vec<String>, PathBuf>,
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn read_crate(name: &str, root: &str, roots: &[&str]) -> Crate {
    let root = repo().join(root);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        !files.is_empty(),
        "no source files under {}",
        root.display()
    );
    let mut modules = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        let is_root = rel.components().count() == 1 && roots.iter().any(|r| rel == Path::new(r));
        // A `main.rs` beside `lib.rs` is a crate of its own: checked as a leaf.
        if is_root && rel != Path::new(roots[0]) {
            continue;
        }
        // Test modules kept in files of their own.
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        modules.insert(module_of(&root, file), file.clone());
    }
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let code = code_of(&text);
        let mut targets = BTreeSet::new();
        for path in named_paths(&code) {
            // A module naming what its own ancestors hold (a folder's `mod.rs` is its
            // facade, re-exporting and sharing what its files need) is no circle by itself:
            // only edges to other files count.
            if let Some(target) = resolve(&path, module, &known, name)
                && !module.starts_with(&target)
            {
                targets.insert(target);
            }
        }
        edges.insert(module.clone(), targets);
    }
    Crate {
        files: modules,
        edges,
    }
}

/// The strongly connected sets of more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a Vec<String>) {
        w.index.insert(v, w.next);
        w.low.insert(v, w.next);
        w.next += 1;
        w.stack.push(v);
        w.on_stack.insert(v);
        if let Some(targets) = w.edges.get(v) {
            for t in targets {
                let Some((t, _)) = w.edges.get_key_value(t) else {
                    continue;
                };
                if !w.index.contains_key(t) {
                    visit(w, t);
                    let low = w.low[t].min(w.low[v]);
                    w.low.insert(v, low);
                } else if w.on_stack.contains(t) {
                    let low = w.index[t].min(w.low[v]);
                    w.low.insert(v, low);
                }
            }
        }
        if w.low[v] == w.index[v] {
            let mut set = Vec::new();
            while let Some(x) = w.stack.pop() {
                w.on_stack.remove(x);
                set.push(x.clone());
                if x == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                w.found.push(set);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

fn shown(file: &Path) -> String {
    file.strip_prefix(repo())
        .unwrap_or(file)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn no_import_circle_between_the_files_of_a_crate() {
    let mut found: Vec<Vec<String>> = Vec::new();
    for (name, root, roots) in CRATES {
        let krate = read_crate(name, root, roots);
        for set in circles(&krate.edges) {
            let files: Vec<String> = set.iter().map(|m| shown(&krate.files[m])).collect();
            found.push(files);
        }
    }
    let excepted: Vec<Vec<String>> = CIRCLE_EXCEPTIONS
        .iter()
        .map(|(files, _)| files.iter().map(|f| (*f).to_owned()).collect())
        .collect();
    let new: Vec<&Vec<String>> = found.iter().filter(|c| !excepted.contains(c)).collect();
    let stale: Vec<&Vec<String>> = excepted.iter().filter(|c| !found.contains(c)).collect();
    let mut problems = String::new();
    for circle in &new {
        problems.push_str(&format!(
            "\nimport circle between {} (break it: move what both need into a leaf file)",
            circle.join(" <-> ")
        ));
    }
    for circle in &stale {
        problems.push_str(&format!(
            "\nthe exception for the circle {} no longer applies: remove it from CIRCLE_EXCEPTIONS",
            circle.join(" <-> ")
        ));
    }
    assert!(problems.is_empty(), "{problems}");
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let mut problems = String::new();
    let mut long = BTreeSet::new();
    for (_, root, _) in CRATES {
        let mut files = Vec::new();
        rust_files(&repo().join(root), &mut files);
        for file in files {
            // A test module kept in a file of its own is no source of the crate's.
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_LINES {
                long.insert(shown(&file));
                if !LONG_FILE_EXCEPTIONS.iter().any(|(f, _)| *f == shown(&file)) {
                    problems.push_str(&format!(
                        "\n{} has {lines} lines, over {MAX_LINES}: split it by concept",
                        shown(&file)
                    ));
                }
            }
        }
    }
    for (file, _) in LONG_FILE_EXCEPTIONS {
        if !long.contains(*file) {
            problems.push_str(&format!(
                "\n{file} is within {MAX_LINES} lines now: remove it from LONG_FILE_EXCEPTIONS"
            ));
        }
    }
    assert!(problems.is_empty(), "{problems}");
}

#[test]
fn the_checker_finds_a_circle_and_resolves_paths() {
    // A circle of three and a leaf: the check must see the circle and nothing else.
    let m = |s: &str| s.split('/').map(str::to_owned).collect::<Vec<_>>();
    let mut edges = BTreeMap::new();
    edges.insert(m("a"), BTreeSet::from([m("b")]));
    edges.insert(m("b"), BTreeSet::from([m("c/d")]));
    edges.insert(m("c/d"), BTreeSet::from([m("a"), m("leaf")]));
    edges.insert(m("leaf"), BTreeSet::new());
    assert_eq!(circles(&edges), vec![vec![m("a"), m("b"), m("c/d")]]);

    let modules: BTreeSet<Vec<String>> = [
        m("agent"),
        m("agent/health"),
        m("agent/observe"),
        Vec::new(),
    ]
    .into_iter()
    .map(|v| v.into_iter().filter(|s| !s.is_empty()).collect())
    .collect();
    let here = m("agent/health");
    let code = code_of(
        "use super::observe::{Observed, STATES};\n// use super::nothing;\nfn f() { let s = \"crate::agent::x\"; crate::agent::observe::f(); }\n#[cfg(test)]\nmod tests { use crate::agent::Thing; }\n",
    );
    let resolved: BTreeSet<Vec<String>> = named_paths(&code)
        .iter()
        .filter_map(|p| resolve(p, &here, &modules, "ccfleet"))
        .collect();
    assert_eq!(resolved, BTreeSet::from([m("agent/observe")]));
}
