//! The tfplugin6 `Provider` service: decodes values, dispatches to the
//! resource types and encodes the results.

use std::collections::HashMap;
use std::sync::RwLock;

use tonic::{Request, Response, Status};

use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::proto::{self, provider_server::Provider};
use crate::resources::{dataflow, queue_service};
use crate::schema::{Attr, BlockSchema, Kind};
use sless_runtime::sync::Unpoisoned;

fn provider_schema() -> BlockSchema {
    BlockSchema {
        description: "The sless provider manages queue services and dataflows through the sless REST API.",
        attrs: vec![
            Attr::new(
                "endpoint",
                Type::String,
                Kind::Optional,
                "Base URL of the sless API, e.g. `http://127.0.0.1:9090`. Defaults to `SLESS_ENDPOINT`.",
            ),
            Attr::new(
                "token",
                Type::String,
                Kind::Optional,
                "Bearer token of the tenant. Defaults to `SLESS_TOKEN`.",
            )
            .sensitive(),
            Attr::new(
                "insecure_skip_verify",
                Type::Bool,
                Kind::Optional,
                "Accept any TLS certificate of the API (testing only). Default false.",
            ),
        ],
        timeouts: false,
    }
}

#[derive(Default)]
pub struct SlessProvider {
    client: RwLock<Option<Client>>,
}

fn decode(v: Option<&proto::DynamicValue>) -> Result<Value, Status> {
    let Some(v) = v else { return Ok(Value::Null) };
    if !v.msgpack.is_empty() {
        Value::from_msgpack(&v.msgpack).map_err(|e| Status::invalid_argument(e.to_string()))
    } else if !v.json.is_empty() {
        Value::from_json(&v.json).map_err(|e| Status::invalid_argument(e.to_string()))
    } else {
        Ok(Value::Null)
    }
}

fn encode(v: &Value) -> Option<proto::DynamicValue> {
    Some(proto::DynamicValue {
        msgpack: v.to_msgpack(),
        json: vec![],
    })
}

fn resource_schema(type_name: &str) -> Result<BlockSchema, Status> {
    match type_name {
        queue_service::TYPE => Ok(queue_service::schema()),
        dataflow::TYPE => Ok(dataflow::schema()),
        other => Err(Status::not_found(format!("unknown resource type {other}"))),
    }
}

impl SlessProvider {
    fn client(&self) -> Result<Client, Diagnostics> {
        self.client
            .read_unpoisoned()
            .clone()
            .ok_or_else(|| Diagnostics::error("Provider not configured", "ConfigureProvider was not called"))
    }
}

/// Settings from the provider block, else the environment.
fn setting(config: &Value, attr: &str, env: &str) -> Option<String> {
    config
        .get(attr)
        .as_str()
        .map(str::to_owned)
        .or_else(|| std::env::var(env).ok())
        .filter(|v| !v.is_empty())
}

#[tonic::async_trait]
impl Provider for SlessProvider {
    async fn get_metadata(
        &self,
        _: Request<proto::get_metadata::Request>,
    ) -> Result<Response<proto::get_metadata::Response>, Status> {
        let types = [queue_service::TYPE, dataflow::TYPE];
        Ok(Response::new(proto::get_metadata::Response {
            server_capabilities: Some(proto::ServerCapabilities::default()),
            diagnostics: vec![],
            data_sources: types
                .iter()
                .map(|t| proto::get_metadata::DataSourceMetadata { type_name: (*t).into() })
                .collect(),
            resources: types
                .iter()
                .map(|t| proto::get_metadata::ResourceMetadata { type_name: (*t).into() })
                .collect(),
        }))
    }

    async fn get_provider_schema(
        &self,
        _: Request<proto::get_provider_schema::Request>,
    ) -> Result<Response<proto::get_provider_schema::Response>, Status> {
        let resources = HashMap::from([
            (queue_service::TYPE.to_owned(), queue_service::schema().proto()),
            (dataflow::TYPE.to_owned(), dataflow::schema().proto()),
        ]);
        let data_sources = HashMap::from([
            (queue_service::TYPE.to_owned(), queue_service::data_schema().proto()),
            (dataflow::TYPE.to_owned(), dataflow::data_schema().proto()),
        ]);
        Ok(Response::new(proto::get_provider_schema::Response {
            provider: Some(provider_schema().proto()),
            resource_schemas: resources,
            data_source_schemas: data_sources,
            diagnostics: vec![],
            provider_meta: None,
            server_capabilities: Some(proto::ServerCapabilities::default()),
        }))
    }

    async fn validate_provider_config(
        &self,
        _: Request<proto::validate_provider_config::Request>,
    ) -> Result<Response<proto::validate_provider_config::Response>, Status> {
        Ok(Response::new(proto::validate_provider_config::Response {
            diagnostics: vec![],
        }))
    }

