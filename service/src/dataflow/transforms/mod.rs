//! Transformations, one file each. A transformation takes one message and
//! returns zero (filtered), one, or several (flattened) messages.

pub mod camel_case;
pub mod filter;
pub mod flatten;
pub mod mask;
pub mod remove;
pub mod router;
pub mod select;
pub mod snake_case;
pub mod timestamp;

use super::condition::ConditionError;
use super::message::Message;
use super::path::PathError;
use crate::model::dataflow::TransformationSpec;
use crate::model::transform_config as config;

pub trait Transform: Send + Sync {
    fn apply(&self, message: Message) -> Vec<Message>;
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("unknown transformation {0:?}")]
    Unknown(String),
    #[error("invalid {kind} configuration: {source}")]
    Config { kind: String, source: serde_json::Error },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Condition(#[from] ConditionError),
    #[error(transparent)]
    Format(#[from] timestamp::FormatError),
    /// The error of one field of the config, e.g. `routes[2].condition`.
    #[error("{field}: {source}")]
    At { field: String, source: Box<BuildError> },
}

impl BuildError {
    fn at(field: impl Into<String>, source: impl Into<BuildError>) -> Self {
        Self::At {
            field: field.into(),
            source: Box::new(source.into()),
        }
    }

    /// The config field the error is about (relative to `config`) and the
    /// error without it.
    pub fn field(&self) -> (Option<&str>, String) {
        match self {
            Self::At { field, source } => (Some(field), source.to_string()),
            other => (None, other.to_string()),
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(spec: &TransformationSpec) -> Result<T, BuildError> {
    let value = spec
        .config
        .clone()
        .unwrap_or(serde_json::Value::Object(Default::default()));
    serde_json::from_value(value).map_err(|source| BuildError::Config {
        kind: spec.kind.clone(),
        source,
    })
}

/// The paths of a `fields` list; an error names the entry.
fn paths(fields: &[String]) -> Result<Vec<super::path::Path>, BuildError> {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| super::path::Path::parse(f).map_err(|e| BuildError::at(format!("fields[{i}]"), e)))
        .collect()
}

/// Builds a transformation from its spec; every path, condition and format
/// is checked here, so a spec that builds cannot fail on them later.
pub fn build(spec: &TransformationSpec) -> Result<Box<dyn Transform>, BuildError> {
    Ok(match spec.kind.as_str() {
        "timestamp" => Box::new(timestamp::Timestamp::new(&parse::<config::TimestampConfig>(spec)?)?),
        "flatten" => Box::new(flatten::Flatten::new(&parse::<config::FlattenConfig>(spec)?)?),
        "filter" => Box::new(filter::Filter::new(&parse::<config::FilterConfig>(spec)?)?),
        "mask" => Box::new(mask::Mask::new(&parse::<config::MaskConfig>(spec)?)?),
        "router" => Box::new(router::Router::new(&parse::<config::RouterConfig>(spec)?)?),
        "select" => Box::new(select::Select::new(&parse::<config::FieldsConfig>(spec)?)?),
        "remove" => Box::new(remove::Remove::new(&parse::<config::FieldsConfig>(spec)?)?),
        "snakeCase" => Box::new(snake_case::SnakeCase::new(&parse::<config::CaseConfig>(spec)?)),
        "camelCase" => Box::new(camel_case::CamelCase::new(&parse::<config::CaseConfig>(spec)?)),
        other => return Err(BuildError::Unknown(other.to_owned())),
    })
}

/// Applies `transforms` in order to one message.
pub fn apply_all(transforms: &[Box<dyn Transform>], message: Message) -> Vec<Message> {
    transforms.iter().fold(vec![message], |messages, t| {
        messages.into_iter().flat_map(|m| t.apply(m)).collect()
    })
}

/// Renames the keys of `value` (and of nested objects with `deep`).
fn rename_keys(value: serde_json::Value, deep: bool, rename: &dyn Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (rename(&k), if deep { rename_keys(v, deep, rename) } else { v }))
                .collect(),
        ),
        Value::Array(items) if deep => Value::Array(items.into_iter().map(|v| rename_keys(v, deep, rename)).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(kind: &str, config: serde_json::Value) -> TransformationSpec {
        TransformationSpec {
            kind: kind.into(),
            config: Some(config),
        }
    }

    #[test]
    fn a_chain_filters_flattens_and_masks_in_order() {
        let chain: Vec<_> = [
            spec("filter", json!({"condition": "status == 'paid'"})),
            spec("flatten", json!({"field": "items"})),
            spec("mask", json!({"fields": ["card"], "keepLength": true})),
            spec("select", json!({"fields": ["id", "sku", "card"]})),
        ]
        .iter()
        .map(|s| build(s).unwrap())
        .collect();
        let paid =
            Message::new(json!({"id": 1, "status": "paid", "card": "4111", "items": [{"sku": "a"}, {"sku": "b"}]}));
        let out = apply_all(&chain, paid);
        assert_eq!(
            out.iter().map(|m| m.data.clone()).collect::<Vec<_>>(),
            [
                json!({"id": 1, "sku": "a", "card": "****"}),
                json!({"id": 1, "sku": "b", "card": "****"})
            ]
        );
        let unpaid = Message::new(json!({"id": 2, "status": "new", "items": [{"sku": "a"}]}));
        assert!(apply_all(&chain, unpaid).is_empty());
    }

    #[test]
    fn bad_specs_do_not_build() {
        assert!(build(&spec("filter", json!({"condition": "a =="}))).is_err());
        assert!(build(&spec("mask", json!({"fields": ["a..b"]}))).is_err());
        assert!(build(&spec("timestamp", json!({"format": "bogus"}))).is_err());
        assert!(build(&spec("explode", json!({}))).is_err());
    }
}
