//! Parsing: the expression text lexed and read into an [`Expr`] at configuration time,
//! refusing anything outside the subset.

use regex::Regex;

use super::{
    Agg, AggBox, BinOp, BinOpBox, Expr, MAX_DEPTH, MAX_LEN, ParseError, Place, TopoFn, Value, Var,
    cap,
};
use crate::agent::router::topology::Level;

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
}
