//! cc-lib's message processor (`process_messages`): drop, rename, add/delete/move tags, meta
//! information and fields under conditions, change unit prefixes and normalize units, in the
//! order `stage_order` gives (default: cc-lib's order).
//!
//! Differences from the Go processor, all deliberate:
//! - conditions are parsed when the configuration is read, and one that uses something
//!   outside the supported subset (see [`super::expr`]) is refused then, naming the rule;
//! - `stage_order` takes cc-lib's stage names (`drop_by_name`, `rename_if`, ...) and also
//!   the configuration keys (`drop_messages`, `rename_messages_if`, ...), as cc-lib's README
//!   describes it;
//! - rules of one kind run in configuration order (Go iterates a map: no order); keyed rules
//!   (`rename_messages_if`, `change_unit_prefix`) run in key order;
//! - deleting the field that makes the message what it is (`value`, `event`, `log`,
//!   `control`) is refused at configuration time rather than failing every message.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use ccfleet::lineproto::OwnedValue;
use serde::Deserialize;

use super::expr::{Expr, Mode, Value};
use super::message::{Message, MessageScope, field_text};
use super::topology::Topology;
use super::units::{Prefix, Unit, scale};

/// One `{"if", "key", "value"}` rule as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KeyRuleConfig {
    /// The tag, meta or field key.
    pub key: String,
    /// The value to set, or the destination key of a move.
    #[serde(default)]
    pub value: String,
    /// The condition.
    #[serde(rename = "if")]
    pub condition: String,
}

/// The `process_messages` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessorConfig {
    /// Stages in the order to run them; cc-lib's default order when empty.
    #[serde(default)]
    pub stage_order: Vec<String>,
    /// Message names to drop.
    #[serde(default)]
    pub drop_messages: Vec<String>,
    /// Conditions under which a message is dropped.
    #[serde(default)]
    pub drop_messages_if: Vec<String>,
    /// Old name to new name.
    #[serde(default)]
    pub rename_messages: BTreeMap<String, String>,
    /// Condition to new name.
    #[serde(default)]
    pub rename_messages_if: BTreeMap<String, String>,
    /// Normalize the unit (meta `unit`, else tag `unit`).
    #[serde(default)]
    pub normalize_units: bool,
    /// Condition to new unit prefix.
    #[serde(default)]
    pub change_unit_prefix: BTreeMap<String, String>,
    /// Tags added under conditions.
    #[serde(default)]
    pub add_tags_if: Vec<KeyRuleConfig>,
    /// Tags deleted under conditions.
    #[serde(default)]
    pub delete_tags_if: Vec<KeyRuleConfig>,
    /// Meta information added under conditions.
    #[serde(default)]
    pub add_meta_if: Vec<KeyRuleConfig>,
    /// Meta information deleted under conditions.
    #[serde(default)]
    pub delete_meta_if: Vec<KeyRuleConfig>,
    /// String fields added under conditions.
    #[serde(default)]
    pub add_field_if: Vec<KeyRuleConfig>,
    /// Fields deleted under conditions.
    #[serde(default)]
    pub delete_field_if: Vec<KeyRuleConfig>,
    /// Message types (`metric`, `event`, `log`, `control`) to drop.
    #[serde(default)]
    pub drop_by_message_type: Vec<String>,
    /// Tag `key` to meta `value`.
    #[serde(default)]
    pub move_tag_to_meta_if: Vec<KeyRuleConfig>,
    /// Tag `key` to field `value`.
    #[serde(default)]
    pub move_tag_to_field_if: Vec<KeyRuleConfig>,
    /// Meta `key` to tag `value`.
    #[serde(default)]
    pub move_meta_to_tag_if: Vec<KeyRuleConfig>,
    /// Meta `key` to field `value`.
    #[serde(default)]
    pub move_meta_to_field_if: Vec<KeyRuleConfig>,
    /// Field `key` to tag `value`.
    #[serde(default)]
    pub move_field_to_tag_if: Vec<KeyRuleConfig>,
    /// Field `key` to meta `value`.
    #[serde(default)]
    pub move_field_to_meta_if: Vec<KeyRuleConfig>,
    /// Constants conditions may name: numbers, strings and booleans. cc-lib also takes
    /// nested objects, which only its member access can read; they are refused here.
    #[serde(default)]
    pub add_base_env: BTreeMap<String, serde_json::Value>,
    /// Keys cc-lib ignores too (its README's example carries one); named in a warning.
    #[serde(flatten)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// A processing stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `drop_by_name` (`drop_messages`).
    DropByName,
    /// `drop_by_type` (`drop_by_message_type`).
    DropByType,
    /// `drop_if` (`drop_messages_if`).
    DropIf,
    /// `add_tag` (`add_tags_if`).
    AddTag,
    /// `delete_tag` (`delete_tags_if`).
    DeleteTag,
    /// `move_tag_to_meta` (`move_tag_to_meta_if`).
    MoveTagToMeta,
    /// `move_tag_to_fields` (`move_tag_to_field_if`).
    MoveTagToField,
    /// `add_meta` (`add_meta_if`).
    AddMeta,
    /// `delete_meta` (`delete_meta_if`).
    DeleteMeta,
    /// `move_meta_to_tags` (`move_meta_to_tag_if`).
    MoveMetaToTag,
    /// `move_meta_to_fields` (`move_meta_to_field_if`).
    MoveMetaToField,
    /// `add_field` (`add_field_if`).
    AddField,
    /// `delete_field` (`delete_field_if`).
    DeleteField,
    /// `move_field_to_tags` (`move_field_to_tag_if`).
    MoveFieldToTag,
    /// `move_field_to_meta` (`move_field_to_meta_if`).
    MoveFieldToMeta,
    /// `rename` (`rename_messages`).
    Rename,
    /// `rename_if` (`rename_messages_if`).
    RenameIf,
    /// `change_unit_prefix`.
    ChangeUnitPrefix,
    /// `normalize_unit` (`normalize_units`).
    NormalizeUnit,
}

