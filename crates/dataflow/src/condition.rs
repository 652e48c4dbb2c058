//! Conditions of `filter` and `router`.
//!
//! ```text
//! condition  := or
//! or         := and ( "||" and )*
//! and        := unary ( "&&" unary )*
//! unary      := "!" unary | "(" or ")" | comparison
//! comparison := path [ op literal ]
//! op         := "==" | "!=" | ">" | ">=" | "<" | "<="
//! literal    := number | 'text' | "text" | true | false | null
//! ```
//!
//! A bare path is true when the field exists and is not `false`, `null`,
//! `0`, `""` or `"false"` (upstream's truthiness). `==` and `!=` compare
//! numbers as numbers and anything else by value; a string field also equals
//! a literal written as its text (`status == 200` matches `"200"`), as
//! upstream compares text. Ordering operators need two numbers or two
//! strings. A missing field makes a comparison false (and `!=` true).

use serde_json::Value;

use super::path::{Path, PathError};

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
    Truthy(Path),
    Compare(Path, Op, Value),
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
        let end = rest
            .find(|c: char| c.is_whitespace() || "=!<>()&|".contains(c))
            .unwrap_or(rest.len());
        if end == 0 {
            return Err(self.err(format!("expected a field path at {:?}", rest)));
        }
        let path = Path::parse(&rest[..end])?;
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
            return Ok(Condition::Truthy(path));
        };
        Ok(Condition::Compare(path, op, self.literal()?))
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
            Self::Truthy(path) => path.get(data).is_some_and(truthy),
            Self::Compare(path, op, literal) => match path.get(data) {
                None => *op == Op::Ne,
                Some(value) => compare(value, *op, literal),
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

fn equal(value: &Value, literal: &Value) -> bool {
    match (value, literal) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::String(s), Value::Number(n)) => s.parse::<f64>().ok() == n.as_f64(),
        (Value::String(s), Value::Bool(b)) => *s == b.to_string(),
        (a, b) => a == b,
    }
}

fn compare(value: &Value, op: Op, literal: &Value) -> bool {
    match op {
        Op::Eq => equal(value, literal),
        Op::Ne => !equal(value, literal),
        _ => {
            let ordering = match (value, literal) {
                (Value::Number(a), Value::Number(b)) => a.as_f64().zip(b.as_f64()).and_then(|(a, b)| a.partial_cmp(&b)),
                (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
                _ => None,
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
mod tests {
    use serde_json::json;

    use super::*;

    fn eval(c: &str, data: &Value) -> bool {
        Condition::parse(c).unwrap_or_else(|e| panic!("{c}: {e}")).eval(data)
    }

    #[test]
    fn truthiness_as_upstream() {
        let d = json!({"t": true, "f": false, "z": 0, "n": null, "e": "", "s": "false", "x": "yes", "o": {}, "one": 1});
        for (path, expected) in [
            ("t", true),
            ("f", false),
            ("z", false),
            ("n", false),
            ("e", false),
            ("s", false),
            ("x", true),
            ("o", true),
            ("one", true),
            ("missing", false),
            ("$.t", true),
        ] {
            assert_eq!(eval(path, &d), expected, "{path}");
        }
    }

    #[test]
    fn comparisons_and_logic() {
        let d = json!({"kind": "order", "amount": 120.5, "code": "200", "user": {"age": 30}, "items": [{"sku": "a"}]});
        for (c, expected) in [
            ("kind == 'order'", true),
            ("$.kind == \"order\"", true),
            ("kind != 'order'", false),
            ("amount > 100", true),
            ("amount <= 100", false),
            ("code == 200", true),
            ("user.age >= 30 && kind == 'order'", true),
            ("user.age < 18 || items[0].sku == 'a'", true),
            ("!(amount > 100)", false),
            ("missing == 1", false),
            ("missing != 1", true),
            ("kind > 5", false),
            ("kind < 'p'", true),
        ] {
            assert_eq!(eval(c, &d), expected, "{c}");
        }
    }

    #[test]
    fn long_chains_and_runs_of_not_are_flat() {
        let d = json!({"a": 1});
        let chain = vec!["a"; MAX_TERMS].join(" && ");
        assert!(eval(&chain, &d));
        let Condition::All(members) = Condition::parse(&chain).unwrap() else {
            panic!("a chain of && is one node");
        };
        assert_eq!(members.len(), MAX_TERMS);
        // Far more `!` than any stack would take if each were a call.
        let nots = format!("{}a", "!".repeat(MAX_LENGTH - 1));
        assert_eq!(
            Condition::parse(&nots).unwrap(),
            Condition::Not(Box::new(Condition::parse("a").unwrap()))
        );
        assert!(!eval(&format!("{}a", "!".repeat(1001)), &d));
        assert!(eval(&format!("{}a", "!".repeat(1000)), &d));
        assert!(eval("a != 2 && !(a == 2)", &d));
    }

    #[test]
    fn what_a_tenant_can_store_is_bounded() {
        let nested = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
        assert!(eval(&nested(MAX_DEPTH), &json!({"a": 1})));
        assert_eq!(Condition::parse(&nested(MAX_DEPTH + 1)), Err(ConditionError::TooDeep));
        // What crashed the process: 520 parentheses, 1,600 `!` with them.
        assert_eq!(Condition::parse(&nested(520)), Err(ConditionError::TooDeep));
        assert_eq!(
            Condition::parse(&format!("{}(a)", "!(".repeat(800))),
            Err(ConditionError::TooDeep)
        );
        let chain = vec!["a"; MAX_TERMS + 1].join(" && ");
        assert_eq!(Condition::parse(&chain), Err(ConditionError::TooManyTerms));
        let huge = vec!["a"; 20_000].join(" && ");
        assert_eq!(Condition::parse(&huge), Err(ConditionError::TooLong(huge.len())));
        for e in [
            ConditionError::TooDeep,
            ConditionError::TooManyTerms,
            ConditionError::TooLong(5000),
        ] {
            assert!(e.to_string().contains("condition"), "{e}");
        }
    }

    #[test]
    fn syntax_errors_are_named() {
        for bad in ["", "a ==", "a == 'x", "(a", "a == b c", "a..b", "== 1", "a == nope"] {
            assert!(Condition::parse(bad).is_err(), "{bad}");
        }
    }
}
