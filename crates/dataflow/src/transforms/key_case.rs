//! What `snakeCase` and `camelCase` share: a transformation that renames
//! the keys of the message (and of nested objects with `deep`); each of
//! them is a [`Case`], the one function that renames a key.

use std::marker::PhantomData;

use serde::Deserialize;
use serde_json::Value;

use super::{Build, BuildError, Message, Outputs, Transform};
use crate::component::Component;

/// Config of `snakeCase` and `camelCase`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseConfig {
    /// Also rename keys of nested objects.
    #[serde(default)]
    pub deep: bool,
}

/// One way of writing keys.
pub trait Case: Send + Sync + 'static {
    /// The transformation's `type`.
    const KIND: &'static str;
    fn rename(key: String) -> String;
}

pub struct RenameKeys<C> {
    deep: bool,
    case: PhantomData<C>,
}

impl<C: Case> RenameKeys<C> {
    pub fn new(config: &CaseConfig) -> Self {
        Self {
            deep: config.deep,
            case: PhantomData,
        }
    }
}

impl<C: Case> Component for RenameKeys<C> {
    const KIND: &'static str = C::KIND;
    type Config = CaseConfig;
}

impl<C: Case> Build for RenameKeys<C> {
    fn build(config: CaseConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Ok(Self::new(&config))
    }
}

impl<C: Case> Transform for RenameKeys<C> {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        message.data = rename_keys(std::mem::take(&mut message.data), self.deep, &C::rename);
        vec![message]
    }
}

/// Renames the keys of `value` (and of nested objects with `deep`).
fn rename_keys(value: Value, deep: bool, rename: &dyn Fn(String) -> String) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (rename(k), if deep { rename_keys(v, deep, rename) } else { v }))
                .collect(),
        ),
        Value::Array(items) if deep => Value::Array(items.into_iter().map(|v| rename_keys(v, deep, rename)).collect()),
        other => other,
    }
}
