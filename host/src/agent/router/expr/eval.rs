//! Evaluation: an [`Expr`] against one message's [`Scope`], without panics; a type mismatch
//! is an [`EvalError`].

use super::{Agg, AggBox, BinOp, BinOpBox, EvalError, Expr, Scope, TopoFn, Value, cap};
use crate::agent::router::topology::{Level, Topology};

impl Expr {
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
