//! `router`: the first route whose condition holds sends the message to that
//! route's sink, and notes the condition in metadata `routed_condition` (as
//! upstream does); a message no route matches goes on to the main sink.
//! The message carries its [`Output`], so routes with the same condition
//! text stay apart.

use serde::Deserialize;
use sless_model::dataflow::ConnectorSpec;
use sless_model::{FieldError, ValidationErrors};

use serde_json::Value;

use super::{Build, BuildError, Message, Outputs, SinkVisitor, Transform};
use crate::component::Component;
use crate::condition::Condition;
use crate::message::Output;

/// Metadata key naming the condition of the route a message took.
pub const ROUTED_CONDITION: &str = "routed_condition";

/// Most routes of one router.
pub const MAX_ROUTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    #[serde(default)]
    pub condition: String,
    pub sink: Option<ConnectorSpec>,
}

/// `config` of `router`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    #[serde(default)]
    pub routes: Vec<RouteRule>,
}

struct Route {
    text: String,
    condition: Condition,
    output: Output,
}

pub struct Router {
    routes: Vec<Route>,
}

impl Component for Router {
    const KIND: &'static str = "router";
    type Config = RouterConfig;

    fn check(config: &RouterConfig, path: &str, errors: &mut ValidationErrors) {
        if config.routes.is_empty() {
            errors.push(FieldError::invalid(
                format!("{path}.routes"),
                "at least one route is required",
            ));
        }
        if config.routes.len() > MAX_ROUTES {
            errors.push(FieldError::invalid(
                format!("{path}.routes"),
                format!("at most {MAX_ROUTES} routes are allowed (got {})", config.routes.len()),
            ));
            return;
        }
        for (i, route) in config.routes.iter().enumerate() {
            let route_path = format!("{path}.routes[{i}]");
            if route.condition.is_empty() {
                errors.push(FieldError::required(format!("{route_path}.condition")));
            }
            // A sink given is checked by the registry, through `sinks`.
            if route.sink.is_none() {
                errors.push(FieldError::required(format!("{route_path}.sink")));
            }
        }
    }
}

impl Build for Router {
    /// The routes' sinks, when there are not too many routes to take.
    fn visit_sinks(config: &mut Value, visit: &mut SinkVisitor<'_>) -> Result<(), String> {
        let Some(routes) = config.get_mut("routes").and_then(Value::as_array_mut) else {
            return Ok(());
        };
        if routes.len() > MAX_ROUTES {
            return Ok(());
        }
        for (i, route) in routes.iter_mut().enumerate() {
            let Some(sink) = route.get_mut("sink") else { continue };
            let Ok(mut spec) = ConnectorSpec::deserialize(&*sink) else {
                continue;
            };
            visit(&format!("routes[{i}].sink"), &mut spec)?;
            *sink = serde_json::to_value(spec).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Each route with a sink becomes an output of the pipeline.
    fn build(config: RouterConfig, outputs: &mut Outputs) -> Result<Self, BuildError> {
        let mut routes = Vec::with_capacity(config.routes.len());
        for (i, rule) in config.routes.into_iter().enumerate() {
            let condition =
                Condition::parse(&rule.condition).map_err(|e| BuildError::at(format!("routes[{i}].condition"), e))?;
            if let Some(sink) = rule.sink {
                routes.push(Route {
                    text: rule.condition,
                    condition,
                    output: outputs.add(sink),
                });
            }
        }
        Ok(Self { routes })
    }
}

impl Transform for Router {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        if let Some(route) = self.routes.iter().find(|r| r.condition.eval(&message.data)) {
            message.metadata.insert(ROUTED_CONDITION.into(), route.text.clone());
            message.output = route.output;
        }
        vec![message]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(condition: &str) -> RouteRule {
        RouteRule {
            condition: condition.into(),
            sink: Some(ConnectorSpec {
                kind: "kafka".into(),
                config: None,
            }),
        }
    }

    #[test]
    fn first_matching_route_wins() {
        let mut outputs = Outputs::default();
        let r = Router::build(
            RouterConfig {
                routes: vec![rule("kind == 'a'"), rule("amount > 10")],
            },
            &mut outputs,
        )
        .unwrap();
        assert_eq!(outputs.sinks().len(), 2);
        let m = r.apply(Message::new(json!({"kind": "a", "amount": 50}))).remove(0);
        assert_eq!(m.metadata[ROUTED_CONDITION], "kind == 'a'");
        assert_eq!(m.output, Output::Route(0));
        let m = r.apply(Message::new(json!({"kind": "b", "amount": 50}))).remove(0);
        assert_eq!(m.metadata[ROUTED_CONDITION], "amount > 10");
        assert_eq!(m.output, Output::Route(1));
        let m = r.apply(Message::new(json!({"kind": "b"}))).remove(0);
        assert!(m.metadata.is_empty());
        assert_eq!(m.output, Output::Main);
    }

    #[test]
    fn routes_with_the_same_condition_are_distinct_outputs() {
        let mut outputs = Outputs::default();
        let first = Router::build(
            RouterConfig {
                routes: vec![rule("kind == 'a'")],
            },
            &mut outputs,
        )
        .unwrap();
        let second = Router::build(
            RouterConfig {
                routes: vec![rule("kind == 'a'")],
            },
            &mut outputs,
        )
        .unwrap();
        let m = first.apply(Message::new(json!({"kind": "a"}))).remove(0);
        assert_eq!(m.output, Output::Route(0));
        // A later router that matches takes the message to its own route.
        assert_eq!(second.apply(m).remove(0).output, Output::Route(1));
    }
}
