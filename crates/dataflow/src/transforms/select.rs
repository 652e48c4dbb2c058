//! `select`: keeps only the listed fields, each named by its last key
//! (`user.email` becomes `email`); `items.#`, an array's count as gjson
//! reads it, is named `#` as upstream names it. When none of them exists
//! the message is left as it is, as upstream does.

use serde_json::{Map, Value};

use sless_model::ValidationErrors;

use super::{Build, BuildError, FieldsConfig, Message, Outputs, Transform};
use crate::component::Component;
use crate::condition::{ConditionError, Operand};

pub struct Select {
    fields: Vec<(String, Operand)>,
}

impl Select {
    pub fn new(config: &FieldsConfig) -> Result<Self, BuildError> {
        let fields = config.fields.iter().enumerate().map(|(i, text)| {
            let at = |e: ConditionError| BuildError::at(format!("fields[{i}]"), e);
            Ok(match Operand::field_or_count(text).map_err(at)? {
                Operand::Field(path) => (path.leaf_name(), Operand::Field(path)),
                count => ("#".to_owned(), count),
            })
        });
        Ok(Self {
            fields: fields.collect::<Result<_, BuildError>>()?,
        })
    }
}

impl Component for Select {
    const KIND: &'static str = "select";
    type Config = FieldsConfig;

    fn check(config: &FieldsConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(path, errors);
    }
}

impl Build for Select {
    fn build(config: FieldsConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Select {
    fn apply(&self, message: Message) -> Vec<Message> {
        let selected: Map<String, Value> = self
            .fields
            .iter()
            .filter_map(|(name, f)| f.resolve(&message.data).map(|v| (name.clone(), v.into_owned())))
            .collect();
        if selected.is_empty() {
            return vec![message];
        }
        vec![message.with_data(Value::Object(selected))]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn selects_by_leaf_name() {
        let s = Select::new(&FieldsConfig {
            fields: vec!["id".into(), "$.user.email".into(), "nope".into()],
        })
        .unwrap();
        let out = s.apply(Message::new(
            json!({"id": 1, "user": {"email": "a@b", "age": 3}, "x": 0}),
        ));
        assert_eq!(out[0].data, json!({"id": 1, "email": "a@b"}));
        assert_eq!(s.apply(Message::new(json!({"x": 0})))[0].data, json!({"x": 0}));
    }

    #[test]
    fn an_arrays_count_is_selected_as_hash_as_upstream_does() {
        let s = Select::new(&FieldsConfig {
            fields: vec!["id".into(), "$.order.items.#".into()],
        })
        .unwrap();
        let out = s.apply(Message::new(json!({"id": 1, "order": {"items": [1, 2, 3]}})));
        assert_eq!(out[0].data, json!({"id": 1, "#": 3}));
        // Not an array: no count, as a missing field.
        let out = s.apply(Message::new(json!({"id": 1, "order": {"items": "x"}})));
        assert_eq!(out[0].data, json!({"id": 1}));
        assert!(
            Select::new(&FieldsConfig {
                fields: vec![".#".into()]
            })
            .is_err()
        );
    }
}
