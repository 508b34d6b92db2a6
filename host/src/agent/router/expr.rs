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

use std::fmt;

use regex::Regex;

use super::topology::{Level, Topology};

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

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Num(f64),
    Ident(String),
    Op(&'static str),
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    const OPS: [&str; 23] = [
        "==", "!=", "<=", ">=", "&&", "||", "**", "??", "?.", "..", "<", ">", "!", "(", ")", "[",
        "]", ",", "+", "-", "*", "/", "%",
    ];
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'\'' || c == b'"' {
            let mut s = String::new();
            let mut j = i + 1;
            loop {
                let Some(ch) = src[j..].chars().next() else {
                    return Err("a string is not closed".into());
                };
                j += ch.len_utf8();
                if ch as u32 == c as u32 {
                    break;
                }
                if ch == '\\' {
                    let Some(next) = src[j..].chars().next() else {
                        return Err("a string is not closed".into());
                    };
                    j += next.len_utf8();
                    s.push(match next {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    s.push(ch);
                }
            }
            out.push(Tok::Str(s));
            i = j;
        } else if c.is_ascii_digit() {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.' || b[j] == b'_') {
                j += 1;
            }
            if j < b.len() && (b[j] == b'e' || b[j] == b'E') {
                let mut k = j + 1;
                if k < b.len() && (b[k] == b'+' || b[k] == b'-') {
                    k += 1;
                }
                if k < b.len() && b[k].is_ascii_digit() {
                    j = k;
                    while j < b.len() && b[j].is_ascii_digit() {
                        j += 1;
                    }
                }
            }
            let text = src[i..j].replace('_', "");
            let n = text
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or_else(|| format!("{:?} is not a number", &src[i..j]))?;
            out.push(Tok::Num(n));
            i = j;
        } else if c == b'$' {
            return Err("unsupported name \"$...\" (expr-lang's $env)".into());
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            // `type-id` and `stype-id` are names (cc-lib rewrites them before expr-lang sees
            // them); any other `-` is subtraction.
            if src[i..j].ends_with("type")
                && src[j..].starts_with("-id")
                && !src[j + 3..]
                    .bytes()
                    .next()
                    .is_some_and(|n| n.is_ascii_alphanumeric() || n == b'_')
            {
                j += 3;
            }
            out.push(Tok::Ident(src[i..j].to_owned()));
            i = j;
        } else if let Some(op) = OPS.iter().find(|op| src[i..].starts_with(**op)) {
            out.push(Tok::Op(op));
            i += op.len();
        } else if c == b'.' {
            out.push(Tok::Op("."));
            i += 1;
        } else if c == b'?' {
            return Err("unsupported operator \"?\" (the conditional a ? b : c)".into());
        } else if c == b':' {
            return Err(
                "unsupported operator \":\" (conditionals a ? b : c, slices x[a:b])".into(),
            );
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(format!("unsupported character {ch:?}"));
        }
    }
    Ok(out)
}

/// Which names an expression may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A condition on one message.
    Condition,
    /// An `interval_aggregates` function: `values`, aggregate functions, metric names.
    Aggregate,
}

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    mode: Mode,
    _src: &'a str,
}