/// cc-lib's default order, with each stage's two names.
const STAGES: [(Stage, &str, &str); 19] = [
    (Stage::DropByName, "drop_by_name", "drop_messages"),
    (Stage::DropByType, "drop_by_type", "drop_by_message_type"),
    (Stage::DropIf, "drop_if", "drop_messages_if"),
    (Stage::AddTag, "add_tag", "add_tags_if"),
    (Stage::DeleteTag, "delete_tag", "delete_tags_if"),
    (
        Stage::MoveTagToMeta,
        "move_tag_to_meta",
        "move_tag_to_meta_if",
    ),
    (
        Stage::MoveTagToField,
        "move_tag_to_fields",
        "move_tag_to_field_if",
    ),
    (Stage::AddMeta, "add_meta", "add_meta_if"),
    (Stage::DeleteMeta, "delete_meta", "delete_meta_if"),
    (
        Stage::MoveMetaToTag,
        "move_meta_to_tags",
        "move_meta_to_tag_if",
    ),
    (
        Stage::MoveMetaToField,
        "move_meta_to_fields",
        "move_meta_to_field_if",
    ),
    (Stage::AddField, "add_field", "add_field_if"),
    (Stage::DeleteField, "delete_field", "delete_field_if"),
    (
        Stage::MoveFieldToTag,
        "move_field_to_tags",
        "move_field_to_tag_if",
    ),
    (
        Stage::MoveFieldToMeta,
        "move_field_to_meta",
        "move_field_to_meta_if",
    ),
    (Stage::Rename, "rename", "rename_messages"),
    (Stage::RenameIf, "rename_if", "rename_messages_if"),
    (
        Stage::ChangeUnitPrefix,
        "change_unit_prefix",
        "change_unit_prefix",
    ),
    (Stage::NormalizeUnit, "normalize_unit", "normalize_units"),
];

impl Stage {
    /// Reads a stage name (cc-lib's name or the configuration key).
    pub fn parse(s: &str) -> Option<Stage> {
        STAGES
            .iter()
            .find(|(_, a, b)| *a == s || *b == s)
            .map(|(stage, _, _)| *stage)
    }
}

/// A compiled condition with its source text (for error messages).
#[derive(Debug, Clone)]
pub struct Condition {
    /// The expression as configured.
    pub source: String,
    pub(super) expr: Expr,
}

impl Condition {
    /// Parses a condition; `rule` names it in the error.
    pub fn parse(source: &str, rule: &str) -> Result<Condition, String> {
        let expr = Expr::parse(source, Mode::Condition).map_err(|e| format!("{rule}: {e}"))?;
        Ok(Condition {
            source: source.to_owned(),
            expr,
        })
    }

    /// Evaluates the condition on `msg`.
    pub fn test(
        &self,
        msg: &Message,
        env: &BTreeMap<String, Value>,
        topology: &Topology,
    ) -> Result<bool, RuleError> {
        self.expr
            .eval_bool(&MessageScope { msg, env, topology })
            .map_err(|e| RuleError {
                condition: self.source.clone(),
                why: e.0,
            })
    }
}

/// A condition that could not be evaluated for one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("condition {condition:?}: {why}")]
pub struct RuleError {
    /// The condition as configured.
    pub condition: String,
    /// Why it failed.
    pub why: String,
}

