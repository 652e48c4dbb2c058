//! `flatten`: one message per element of an array field, keeping the parent
//! fields. An object element's keys are merged into the parent; any other
//! element takes the array's place. An empty array drops the field; a
//! missing or non-array field leaves the message as it is. An array in
//! Avro's JSON wrapper, `{"array": [...]}`, is flattened as the array.

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
        let items = match self.field.get(&message.data) {
            Some(Value::Array(items)) => items.clone(),
            Some(Value::Object(wrapper)) if wrapper.len() == 1 => match wrapper.get("array") {
                Some(Value::Array(items)) => items.clone(),
                _ => return vec![message],
            },
            _ => return vec![message],
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

    #[test]
    fn an_avro_array_wrapper_is_the_array() {
        assert_eq!(
            flatten(
                "items",
                json!({"id": 1, "items": {"array": [{"sku": "a"}, {"sku": "b"}]}})
            ),
            [json!({"id": 1, "sku": "a"}), json!({"id": 1, "sku": "b"})]
        );
        let other = json!({"id": 1, "items": {"array": [1], "more": 2}});
        assert_eq!(flatten("items", other.clone()), [other], "only the one-key wrapper");
    }
}
