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
    /// The key's new name; `None` when it stays as it is.
    fn rename(key: &str) -> Option<String>;
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
        rename_keys::<C>(&mut message.data, self.deep);
        vec![message]
    }
}

/// Renames the keys of `value` (and of nested objects with `deep`) in
/// place: most keys of a row keep their names and are not copied.
fn rename_keys<C: Case>(value: &mut Value, deep: bool) {
    match value {
        Value::Object(map) => {
            let renames: Vec<(String, String)> = map
                .keys()
                .filter_map(|k| C::rename(k).map(|new| (k.clone(), new)))
                .collect();
            // A set of the new names only when there are two or more.
            let mut targets = std::collections::HashSet::new();
            let collide = renames
                .iter()
                .any(|(_, new)| map.contains_key(new) || (renames.len() > 1 && !targets.insert(new.as_str())));
            if collide {
                // Two keys get one name: as when the object is built anew,
                // the one last in key order keeps it.
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| (C::rename(&k).unwrap_or(k), v))
                    .collect();
            } else {
                for (old, new) in renames {
                    if let Some(v) = map.remove(&old) {
                        map.insert(new, v);
                    }
                }
            }
            if deep {
                map.values_mut().for_each(|v| rename_keys::<C>(v, deep));
            }
        }
        Value::Array(items) if deep => items.iter_mut().for_each(|v| rename_keys::<C>(v, deep)),
        _ => {}
    }
}
