//! Typed `config` objects of the transformations, with upstream's field names.

use serde::{Deserialize, Serialize};

use super::connector_config::{self, Role};
use super::dataflow::ConnectorSpec;
use super::{FieldError, ValidationErrors};

/// Most routes of one router.
pub const MAX_ROUTES: usize = 32;
/// Most fields of one mask, select or remove.
pub const MAX_FIELDS: usize = 256;

pub const TYPES: &[&str] = &[
    "timestamp",
    "flatten",
    "filter",
    "mask",
    "router",
    "select",
    "remove",
    "snakeCase",
    "camelCase",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimestampConfig {
    /// Default `created_at`.
    pub field_name: Option<String>,
    /// Default RFC 3339.
    pub format: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlattenConfig {
    #[serde(default)]
    pub field: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    #[serde(default)]
    pub condition: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaskConfig {
    #[serde(default)]
    pub fields: Vec<String>,
    /// Default `*`.
    pub mask_char: Option<String>,
    #[serde(default)]
    pub keep_length: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    #[serde(default)]
    pub condition: String,
    pub sink: Option<ConnectorSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    #[serde(default)]
    pub routes: Vec<RouteRule>,
}

/// Config of `select` and `remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsConfig {
    #[serde(default)]
    pub fields: Vec<String>,
}

/// Config of `snakeCase` and `camelCase`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseConfig {
    /// Also rename keys of nested objects.
    #[serde(default)]
    pub deep: bool,
}

/// Validates the `config` (at `path`) of a transformation of type `kind`,
/// which must be one of [`TYPES`].
pub fn validate(kind: &str, config: &serde_json::Value, path: &str, errors: &mut ValidationErrors) {
    use connector_config::parse;
    let non_empty = |value: &str, field: &str, errors: &mut ValidationErrors| {
        if value.is_empty() {
            errors.push(FieldError::required(format!("{path}.{field}")));
        }
    };
    let fields_given = |fields: &[String], errors: &mut ValidationErrors| {
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
            non_empty(f, &format!("fields[{i}]"), errors);
        }
    };
    match kind {
        "timestamp" => {
            parse::<TimestampConfig>(config, path, errors);
        }
        "flatten" => {
            if let Some(c) = parse::<FlattenConfig>(config, path, errors) {
                non_empty(&c.field, "field", errors);
            }
        }
        "filter" => {
            if let Some(c) = parse::<FilterConfig>(config, path, errors) {
                non_empty(&c.condition, "condition", errors);
            }
        }
        "mask" => {
            if let Some(c) = parse::<MaskConfig>(config, path, errors) {
                fields_given(&c.fields, errors);
                if c.mask_char.as_deref().is_some_and(|m| m.chars().count() != 1) {
                    errors.push(FieldError::invalid(
                        format!("{path}.maskChar"),
                        "must be exactly one character",
                    ));
                }
            }
        }
        "router" => {
            if let Some(c) = parse::<RouterConfig>(config, path, errors) {
                if c.routes.is_empty() {
                    errors.push(FieldError::invalid(
                        format!("{path}.routes"),
                        "at least one route is required",
                    ));
                }
                if c.routes.len() > MAX_ROUTES {
                    errors.push(FieldError::invalid(
                        format!("{path}.routes"),
                        format!("at most {MAX_ROUTES} routes are allowed (got {})", c.routes.len()),
                    ));
                    return;
                }
                for (i, route) in c.routes.iter().enumerate() {
                    let route_path = format!("{path}.routes[{i}]");
                    if route.condition.is_empty() {
                        errors.push(FieldError::required(format!("{route_path}.condition")));
                    }
                    ConnectorSpec::validate_opt(route.sink.as_ref(), Role::Sink, &format!("{route_path}.sink"), errors);
                }
            }
        }
        "select" | "remove" => {
            if let Some(c) = parse::<FieldsConfig>(config, path, errors) {
                fields_given(&c.fields, errors);
            }
        }
        "snakeCase" | "camelCase" => {
            parse::<CaseConfig>(config, path, errors);
        }
        other => errors.push(FieldError::not_supported(path, other, TYPES)),
    }
}
