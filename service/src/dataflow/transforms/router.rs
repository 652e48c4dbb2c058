//! `router`: the first route whose condition holds tags the message with
//! `routed_condition`, so the processor writes it to that route's sink;
//! a message no route matches goes on to the main sink untagged.

use super::{BuildError, Message, Transform};
use crate::dataflow::condition::Condition;
use crate::model::transform_config::RouterConfig;

/// Metadata key naming the route a message took.
pub const ROUTED_CONDITION: &str = "routed_condition";

pub struct Router {
    routes: Vec<(String, Condition)>,
}

impl Router {
    pub fn new(config: &RouterConfig) -> Result<Self, BuildError> {
        Ok(Self {
            routes: config
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let condition = Condition::parse(&r.condition)
                        .map_err(|e| BuildError::at(format!("routes[{i}].condition"), e))?;
                    Ok((r.condition.clone(), condition))
                })
                .collect::<Result<_, BuildError>>()?,
        })
    }
}

impl Transform for Router {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        if let Some((text, _)) = self.routes.iter().find(|(_, c)| c.eval(&message.data)) {
            message.metadata.insert(ROUTED_CONDITION.into(), text.clone());
        }
        vec![message]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::transform_config::RouteRule;

    #[test]
    fn first_matching_route_wins() {
        let rule = |c: &str| RouteRule {
            condition: c.into(),
            sink: None,
        };
        let r = Router::new(&RouterConfig {
            routes: vec![rule("kind == 'a'"), rule("amount > 10")],
        })
        .unwrap();
        let m = r.apply(Message::new(json!({"kind": "a", "amount": 50}))).remove(0);
        assert_eq!(m.metadata[ROUTED_CONDITION], "kind == 'a'");
        let m = r.apply(Message::new(json!({"kind": "b", "amount": 50}))).remove(0);
        assert_eq!(m.metadata[ROUTED_CONDITION], "amount > 10");
        assert!(
            r.apply(Message::new(json!({"kind": "b"})))
                .remove(0)
                .metadata
                .is_empty()
        );
    }
}
