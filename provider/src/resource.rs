//! What a resource type is to the provider: a typed [`Resource`] (its state
//! one struct, its API calls through `sless-model`'s types) and the untyped
//! [`Dispatch`] the protocol server calls, where cty values become typed
//! state and back.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::{ApiError, Client};
use crate::cty::Value;
use crate::diag::Diagnostics;
use crate::schema::{BlockSchema, Kind};

/// A failed apply, with the state of what exists if anything does (then
/// Terraform records it, tainted).
pub struct Failure<S> {
    pub diagnostics: Diagnostics,
    pub state: Option<S>,
}

impl<S> From<Diagnostics> for Failure<S> {
    fn from(diagnostics: Diagnostics) -> Self {
        Self {
            diagnostics,
            state: None,
        }
    }
}

impl<S> From<ApiError> for Failure<S> {
    fn from(e: ApiError) -> Self {
        Diagnostics::from(e).into()
    }
}

/// What a create or an update leaves: the new state and any warnings.
pub type Applied<S> = Result<(S, Diagnostics), Failure<S>>;

/// The names every resource's state holds.
pub trait Named {
    /// The object's name, or the id an import starts from.
    fn name(&self) -> Option<&str>;
}

/// One resource type of the provider, typed end to end.
#[tonic::async_trait]
pub trait Resource: Send + Sync + 'static {
    /// Its state: one field per attribute of [`Resource::schema`], as
    /// Terraform stores it (every field optional, since a plan may not
    /// know it yet).
    type State: Serialize + DeserializeOwned + Named + Default + Send + Sync;

    /// `sless_queue_service`, the name in configurations.
    const TYPE: &'static str;

    fn schema(&self) -> BlockSchema;

    /// The description of the data source of the same name.
    fn data_description(&self) -> &'static str;

    /// Checks a configuration before any plan, by the service's own rules.
    fn validate(&self, config: &Self::State) -> Diagnostics;

    async fn create(&self, client: &Client, planned: Self::State) -> Applied<Self::State>;

    /// The object's state now, `None` if it is gone; `prior` gives the name
    /// and what only the configuration holds.
    async fn read(&self, client: &Client, prior: &Self::State) -> Result<Option<Self::State>, Diagnostics>;

    async fn update(&self, client: &Client, planned: Self::State) -> Applied<Self::State>;

    /// Deletes the object; one already gone counts as deleted.
    async fn delete(&self, client: &Client, prior: Self::State) -> Result<(), Diagnostics>;

    /// The state `terraform import` starts from (the name; Read fills the rest).
    fn import(&self, id: &str) -> Self::State;
}

/// A resource type as the protocol server sees it: cty values in and out.
/// Every [`Resource`] is one; [`crate::resources::ALL`] lists them.
#[tonic::async_trait]
pub trait Dispatch: Send + Sync {
    fn type_name(&self) -> &'static str;
    fn schema(&self) -> BlockSchema;
    fn data_schema(&self) -> BlockSchema;
    fn validate(&self, config: &Value) -> Diagnostics;
    /// The planned state and the attributes whose change forces a replacement.
    fn plan(&self, prior: &Value, proposed: Value, config: &Value) -> (Value, Vec<&'static str>);
    /// Applies a plan: a create from a null `prior`, a delete to a null
    /// `planned`, else an update. Returns the state to record.
    async fn apply(&self, client: &Client, prior: Value, planned: Value) -> (Value, Diagnostics);
    /// `Ok(None)`: deleted outside Terraform.
    async fn read(&self, client: &Client, prior: &Value) -> Result<Option<Value>, Diagnostics>;
    /// The data source: the object the configuration names, which must exist.
    async fn read_data(&self, client: &Client, config: &Value) -> Result<Value, Diagnostics>;
    fn import(&self, id: &str) -> Result<Value, Diagnostics>;
}

fn malformed(what: &str, e: serde_json::Error) -> Diagnostics {
    Diagnostics::error(format!("Malformed {what}"), e.to_string())
}

#[tonic::async_trait]
impl<R: Resource> Dispatch for R {
    fn type_name(&self) -> &'static str {
        R::TYPE
    }

    fn schema(&self) -> BlockSchema {
        Resource::schema(self)
    }

