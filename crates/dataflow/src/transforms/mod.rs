//! Transformations, one file each. A transformation takes one message and
//! returns zero (filtered), one, or several (flattened) messages.

pub mod camel_case;
pub mod filter;
pub mod flatten;
pub mod key_case;
pub mod mask;
pub mod remove;
pub mod router;
pub mod select;
pub mod snake_case;
pub mod timestamp;

use serde::Deserialize;
use serde_json::Value;
use sless_model::dataflow::ConnectorSpec;
use sless_model::{FieldError, ValidationErrors};

use crate::component::{self, Component};
use crate::condition::ConditionError;
use crate::message::{Message, Output};
use crate::path::PathError;

/// Most fields of one mask, select or remove.
pub const MAX_FIELDS: usize = 256;

pub trait Transform: Send + Sync {
    fn apply(&self, message: Message) -> Vec<Message>;
}

/// A transformation type: a [`Component`] that is built. One file holds
/// each; [`crate::registry::TRANSFORMS`] lists them.
pub trait Build: Component + Transform {
    /// Builds the transformation; every path, condition and format is
    /// checked here, so a spec that builds cannot fail on them later. Extra
    /// outputs (a router's routes) are taken from `outputs`.
    fn build(config: Self::Config, outputs: &mut Outputs) -> Result<Self, BuildError>;

    /// Hands each sink a config as a spec gives it names (a router's
    /// routes) to `visit` with its field, to read or change: the registry
    /// checks them as it checks the pipeline's own sinks, and platforms
    /// resolve what they name. A config that does not parse names none.
    fn visit_sinks(_config: &mut Value, _visit: &mut SinkVisitor<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// What [`Build::visit_sinks`] hands each sink to: its field in the config
/// (e.g. `routes[2].sink`) and the sink.
pub type SinkVisitor<'a> = dyn FnMut(&str, &mut ConnectorSpec) -> Result<(), String> + 'a;

pub type BuildFn = fn(&Value, &mut Outputs) -> Result<Box<dyn Transform>, BuildError>;
pub type VisitSinksFn = fn(&mut Value, &mut SinkVisitor<'_>) -> Result<(), String>;

/// How the processor makes a transformation, and the sinks its config names.
pub struct Making {
    pub(crate) build: BuildFn,
    pub(crate) visit_sinks: VisitSinksFn,
}

/// A registry entry of a transformation.
pub type Descriptor = component::Descriptor<Making>;

impl Descriptor {
    pub const fn of<C: Build>() -> Self {
        Self {
            kind: C::KIND,
            check: check_by_building::<C>,
            check_scope: component::check_scope_fn::<C>,
            start: Making {
                build: build_boxed::<C>,
                visit_sinks: C::visit_sinks,
            },
        }
    }
}

/// Checks a config as a spec gives it: its types, its field rules, and
/// then by building it.
fn check_by_building<C: Build>(config: &Value, path: &str, errors: &mut ValidationErrors) {
    let before = errors.0.len();
    let Some(config) = component::check::<C>(config, path, errors) else {
        return;
    };
    if errors.0.len() == before
        && let Err(e) = C::build(config, &mut Outputs::default())
    {
        let (field, message) = e.field();
        let field = field.map_or(path.to_owned(), |f| format!("{path}.{f}"));
        errors.push(FieldError::invalid(field, message));
    }
}

fn build_boxed<C: Build>(config: &Value, outputs: &mut Outputs) -> Result<Box<dyn Transform>, BuildError> {
    let config = C::Config::deserialize(config).map_err(|source| BuildError::Config {
        kind: C::KIND.to_owned(),
        source,
    })?;
    Ok(Box::new(C::build(config, outputs)?))
}

/// The extra outputs of a pipeline, each with the sink it writes to, in the
/// order the transformations declared them.
#[derive(Debug, Default)]
pub struct Outputs(Vec<ConnectorSpec>);

impl Outputs {
    pub fn add(&mut self, sink: ConnectorSpec) -> Output {
        self.0.push(sink);
        Output::Route(self.0.len() - 1)
    }

    pub fn sinks(&self) -> &[ConnectorSpec] {
        &self.0
    }
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

/// The paths of a `fields` list; an error names the entry.
fn paths(fields: &[String]) -> Result<Vec<crate::path::Path>, BuildError> {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| crate::path::Path::parse(f).map_err(|e| BuildError::at(format!("fields[{i}]"), e)))
        .collect()
}

/// Config of `select` and `remove`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsConfig {
    #[serde(default)]
    pub fields: Vec<String>,
}

impl FieldsConfig {
    pub fn check(&self, path: &str, errors: &mut ValidationErrors) {
        check_fields(&self.fields, path, errors);
    }
}

/// The `fields` of a config at `path`: at least one, at most
/// [`MAX_FIELDS`], none empty.
pub fn check_fields(fields: &[String], path: &str, errors: &mut ValidationErrors) {
    {
        if fields.is_empty() {
            errors.push(FieldError::invalid(
                format!("{path}.fields"),
                "at least one field is required",
            ));
        }
        if fields.len() > MAX_FIELDS {
            errors.push(FieldError::invalid(
                format!("{path}.fields"),
                format!("at most {MAX_FIELDS} fields are allowed (got {})", fields.len()),
            ));
            return;
        }
        for (i, f) in fields.iter().enumerate() {
            if f.is_empty() {
                errors.push(FieldError::required(format!("{path}.fields[{i}]")));
            }
        }
    }
}

/// Applies `transforms` in order to one message.
pub fn apply_all(transforms: &[Box<dyn Transform>], message: Message) -> Vec<Message> {
    transforms.iter().fold(vec![message], |mut messages, t| {
        // One message in, as for most rows: its output is the new list.
        if messages.len() == 1
            && let Some(message) = messages.pop()
        {
            return t.apply(message);
        }
        messages.into_iter().flat_map(|m| t.apply(m)).collect()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sless_model::dataflow::TransformationSpec;

    use super::*;
    use crate::registry::build_transform as build;

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
        .map(|s| build(s, &mut Outputs::default()).unwrap())
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
        let build = |s: &TransformationSpec| build(s, &mut Outputs::default());
        assert!(build(&spec("filter", json!({"condition": "a =="}))).is_err());
        assert!(build(&spec("mask", json!({"fields": ["a..b"]}))).is_err());
        assert!(build(&spec("timestamp", json!({"format": "rfc3339"}))).is_err());
        assert!(build(&spec("explode", json!({}))).is_err());
    }
}
