//! `filter`: keeps a message when its condition holds; a dropped message
//! counts as done.

use super::{BuildError, Message, Transform};
use crate::dataflow::condition::Condition;
use crate::model::transform_config::FilterConfig;

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
