//! The configuration reference of the book (`docs/src/reference/*.md`) is generated from the
//! configuration types: their JSON Schemas (`schemars`), whose descriptions are the types'
//! doc comments. This test renders every page and fails when the checked-in page differs,
//! or when a key has no documentation, so a key cannot be added without it.
//!
//! After changing a configuration type, write the pages anew:
//!
//! ```text
//! CCFLEET_BLESS=1 cargo test -p ccfleet-host --all-features --test config_reference
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{Map, Value};

/// One page of the reference: where it goes, its title, and the schema it documents.
struct Page {
    file: &'static str,
    title: &'static str,
    schema: Value,
}

/// Types documented on a page of their own: where another page meets them, it links there.
const ELSEWHERE: &[(&str, &str, &str)] = &[
    ("SinkSchema", "sinks.md", "Metric sinks"),
    ("RouterConfig", "router.md", "Router"),
];

fn pages() -> Vec<Page> {
    let value = |schema: schemars::Schema| serde_json::to_value(schema).unwrap();
    vec![
        Page {
            file: "server.md",
            title: "Server configuration",
            schema: value(ccfleet::server::ServerConfig::json_schema()),
        },
        Page {
            file: "agent.md",
            title: "Agent configuration",
            schema: value(ccfleet_host::agent::AgentConfig::json_schema()),
        },
        Page {
            file: "sinks.md",
            title: "Metric sinks",
            schema: value(ccfleet_host::agent::sinks::SinkConfig::json_schema()),
        },
        Page {
            file: "router.md",
            title: "Router",
            schema: value(ccfleet_host::agent::router::RouterConfig::json_schema()),
        },
        Page {
            file: "rollouts.md",
            title: "Staged rollouts",
            schema: value(ccfleet::server::rollout::schema::json_schema()),
        },
    ]
}

/// What a walk over one schema collects.
struct Walk<'a> {
    defs: &'a Map<String, Value>,
    /// `(key, type, description)` per key, in the order the schema lists them.
    rows: Vec<(String, String, String)>,
    /// Keys without documentation.
    undocumented: Vec<String>,
    /// The page being written, so that a type documented there is not linked to itself.
    page: &'static str,
}

/// A doc comment as one table cell: one line, `|` escaped, rustdoc's intra-doc link
/// brackets taken off.
fn cell(text: &str) -> String {
    let mut out = text.split_whitespace().collect::<Vec<_>>().join(" ");
    while let Some(start) = out.find("[`") {
        let Some(len) = out[start..].find("`]") else {
            break;
        };
        let end = start + len + 2;
        if out[end..].starts_with('(') {
            break;
        }
        let inner = out[start + 1..end - 1].to_owned();
        out.replace_range(start..end, &inner);
    }
    out.replace('|', "\\|")
}

impl<'a> Walk<'a> {
    /// The schema a `$ref` names, with the referring schema's own description kept.
    fn resolve<'s>(&self, node: &'s Value) -> (Option<&'s str>, &'s Value)
    where
        'a: 's,
    {
        let defs: &'a Map<String, Value> = self.defs;
        let name = node
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"));
        match name.and_then(|n| defs.get(n)) {
            Some(target) => (name, target),
            None => (None, node),
        }
    }

    /// `T`, given `Option<T>`'s schema (`anyOf` of `T` and null).
    fn non_null<'s>(&self, node: &'s Value) -> &'s Value {
        if let Some(any) = node.get("anyOf").and_then(Value::as_array) {
            let rest: Vec<&Value> = any
                .iter()
                .filter(|v| v.get("type") != Some(&Value::from("null")))
                .collect();
            if rest.len() == 1 {
                return rest[0];
            }
        }
        node
    }

    fn type_name(&self, node: &Value) -> String {
        let node = self.non_null(node);
        let (name, node) = self.resolve(node);
        if let Some((_, file, title)) = ELSEWHERE
            .iter()
            .find(|(n, file, _)| Some(*n) == name && *file != self.page)
        {
            return format!("object, see [{title}]({file})");
        }
        if let Some(values) = node.get("enum").and_then(Value::as_array) {
            return values
                .iter()
                .map(|v| format!("`{}`", v.as_str().map_or(v.to_string(), str::to_owned)))
                .collect::<Vec<_>>()
                .join(", ");
        }
        if let Some(value) = node.get("const") {
            return format!(
                "`{}`",
                value.as_str().map_or(value.to_string(), str::to_owned)
            );
        }
        let types: Vec<&str> = match node.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
        match types.as_slice() {
            ["array"] => match node.get("items") {
                Some(items) => format!("array of {}", plural(&self.type_name(items))),
                None => "array".to_owned(),
            },
            ["object"] => match node.get("additionalProperties") {
                Some(Value::Object(_)) if node.get("properties").is_none() => format!(
                    "object of {}",
                    plural(&self.type_name(&node["additionalProperties"]))
                ),
                _ => "object".to_owned(),
            },
            [one] => (*one).to_owned(),
            [] if node.get("oneOf").is_some() || node.get("anyOf").is_some() => {
                let alternatives = node
                    .get("oneOf")
                    .or_else(|| node.get("anyOf"))
                    .and_then(Value::as_array)
                    .unwrap();
                alternatives
                    .iter()
                    .map(|a| self.type_name(a))
                    .collect::<Vec<_>>()
                    .join(" or ")
            }
            [] => "any JSON".to_owned(),
            many => many.join(" or "),
        }
    }

    /// Adds the rows of `node`'s keys under `prefix`.
    fn children(&mut self, prefix: &str, node: &Value) {
        let node = self.non_null(node);
        let (name, node) = self.resolve(node);
        if ELSEWHERE
            .iter()
            .any(|(n, file, _)| Some(*n) == name && *file != self.page)
        {
            return;
        }
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (key, value) in props {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                self.key(&path, value);
            }
        }
        match node.get("additionalProperties") {
            Some(value @ Value::Object(_)) if node.get("properties").is_none() => {
                self.children(&format!("{prefix}.<name>"), value)
            }
            _ => {}
        }
        if let Some(items) = node.get("items") {
            self.children(&format!("{prefix}[]"), items);
        }
        // A choice between shapes (a sink's `type`, say): the keys of each.
        for key in ["oneOf", "anyOf"] {
            if let Some(alternatives) = node.get(key).and_then(Value::as_array) {
                for alternative in alternatives {
                    self.children(prefix, alternative);
                }
            }
        }
    }

    fn key(&mut self, path: &str, node: &Value) {
        let description = node
            .get("description")
            .or_else(|| self.resolve(self.non_null(node)).1.get("description"))
            .and_then(Value::as_str);
        match description {
            Some(text) if !text.trim().is_empty() => {
                let row = (format!("`{path}`"), self.type_name(node), cell(text));
                // A key several shapes share (each sink's `type`) is listed once.
                if !self.rows.iter().any(|r| r.0 == row.0) {
                    self.rows.push(row);
                }
            }
            _ => self.undocumented.push(path.to_owned()),
        }
        self.children(path, node);
    }
}