type PResult = Result<Expr, String>;

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(o)) if *o == op)
    }
    fn peek_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(i)) if i == w)
    }
    fn eat_op(&mut self, op: &str) -> bool {
        let hit = self.peek_op(op);
        if hit {
            self.pos += 1;
        }
        hit
    }
    fn eat_word(&mut self, w: &str) -> bool {
        let hit = self.peek_word(w);
        if hit {
            self.pos += 1;
        }
        hit
    }
    fn expect_op(&mut self, op: &str) -> Result<(), String> {
        if self.eat_op(op) {
            Ok(())
        } else {
            Err(format!("expected {op:?} {}", self.here()))
        }
    }
    fn here(&self) -> String {
        match self.peek() {
            None => "at the end".into(),
            Some(Tok::Op(o)) => format!("before {o:?}"),
            Some(Tok::Ident(i)) => format!("before {i:?}"),
            Some(Tok::Str(s)) => format!("before the string {s:?}"),
            Some(Tok::Num(n)) => format!("before the number {n}"),
        }
    }
    fn enter(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    fn expr(&mut self) -> PResult {
        // The operator loops below count each operator they chain (the tree grows one level
        // per operator); leaving restores the depth of the enclosing expression.
        let saved = self.depth;
        self.enter()?;
        let e = self.or();
        self.depth = saved;
        e
    }
    fn bin(op: BinOp, l: Expr, r: Expr) -> Expr {
        Expr::Bin(BinOpBox(op, Box::new(l), Box::new(r)))
    }
    fn or(&mut self) -> PResult {
        let mut l = self.and()?;
        while self.eat_op("||") || self.eat_word("or") {
            self.enter()?;
            let r = self.and()?;
            l = Self::bin(BinOp::Or, l, r);
        }
        Ok(l)
    }
    fn and(&mut self) -> PResult {
        let mut l = self.cmp()?;
        while self.eat_op("&&") || self.eat_word("and") {
            self.enter()?;
            let r = self.cmp()?;
            l = Self::bin(BinOp::And, l, r);
        }
        Ok(l)
    }
    fn cmp(&mut self) -> PResult {
        let mut l = self.add()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op("==")) => BinOp::Eq,
                Some(Tok::Op("!=")) => BinOp::Ne,
                Some(Tok::Op("<")) => BinOp::Lt,
                Some(Tok::Op(">")) => BinOp::Gt,
                Some(Tok::Op("<=")) => BinOp::Le,
                Some(Tok::Op(">=")) => BinOp::Ge,
                Some(Tok::Ident(w)) if w == "in" => BinOp::In,
                Some(Tok::Ident(w)) if w == "contains" => BinOp::Contains,
                Some(Tok::Ident(w)) if w == "startsWith" => BinOp::StartsWith,
                Some(Tok::Ident(w)) if w == "endsWith" => BinOp::EndsWith,
                Some(Tok::Ident(w)) if w == "matches" => {
                    self.pos += 1;
                    let re = self.regex_literal("matches")?;
                    self.enter()?;
                    l = Expr::Matches(Box::new(l), re);
                    continue;
                }
                Some(Tok::Ident(w)) if w == "not" => {
                    if matches!(self.toks.get(self.pos + 1), Some(Tok::Ident(i)) if i == "in") {
                        self.pos += 1;
                        BinOp::NotIn
                    } else {
                        return Ok(l);
                    }
                }
                _ => return Ok(l),
            };
            self.pos += 1;
            self.enter()?;
            let r = self.add()?;
            l = Self::bin(op, l, r);
        }
    }
    fn add(&mut self) -> PResult {
        let mut l = self.mul()?;
        loop {
            let op = if self.eat_op("+") {
                BinOp::Add
            } else if self.eat_op("-") {
                BinOp::Sub
            } else {
                return Ok(l);
            };
            self.enter()?;
            let r = self.mul()?;
            l = Self::bin(op, l, r);
        }
    }
    fn mul(&mut self) -> PResult {
        let mut l = self.unary()?;
        loop {
            let op = if self.eat_op("*") {
                BinOp::Mul
            } else if self.eat_op("/") {
                BinOp::Div
            } else if self.eat_op("%") {
                BinOp::Rem
            } else {
                return Ok(l);
            };
            self.enter()?;
            let r = self.unary()?;
            l = Self::bin(op, l, r);
        }
    }
    fn unary(&mut self) -> PResult {
        let saved = self.depth;
        self.enter()?;
        let e = if self.eat_op("!") || self.eat_word("not") {
            Expr::Not(Box::new(self.unary()?))
        } else if self.eat_op("-") {
            Expr::Neg(Box::new(self.unary()?))
        } else if self.eat_op("+") {
            self.unary()?
        } else {
            self.postfix()?
        };
        self.depth = saved;
        Ok(e)
    }
    fn regex_literal(&mut self, what: &str) -> Result<Regex, String> {
        match self.toks.get(self.pos).cloned() {
            Some(Tok::Str(s)) => {
                self.pos += 1;
                let pattern = s.replace('%', "\\");
                regex::RegexBuilder::new(&pattern)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("{what}: the regular expression {s:?} is invalid: {e}"))
            }
            _ => Err(format!(
                "{what} needs a literal regular expression ('...'), not a computed one"
            )),
        }
    }
    fn postfix(&mut self) -> PResult {
        let tok = self
            .toks
            .get(self.pos)
            .cloned()
            .ok_or_else(|| "the expression ends early".to_owned())?;
        self.pos += 1;
        match tok {
            Tok::Str(s) => Ok(Expr::Lit(Value::Str(s))),
            Tok::Num(n) => Ok(Expr::Lit(Value::Num(n))),
            Tok::Op("(") => {
                let e = self.expr()?;
                self.expect_op(")")?;
                Ok(e)
            }
            Tok::Op("[") => {
                let mut items = Vec::new();
                if !self.eat_op("]") {
                    loop {
                        items.push(self.expr()?);
                        if self.eat_op("]") {
                            break;
                        }
                        self.expect_op(",")?;
                        if self.eat_op("]") {
                            break;
                        }
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Op(op) => Err(format!("unsupported operator {op:?}")),
            Tok::Ident(id) => self.ident(id),
        }
    }
    fn ident(&mut self, id: String) -> PResult {
        match id.as_str() {
            "true" => return Ok(Expr::Lit(Value::Bool(true))),
            "false" => return Ok(Expr::Lit(Value::Bool(false))),
            "nil" => return Ok(Expr::Lit(Value::Nil)),
            _ => {}
        }
        if self.eat_op("(") {
            return self.call(&id);
        }
        // Map access: tag.x, tags['x'], meta.x, field.x, fields.x; methods on the message.
        let place = match id.as_str() {
            "tag" | "tags" => Some(Place::Tag),
            "field" | "fields" => Some(Place::Field),
            "meta" => Some(Place::Meta),
            _ => None,
        };
        let is_message = matches!(id.as_str(), "metric" | "msg" | "message");
        if self.peek_op(".") || self.peek_op("[") {
            let key = if self.eat_op(".") {
                match self.toks.get(self.pos).cloned() {
                    Some(Tok::Ident(k)) => {
                        self.pos += 1;
                        k
                    }
                    _ => return Err(format!("expected a name after \"{id}.\"")),
                }
            } else {
                self.pos += 1;
                let key = match self.toks.get(self.pos).cloned() {
                    Some(Tok::Str(k)) => k,
                    _ => return Err(format!("{id}[...] needs a literal key ('...')")),
                };
                self.pos += 1;
                self.expect_op("]")?;
                key
            };
            if is_message && self.eat_op("(") {
                return self.method(&key);
            }
            let Some(place) = place else {
                return Err(format!("unsupported member access {id}.{key}"));
            };
            if self.peek_op(".") || self.peek_op("[") || self.peek_op("(") {
                return Err(format!("unsupported access after {id}.{key}"));
            }
            return Ok(Expr::Var(match place {
                Place::Tag => Var::Tag(canonical_key(&key)),
                Place::Field => Var::Field(key),
                Place::Meta => Var::Meta(key),
            }));
        }
        if place.is_some() || is_message {
            return Err(format!(
                "{id} is a map or the message itself; name a key ({id}.key)"
            ));
        }
        let var = match id.as_str() {
            "name" => Var::Name,
            "timestamp" | "time" => Var::Time,
            "messagetype" | "msgtype" => Var::MessageType,
            "value" | "event" | "log" | "control" => {
                if self.mode == Mode::Aggregate && id == "value" {
                    Var::Bare(id)
                } else {
                    Var::Field(id)
                }
            }
            "values" if self.mode == Mode::Aggregate => Var::Values,
            // cc-lib's spelling of the tags `type-id` and `stype-id`.
            "typeid" | "stypeid" => Var::Tag(canonical_key(&id)),
            _ => {
                if let Some(k) = id.strip_prefix("tags_").or_else(|| id.strip_prefix("tag_")) {
                    Var::Tag(canonical_key(k))
                } else if let Some(k) = id
                    .strip_prefix("fields_")
                    .or_else(|| id.strip_prefix("field_"))
                {
                    Var::Field(k.to_owned())
                } else if let Some(k) = id.strip_prefix("meta_") {
                    Var::Meta(k.to_owned())
                } else if id == "in" || id == "matches" || id == "and" || id == "or" {
                    return Err(format!("{id:?} needs a left operand"));
                } else if matches!(
                    id.as_str(),
                    "let" | "if" | "else" | "filter" | "map" | "all" | "any" | "none" | "one"
                ) {
                    return Err(format!("unsupported construct {id:?}"));
                } else {
                    Var::Bare(id)
                }
            }
        };
        Ok(Expr::Var(var))
    }
    fn args(&mut self, name: &str) -> Result<Vec<Expr>, String> {
        let mut args = Vec::new();
        if self.eat_op(")") {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat_op(")") {
                return Ok(args);
            }
            if !self.eat_op(",") {
                return Err(format!(
                    "expected \",\" or \")\" in the arguments of {name}"
                ));
            }
        }
    }
    fn method(&mut self, method: &str) -> PResult {
        let place = match method {
            "Name" => {
                self.expect_op(")")?;
                return Ok(Expr::Var(Var::Name));
            }
            "HasTag" => Place::Tag,
            "HasMeta" => Place::Meta,
            "HasField" => Place::Field,
            other => return Err(format!("unsupported method {other}()")),
        };
        let key = match self.toks.get(self.pos).cloned() {
            Some(Tok::Str(k)) => k,
            _ => return Err(format!("{method} needs a literal key ('...')")),
        };
        self.pos += 1;
        self.expect_op(")")?;
        Ok(Expr::Has(place, key))
    }
    fn call(&mut self, name: &str) -> PResult {
        let agg = match name {
            "avg" | "mean" => Some(Agg::Avg),
            "sum" => Some(Agg::Sum),
            "min" => Some(Agg::Min),
            "max" => Some(Agg::Max),
            "median" => Some(Agg::Median),
            "count" => Some(Agg::Count),
            _ => None,
        };
        if let Some(agg) = agg {
            let mut args = self.args(name)?;
            if args.len() != 1 {
                return Err(format!("{name}() takes one list"));
            }
            return Ok(Expr::Agg(AggBox(agg, Box::new(args.remove(0)))));
        }
        let topo = match name {
            "getCpuListOfType" => Some((TopoFn::ListOfType, 2)),
            "getCpuList" => Some((TopoFn::List, 0)),
            "getSockCpuList" => Some((TopoFn::ListOf(Level::Socket), 1)),
            "getNumaCpuList" => Some((TopoFn::ListOf(Level::NumaDomain), 1)),
            "getDieCpuList" => Some((TopoFn::ListOf(Level::Die), 1)),
            "getCoreCpuList" => Some((TopoFn::ListOf(Level::Core), 1)),
            "getCpuSocket" => Some((TopoFn::LevelOf(Level::Socket), 1)),
            "getCpuNuma" => Some((TopoFn::LevelOf(Level::NumaDomain), 1)),
            "getCpuDie" => Some((TopoFn::LevelOf(Level::Die), 1)),
            "getCpuCore" => Some((TopoFn::LevelOf(Level::Core), 1)),
            _ => None,
        };
        if let Some((f, arity)) = topo {
            let args = self.args(name)?;
            if args.len() != arity {
                return Err(format!(
                    "{name}() takes {arity} argument(s), not {}",
                    args.len()
                ));
            }
            if f == TopoFn::ListOfType
                && let Expr::Lit(Value::Str(level)) = &args[0]
                && Level::parse(level).is_none()
            {
                return Err(format!(
                    "{name}(): {level:?} is not node, socket, die, numadomain, core or hwthread"
                ));
            }
            return Ok(Expr::Topo(f, args));
        }
        match name {
            "match" => {
                let re = self.regex_literal("match")?;
                self.expect_op(",")?;
                let subject = self.expr()?;
                self.expect_op(")")?;
                Ok(Expr::Matches(Box::new(subject), re))
            }
            "len" => {
                let mut args = self.args(name)?;
                if args.len() != 1 {
                    return Err("len() takes one argument".into());
                }
                Ok(Expr::Len(Box::new(args.remove(0))))
            }
            other => Err(format!("unsupported function {other}()")),
        }
    }
}

/// Tag keys as conditions spell them: `typeid` and `type-id` are one key.
fn canonical_key(k: &str) -> String {
    match k {
        "typeid" => "type-id".to_owned(),
        "stypeid" => "stype-id".to_owned(),
        other => other.to_owned(),
    }
}

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

impl Expr {
    /// Parses a condition (`mode` [`Mode::Condition`]) or an aggregate function.
    pub fn parse(src: &str, mode: Mode) -> Result<Expr, ParseError> {
        let fail = |why: String| ParseError {
            expr: cap(src),
            why,
        };
        if src.len() > MAX_LEN {
            return Err(fail(format!("longer than {MAX_LEN} bytes")));
        }
        if mode == Mode::Condition && src.trim() == "*" {
            return Ok(Expr::Lit(Value::Bool(true)));
        }
        let toks = lex(src).map_err(fail)?;
        if toks.is_empty() {
            return Err(fail("empty expression".into()));
        }
        if let Some(Tok::Op(op)) = toks
            .iter()
            .find(|t| matches!(t, Tok::Op("**" | "??" | "?." | "..")))
        {
            return Err(fail(format!("unsupported operator {op:?}")));
        }
        let mut p = Parser {
            toks,
            pos: 0,
            depth: 0,
            mode,
            _src: src,
        };
        let e = p.expr().map_err(fail)?;
        if p.pos != p.toks.len() {
            let at = p.here();
            return Err(fail(format!("unexpected input {at}")));
        }
        Ok(e)
    }

    /// Evaluates to a value.
    pub fn eval(&self, scope: &dyn Scope) -> Result<Value, EvalError> {
        let err = |s: String| Err(EvalError(s));
        Ok(match self {
            Expr::Lit(v) => v.clone(),
            Expr::Var(v) => scope.get(v),
            Expr::List(items) => Value::List(
                items
                    .iter()
                    .map(|e| e.eval(scope))
                    .collect::<Result<_, _>>()?,
            ),
            Expr::Not(e) => match e.eval(scope)? {
                Value::Bool(b) => Value::Bool(!b),
                Value::Nil => Value::Bool(true),
                other => return err(format!("! of a {}", other.kind())),
            },
            Expr::Neg(e) => match e.eval(scope)?.as_num() {
                Some(n) => Value::Num(-n),
                None => return err("- of a non-number".into()),
            },
            Expr::Has(place, key) => Value::Bool(scope.has(*place, key)),
            Expr::Matches(e, re) => {
                let borrowed = match &**e {
                    Expr::Var(v) => scope.text(v),
                    _ => None,
                };
                match borrowed {
                    Some(text) => Value::Bool(text.is_some_and(|t| re.is_match(t))),
                    None => match e.eval(scope)? {
                        Value::Str(s) => Value::Bool(re.is_match(&s)),
                        Value::Nil => Value::Bool(false),
                        other => Value::Bool(re.is_match(&other.to_string())),
                    },
                }
            }
            Expr::Len(e) => match e.eval(scope)? {
                Value::Str(s) => Value::Num(s.chars().count() as f64),
                Value::List(l) => Value::Num(l.len() as f64),
                other => return err(format!("len of a {}", other.kind())),
            },
            Expr::Agg(AggBox(agg, e)) => aggregate(*agg, e.eval(scope)?)?,
            Expr::Bin(BinOpBox(op, l, r)) => binary(*op, l, r, scope)?,
            Expr::Topo(f, args) => topology(*f, args, scope)?,
        })
    }

    /// Evaluates a condition, which must give `true` or `false`.
    pub fn eval_bool(&self, scope: &dyn Scope) -> Result<bool, EvalError> {
        match self.eval(scope)? {
            Value::Bool(b) => Ok(b),
            // A missing tag or name used as a flag is false (expr-lang refuses unknown names
            // when compiling; here they may be tags that some points lack).
            Value::Nil => Ok(false),
            other => Err(EvalError(format!(
                "the condition gave a {}, not true or false",
                other.kind()
            ))),
        }
    }
}

/// A CPU, socket, ... number: an integer, or a tag's text holding one.
fn id_arg(v: &Value) -> Result<i64, EvalError> {
    match v.as_num() {
        Some(n) if n.fract() == 0.0 && n.abs() < 1e15 => Ok(n as i64),
        _ => Err(EvalError(format!(
            "a {} is not a CPU topology number",
            v.kind()
        ))),
    }
}

fn topology(f: TopoFn, args: &[Expr], scope: &dyn Scope) -> Result<Value, EvalError> {
    let mut vals = Vec::with_capacity(args.len());
    for a in args {
        vals.push(a.eval(scope)?);
    }
    let empty = Topology::default();
    let topo = scope.topology().unwrap_or(&empty);
    let list =
        |cpus: Vec<i64>| Value::List(cpus.into_iter().map(|c| Value::Num(c as f64)).collect());
    Ok(match (f, vals.as_slice()) {
        (TopoFn::List, []) => list(topo.cpus_of(Level::Node, 0)),
        (TopoFn::ListOfType, [level, id]) => {
            let Value::Str(name) = level else {
                return Err(EvalError(format!(
                    "getCpuListOfType needs a type name, not a {}",
                    level.kind()
                )));
            };
            let Some(level) = Level::parse(name) else {
                return Err(EvalError(format!(
                    "getCpuListOfType: {:?} is not a topology type",
                    cap(name)
                )));
            };
            let id = if level == Level::Node { 0 } else { id_arg(id)? };
            list(topo.cpus_of(level, id))
        }
        (TopoFn::ListOf(level), [id]) => list(topo.cpus_of(level, id_arg(id)?)),
        (TopoFn::LevelOf(level), [cpu]) => topo
            .level_of(id_arg(cpu)?, level)
            .map_or(Value::Nil, |n| Value::Num(n as f64)),
        _ => {
            return Err(EvalError(
                "a topology function with the wrong arguments".into(),
            ));
        }
    })
}

fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Num(x), Value::Num(y)) => x == y,
        (Value::Num(_), Value::Str(_)) | (Value::Str(_), Value::Num(_)) => {
            matches!((a.as_num(), b.as_num()), (Some(x), Some(y)) if x == y)
        }
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| loose_eq(a, b))
        }
        _ => a == b,
    }
}

