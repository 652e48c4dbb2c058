//! `select`: keeps only the listed fields, each named by its last key
//! (`user.email` becomes `email`). When none of them exists the message is
//! left as it is, as upstream does.

use serde_json::{Map, Value};

use sless_model::ValidationErrors;

use super::{Build, BuildError, FieldsConfig, Message, Outputs, Transform};
use crate::component::Component;
use crate::path::Path;

pub struct Select {
    fields: Vec<Path>,
}

impl Select {
    pub fn new(config: &FieldsConfig) -> Result<Self, BuildError> {
        Ok(Self {
            fields: super::paths(&config.fields)?,
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
            .filter_map(|f| f.get(&message.data).map(|v| (f.leaf_name(), v.clone())))
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
}
