//! `remove`: drops the listed fields.

use super::{BuildError, Message, Transform};
use crate::dataflow::path::Path;
use crate::model::transform_config::FieldsConfig;

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
