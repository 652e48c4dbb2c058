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

#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Truthy(Path),
    Compare(Path, Op, Value),
    Not(Box<Condition>),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
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
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
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
        let mut left = self.and()?;
        while self.eat("||") {
            left = Condition::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Condition, ConditionError> {
        let mut left = self.unary()?;
        while self.eat("&&") {
            left = Condition::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Condition, ConditionError> {
        if self.eat("!") && !self.rest().starts_with('=') {
            return Ok(Condition::Not(Box::new(self.unary()?)));
        }
        if self.eat("(") {
            let inner = self.or()?;
            if !self.eat(")") {
                return Err(self.err("missing )"));
            }
            return Ok(inner);
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Condition, ConditionError> {
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

impl Condition {
    pub fn parse(text: &str) -> Result<Self, ConditionError> {
        let mut parser = Parser { text, pos: 0 };
        let condition = parser.or()?;
        parser.skip_ws();
        if !parser.rest().is_empty() {
            return Err(parser.err(format!("unexpected {:?}", parser.rest())));
        }
        Ok(condition)
    }

    pub fn eval(&self, data: &Value) -> bool {
        match self {
            Self::Truthy(path) => path.get(data).is_some_and(truthy),
            Self::Compare(path, op, literal) => match path.get(data) {
                None => *op == Op::Ne,
                Some(value) => compare(value, *op, literal),
            },
            Self::Not(c) => !c.eval(data),
            Self::And(a, b) => a.eval(data) && b.eval(data),
            Self::Or(a, b) => a.eval(data) || b.eval(data),
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
    fn syntax_errors_are_named() {
        for bad in ["", "a ==", "a == 'x", "(a", "a == b c", "a..b", "== 1", "a == nope"] {
            assert!(Condition::parse(bad).is_err(), "{bad}");
        }
    }
}
