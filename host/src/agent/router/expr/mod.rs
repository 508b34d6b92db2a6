//! The condition language of the router: the subset of `expr-lang` (and of the older
//! router's `gval`) that cc-metric-collector's and cc-lib's documentation and examples use.
//!
//! Parsed once at configuration time into an [`Expr`]; anything outside the subset is refused
//! then, with an error naming the construct and the expression, so a rule never fails later
//! for a reason the configuration check could have found. Evaluation reads the message
//! through a [`Scope`] and never panics; a type mismatch is an [`EvalError`] for that
//! message alone.
//!
//! The subset:
//! - literals: `'text'` and `"text"`, numbers (`1`, `2.5`, `1e3`), `true`, `false`, `nil`,
//!   lists `[a, b, ...]`; a whole condition of `*` means `true` (the old router's wildcard);
//! - identifiers: `name`, `timestamp`/`time`, `messagetype`/`msgtype`, `value`, `event`,
//!   `log`, `control`, `tag.x`/`tags.x`/`tag_x`/`tags_x`, `field.x`/`fields.x`/`field_x`/
//!   `fields_x`, `meta.x`/`meta_x`, `x['key']` for any of those maps, and a bare `type`,
//!   `type-id`, `stype`, `stype-id` or other name, looked up in the tags, then the meta
//!   information, then the fields, then `add_base_env`;
//! - `==` `!=` `<` `>` `<=` `>=`, `&&` `||` `and` `or` `not` `!`, `in [list]`, `not in`,
//!   `matches` / `contains` / `startsWith` / `endsWith`, `+ - * / %`, unary `-`, parentheses;
//! - functions `match(regex, text)`, `len(x)`, and for aggregates `avg`, `sum`, `min`,
//!   `max`, `median`, `count`; methods `metric.Name()` and `msg.HasTag('k')` (also on
//!   `message`), `HasMeta`, `HasField`;
//! - the topology functions of the local CPU topology ([`super::topology`]):
//!   `getCpuListOfType(type, id)`, `getCpuList()`, `getSockCpuList(id)`,
//!   `getNumaCpuList(id)`, `getDieCpuList(id)`, `getCoreCpuList(id)`, `getCpuSocket(cpu)`,
//!   `getCpuNuma(cpu)`, `getCpuDie(cpu)`, `getCpuCore(cpu)`.
//!
//! Regular expressions are written with `%` for `\` (JSON-friendly, as both Go components
//! do) and must be literals, so they are compiled once.
//!
//! This file holds the expression tree and the values it evaluates to; `parse` reads the
//! text into the tree, `eval` evaluates it against a message.

use std::fmt;

use regex::Regex;

use super::topology::{Level, Topology};

mod eval;
mod parse;

pub use parse::Mode;

/// The deepest nesting of parentheses, lists, calls and operators accepted.
pub const MAX_DEPTH: usize = 128;
/// The longest expression accepted, in bytes.
pub const MAX_LEN: usize = 4096;

/// A configuration-time error: the expression is malformed or uses an unsupported construct.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expression {expr:?}: {why}")]
pub struct ParseError {
    /// The expression as configured (capped).
    pub expr: String,
    /// What is wrong, naming the construct.
    pub why: String,
}

/// A per-message error: the expression met values it cannot combine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

/// A value during evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A missing tag, field or meta entry.
    Nil,
    /// A boolean.
    Bool(bool),
    /// Any number (line protocol's integers are compared as floats, as expr-lang converts).
    Num(f64),
    /// A string.
    Str(String),
    /// A list (literal lists, `values`, a metric's values in an aggregate).
    List(Vec<Value>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Num(_) => "number",
            Value::Str(_) => "string",
            Value::List(_) => "list",
        }
    }

    /// The number this value is, or stands for (a string holding a number counts: tags are
    /// strings, and `type-id == 0` is how the documentation writes it).
    pub fn as_num(&self) -> Option<f64> {
        match self {
            Value::Num(n) => Some(*n),
            Value::Str(s) => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Num(n) => write!(f, "{n}"),
            Value::Str(s) => f.write_str(s),
            Value::List(l) => write!(f, "[{} values]", l.len()),
        }
    }
}