#[derive(Debug, Clone)]
struct KeyRule {
    cond: Condition,
    key: String,
    value: String,
}

#[derive(Debug, Clone, Copy)]
enum Loc {
    Tag,
    Meta,
    Field,
}

/// The compiled processor.
#[derive(Debug, Clone, Default)]
pub struct Processor {
    stages: Vec<Stage>,
    drop_names: HashSet<String>,
    drop_types: Vec<String>,
    drop_if: Vec<Condition>,
    rename: BTreeMap<String, String>,
    rename_if: Vec<(Condition, String)>,
    change_prefix: Vec<(Condition, Prefix)>,
    normalize: bool,
    rules: BTreeMap<&'static str, Vec<KeyRule>>,
    env: BTreeMap<String, Value>,
    topology: Arc<Topology>,
    rule_count: usize,
}

fn env_value(v: &serde_json::Value) -> Option<Value> {
    match v {
        serde_json::Value::Number(n) => n.as_f64().map(Value::Num),
        serde_json::Value::String(s) => Some(Value::Str(s.clone())),
        serde_json::Value::Bool(b) => Some(Value::Bool(*b)),
        _ => None,
    }
}

impl Processor {
    /// Compiles `config`; `at` names its place in errors (`router.process_messages`).
    pub fn new(config: &ProcessorConfig, at: &str) -> Result<Processor, String> {
        let mut p = Processor::default();
        for key in config.unknown.keys() {
            tracing::warn!(
                "{at}: unknown key \"{}\" ignored",
                ccfleet::untrusted::Untrusted(key).capped(100)
            );
        }
        p.stages = if config.stage_order.is_empty() {
            STAGES.iter().map(|(s, _, _)| *s).collect()
        } else {
            let mut v = Vec::new();
            for (i, name) in config.stage_order.iter().enumerate() {
                v.push(
                    Stage::parse(name)
                        .ok_or_else(|| format!("{at}.stage_order[{i}]: unknown stage {name:?}"))?,
                );
            }
            v
        };
        for name in &config.drop_messages {
            p.add_drop_name(name);
        }
        for (i, t) in config.drop_by_message_type.iter().enumerate() {
            if !matches!(t.as_str(), "metric" | "event" | "log" | "control") {
                return Err(format!(
                    "{at}.drop_by_message_type[{i}]: {t:?} is not metric, event, log or control"
                ));
            }
            p.drop_types.push(t.clone());
            p.rule_count += 1;
        }
        for (i, c) in config.drop_messages_if.iter().enumerate() {
            p.add_drop_if(c, &format!("{at}.drop_messages_if[{i}]"))?;
        }
        for (from, to) in &config.rename_messages {
            p.add_rename(from, to, &format!("{at}.rename_messages[{from:?}]"))?;
        }
        for (c, to) in &config.rename_messages_if {
            let rule = format!("{at}.rename_messages_if[{c:?}]");
            if to.is_empty() {
                return Err(format!("{rule}: the new name is empty"));
            }
            let cond = Condition::parse(c, &rule)?;
            p.rename_if.push((cond, to.clone()));
            p.rule_count += 1;
        }
        for (c, prefix) in &config.change_unit_prefix {
            p.add_change_prefix(c, prefix, &format!("{at}.change_unit_prefix[{c:?}]"))?;
        }
        p.normalize = config.normalize_units;
        let keyed: [(&'static str, &Vec<KeyRuleConfig>); 12] = [
            ("add_tags_if", &config.add_tags_if),
            ("delete_tags_if", &config.delete_tags_if),
            ("add_meta_if", &config.add_meta_if),
            ("delete_meta_if", &config.delete_meta_if),
            ("add_field_if", &config.add_field_if),
            ("delete_field_if", &config.delete_field_if),
            ("move_tag_to_meta_if", &config.move_tag_to_meta_if),
            ("move_tag_to_field_if", &config.move_tag_to_field_if),
            ("move_meta_to_tag_if", &config.move_meta_to_tag_if),
            ("move_meta_to_field_if", &config.move_meta_to_field_if),
            ("move_field_to_tag_if", &config.move_field_to_tag_if),
            ("move_field_to_meta_if", &config.move_field_to_meta_if),
        ];
        for (kind, rules) in keyed {
            for (i, r) in rules.iter().enumerate() {
                p.add_key_rule(kind, r, &format!("{at}.{kind}[{i}]"))?;
            }
        }
        for (k, v) in &config.add_base_env {
            let v = env_value(v).ok_or_else(|| {
                format!(
                    "{at}.add_base_env.{k}: only numbers, strings and booleans are supported as constants"
                )
            })?;
            p.env.insert(k.clone(), v);
        }
        Ok(p)
    }

    /// Drops messages named `name`.
    pub fn add_drop_name(&mut self, name: &str) {
        self.drop_names.insert(name.to_owned());
        self.rule_count += 1;
    }

    /// Drops messages for which `condition` holds.
    pub fn add_drop_if(&mut self, condition: &str, rule: &str) -> Result<(), String> {
        self.drop_if.push(Condition::parse(condition, rule)?);
        self.rule_count += 1;
        Ok(())
    }

    /// Renames messages named `from`; `rule` names the rule in the error.
    pub fn add_rename(&mut self, from: &str, to: &str, rule: &str) -> Result<(), String> {
        if to.is_empty() {
            return Err(format!("{rule}: the new name is empty"));
        }
        self.rename.insert(from.to_owned(), to.to_owned());
        self.rule_count += 1;
        Ok(())
    }

    /// Changes the unit prefix of metrics for which `condition` holds.
    pub fn add_change_prefix(
        &mut self,
        condition: &str,
        prefix: &str,
        rule: &str,
    ) -> Result<(), String> {
        let cond = Condition::parse(condition, rule)?;
        let prefix = Prefix::parse(prefix)
            .ok_or_else(|| format!("{rule}: {prefix:?} is not a unit prefix (K, M, G, Ki, ...)"))?;
        self.change_prefix.push((cond, prefix));
        self.rule_count += 1;
        Ok(())
    }

    /// Sets the CPU topology the topology functions read (empty until set).
    pub fn set_topology(&mut self, topology: Arc<Topology>) {
        self.topology = topology;
    }

    /// Normalizes units.
    pub fn set_normalize_units(&mut self, on: bool) {
        self.normalize = on;
    }

    /// Adds a keyed rule of `kind` (`add_tags_if`, `delete_tags_if`, ...).
    pub fn add_key_rule(
        &mut self,
        kind: &'static str,
        r: &KeyRuleConfig,
        rule: &str,
    ) -> Result<(), String> {
        if kind == "delete_field_if"
            && matches!(r.key.as_str(), "value" | "event" | "log" | "control")
        {
            return Err(format!(
                "{rule}: the field {:?} makes a message what it is and cannot be deleted",
                r.key
            ));
        }
        if r.key.is_empty() {
            return Err(format!("{rule}: key is empty"));
        }
        let moves = kind.starts_with("move_");
        if (moves || kind == "add_tags_if") && r.value.is_empty() {
            return Err(format!(
                "{rule}: value is empty (a tag value, or the destination key of a move)"
            ));
        }
        let cond = Condition::parse(&r.condition, rule)?;
        self.rules.entry(kind).or_default().push(KeyRule {
            cond,
            key: r.key.clone(),
            value: r.value.clone(),
        });
        self.rule_count += 1;
        Ok(())
    }

    /// Whether any rule is configured (a processor without rules changes nothing).
    pub fn is_empty(&self) -> bool {
        self.rule_count == 0 && !self.normalize
    }

    /// Applies every stage; `Ok(false)` when the message is dropped.
    pub fn process(&self, msg: &mut Message) -> Result<bool, RuleError> {
        let env = &self.env;
        let topo = &*self.topology;
        for stage in &self.stages {
            match stage {
                Stage::DropByName => {
                    if self.drop_names.contains(msg.name()) {
                        return Ok(false);
                    }
                }
                Stage::DropByType => {
                    let t = msg.message_type();
                    if self.drop_types.iter().any(|d| d == t) {
                        return Ok(false);
                    }
                }
                Stage::DropIf => {
                    for c in &self.drop_if {
                        if c.test(msg, env, topo)? {
                            return Ok(false);
                        }
                    }
                }
                Stage::AddTag => self.add(msg, "add_tags_if", Loc::Tag)?,
                Stage::DeleteTag => self.delete(msg, "delete_tags_if", Loc::Tag)?,
                Stage::MoveTagToMeta => self.mv(msg, "move_tag_to_meta_if", Loc::Tag, Loc::Meta)?,
                Stage::MoveTagToField => {
                    self.mv(msg, "move_tag_to_field_if", Loc::Tag, Loc::Field)?
                }
                Stage::AddMeta => self.add(msg, "add_meta_if", Loc::Meta)?,
                Stage::DeleteMeta => self.delete(msg, "delete_meta_if", Loc::Meta)?,
                Stage::MoveMetaToTag => self.mv(msg, "move_meta_to_tag_if", Loc::Meta, Loc::Tag)?,
                Stage::MoveMetaToField => {
                    self.mv(msg, "move_meta_to_field_if", Loc::Meta, Loc::Field)?
                }
                Stage::AddField => self.add(msg, "add_field_if", Loc::Field)?,
                Stage::DeleteField => self.delete(msg, "delete_field_if", Loc::Field)?,
                Stage::MoveFieldToTag => {
                    self.mv(msg, "move_field_to_tag_if", Loc::Field, Loc::Tag)?
                }
                Stage::MoveFieldToMeta => {
                    self.mv(msg, "move_field_to_meta_if", Loc::Field, Loc::Meta)?
                }
                Stage::Rename => {
                    if let Some(to) = self.rename.get(msg.name()) {
                        rename(msg, to);
                    }
                }
                Stage::RenameIf => {
                    for (c, to) in &self.rename_if {
                        if c.test(msg, env, topo)? {
                            rename(msg, to);
                        }
                    }
                }
                // cc-lib converts units of metrics only.
                Stage::ChangeUnitPrefix if msg.message_type() != "metric" => {}
                Stage::NormalizeUnit if msg.message_type() != "metric" => {}
                Stage::ChangeUnitPrefix => {
                    for (c, prefix) in &self.change_prefix {
                        if c.test(msg, env, topo)? {
                            change_prefix(msg, *prefix);
                        }
                    }
                }
                Stage::NormalizeUnit => {
                    if self.normalize {
                        normalize(msg);
                    }
                }
            }
        }
        Ok(true)
    }

    fn add(&self, msg: &mut Message, kind: &str, loc: Loc) -> Result<(), RuleError> {
        for r in self.rules.get(kind).into_iter().flatten() {
            if r.cond.test(msg, &self.env, &self.topology)? {
                put(msg, loc, &r.key, r.value.clone());
            }
        }
        Ok(())
    }

    fn delete(&self, msg: &mut Message, kind: &str, loc: Loc) -> Result<(), RuleError> {
        for r in self.rules.get(kind).into_iter().flatten() {
            if r.cond.test(msg, &self.env, &self.topology)? {
                take(msg, loc, &r.key);
            }
        }
        Ok(())
    }

    fn mv(&self, msg: &mut Message, kind: &str, from: Loc, to: Loc) -> Result<(), RuleError> {
        for r in self.rules.get(kind).into_iter().flatten() {
            if r.cond.test(msg, &self.env, &self.topology)?
                && let Some(v) = take(msg, from, &r.key)
            {
                put(msg, to, &r.value, v);
            }
        }
        Ok(())
    }
}

fn put(msg: &mut Message, loc: Loc, key: &str, value: String) {
    match loc {
        Loc::Tag => msg.set_tag(key, &value),
        Loc::Meta => {
            msg.meta.insert(key.to_owned(), value);
        }
        Loc::Field => msg.set_field(key, OwnedValue::String(value)),
    }
}

fn take(msg: &mut Message, loc: Loc, key: &str) -> Option<String> {
    match loc {
        Loc::Tag => msg.remove_tag(key),
        Loc::Meta => msg.meta.remove(key),
        Loc::Field => msg.remove_field(key).map(|v| field_text(&v)),
    }
}

fn rename(msg: &mut Message, to: &str) {
    let old = std::mem::replace(&mut msg.point.measurement, to.to_owned());
    msg.meta.insert("oldname".to_owned(), old);
}

/// Where the unit is: meta `unit` first, then tag `unit` (cc-lib's order).
fn unit_of(msg: &Message) -> Option<(bool, String)> {
    if let Some(u) = msg.meta.get("unit") {
        return Some((true, u.clone()));
    }
    msg.tag("unit").map(|u| (false, u.to_owned()))
}

fn set_unit(msg: &mut Message, in_meta: bool, unit: &str) {
    if in_meta {
        msg.meta.insert("unit".to_owned(), unit.to_owned());
    } else {
        msg.set_tag("unit", unit);
    }
}

fn normalize(msg: &mut Message) {
    if let Some((in_meta, u)) = unit_of(msg)
        && let Some(unit) = Unit::parse(&u)
    {
        set_unit(msg, in_meta, &unit.short());
    }
}

fn change_prefix(msg: &mut Message, prefix: Prefix) {
    let Some((in_meta, u)) = unit_of(msg) else {
        return;
    };
    let Some(unit) = Unit::parse(&u) else {
        return;
    };
    let (factor, out) = unit.with_prefix(prefix);
    let Some(value) = msg.field("value").and_then(|v| scale(v, factor)) else {
        return;
    };
    msg.set_field("value", value);
    set_unit(msg, in_meta, &out.short());
}
