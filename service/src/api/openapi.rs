//! The OpenAPI 3 document, generated from the handler and model types.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{dataflows, queue_services, queues};
use sless_model::{ErrorBody, ErrorDetail, dataflow, queue_service};

#[derive(OpenApi)]
#[openapi(
    info(title = "sless API", description = "Managed SQS-compatible queues and dataflows. Authenticate with `Authorization: Bearer <token>`."),
    paths(
        queue_services::create, queue_services::list, queue_services::get,
        queue_services::put, queue_services::patch, queue_services::delete,
        dataflows::create, dataflows::list, dataflows::get,
        dataflows::put, dataflows::patch, dataflows::delete, dataflows::events, dataflows::snapshot,
        queues::list, queues::create, queues::delete, queues::send, queues::peek, queues::redrive,
    ),
    components(schemas(
        queue_service::QueueServicePhase, dataflow::DataFlowPhase, ErrorBody, ErrorDetail,
        queue_service::QueueServiceRequest, queue_service::QueueServiceView, queue_services::QueueServiceList,
        dataflow::DataFlowRequest, dataflow::DataFlowView, dataflow::DataFlowCounters, dataflow::ConnectorSpec,
        dataflow::TransformationSpec, dataflow::Resources, dataflows::DataFlowList,
        dataflow::DataFlowEvent, dataflow::DataFlowEventList, dataflow::EventKind,
        dataflow::SnapshotTables, dataflow::SnapshotRequest,
        queues::QueueView, queues::QueueList, queues::QueueRequest, queues::MessageRequest,
        queues::PeekedMessage, queues::PeekList,
    )),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The error answers any route may give, by status: what the handlers'
/// annotations leave out because every route shares them.
const SHARED_ERRORS: &[(&str, &str)] = &[
    ("400", "A malformed request: a path, query or body that does not parse"),
    ("401", "No token, or not a valid one"),
    ("429", "The tenant's API rate is spent: retry after Retry-After seconds"),
    ("503", "The platform is unavailable; retry"),
];
/// And those of a route that takes a body.
const BODY_ERRORS: &[(&str, &str)] = &[
    ("413", "The body is larger than 256 KiB"),
    ("415", "The body is not sent as application/json"),
];

/// Request bodies whose fields a create or a replace requires, though the
/// same type serves PATCH with every field optional: (method, path, the
/// schema's name in the document, required fields).
const REQUIRED: &[(&str, &str, &str, &str, &[&str])] = &[
    (
        "post",
        "/api/v1/queue-services",
        "QueueServiceRequest",
        "QueueServiceCreate",
        &["name"],
    ),
    (
        "post",
        "/api/v1/dataflows",
        "DataFlowRequest",
        "DataFlowCreate",
        &["name", "source", "sink"],
    ),
    (
        "put",
        "/api/v1/dataflows/{name}",
        "DataFlowRequest",
        "DataFlowReplace",
        &["source", "sink"],
    ),
];

/// Request types refuse fields they do not know (`deny_unknown_fields`).
const CLOSED: &[&str] = &[
    "QueueServiceRequest",
    "DataFlowRequest",
    "QueueRequest",
    "MessageRequest",
    "Resources",
    "ConnectorSpec",
    "TransformationSpec",
    "SnapshotTables",
];

