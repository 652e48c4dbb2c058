//! `flatten`: one message per element of an array field, keeping the parent
//! fields. An object element's keys are merged into the parent; any other
//! element takes the array's place. An empty array drops the field; a
//! missing or non-array field leaves the message as it is.

use serde_json::Value;

use serde::Deserialize;
use sless_model::{FieldError, ValidationErrors};

use super::{Build, BuildError, Message, Outputs, Transform};
use crate::component::Component;
use crate::path::Path;

/// `config` of `flatten`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlattenConfig {
    #[serde(default)]
    pub field: String,
}

pub struct Flatten {
    field: Path,
}

impl Flatten {
    pub fn new(config: &FlattenConfig) -> Result<Self, BuildError> {
        Ok(Self {
            field: Path::parse(&config.field).map_err(|e| BuildError::at("field", e))?,
        })
    }
}

impl Component for Flatten {
    const KIND: &'static str = "flatten";
    type Config = FlattenConfig;

    fn check(config: &FlattenConfig, path: &str, errors: &mut ValidationErrors) {
        if config.field.is_empty() {
            errors.push(FieldError::required(format!("{path}.field")));
        }
    }
}

impl Build for Flatten {
    fn build(config: FlattenConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Flatten {
    fn apply(&self, message: Message) -> Vec<Message> {
        let Some(Value::Array(items)) = self.field.get(&message.data).cloned() else {
            return vec![message];
        };
        let mut parent = message.data.clone();
        self.field.remove(&mut parent);
        if items.is_empty() {
            return vec![message.with_data(parent)];
        }
        items
            .into_iter()
            .map(|item| {
                let mut data = parent.clone();
                match (item, &mut data) {
                    (Value::Object(fields), Value::Object(target)) => target.extend(fields),
                    (other, _) => {
                        self.field.set(&mut data, other);
                    }
                }
                message.with_data(data)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn flatten(field: &str, data: Value) -> Vec<Value> {
        Flatten::new(&FlattenConfig { field: field.into() })
            .unwrap()
            .apply(Message::new(data))
            .into_iter()
            .map(|m| m.data)
            .collect()
    }

    #[test]
    fn objects_merge_scalars_replace() {
        assert_eq!(
            flatten(
                "$.items",
                json!({"order": 7, "items": [{"sku": "a"}, {"sku": "b", "qty": 2}]})
            ),
            [
                json!({"order": 7, "sku": "a"}),
                json!({"order": 7, "sku": "b", "qty": 2})
            ]
        );
        assert_eq!(
            flatten("tags", json!({"id": 1, "tags": ["x", "y"]})),
            [json!({"id": 1, "tags": "x"}), json!({"id": 1, "tags": "y"})]
        );
        assert_eq!(flatten("tags", json!({"id": 1, "tags": []})), [json!({"id": 1})]);
        assert_eq!(
            flatten("tags", json!({"id": 1, "tags": "x"})),
            [json!({"id": 1, "tags": "x"})]
        );
        assert_eq!(
            flatten("a.list", json!({"a": {"list": [1, 2]}})),
            [json!({"a": {"list": 1}}), json!({"a": {"list": 2}})]
        );
    }
}