fn binary(op: BinOp, l: &Expr, r: &Expr, scope: &dyn Scope) -> Result<Value, EvalError> {
    let want_bool = |v: Value, side: &str| match v {
        Value::Bool(b) => Ok(b),
        Value::Nil => Ok(false),
        other => Err(EvalError(format!(
            "{side} of a logical operator is a {}, not true or false",
            other.kind()
        ))),
    };
    match op {
        BinOp::Or => {
            return Ok(Value::Bool(
                want_bool(l.eval(scope)?, "the left side")?
                    || want_bool(r.eval(scope)?, "the right side")?,
            ));
        }
        BinOp::And => {
            return Ok(Value::Bool(
                want_bool(l.eval(scope)?, "the left side")?
                    && want_bool(r.eval(scope)?, "the right side")?,
            ));
        }
        BinOp::Eq | BinOp::Ne => {
            // A string and a text compare as strings (`loose_eq`), so no copy is needed.
            let pair = match (l, r) {
                (Expr::Var(v), Expr::Lit(Value::Str(lit)))
                | (Expr::Lit(Value::Str(lit)), Expr::Var(v)) => Some((v, lit)),
                _ => None,
            };
            if let Some((v, lit)) = pair
                && let Some(text) = scope.text(v)
            {
                return Ok(Value::Bool(
                    (text == Some(lit.as_str())) == (op == BinOp::Eq),
                ));
            }
        }
        _ => {}
    }
    let a = l.eval(scope)?;
    let b = r.eval(scope)?;
    let mismatch = |what: &str| {
        Err(EvalError(format!(
            "cannot {what} a {} and a {}",
            a.kind(),
            b.kind()
        )))
    };
    Ok(match op {
        BinOp::Eq => Value::Bool(loose_eq(&a, &b)),
        BinOp::Ne => Value::Bool(!loose_eq(&a, &b)),
        BinOp::Lt | BinOp::Gt | BinOp::Le | BinOp::Ge => {
            let ord = match (&a, &b) {
                (Value::Str(x), Value::Str(y)) => x.partial_cmp(y),
                _ => match (a.as_num(), b.as_num()) {
                    (Some(x), Some(y)) => x.partial_cmp(&y),
                    _ => return mismatch("compare"),
                },
            };
            let Some(ord) = ord else {
                return Ok(Value::Bool(false));
            };
            Value::Bool(match op {
                BinOp::Lt => ord.is_lt(),
                BinOp::Gt => ord.is_gt(),
                BinOp::Le => ord.is_le(),
                _ => ord.is_ge(),
            })
        }
        BinOp::In | BinOp::NotIn => {
            let found = match &b {
                Value::List(items) => items.iter().any(|i| loose_eq(&a, i)),
                Value::Nil => false,
                _ => return mismatch("test membership of"),
            };
            Value::Bool(found == (op == BinOp::In))
        }
        BinOp::Contains | BinOp::StartsWith | BinOp::EndsWith => match (&a, &b) {
            (Value::Str(x), Value::Str(y)) => Value::Bool(match op {
                BinOp::Contains => x.contains(y.as_str()),
                BinOp::StartsWith => x.starts_with(y.as_str()),
                _ => x.ends_with(y.as_str()),
            }),
            (Value::Nil, _) | (_, Value::Nil) => Value::Bool(false),
            _ => return mismatch("compare the text of"),
        },
        BinOp::Add => match (&a, &b) {
            (Value::Str(x), Value::Str(y)) => Value::Str(format!("{x}{y}")),
            (Value::Num(x), Value::Num(y)) => Value::Num(x + y),
            _ => return mismatch("add"),
        },
        BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => {
            let (Value::Num(x), Value::Num(y)) = (&a, &b) else {
                return mismatch("do arithmetic on");
            };
            let v = match op {
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                BinOp::Div => x / y,
                _ => x % y,
            };
            if !v.is_finite() {
                return Err(EvalError("the arithmetic gave no finite number".into()));
            }
            Value::Num(v)
        }
        BinOp::Or | BinOp::And => unreachable_bool(),
    })
}

