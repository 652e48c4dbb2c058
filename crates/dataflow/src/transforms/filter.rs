//! `filter`: keeps a message when its condition holds; a dropped message
//! counts as done.

use serde::Deserialize;
use sless_model::{FieldError, ValidationErrors};

use super::{Build, BuildError, Message, Outputs, Transform};
use crate::component::Component;
use crate::condition::Condition;

/// `config` of `filter`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    #[serde(default)]
    pub condition: String,
}

pub struct Filter {
    condition: Condition,
}

impl Filter {
    pub fn new(config: &FilterConfig) -> Result<Self, BuildError> {
        Ok(Self {
            condition: Condition::parse(&config.condition).map_err(|e| BuildError::at("condition", e))?,
        })
    }
}

impl Component for Filter {
    const KIND: &'static str = "filter";
    type Config = FilterConfig;

    fn check(config: &FilterConfig, path: &str, errors: &mut ValidationErrors) {
        if config.condition.is_empty() {
            errors.push(FieldError::required(format!("{path}.condition")));
        }
    }
}

impl Build for Filter {
    fn build(config: FilterConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Filter {
    fn apply(&self, message: Message) -> Vec<Message> {
        if self.condition.eval(&message.data) {
            vec![message]
        } else {
            vec![]
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keeps_only_matching_messages() {
        let f = Filter::new(&FilterConfig {
            condition: "active".into(),
        })
        .unwrap();
        assert_eq!(f.apply(Message::new(json!({"active": true}))).len(), 1);
        assert!(f.apply(Message::new(json!({"active": false}))).is_empty());
        assert!(f.apply(Message::new(json!({}))).is_empty());
    }
}
