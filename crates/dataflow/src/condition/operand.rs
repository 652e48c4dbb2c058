//! What a comparison looks at: a field, an array's length (`items.#`), or
//! the first element of an array for which a condition holds
//! (`items.#(qty>2)`, then optionally a field of it), as upstream's gjson
//! paths have them.

use std::borrow::Cow;

use serde_json::Value;

use super::{Condition, ConditionError};
use crate::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Field(Path),
    /// `path.#`: how many elements the array has.
    Count(Path),
    /// `path.#(filter)[.then]`: the first element where `filter` holds.
    First {
        array: Path,
        filter: Box<Condition>,
        then: Option<Path>,
    },
}

/// Where an operand's text ends in `text`: at whitespace or an operator
/// character, except inside the parentheses of `#(…)`.
pub(super) fn token_end(text: &str) -> usize {
    let mut depth = 0usize;
    let mut previous = None;
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth > 0 || previous == Some('#') => depth += 1,
            ')' if depth > 0 => depth -= 1,
            c if depth == 0 && (c.is_whitespace() || "=!<>()&|".contains(c)) => return i,
            _ => {}
        }
        previous = Some(c);
    }
    text.len()
}

/// `(array, filter, then)` of an array query `array.#(filter)[.then]`, or
/// `None` when `text` is not one.
pub(super) fn split_query(text: &str) -> Result<Option<(&str, &str, &str)>, &'static str> {
    let Some(start) = text.find(".#(") else {
        return Ok(None);
    };
    let open = start + 3;
    let mut depth = 1usize;
    let mut close = None;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close.ok_or("an array query #( is not closed")?;
    let after = &text[close + 1..];
    let then = match after.strip_prefix('.') {
        Some(then) if !then.is_empty() => then,
        None if after.is_empty() => "",
        _ => return Err("an array query #(…) may be followed only by .field"),
    };
    Ok(Some((&text[..start], &text[open..close], then)))
}

impl Operand {
    /// A field, or with `.#` at its end the count of an array.
    pub fn field_or_count(text: &str) -> Result<Self, ConditionError> {
        Ok(match text.strip_suffix(".#") {
            Some(array) => Self::Count(Path::parse(array)?),
            None => Self::Field(Path::parse(text)?),
        })
    }

    pub(super) fn query(array: &str, filter: Condition, then: &str) -> Result<Self, ConditionError> {
        Ok(Self::First {
            array: Path::parse(array)?,
            filter: Box::new(filter),
            then: if then.is_empty() {
                None
            } else {
                Some(Path::parse(then)?)
            },
        })
    }

    /// Its value in `data`, if there is one.
    pub fn resolve<'a>(&self, data: &'a Value) -> Option<Cow<'a, Value>> {
        match self {
            Self::Field(path) => path.get(data).map(Cow::Borrowed),
            Self::Count(path) => Some(Cow::Owned(Value::from(path.get(data)?.as_array()?.len()))),
            Self::First { array, filter, then } => {
                let first = array.get(data)?.as_array()?.iter().find(|item| filter.eval(item))?;
                match then {
                    None => Some(Cow::Borrowed(first)),
                    Some(path) => path.get(first).map(Cow::Borrowed),
                }
            }
        }
    }
}
