//! Conditions of `filter` and `router`.
//!
//! ```text
//! condition  := or
//! or         := and ( "||" and )*
//! and        := unary ( "&&" unary )*
//! unary      := "!" unary | "(" or ")" | comparison
//! comparison := operand [ op literal ]
//! operand    := path | path ".#" | path ".#(" condition ")" [ "." path ]
//! op         := "==" | "!=" | ">" | ">=" | "<" | "<="
//! literal    := number | 'text' | "text" | true | false | null
//! ```
//!
//! The operands follow upstream's gjson: `items.#` is how many elements the
//! array has, `items.#(qty>2)` the first element for which the condition
//! holds (a bare one is true when there is one), and `items.#(qty>2).sku`
//! a field of it. A bare operand is true when it exists and is not `false`,
//! `null`, `0`, `""` or `"false"` (upstream's truthiness). `==` and `!=`
//! compare numbers as numbers and anything else by value; a number or a
//! boolean also equals a literal written as its text, and the other way
//! round (`status == 200` matches `"200"`, `level == '5'` matches 5), as
//! upstream compares text. Ordering operators need two numbers (a numeric
//! text counts as one) or two strings. A missing field makes a comparison
//! false (and `!=` true).

mod operand;

pub use operand::Operand;

use serde_json::Value;

use super::path::PathError;

/// Longest condition text accepted.
pub const MAX_LENGTH: usize = 4096;
/// Deepest nesting of parentheses. Parsing, evaluating and dropping recurse
/// only per level of parentheses (an `&&`/`||` chain is one flat list and a
/// run of `!` folds into one), so this bounds the stack any stored condition
/// can use.
pub const MAX_DEPTH: usize = 16;
/// Most comparisons (and bare paths) in one condition.
pub const MAX_TERMS: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Truthy(Operand),
    Compare(Operand, Op, Value),
    Not(Box<Condition>),
    /// Every member holds (`a && b && …`).
    All(Vec<Condition>),
    /// Some member holds (`a || b || …`).
    Any(Vec<Condition>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("invalid condition {condition:?}: {reason}")]
    Syntax { condition: String, reason: String },
    #[error("the condition is {0} bytes long; at most {MAX_LENGTH} are allowed")]
    TooLong(usize),
    #[error("the condition nests parentheses deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the condition has more than {MAX_TERMS} comparisons")]
    TooManyTerms,
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
    terms: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, reason: impl Into<String>) -> ConditionError {
        ConditionError::Syntax {
            condition: self.text.to_owned(),
            reason: reason.into(),
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Condition, ConditionError> {
        let mut members = vec![self.and()?];
        while self.eat("||") {
            members.push(self.and()?);
        }
        Ok(flatten(members, Condition::Any))
    }

    fn and(&mut self) -> Result<Condition, ConditionError> {
        let mut members = vec![self.unary()?];
        while self.eat("&&") {
            members.push(self.unary()?);
        }
        Ok(flatten(members, Condition::All))
    }

    fn unary(&mut self) -> Result<Condition, ConditionError> {
        // A run of `!` is counted, not recursed into.
        let mut negations = 0usize;
        loop {
            self.skip_ws();
            if self.rest().starts_with('!') && !self.rest().starts_with("!=") {
                self.pos += 1;
                negations += 1;
            } else {
                break;
            }
        }
        let inner = if self.eat("(") {
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err(ConditionError::TooDeep);
            }
            let inner = self.or()?;
            if !self.eat(")") {
                return Err(self.err("missing )"));
            }
            self.depth -= 1;
            inner
        } else {
            self.comparison()?
        };
        Ok(if negations % 2 == 1 {
            Condition::Not(Box::new(inner))
        } else {
            inner
        })
    }

    fn comparison(&mut self) -> Result<Condition, ConditionError> {
        self.terms += 1;
        if self.terms > MAX_TERMS {
            return Err(ConditionError::TooManyTerms);
        }
        self.skip_ws();
        let rest = self.rest();
        let end = operand::token_end(rest);
        if end == 0 {
            return Err(self.err(format!("expected a field path at {:?}", rest)));
        }
        let operand = self.operand(&rest[..end])?;
        self.pos += end;
        let op = [
            ("==", Op::Eq),
            ("!=", Op::Ne),
            (">=", Op::Ge),
            ("<=", Op::Le),
            (">", Op::Gt),
            ("<", Op::Lt),
        ]
        .into_iter()
        .find(|(token, _)| self.eat(token))
        .map(|(_, op)| op);
        let Some(op) = op else {
            return Ok(Condition::Truthy(operand));
        };
        Ok(Condition::Compare(operand, op, self.literal()?))
    }

    /// An operand's text; the condition of an array query is parsed one
    /// level deeper, its comparisons counted with the rest.
    fn operand(&mut self, text: &str) -> Result<Operand, ConditionError> {
        let Some((array, inner, rest)) = operand::split_query(text).map_err(|reason| self.err(reason))? else {
            return Operand::field_or_count(text);
        };
        if self.depth + 1 > MAX_DEPTH {
            return Err(ConditionError::TooDeep);
        }
        let mut nested = Parser {
            text: inner,
            pos: 0,
            depth: self.depth + 1,
            terms: self.terms,
        };
        let filter = nested.or()?;
        nested.skip_ws();
        if !nested.rest().is_empty() {
            return Err(nested.err(format!("unexpected {:?}", nested.rest())));
        }
        self.terms = nested.terms;
        Operand::query(array, filter, rest)
    }

    fn literal(&mut self) -> Result<Value, ConditionError> {
        self.skip_ws();
        let rest = self.rest();
        if let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
            let mut text = String::new();
            let mut escaped = false;
            for (i, c) in rest[1..].char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    c if c == quote && !escaped => {
                        self.pos += i + 2;
                        return Ok(Value::String(text));
                    }
                    c => {
                        text.push(c);
                        escaped = false;
                    }
                }
            }
            return Err(self.err("unterminated string"));
        }
        let end = rest
            .find(|c: char| c.is_whitespace() || "()&|".contains(c))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        let value = match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            w => serde_json::from_str::<serde_json::Number>(w)
                .map(Value::Number)
                .map_err(|_| self.err(format!("{w:?} is not a number, quoted text, true, false or null")))?,
        };
        self.pos += end;
        Ok(value)
    }
}