/// The document as served: [`ApiDoc`] with what the server enforces and
/// the annotations cannot say: shared error answers, the fields a create
/// requires, and closed request objects.
pub fn document() -> serde_json::Value {
    use serde_json::{Value, json};
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
    let error = |description: &str| {
        json!({"description": description,
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    };
    let mut required_schemas = Vec::new();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else { continue };
            for (method, operation) in item.iter_mut() {
                let has_body = operation.get("requestBody").is_some();
                let responses = &mut operation["responses"];
                for (status, description) in SHARED_ERRORS.iter().chain(if has_body { BODY_ERRORS } else { &[] }) {
                    if responses.get(*status).is_none() {
                        responses[*status] = error(description);
                    }
                }
                let quota = path.starts_with("/api/v1/dataflows") && !path.ends_with("/snapshots");
                if has_body && quota && responses.get("403").is_none() {
                    responses["403"] = error("Over the tenant's quota of dataflows or of sinks per dataflow");
                }
                if path.contains("/queues") && responses.get("409").is_none() {
                    responses["409"] = error("The queue service is not Ready");
                }
                for (m, p, base, name, required) in REQUIRED {
                    if m == method && p == path {
                        operation["requestBody"]["content"]["application/json"]["schema"] =
                            json!({"$ref": format!("#/components/schemas/{name}")});
                        required_schemas.push((*base, *name, *required));
                    }
                }
            }
        }
    }
    let schemas = &mut doc["components"]["schemas"];
    for name in CLOSED {
        if schemas.get(*name).is_some() {
            schemas[*name]["additionalProperties"] = json!(false);
        }
    }
    // A connector's or a transformation's type is required (serde's default
    // only lets validation name it), and is one the registry lists.
    let kinds = |list: &mut dyn Iterator<Item = &'static str>| {
        let mut kinds: Vec<&str> = list.collect();
        kinds.sort_unstable();
        kinds.dedup();
        kinds
    };
    use sless_dataflow::registry::{SINKS, SOURCES, TRANSFORMS};
    let connectors = kinds(&mut SOURCES.iter().map(|d| d.kind).chain(SINKS.iter().map(|d| d.kind)));
    let transforms = kinds(&mut TRANSFORMS.iter().map(|d| d.kind));
    for (name, kinds) in [("ConnectorSpec", connectors), ("TransformationSpec", transforms)] {
        schemas[name]["required"] = json!(["type"]);
        schemas[name]["properties"]["type"]["enum"] = json!(kinds);
    }
    for (base, name, required) in required_schemas {
        let mut schema = schemas[base].clone();
        schema["required"] = json!(required);
        // A required field is not null either.
        for field in required {
            let property = &mut schema["properties"][*field];
            if let Some(types) = property["type"].as_array() {
                let types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                property["type"] = if types.len() == 1 {
                    types[0].clone()
                } else {
                    Value::Array(types)
                };
            }
            if let Some(branches) = property["oneOf"].as_array() {
                let branches: Vec<Value> = branches.iter().filter(|b| b["type"] != "null").cloned().collect();
                if let [only] = branches.as_slice() {
                    *property = only.clone();
                }
            }
        }
        schemas[name] = schema;
    }
    doc
}

pub async fn serve() -> Json<serde_json::Value> {
    static DOCUMENT: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(document);
    Json(DOCUMENT.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sless_model::queue_service::{MEMORY_MB, STORAGE_MB};

    /// The document states the rules the handlers apply, from the same facts.
    #[test]
    fn the_document_says_what_the_server_enforces() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for request in ["QueueServiceRequest", "DataFlowRequest"] {
            assert_eq!(
                schemas[request]["properties"]["name"]["pattern"],
                sless_model::name::PATTERN,
                "{request}"
            );
        }
        let memory = &schemas["QueueServiceRequest"]["properties"]["memoryMB"];
        assert_eq!(
            (memory["minimum"].as_i64(), memory["maximum"].as_i64()),
            (Some(*MEMORY_MB.start()), Some(*MEMORY_MB.end()))
        );
        let storage = &schemas["QueueServiceRequest"]["properties"]["storageMB"];
        assert_eq!(
            (storage["minimum"].as_i64(), storage["maximum"].as_i64()),
            (Some(*STORAGE_MB.start()), Some(*STORAGE_MB.end()))
        );
        let buffer = &schemas["DataFlowRequest"]["properties"]["channelBufferSize"];
        assert_eq!(
            buffer["maximum"].as_u64(),
            Some(u64::from(sless_model::dataflow::MAX_CHANNEL_BUFFER_SIZE))
        );
        assert_eq!(schemas["QueueServiceCreate"]["required"], serde_json::json!(["name"]));
        assert_eq!(schemas["QueueServiceCreate"]["properties"]["name"]["type"], "string");
        assert_eq!(
            doc["paths"]["/api/v1/dataflows"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/DataFlowCreate"
        );
        assert!(
            schemas["ConnectorSpec"]["properties"]["type"]["enum"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("postgresql-cdc"))
        );
        for (status, _) in SHARED_ERRORS.iter().chain(BODY_ERRORS) {
            assert!(
                doc["paths"]["/api/v1/dataflows"]["post"]["responses"]
                    .get(*status)
                    .is_some(),
                "{status}"
            );
        }
        assert_eq!(schemas["DataFlowRequest"]["additionalProperties"], false);
    }
}
