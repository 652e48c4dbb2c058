//! Field paths.
//!
//! ```text
//! path    := [ "$." | "$" ] segment ( "." segment | "[" index "]" )*
//! segment := one or more characters other than . [ ] (a key of an object)
//! index   := decimal digits (an element of an array)
//! ```
//!
//! `user.address.city`, `$.items[0].price` and `items[0]` are paths. The
//! leading `$.` of JSONPath is accepted everywhere, as upstream accepts it in
//! some transformations and not others. A key of digits on an array is an
//! index, as in upstream's gjson paths: `items.0.price` is `items[0].price`.

use std::fmt;

use serde_json::{Map, Value};

/// Longest path text accepted.
pub const MAX_LENGTH: usize = 512;
/// Most steps in a path: `set` creates objects along it, so this also bounds
/// how deep a transformation can nest a message.
pub const MAX_STEPS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

impl Step {
    /// The array index this step names: `[i]`, or a key of digits.
    fn index(&self) -> Option<usize> {
        match self {
            Self::Index(i) => Some(*i),
            Self::Key(k) => array_index(k),
        }
    }
}

/// A key of decimal digits read as an array index (gjson's `items.0`).
fn array_index(key: &str) -> Option<usize> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub text: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid field path {path:?}: {reason}")]
pub struct PathError {
    pub path: String,
    pub reason: &'static str,
}

impl Path {
    pub fn parse(text: &str) -> Result<Self, PathError> {
        let err = |reason| PathError {
            path: text.to_owned(),
            reason,
        };
        let body = text
            .strip_prefix("$.")
            .or_else(|| text.strip_prefix('$'))
            .unwrap_or(text);
        if body.is_empty() {
            return Err(err("it is empty"));
        }
        if text.len() > MAX_LENGTH {
            return Err(PathError {
                path: format!("{}…", text.chars().take(32).collect::<String>()),
                reason: "it is longer than 512 bytes",
            });
        }
        let mut steps = Vec::new();
        let mut chars = body.chars().peekable();
        let mut key = String::new();
        let mut expect_key = true;
        while let Some(c) = chars.next() {
            match c {
                '.' => {
                    if key.is_empty() && expect_key {
                        return Err(err("a segment is empty"));
                    }
                    if !key.is_empty() {
                        steps.push(Step::Key(std::mem::take(&mut key)));
                    }
                    expect_key = true;
                }
                '[' => {
                    if !key.is_empty() {
                        steps.push(Step::Key(std::mem::take(&mut key)));
                    } else if steps.is_empty() {
                        return Err(err("it starts with an index"));
                    }
                    let mut digits = String::new();
                    loop {
                        match chars.next() {
                            Some(']') => break,
                            Some(d) if d.is_ascii_digit() => digits.push(d),
                            _ => return Err(err("an index must be [digits]")),
                        }
                    }
                    let index = digits.parse().map_err(|_| err("an index must be [digits]"))?;
                    steps.push(Step::Index(index));
                    expect_key = false;
                    if let Some(next) = chars.peek()
                        && *next != '.'
                        && *next != '['
                    {
                        return Err(err("an index must be followed by . or ["));
                    }
                }
                ']' => return Err(err("an unmatched ]")),
                c => {
                    key.push(c);
                    expect_key = false;
                }
            }
        }
        if !key.is_empty() {
            steps.push(Step::Key(key));
        } else if expect_key {
            return Err(err("a segment is empty"));
        }
        if steps.len() > MAX_STEPS {
            return Err(err("it has more than 32 steps"));
        }
        Ok(Self {
            text: text.to_owned(),
            steps,
        })
    }

    /// The last key of the path (what `select` names its output field).
    pub fn leaf_name(&self) -> String {
        match self.steps.last() {
            Some(Step::Key(k)) => k.clone(),
            _ => self.text.clone(),
        }
    }

