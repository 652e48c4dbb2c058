//! What every dataflow component has, whatever its kind: the `type` a spec
//! names it with, its `config`, and the rules on that config. Sources,
//! transformations and sinks each add how the processor starts them
//! (`sources::Open`, `transforms::Build`, `sinks::Open`), and
//! [`crate::registry`] lists them as [`Descriptor`]s.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;

pub trait Component: Sized + 'static {
    /// The `type` a spec names it with.
    const KIND: &'static str;
    type Config: DeserializeOwned + Send + Sync;

    /// Field rules beyond the config's types (required, counts), each
    /// problem at its field under `path`.
    fn check(_config: &Self::Config, _path: &str, _errors: &mut ValidationErrors) {}

    /// Rules on names a tenant may give only within its `scope` (what
    /// [`crate::context::PipelineContext::tenant`] is: names on servers
    /// tenants share), each problem at its field under `path`.
    fn check_scope(_config: &Self::Config, _scope: &str, _path: &str, _errors: &mut ValidationErrors) {}
}

/// Checks a component's `config` at `path`, reporting each problem there.
pub type CheckFn = fn(&Value, &str, &mut ValidationErrors);
/// Checks the names a component's `config` gives against a tenant's scope
/// (`config`, scope, `path`).
pub type ScopeCheckFn = fn(&Value, &str, &str, &mut ValidationErrors);

/// One registry entry: a component with its type erased. `start` is how
/// the processor makes it (builds a transformation, connects a connector).
pub struct Descriptor<Start> {
    pub kind: &'static str,
    pub check: CheckFn,
    pub check_scope: ScopeCheckFn,
    pub(crate) start: Start,
}

/// The entry of `list` whose type is `kind`.
pub fn find<Start>(list: &'static [Descriptor<Start>], kind: &str) -> Option<&'static Descriptor<Start>> {
    list.iter().find(|d| d.kind == kind)
}

/// The types `list` knows, for error messages.
pub fn kinds<Start>(list: &[Descriptor<Start>]) -> Vec<&'static str> {
    list.iter().map(|d| d.kind).collect()
}

/// Parses `config` as `C`'s and applies its rules; `None` when it does
/// not parse.
pub fn check<C: Component>(config: &Value, path: &str, errors: &mut ValidationErrors) -> Option<C::Config> {
    let parsed = parse::<C::Config>(config, path, errors)?;
    C::check(&parsed, path, errors);
    Some(parsed)
}

/// [`check`] as a [`CheckFn`].
pub fn check_fn<C: Component>(config: &Value, path: &str, errors: &mut ValidationErrors) {
    check::<C>(config, path, errors);
}

/// [`Component::check_scope`] as a [`ScopeCheckFn`]; a config that does
/// not parse is [`check`]'s to report.
pub fn check_scope_fn<C: Component>(config: &Value, scope: &str, path: &str, errors: &mut ValidationErrors) {
    if let Ok(parsed) = C::Config::deserialize(config) {
        C::check_scope(&parsed, scope, path, errors);
    }
}

/// A connector's config as its connect and release take it: one the
/// spec's checks passed, so a failure here is the spec's.
pub fn connector_config<C: Component>(config: &Value) -> Result<C::Config, ConnectorError> {
    serde::Deserialize::deserialize(config).map_err(|e: serde_json::Error| ConnectorError::Config(e.to_string()))
}

/// Deserialises a component config, reporting serde's message at `path`.
pub fn parse<T: DeserializeOwned>(config: &Value, path: &str, errors: &mut ValidationErrors) -> Option<T> {
    match T::deserialize(config) {
        Ok(value) => Some(value),
        Err(e) => {
            errors.push(FieldError::invalid(path, e.to_string()));
            None
        }
    }
}

/// A value given inline, or else the reason it is missing: a `…SecretRef`
/// is resolved by the kubernetes operator, never by the processor.
pub fn inline<'a>(value: Option<&'a str>, secret: &Option<SecretRef>, field: &str) -> Result<&'a str, ConnectorError> {
    match (value.filter(|v| !v.is_empty()), secret) {
        (Some(v), _) => Ok(v),
        (None, Some(_)) => Err(ConnectorError::Config(format!(
            "{field}SecretRef was not resolved: give {field} inline here, secrets are resolved only in kubernetes mode"
        ))),
        (None, None) => Err(ConnectorError::Config(format!("{field} is required"))),
    }
}

/// Requires `field` inline or through `{field}SecretRef`, and checks the ref.
pub fn either(inline: bool, reference: &Option<SecretRef>, path: &str, field: &str, errors: &mut ValidationErrors) {
    let ref_field = format!("{field}SecretRef");
    if !inline && reference.is_none() {
        errors.push(FieldError::invalid(
            format!("{path}.{field}"),
            format!("{field} or {ref_field} is required"),
        ));
    }
    secret_ref(reference, path, &ref_field, errors);
}

pub fn secret_ref(reference: &Option<SecretRef>, path: &str, field: &str, errors: &mut ValidationErrors) {
    if let Some(r) = reference {
        if r.name.is_empty() {
            errors.push(FieldError::required(format!("{path}.{field}.name")));
        }
        if r.key.is_empty() {
            errors.push(FieldError::required(format!("{path}.{field}.key")));
        }
    }
}

pub fn non_empty(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|v| !v.is_empty())
}

/// What every database connector requires: a connection string and, where
/// it names one (`table` is `Some`), a table, each inline or through its
/// `…SecretRef`.
pub fn check_target(
    connection_string: (&Option<String>, &Option<SecretRef>),
    table: Option<(&Option<String>, &Option<SecretRef>)>,
    path: &str,
    errors: &mut ValidationErrors,
) {
    either(
        non_empty(connection_string.0),
        connection_string.1,
        path,
        "connectionString",
        errors,
    );
    if let Some((table, table_ref)) = table {
        either(non_empty(table), table_ref, path, "table", errors);
    }
}