/// Where a variable's value comes from; resolved at parse time.
#[derive(Debug, Clone, PartialEq)]
pub enum Var {
    /// The message name.
    Name,
    /// Unix seconds of the message.
    Time,
    /// `metric`, `event`, `log`, `control` or `unknown`.
    MessageType,
    /// A tag by key.
    Tag(String),
    /// A field by key.
    Field(String),
    /// A meta entry by key.
    Meta(String),
    /// A bare name: tag, then meta, then field, then base environment (or, in an aggregate,
    /// the values of the metrics of that name).
    Bare(String),
    /// An aggregate's matched values.
    Values,
}

/// What a condition reads: the message, the base environment, an aggregate's values.
pub trait Scope {
    /// The value of `var`, `Value::Nil` when absent.
    fn get(&self, var: &Var) -> Value;
    /// `HasTag`, `HasMeta`, `HasField` of the message.
    fn has(&self, place: Place, key: &str) -> bool;
    /// The CPU topology the topology functions read (none: their lists are empty).
    fn topology(&self) -> Option<&Topology> {
        None
    }
    /// The text `var` stands for, borrowed rather than copied: `Some(None)` when it is
    /// missing, `None` when [`Scope::get`] must decide (a field, a bare name, values).
    /// Comparisons of a name or tag with a literal, most conditions, take this path.
    fn text(&self, _var: &Var) -> Option<Option<&str>> {
        None
    }
}

/// The topology functions of cc-metric-collector's conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopoFn {
    /// `getCpuListOfType(type, id)`: the CPUs of a socket, core, ... (`node`: all).
    ListOfType,
    /// `getCpuList()`: every CPU.
    List,
    /// `getSockCpuList(id)`, `getNumaCpuList`, `getDieCpuList`, `getCoreCpuList`.
    ListOf(Level),
    /// `getCpuSocket(cpu)`, `getCpuNuma`, `getCpuDie`, `getCpuCore`.
    LevelOf(Level),
}

/// The three places of a message's key-value pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Tags.
    Tag,
    /// Meta information.
    Meta,
    /// Fields.
    Field,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
    In,
    NotIn,
    Contains,
    StartsWith,
    EndsWith,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agg {
    Avg,
    Sum,
    Min,
    Max,
    Median,
    Count,
}

/// A parsed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    /// A constant.
    Lit(Value),
    /// A variable.
    Var(Var),
    /// A literal list.
    List(Vec<Expr>),
    /// `!x`.
    Not(Box<Expr>),
    /// `-x`.
    Neg(Box<Expr>),
    /// A binary operator.
    #[doc(hidden)]
    Bin(BinOpBox),
    /// `x matches 'regex'` or `match('regex', x)`.
    Matches(Box<Expr>, Regex),
    /// `HasTag`/`HasMeta`/`HasField` with a literal key.
    Has(Place, String),
    /// `len(x)`.
    Len(Box<Expr>),
    /// An aggregate function over a list.
    #[doc(hidden)]
    Agg(AggBox),
    /// A topology function with its arguments.
    Topo(TopoFn, Vec<Expr>),
}

/// A binary operation (internal representation).
#[derive(Debug, Clone)]
pub struct BinOpBox(BinOp, Box<Expr>, Box<Expr>);

/// An aggregate call (internal representation).
#[derive(Debug, Clone)]
pub struct AggBox(Agg, Box<Expr>);

/// The expression as errors quote it: its first 200 bytes.
fn cap(src: &str) -> String {
    let mut end = src.len().min(200);
    while !src.is_char_boundary(end) {
        end -= 1;
    }
    if end < src.len() {
        format!("{}...", &src[..end])
    } else {
        src.to_owned()
    }
}