    pub fn get<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.steps.iter().try_fold(value, |v, step| match (step, v) {
            (Step::Key(k), Value::Object(map)) => map.get(k),
            (Step::Key(k), Value::Array(items)) => items.get(array_index(k)?),
            (Step::Index(i), Value::Array(items)) => items.get(*i),
            _ => None,
        })
    }

    /// Sets the value at the path, creating objects on the way; an index
    /// must already exist. Returns whether it was set.
    pub fn set(&self, value: &mut Value, new: Value) -> bool {
        let Some((last, parents)) = self.steps.split_last() else {
            return false;
        };
        let mut current = value;
        for step in parents {
            current = match (step, current) {
                (Step::Key(k), Value::Object(map)) => map.entry(k.clone()).or_insert_with(|| Value::Object(Map::new())),
                (step, Value::Array(items)) => match step.index().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => return false,
                },
                _ => return false,
            };
        }
        match (last, current) {
            (Step::Key(k), Value::Object(map)) => {
                map.insert(k.clone(), new);
                true
            }
            (step, Value::Array(items)) => match step.index().and_then(|i| items.get_mut(i)) {
                Some(slot) => {
                    *slot = new;
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// Removes and returns the value at the path.
    pub fn remove(&self, value: &mut Value) -> Option<Value> {
        let (last, parents) = self.steps.split_last()?;
        let mut current = value;
        for step in parents {
            current = match (step, current) {
                (Step::Key(k), Value::Object(map)) => map.get_mut(k)?,
                (step, Value::Array(items)) => items.get_mut(step.index()?)?,
                _ => return None,
            };
        }
        match (last, current) {
            (Step::Key(k), Value::Object(map)) => map.remove(k),
            (step, Value::Array(items)) => {
                let i = step.index()?;
                (i < items.len()).then(|| items.remove(i))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn grammar() {
        for (text, steps) in [
            ("a", vec![Step::Key("a".into())]),
            ("$.a.b", vec![Step::Key("a".into()), Step::Key("b".into())]),
            ("$a", vec![Step::Key("a".into())]),
            (
                "items[2].price",
                vec![Step::Key("items".into()), Step::Index(2), Step::Key("price".into())],
            ),
            ("m[0][1]", vec![Step::Key("m".into()), Step::Index(0), Step::Index(1)]),
        ] {
            assert_eq!(Path::parse(text).unwrap().steps, steps, "{text}");
        }
        for bad in ["", "$.", "a..b", ".a", "a.", "[0]", "a[x]", "a[1", "a]", "a[0]b"] {
            assert!(Path::parse(bad).is_err(), "{bad}");
        }
        let steps = |n: usize| vec!["a"; n].join(".");
        assert!(Path::parse(&steps(MAX_STEPS)).is_ok());
        assert_eq!(
            Path::parse(&steps(MAX_STEPS + 1)).unwrap_err().reason,
            "it has more than 32 steps"
        );
        let long = "k".repeat(MAX_LENGTH + 1);
        let e = Path::parse(&long).unwrap_err();
        assert!(e.path.len() < 40, "the error does not echo the whole path");
    }

    #[test]
    fn get_set_remove() {
        let mut v = json!({"user": {"name": "ann", "tags": ["x", "y"]}});
        let p = |s| Path::parse(s).unwrap();
        assert_eq!(p("user.tags[1]").get(&v), Some(&json!("y")));
        assert_eq!(p("user.missing").get(&v), None);
        assert!(p("user.address.city").set(&mut v, json!("Oslo")));
        assert_eq!(v["user"]["address"]["city"], "Oslo");
        assert!(!p("user.tags[5]").set(&mut v, json!(1)), "indices are not created");
        assert_eq!(p("$.user.name").remove(&mut v), Some(json!("ann")));
        assert_eq!(p("user.tags[0]").remove(&mut v), Some(json!("x")));
        assert_eq!(v["user"]["tags"], json!(["y"]));
        assert_eq!(p("user.tags").leaf_name(), "tags");
    }

    #[test]
    fn a_key_of_digits_indexes_an_array_and_names_an_object_key() {
        let mut v = json!({"items": [{"card": "1234"}, {"card": "5678"}], "codes": {"0": "zero"}});
        let p = |s| Path::parse(s).unwrap();
        assert_eq!(p("items.1.card").get(&v), Some(&json!("5678")));
        assert_eq!(p("codes.0").get(&v), Some(&json!("zero")), "on an object, 0 is a key");
        assert!(p("items.0.card").set(&mut v, json!("****")));
        assert_eq!(v["items"][0]["card"], "****");
        assert!(!p("items.7.card").set(&mut v, json!(1)), "no element is created");
        assert_eq!(p("items.1").remove(&mut v), Some(json!({"card": "5678"})));
        assert_eq!(v["items"].as_array().unwrap().len(), 1);
        assert_eq!(p("items.x").get(&v), None);
    }
}
