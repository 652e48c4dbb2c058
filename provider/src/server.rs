//! The tfplugin6 `Provider` service: decodes values, dispatches to the
//! resource type a request names (one of [`resources::ALL`]) and encodes
//! the results.

use std::collections::HashMap;
use std::sync::RwLock;

use tonic::{Request, Response, Status};

use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::proto::{self, provider_server::Provider};
use crate::resource::Dispatch;
use crate::resources;
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

fn resource(type_name: &str) -> Result<&'static dyn Dispatch, Status> {
    resources::find(type_name).ok_or_else(|| Status::not_found(format!("unknown resource type {type_name}")))
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
        Ok(Response::new(proto::get_metadata::Response {
            server_capabilities: Some(proto::ServerCapabilities::default()),
            diagnostics: vec![],
            data_sources: resources::ALL
                .iter()
                .map(|r| proto::get_metadata::DataSourceMetadata {
                    type_name: r.type_name().into(),
                })
                .collect(),
            resources: resources::ALL
                .iter()
                .map(|r| proto::get_metadata::ResourceMetadata {
                    type_name: r.type_name().into(),
                })
                .collect(),
        }))
    }

    async fn get_provider_schema(
        &self,
        _: Request<proto::get_provider_schema::Request>,
    ) -> Result<Response<proto::get_provider_schema::Response>, Status> {
        let schemas = |schema: fn(&dyn Dispatch) -> BlockSchema| -> HashMap<String, proto::Schema> {
            resources::ALL
                .iter()
                .map(|r| (r.type_name().to_owned(), schema(*r).proto()))
                .collect()
        };
        Ok(Response::new(proto::get_provider_schema::Response {
            provider: Some(provider_schema().proto()),
            resource_schemas: schemas(|r| r.schema()),
            data_source_schemas: schemas(|r| r.data_schema()),
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
        let diags = resource(&r.type_name)?.validate(&decode(r.config.as_ref())?);
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
        let schema = resource(&r.type_name)?.schema();
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
        let resource = resource(&r.type_name)?;
        let prior = decode(r.current_state.as_ref())?;
        let result = match self.client() {
            Err(d) => Err(d),
            Ok(client) => resource.read(&client, &prior).await,
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
        let resource = resource(&r.type_name)?;
        let prior = decode(r.prior_state.as_ref())?;
        let proposed = decode(r.proposed_new_state.as_ref())?;
        let config = decode(r.config.as_ref())?;
        let (planned, replace) = resource.plan(&prior, proposed, &config);
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
        let resource = resource(&r.type_name)?;
        let prior = decode(r.prior_state.as_ref())?;
        let planned = decode(r.planned_state.as_ref())?;
        let (state, diags) = match self.client() {
            Ok(client) => resource.apply(&client, prior, planned).await,
            Err(d) => (prior, d),
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
        let (imported, diags) = match resource(&r.type_name)?.import(&r.id) {
            Ok(state) => (
                vec![proto::import_resource_state::ImportedResource {
                    type_name: r.type_name,
                    state: encode(&state),
                    private: vec![],
                }],
                Diagnostics::default(),
            ),
            Err(d) => (vec![], d),
        };
        Ok(Response::new(proto::import_resource_state::Response {
            imported_resources: imported,
            diagnostics: diags.0,
        }))
    }

    async fn read_data_source(
        &self,
        request: Request<proto::read_data_source::Request>,
    ) -> Result<Response<proto::read_data_source::Response>, Status> {
        let r = request.into_inner();
        let resource = resources::find(&r.type_name)
            .ok_or_else(|| Status::not_found(format!("unknown data source {}", r.type_name)))?;
        let config = decode(r.config.as_ref())?;
        let result = match self.client() {
            Ok(client) => resource.read_data(&client, &config).await,
            Err(d) => Err(d),
        };
        let (state, diags) = match result {
            Ok(state) => (state, Diagnostics::default()),
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
