//! `remove`: drops the listed fields.

use sless_model::ValidationErrors;

use super::{Build, BuildError, FieldsConfig, Message, Outputs, Transform};
use crate::component::Component;
use crate::path::Path;

pub struct Remove {
    fields: Vec<Path>,
}

impl Remove {
    pub fn new(config: &FieldsConfig) -> Result<Self, BuildError> {
        Ok(Self {
            fields: super::paths(&config.fields)?,
        })
    }
}

impl Component for Remove {
    const KIND: &'static str = "remove";
    type Config = FieldsConfig;

    fn check(config: &FieldsConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(path, errors);
    }
}

impl Build for Remove {
    fn build(config: FieldsConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Remove {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        for field in &self.fields {
            field.remove(&mut message.data);
        }
        vec![message]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn removes_nested_and_missing_fields() {
        let r = Remove::new(&FieldsConfig {
            fields: vec!["password".into(), "user.ssn".into(), "nope".into()],
        })
        .unwrap();
        let out = r.apply(Message::new(
            json!({"id": 1, "password": "x", "user": {"ssn": "1", "name": "n"}}),
        ));
        assert_eq!(out[0].data, json!({"id": 1, "user": {"name": "n"}}));
    }
}