    fn data_schema(&self) -> BlockSchema {
        let mut s = Resource::schema(self);
        s.description = self.data_description();
        s.timeouts = false;
        for a in &mut s.attrs {
            a.requires_replace = false;
            a.default = None;
            if a.name != "name" {
                a.kind = Kind::Computed;
            }
        }
        s
    }

    fn validate(&self, config: &Value) -> Diagnostics {
        match config.to_typed() {
            Ok(config) => Resource::validate(self, &config),
            Err(e) => malformed("configuration", e),
        }
    }

    fn plan(&self, prior: &Value, proposed: Value, config: &Value) -> (Value, Vec<&'static str>) {
        let schema = Resource::schema(self);
        let (planned, replace) = schema.plan(prior, proposed, config);
        if planned.is_null() {
            (planned, replace)
        } else {
            (planned.conform(&schema.ty()), replace)
        }
    }

    async fn apply(&self, client: &Client, prior: Value, planned: Value) -> (Value, Diagnostics) {
        apply(self, client, prior, planned).await
    }

    async fn read(&self, client: &Client, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let prior: R::State = prior.to_typed().map_err(|e| malformed("state", e))?;
        let Some(state) = Resource::read(self, client, &prior).await? else {
            return Ok(None);
        };
        Value::from_typed(&state, &Resource::schema(self).ty())
            .map(Some)
            .map_err(|e| malformed("state", e))
    }

    async fn read_data(&self, client: &Client, config: &Value) -> Result<Value, Diagnostics> {
        let config: R::State = config.to_typed().map_err(|e| malformed("configuration", e))?;
        let name = config.name().unwrap_or_default().to_owned();
        match Resource::read(self, client, &config).await? {
            // The data schema's type has no `timeouts`; conforming drops it.
            Some(state) => Value::from_typed(&state, &self.data_schema().ty()).map_err(|e| malformed("state", e)),
            None => Err(Diagnostics::error(
                format!("{} {name:?} not found", R::TYPE),
                "No object of this name exists for your tenant.",
            )),
        }
    }

    fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        Value::from_typed(&Resource::import(self, id), &Resource::schema(self).ty()).map_err(|e| malformed("state", e))
    }
}

/// Dispatch::apply of a typed resource.
async fn apply<R: Resource>(resource: &R, client: &Client, prior: Value, planned: Value) -> (Value, Diagnostics) {
    let typed = |v: &Value| v.to_typed::<R::State>().map_err(|e| malformed("state", e));
    if planned.is_null() {
        let done = match typed(&prior) {
            Ok(prior_state) => resource.delete(client, prior_state).await,
            Err(d) => Err(d),
        };
        return match done {
            Ok(()) => (Value::Null, Diagnostics::default()),
            Err(d) => (prior, d),
        };
    }
    let planned = match typed(&planned) {
        Ok(planned) => planned,
        Err(d) => return (prior, d),
    };
    let applied = if prior.is_null() {
        resource.create(client, planned).await
    } else {
        resource.update(client, planned).await
    };
    let (state, diagnostics) = match applied {
        Ok((state, warnings)) => (Some(state), warnings),
        Err(Failure { diagnostics, state }) => (state, diagnostics),
    };
    match state {
        Some(state) => match Value::from_typed(&state, &resource.schema().ty()) {
            Ok(value) => (value, diagnostics),
            Err(e) => (prior, malformed("state", e)),
        },
        // Nothing new exists: a failed create records nothing (prior is
        // null), a failed update keeps what was there.
        None => (prior, diagnostics),
    }
}

/// The `timeouts { create, delete }` block of a resource that waits.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timeouts {
    pub create: Option<String>,
    pub delete: Option<String>,
}

impl Timeouts {
    /// `timeouts.create` of `block`, or `default`.
    pub fn create(block: Option<&Self>, default: Duration) -> Result<Duration, Diagnostics> {
        parse_timeout(block.and_then(|t| t.create.as_deref()), "create", default)
    }

    /// `timeouts.delete` of `block`, or `default`.
    pub fn delete(block: Option<&Self>, default: Duration) -> Result<Duration, Diagnostics> {
        parse_timeout(block.and_then(|t| t.delete.as_deref()), "delete", default)
    }
}

fn parse_timeout(text: Option<&str>, which: &str, default: Duration) -> Result<Duration, Diagnostics> {
    match text {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            Diagnostics::error(
                format!("Invalid timeouts.{which}"),
                format!("{text:?} is not a duration such as 10m: {e}"),
            )
        }),
    }
}