    async fn validate_resource_config(
        &self,
        request: Request<proto::validate_resource_config::Request>,
    ) -> Result<Response<proto::validate_resource_config::Response>, Status> {
        let r = request.into_inner();
        let config = decode(r.config.as_ref())?;
        let diags = match r.type_name.as_str() {
            queue_service::TYPE => queue_service::validate(&config),
            dataflow::TYPE => dataflow::validate(&config),
            other => return Err(Status::not_found(format!("unknown resource type {other}"))),
        };
        Ok(Response::new(proto::validate_resource_config::Response {
            diagnostics: diags.0,
        }))
    }

    async fn validate_data_resource_config(
        &self,
        _: Request<proto::validate_data_resource_config::Request>,
    ) -> Result<Response<proto::validate_data_resource_config::Response>, Status> {
        Ok(Response::new(proto::validate_data_resource_config::Response {
            diagnostics: vec![],
        }))
    }

    async fn upgrade_resource_state(
        &self,
        request: Request<proto::upgrade_resource_state::Request>,
    ) -> Result<Response<proto::upgrade_resource_state::Response>, Status> {
        let r = request.into_inner();
        let schema = resource_schema(&r.type_name)?;
        let raw = r.raw_state.map(|s| s.json).unwrap_or_default();
        let state = if raw.is_empty() {
            Value::Null
        } else {
            Value::from_json(&raw)
                .map_err(|e| Status::invalid_argument(e.to_string()))?
                .conform(&schema.ty())
        };
        Ok(Response::new(proto::upgrade_resource_state::Response {
            upgraded_state: encode(&state),
            diagnostics: vec![],
        }))
    }

    async fn configure_provider(
        &self,
        request: Request<proto::configure_provider::Request>,
    ) -> Result<Response<proto::configure_provider::Response>, Status> {
        let config = decode(request.into_inner().config.as_ref())?;
        let mut diags = Diagnostics::default();
        let endpoint = setting(&config, "endpoint", "SLESS_ENDPOINT");
        let token = setting(&config, "token", "SLESS_TOKEN");
        if endpoint.is_none() {
            diags.push_error(
                "Missing sless API endpoint",
                "Set `endpoint` in the provider block or the SLESS_ENDPOINT environment variable.",
                Some("endpoint"),
            );
        }
        if token.is_none() {
            diags.push_error(
                "Missing sless API token",
                "Set `token` in the provider block or the SLESS_TOKEN environment variable.",
                Some("token"),
            );
        }
        if let (Some(endpoint), Some(token)) = (endpoint, token) {
            let insecure = config.get("insecure_skip_verify").as_bool().unwrap_or(false);
            match Client::new(&endpoint, &token, insecure) {
                Ok(client) => *self.client.lock_unpoisoned() = Some(client),
                Err(e) => diags.push_error("Cannot create the HTTP client", e.to_string(), None),
            }
        }
        Ok(Response::new(proto::configure_provider::Response {
            diagnostics: diags.0,
        }))
    }

    async fn read_resource(
        &self,
        request: Request<proto::read_resource::Request>,
    ) -> Result<Response<proto::read_resource::Response>, Status> {
        let r = request.into_inner();
        let prior = decode(r.current_state.as_ref())?;
        let result = match self.client() {
            Err(d) => Err(d),
            Ok(client) => match r.type_name.as_str() {
                queue_service::TYPE => queue_service::read(&client, &prior).await,
                dataflow::TYPE => dataflow::read(&client, &prior).await,
                other => return Err(Status::not_found(format!("unknown resource type {other}"))),
            },
        };
        let (state, diags) = match result {
            // Deleted outside Terraform: a null state drops it.
            Ok(state) => (state.unwrap_or(Value::Null), Diagnostics::default()),
            Err(d) => (prior, d),
        };
        Ok(Response::new(proto::read_resource::Response {
            new_state: encode(&state),
            diagnostics: diags.0,
            private: r.private,
        }))
    }

    async fn plan_resource_change(
        &self,
        request: Request<proto::plan_resource_change::Request>,
    ) -> Result<Response<proto::plan_resource_change::Response>, Status> {
        let r = request.into_inner();
        let schema = resource_schema(&r.type_name)?;
        let prior = decode(r.prior_state.as_ref())?;
        let proposed = decode(r.proposed_new_state.as_ref())?;
        let config = decode(r.config.as_ref())?;
        let (planned, replace) = schema.plan(&prior, proposed, &config);
        let planned = if planned.is_null() {
            planned
        } else {
            planned.conform(&schema.ty())
        };
        Ok(Response::new(proto::plan_resource_change::Response {
            planned_state: encode(&planned),
            requires_replace: replace
                .into_iter()
                .map(|name| proto::AttributePath {
                    steps: vec![proto::attribute_path::Step {
                        selector: Some(proto::attribute_path::step::Selector::AttributeName(name.into())),
                    }],
                })
                .collect(),
            planned_private: r.prior_private,
            diagnostics: vec![],
        }))
    }