// The logical operators return above; a value keeps the match exhaustive without a panic.
fn unreachable_bool() -> Value {
    Value::Bool(false)
}

fn aggregate(agg: Agg, v: Value) -> Result<Value, EvalError> {
    let list = match v {
        Value::List(l) => l,
        Value::Nil => Vec::new(),
        other => vec![other],
    };
    let mut nums = Vec::with_capacity(list.len());
    for v in &list {
        match v.as_num() {
            Some(n) => nums.push(n),
            None => return Err(EvalError(format!("cannot aggregate a {}", v.kind()))),
        }
    }
    if agg == Agg::Count || (agg == Agg::Sum && nums.is_empty()) {
        // An empty sum is 0 (a metric of `sum(a) - sum(b)` that did not come this interval).
        return Ok(Value::Num(if agg == Agg::Count {
            nums.len() as f64
        } else {
            0.0
        }));
    }
    if nums.is_empty() {
        return Err(EvalError("no values to aggregate".into()));
    }
    Ok(Value::Num(match agg {
        Agg::Sum => nums.iter().sum(),
        Agg::Avg => nums.iter().sum::<f64>() / nums.len() as f64,
        Agg::Min => nums.iter().copied().fold(f64::INFINITY, f64::min),
        Agg::Max => nums.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Agg::Median => {
            nums.sort_by(f64::total_cmp);
            let n = nums.len();
            if n % 2 == 1 {
                nums[n / 2]
            } else {
                (nums[n / 2 - 1] + nums[n / 2]) / 2.0
            }
        }
        Agg::Count => nums.len() as f64,
    }))
}
