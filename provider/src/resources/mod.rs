//! The provider's resource and data source types.

pub mod dataflow;
pub mod queue_service;

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;

use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;

/// The API view of the object `prior` names under `collection`
/// (`/queue-services`), or `None` if it is gone.
pub async fn read_view(
    client: &Client,
    collection: &str,
    prior: &Value,
) -> Result<Option<serde_json::Value>, Diagnostics> {
    let Some(name) = prior.get("name").as_str().or(prior.get("id").as_str()) else {
        return Ok(None);
    };
    match client.call(Method::GET, &format!("{collection}/{name}"), None).await {
        Ok(view) => Ok(Some(view)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the object `prior` names; one already gone counts as deleted.
/// Returns whether a delete was sent.
pub async fn delete_object(client: &Client, collection: &str, prior: &Value) -> Result<bool, Diagnostics> {
    let name = prior.get("name").as_str().unwrap_or_default();
    match client.call(Method::DELETE, &format!("{collection}/{name}"), None).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The state `terraform import` starts from: the name; Read fills the rest.
pub fn import_state(id: &str, ty: &Type) -> Value {
    Value::Object(BTreeMap::from([
        ("id".into(), Value::str(id)),
        ("name".into(), Value::str(id)),
    ]))
    .conform(ty)
}

/// The `timeouts` block's `create`/`delete` duration, or `default`.
pub fn timeout(state: &Value, which: &str, default: Duration) -> Result<Duration, Diagnostics> {
    match state.get("timeouts").get(which).as_str() {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            Diagnostics::error(
                format!("Invalid timeouts.{which}"),
                format!("{text:?} is not a duration such as 10m: {e}"),
            )
        }),
    }
}

/// A DNS label check for names known at validation time.
pub fn check_name(config: &Value, diags: &mut Diagnostics) {
    if let Some(name) = config.get("name").as_str()
        && let Err(e) = sless_model::name::DnsLabel::parse(name, "name")
    {
        diags.push_error("Invalid name", e.message, Some("name"));
    }
}

/// The phases of a resource kind as the API spells them, for descriptions.
pub fn phases<P: serde::Serialize>(all: &[P]) -> String {
    let names: Vec<String> = all
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok()?.as_str().map(str::to_owned))
        .collect();
    names.join(", ")
}