    async fn apply_resource_change(
        &self,
        request: Request<proto::apply_resource_change::Request>,
    ) -> Result<Response<proto::apply_resource_change::Response>, Status> {
        let r = request.into_inner();
        resource_schema(&r.type_name)?;
        let prior = decode(r.prior_state.as_ref())?;
        let planned = decode(r.planned_state.as_ref())?;
        let client = match self.client() {
            Ok(c) => c,
            Err(d) => {
                return Ok(Response::new(proto::apply_resource_change::Response {
                    new_state: encode(&prior),
                    private: vec![],
                    diagnostics: d.0,
                }));
            }
        };
        let queue = r.type_name == queue_service::TYPE;
        let (state, diags) = match (prior.is_null(), planned.is_null()) {
            (_, true) => {
                let done = if queue {
                    queue_service::delete(&client, &prior).await
                } else {
                    dataflow::delete(&client, &prior).await
                };
                match done {
                    Ok(()) => (Value::Null, Diagnostics::default()),
                    Err(d) => (prior, d),
                }
            }
            (creating, false) => {
                let result = match (queue, creating) {
                    (true, true) => queue_service::create(&client, &planned)
                        .await
                        .map(|s| (s, Diagnostics::default())),
                    (true, false) => queue_service::update(&client, &planned)
                        .await
                        .map(|s| (s, Diagnostics::default())),
                    (false, true) => dataflow::create(&client, &planned).await,
                    (false, false) => dataflow::update(&client, &planned).await,
                };
                match result {
                    Ok((state, warnings)) => (state, warnings),
                    // An object that exists but failed is recorded (tainted).
                    Err((d, Some(state))) => (state, d),
                    Err((d, None)) => (if creating { Value::Null } else { prior }, d),
                }
            }
        };
        Ok(Response::new(proto::apply_resource_change::Response {
            new_state: encode(&state),
            private: vec![],
            diagnostics: diags.0,
        }))
    }

    async fn import_resource_state(
        &self,
        request: Request<proto::import_resource_state::Request>,
    ) -> Result<Response<proto::import_resource_state::Response>, Status> {
        let r = request.into_inner();
        let state = match r.type_name.as_str() {
            queue_service::TYPE => queue_service::import(&r.id),
            dataflow::TYPE => dataflow::import(&r.id),
            other => return Err(Status::not_found(format!("unknown resource type {other}"))),
        };
        Ok(Response::new(proto::import_resource_state::Response {
            imported_resources: vec![proto::import_resource_state::ImportedResource {
                type_name: r.type_name,
                state: encode(&state),
                private: vec![],
            }],
            diagnostics: vec![],
        }))
    }

    async fn read_data_source(
        &self,
        request: Request<proto::read_data_source::Request>,
    ) -> Result<Response<proto::read_data_source::Response>, Status> {
        let r = request.into_inner();
        let config = decode(r.config.as_ref())?;
        let name = config.get("name").as_str().unwrap_or_default().to_owned();
        let result = match self.client() {
            Err(d) => Err(d),
            Ok(client) => match r.type_name.as_str() {
                queue_service::TYPE => queue_service::read(&client, &config).await,
                dataflow::TYPE => dataflow::read(&client, &config).await,
                other => return Err(Status::not_found(format!("unknown data source {other}"))),
            },
        };
        let (state, diags) = match result {
            Ok(Some(state)) => {
                // Data sources have no timeouts block.
                let state = match state {
                    Value::Object(mut m) => {
                        m.remove("timeouts");
                        Value::Object(m)
                    }
                    other => other,
                };
                (state, Diagnostics::default())
            }
            Ok(None) => (
                Value::Null,
                Diagnostics::error(
                    format!("{} {name:?} not found", r.type_name),
                    "No object of this name exists for your tenant.",
                ),
            ),
            Err(d) => (Value::Null, d),
        };
        Ok(Response::new(proto::read_data_source::Response {
            state: encode(&state),
            diagnostics: diags.0,
        }))
    }

    async fn stop_provider(
        &self,
        _: Request<proto::stop_provider::Request>,
    ) -> Result<Response<proto::stop_provider::Response>, Status> {
        Ok(Response::new(proto::stop_provider::Response { error: String::new() }))
    }
}