/// One member stays itself; several become one n-ary node.
fn flatten(mut members: Vec<Condition>, node: fn(Vec<Condition>) -> Condition) -> Condition {
    if members.len() == 1 {
        members.remove(0)
    } else {
        node(members)
    }
}

impl Condition {
    pub fn parse(text: &str) -> Result<Self, ConditionError> {
        if text.len() > MAX_LENGTH {
            return Err(ConditionError::TooLong(text.len()));
        }
        let mut parser = Parser {
            text,
            pos: 0,
            depth: 0,
            terms: 0,
        };
        let condition = parser.or()?;
        parser.skip_ws();
        if !parser.rest().is_empty() {
            return Err(parser.err(format!("unexpected {:?}", parser.rest())));
        }
        Ok(condition)
    }

    /// Recurses once per level of parentheses at most ([`MAX_DEPTH`]).
    pub fn eval(&self, data: &Value) -> bool {
        match self {
            Self::Truthy(operand) => operand.resolve(data).is_some_and(|v| truthy(&v)),
            Self::Compare(operand, op, literal) => match operand.resolve(data) {
                None => *op == Op::Ne,
                Some(value) => compare(&value, *op, literal),
            },
            Self::Not(c) => !c.eval(data),
            Self::All(members) => members.iter().all(|c| c.eval(data)),
            Self::Any(members) => members.iter().any(|c| c.eval(data)),
        }
    }
}

/// Upstream's truthiness of a field value.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty() && s != "false",
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// A number, or a text that is one.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn equal(value: &Value, literal: &Value) -> bool {
    match (value, literal) {
        (Value::Number(_), Value::Number(_) | Value::String(_)) | (Value::String(_), Value::Number(_)) => {
            number(value).is_some_and(|a| Some(a) == number(literal))
        }
        (Value::String(s), Value::Bool(b)) | (Value::Bool(b), Value::String(s)) => *s == b.to_string(),
        (a, b) => a == b,
    }
}

fn compare(value: &Value, op: Op, literal: &Value) -> bool {
    match op {
        Op::Eq => equal(value, literal),
        Op::Ne => !equal(value, literal),
        _ => {
            let ordering = match (value, literal) {
                (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
                _ => number(value).zip(number(literal)).and_then(|(a, b)| a.partial_cmp(&b)),
            };
            ordering.is_some_and(|o| match op {
                Op::Gt => o.is_gt(),
                Op::Ge => o.is_ge(),
                Op::Lt => o.is_lt(),
                _ => o.is_le(),
            })
        }
    }
}

#[cfg(test)]
mod tests;
