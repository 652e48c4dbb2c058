//! The OpenAPI 3 document, generated from the handler and model types.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{dataflows, error, queue_services, queues};
use sless_model::{dataflow, queue_service};

#[derive(OpenApi)]
#[openapi(
    info(title = "sless API", description = "Managed SQS-compatible queues and dataflows. Authenticate with `Authorization: Bearer <token>`."),
    paths(
        queue_services::create, queue_services::list, queue_services::get,
        queue_services::put, queue_services::patch, queue_services::delete,
        dataflows::create, dataflows::list, dataflows::get,
        dataflows::put, dataflows::patch, dataflows::delete, dataflows::events,
        queues::list, queues::create, queues::delete, queues::send, queues::peek, queues::redrive,
    ),
    components(schemas(
        queue_service::QueueServicePhase, dataflow::DataFlowPhase, error::ErrorBody, error::ErrorDetail,
        queue_service::QueueServiceRequest, queue_service::QueueServiceView, queue_services::QueueServiceList,
        dataflow::DataFlowRequest, dataflow::DataFlowView, dataflow::DataFlowCounters, dataflow::ConnectorSpec,
        dataflow::TransformationSpec, dataflow::Resources, dataflows::DataFlowList,
        dataflow::DataFlowEvent, dataflow::DataFlowEventList, dataflow::EventKind,
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

pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