fn plural(type_name: &str) -> String {
    match type_name {
        "string" | "integer" | "number" | "boolean" | "object" => format!("{type_name}s"),
        other => match other.strip_prefix("object,") {
            Some(rest) => format!("objects,{rest}"),
            None => other.to_owned(),
        },
    }
}

/// The page's Markdown and the keys it found undocumented.
fn render(page: &Page) -> (String, Vec<String>) {
    let empty = Map::new();
    let defs = page
        .schema
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = String::new();
    writeln!(
        out,
        "<!-- Generated from the configuration types by host/tests/config_reference.rs: edit \
         their doc comments, then run\n     CCFLEET_BLESS=1 cargo test -p ccfleet-host \
         --all-features --test config_reference -->\n"
    )
    .unwrap();
    writeln!(out, "# {}\n", page.title).unwrap();
    let mut undocumented = Vec::new();
    match page.schema.get("description").and_then(Value::as_str) {
        Some(text) => writeln!(out, "{}\n", text.trim()).unwrap(),
        None => undocumented.push("(the file itself)".to_owned()),
    }
    // A file whose `type` chooses its shape (a sink) gets a section per shape, so that
    // each key is listed under the kinds that have it.
    let kinds: Vec<(&str, &Value)> = page
        .schema
        .get("oneOf")
        .and_then(Value::as_array)
        .map(|alternatives| {
            alternatives
                .iter()
                .filter_map(|a| Some((a.pointer("/properties/type/const")?.as_str()?, a)))
                .collect()
        })
        .unwrap_or_default();
    let sections: Vec<(Option<&str>, &Value)> = if kinds.is_empty() {
        vec![(None, &page.schema)]
    } else {
        kinds.into_iter().map(|(k, a)| (Some(k), a)).collect()
    };
    for (kind, schema) in sections {
        let mut walk = Walk {
            defs,
            rows: Vec::new(),
            undocumented: Vec::new(),
            page: page.file,
        };
        walk.children("", schema);
        if let Some(kind) = kind {
            writeln!(out, "## `{kind}`\n").unwrap();
            match schema.get("description").and_then(Value::as_str) {
                Some(text) => writeln!(out, "{}\n", text.trim()).unwrap(),
                None => undocumented.push(format!("(the kind {kind})")),
            }
        }
        writeln!(out, "| key | type | meaning |\n|---|---|---|").unwrap();
        for (key, type_name, description) in &walk.rows {
            writeln!(out, "| {key} | {type_name} | {description} |").unwrap();
        }
        if kind.is_some() {
            writeln!(out).unwrap();
        }
        undocumented.extend(walk.undocumented);
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    (out, undocumented)
}

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference")
}

#[test]
fn the_configuration_reference_is_generated_from_the_types() {
    let bless = std::env::var_os("CCFLEET_BLESS").is_some_and(|v| v == "1");
    let mut problems = Vec::new();
    let mut keys = BTreeMap::new();
    for page in pages() {
        let (text, undocumented) = render(&page);
        for key in undocumented {
            problems.push(format!(
                "{}: `{key}` has no doc comment: document it on its configuration type",
                page.file
            ));
        }
        keys.insert(page.file, text.matches("\n| `").count());
        let path = reference_dir().join(page.file);
        if bless {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != text {
            let line = current
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(current.lines().count().min(text.lines().count()));
            problems.push(format!(
                "docs/src/reference/{} is not what the configuration types say (first \
                 difference at line {}: {:?}); run CCFLEET_BLESS=1 cargo test -p ccfleet-host \
                 --all-features --test config_reference",
                page.file,
                line + 1,
                text.lines().nth(line).unwrap_or("<end of page>")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every page lists the keys of its file.
    for (file, count) in keys {
        assert!(count >= 5, "{file} lists only {count} keys");
    }
}

#[test]
fn an_undocumented_key_is_found() {
    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    /// A file.
    struct File {
        /// Documented.
        documented: String,
        inner: Inner,
    }
    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        /// Documented.
        key: Option<u32>,
        bare: bool,
    }
    let page = Page {
        file: "test.md",
        title: "Test",
        schema: serde_json::to_value(schemars::schema_for!(File)).unwrap(),
    };
    let (text, undocumented) = render(&page);
    assert_eq!(undocumented, ["inner", "inner.bare"], "{text}");
    assert!(
        text.contains("| `inner.key` | integer | Documented. |"),
        "{text}"
    );
}
