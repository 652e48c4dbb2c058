//! The provider's resource types, each also a data source of the same name.

pub mod dataflow;
pub mod queue_service;

use serde::de::DeserializeOwned;

use crate::client::Client;
use crate::diag::Diagnostics;
use crate::resource::Dispatch;

/// Every resource type: what the protocol server offers and dispatches to.
pub static ALL: [&dyn Dispatch; 2] = [&queue_service::QueueService, &dataflow::DataFlow];

/// The resource type of this name.
pub fn find(type_name: &str) -> Option<&'static dyn Dispatch> {
    ALL.iter().copied().find(|r| r.type_name() == type_name)
}

/// The API's view of the object `name` in `collection` (`/queue-services`),
/// or `None` if it is gone (or has no name yet).
async fn read_view<V: DeserializeOwned>(
    client: &Client,
    collection: &str,
    name: Option<&str>,
) -> Result<Option<V>, Diagnostics> {
    let Some(name) = name else { return Ok(None) };
    match client.get(&format!("{collection}/{name}")).await {
        Ok(view) => Ok(Some(view)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the object `name`; one already gone counts as deleted. Returns
/// whether a delete was sent.
async fn delete_object(client: &Client, collection: &str, name: &str) -> Result<bool, Diagnostics> {
    match client.delete(&format!("{collection}/{name}")).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A DNS label check for names known at validation time.
fn check_name(name: Option<&str>, diags: &mut Diagnostics) {
    if let Some(name) = name
        && let Err(e) = sless_model::name::DnsLabel::parse(name, "name")
    {
        diags.push_error("Invalid name", e.message, Some("name"));
    }
}

/// A whole number in `range` at `attr`, or an error diagnostic.
fn check_whole(value: Option<f64>, attr: &str, range: std::ops::RangeInclusive<i64>, diags: &mut Diagnostics) {
    if let Some(v) = value
        && (v.fract() != 0.0 || !(*range.start() as f64..=*range.end() as f64).contains(&v))
    {
        diags.push_error(
            format!("Invalid {attr}"),
            format!(
                "must be a whole number from {} to {}, got {v}",
                range.start(),
                range.end()
            ),
            Some(attr),
        );
    }
}

/// The phases of a resource kind as the API spells them, for descriptions.
fn phases<P: serde::Serialize>(all: &[P]) -> String {
    let names: Vec<String> = all
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok()?.as_str().map(str::to_owned))
        .collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::cty::Type;
    use crate::resource::Resource;

    /// A state field the schema lacks would be dropped on the way to
    /// Terraform, an attribute the state lacks always null: both are a
    /// silent loss, so the two must name the same attributes.
    fn state_names_every_attribute<R: Resource>(resource: &R) {
        let Type::Object(attrs) = resource.schema().ty() else {
            panic!("a schema is an object type");
        };
        let schema: BTreeSet<String> = attrs.into_keys().collect();
        let serde_json::Value::Object(state) = serde_json::to_value(R::State::default()).unwrap() else {
            panic!("a state is a struct");
        };
        let state: BTreeSet<String> = state.into_iter().map(|(k, _)| k).collect();
        assert_eq!(state, schema, "{}", R::TYPE);
    }

    #[test]
    fn each_state_struct_names_the_attributes_of_its_schema() {
        state_names_every_attribute(&queue_service::QueueService);
        state_names_every_attribute(&dataflow::DataFlow);
    }

    #[test]
    fn every_type_is_found_by_its_name_and_no_other() {
        for r in ALL {
            assert_eq!(find(r.type_name()).map(|f| f.type_name()), Some(r.type_name()));
        }
        let names: BTreeSet<&str> = ALL.iter().map(|r| r.type_name()).collect();
        assert_eq!(names.len(), ALL.len());
        assert!(find("sless_queue").is_none());
    }
}
