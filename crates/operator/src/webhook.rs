//! The validating admission webhook: the API server sends each create and
//! update as an AdmissionReview. A DataFlow (seed 001) gets the same rules
//! as the REST API (`DataFlowCrdSpec::to_spec`), and secret references
//! outside its namespace are refused; a QueueService must stand in its
//! tenant's namespace. Served over HTTPS, as the API server requires.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sless_model::{FieldError, ValidationErrors};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::crd::dataflow::DataFlow;
use super::crd::queue_service::QueueService;

pub const DATAFLOW_PATH: &str = "/validate/dataflows";
pub const QUEUE_SERVICE_PATH: &str = "/validate/queueservices";

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("cannot read the webhook certificate or key: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("invalid webhook certificate: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("webhook server: {0}")]
    Serve(#[source] std::io::Error),
}

/// The answer to one review.
pub fn review_dataflow(review: AdmissionReview<DataFlow>) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<DataFlow> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(e.to_string()).into_review(),
    };
    let response = AdmissionResponse::from(&request);
    let Some(dataflow) = request
        .object
        .as_ref()
        .filter(|_| request.operation != Operation::Delete)
    else {
        return response.into_review();
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let verdict = dataflow.spec.to_spec().and_then(|spec| {
        super::dataflow::referenced_secrets(&spec, &namespace).map_err(FieldError::from)?;
        // The processor's id is namespace/name: names on shared servers
        // carry the namespace's prefix.
        sless_dataflow::registry::check_scope(&spec, &namespace).into_result()
    });
    match verdict {
        Ok(_) => response,
        Err(errors) => denied(response, &errors),
    }
    .into_review()
}

/// The answer to one review of a QueueService: it must stand in its
/// tenant's namespace (see [`crate::queue_service::misplaced`]).
pub fn review_queue_service(review: AdmissionReview<QueueService>) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<QueueService> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(e.to_string()).into_review(),
    };
    let response = AdmissionResponse::from(&request);
    let Some(mut qs) = request
        .object
        .clone()
        .filter(|_| request.operation != Operation::Delete)
    else {
        return response.into_review();
    };
    // The review names the namespace; the object may leave it unset.
    qs.metadata.namespace = request.namespace.clone();
    let verdict = match crate::queue_service::misplaced(&qs) {
        Some(reason) => Err(FieldError::invalid("tenantId", reason).into()),
        None => qs.spec.check(),
    };
    match verdict {
        Ok(()) => response,
        Err(errors) => denied(response, &errors),
    }
    .into_review()
}

/// A denial as the API server words a schema refusal: 422 `Invalid`, each
/// problem a cause at its field, so callers read fields, not prose.
fn denied(response: AdmissionResponse, errors: &ValidationErrors) -> AdmissionResponse {
    let mut response = response.deny(errors);
    response.result.code = 422;
    response.result.reason = "Invalid".into();
    response.result.details = Some(StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: errors
            .0
            .iter()
            .map(|e| StatusCause {
                reason: "FieldValueInvalid".into(),
                message: e.message.clone(),
                field: format!("spec.{}", e.field),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    response
}

pub fn router() -> Router {
    Router::new()
        .route(
            DATAFLOW_PATH,
            post(|Json(review): Json<AdmissionReview<DataFlow>>| async move { Json(review_dataflow(review)) }),
        )
        .route(
            QUEUE_SERVICE_PATH,
            post(|Json(review): Json<AdmissionReview<QueueService>>| async move { Json(review_queue_service(review)) }),
        )
}

/// TLS over a TCP listener, for axum::serve.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            match tokio::time::timeout(Duration::from_secs(10), self.acceptor.accept(stream)).await {
                Ok(Ok(tls)) => return (tls, addr),
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "webhook TLS handshake failed"),
                Err(_) => tracing::debug!(%addr, "webhook TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

pub struct Webhook {
    listener: TlsListener,
    pub addr: SocketAddr,
}

impl Webhook {
    pub async fn bind(listen: SocketAddr, cert: &Path, key: &Path) -> Result<Self, WebhookError> {
        sless_runtime::tls::install_default_provider();
        let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(key)?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        let tcp = TcpListener::bind(listen)
            .await
            .map_err(|source| WebhookError::Bind { addr: listen, source })?;
        let addr = tcp.local_addr().map_err(WebhookError::Serve)?;
        Ok(Self {
            listener: TlsListener {
                tcp,
                acceptor: TlsAcceptor::from(Arc::new(config)),
            },
            addr,
        })
    }

    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), WebhookError> {
        axum::serve(self.listener, router())
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(WebhookError::Serve)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn review(operation: &str, spec: Value) -> AdmissionReview<DataFlow> {
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "dataflow.dataflow.io", "version": "v1", "kind": "DataFlow"},
                "resource": {"group": "dataflow.dataflow.io", "version": "v1", "resource": "dataflows"},
                "name": "orders",
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "dataflow.dataflow.io/v1",
                    "kind": "DataFlow",
                    "metadata": {"name": "orders", "namespace": "team-a"},
                    "spec": spec
                },
                "dryRun": false
            }
        }))
        .unwrap()
    }

    fn answer(operation: &str, spec: Value) -> Value {
        serde_json::to_value(review_dataflow(review(operation, spec))).unwrap()["response"].clone()
    }

    const GOOD: &str = r#"{
        "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "in"}},
        "sink": {"type": "postgresql", "config": {"connectionStringSecretRef": {"name": "pg", "key": "dsn"}, "table": "t"}}
    }"#;

    #[test]
    fn a_valid_dataflow_is_allowed_with_its_uid() {
        let response = answer("CREATE", serde_json::from_str(GOOD).unwrap());
        assert_eq!(response["allowed"], true, "{response}");
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    }

    #[test]
    fn an_invalid_dataflow_is_denied_with_every_field_named() {
        let response = answer(
            "UPDATE",
            json!({
                "source": {"type": "mysql", "config": {}},
                "sink": {"type": "postgresql", "config": {"table": "t"}},
                "transformations": [{"type": "explode"}]
            }),
        );
        assert_eq!(response["allowed"], false);
        let message = response["status"]["message"].as_str().unwrap();
        for field in ["source.type", "sink.config.connectionString", "transformations[0].type"] {
            assert!(message.contains(field), "{field} missing from {message}");
        }
        // As the API server words a schema refusal, so the REST API names
        // the fields.
        assert_eq!(
            (&response["status"]["code"], &response["status"]["reason"]),
            (&json!(422), &json!("Invalid"))
        );
        let causes: Vec<&str> = response["status"]["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert!(causes.contains(&"spec.source.type"), "{causes:?}");
        assert!(causes.contains(&"spec.transformations[0].type"), "{causes:?}");
        assert!(message.contains("\"mysql\""), "{message}");
    }

    #[test]
    fn a_slot_outside_the_namespaces_prefix_is_denied() {
        let mut spec: Value = serde_json::from_str(GOOD).unwrap();
        spec["source"] = json!({"type": "postgresql-cdc", "config": {
            "connectionString": "postgres://db/app", "table": "orders", "slotName": "sless_elsewhere"}});
        let response = answer("CREATE", spec);
        assert_eq!(response["allowed"], false, "{response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("source.config.slotName") && message.contains("must begin with sless_"),
            "{message}"
        );
    }

    #[test]
    fn a_secret_reference_to_another_namespace_is_denied() {
        let mut spec: Value = serde_json::from_str(GOOD).unwrap();
        spec["sink"]["config"]["connectionStringSecretRef"]["namespace"] = json!("team-b");
        let response = answer("CREATE", spec);
        assert_eq!(response["allowed"], false);
        assert!(response["status"]["message"].as_str().unwrap().contains("team-b"));
        assert_eq!(
            response["status"]["details"]["causes"][0]["field"],
            "spec.sink.config.connectionStringSecretRef"
        );
    }

    fn queue_service_review(namespace: &str, tenant: &str) -> Value {
        queue_service_spec_review(namespace, json!({"tenantId": tenant}))
    }

    fn queue_service_spec_review(namespace: &str, spec: Value) -> Value {
        let review: AdmissionReview<QueueService> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "9f3c0b8e-0000-4000-8000-000000000001",
                "kind": {"group": "sless.kube5s.ru", "version": "v1alpha1", "kind": "QueueService"},
                "resource": {"group": "sless.kube5s.ru", "version": "v1alpha1", "resource": "queueservices"},
                "name": "main",
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "sless.kube5s.ru/v1alpha1",
                    "kind": "QueueService",
                    "metadata": {"name": "main"},
                    "spec": spec
                },
                "dryRun": false
            }
        }))
        .unwrap();
        serde_json::to_value(review_queue_service(review)).unwrap()["response"].clone()
    }

    /// A QueueService makes its children in its tenant's namespace and
    /// reads its keys there, so it may only stand there: one elsewhere
    /// (another tenant's namespace, or any other) is denied at tenantId.
    #[test]
    fn a_queue_service_outside_its_tenants_namespace_is_denied() {
        assert_eq!(queue_service_review("sless-fn-acme", "acme")["allowed"], true);
        for (namespace, tenant) in [("sless-fn-acme", "beta"), ("default", "acme")] {
            let response = queue_service_review(namespace, tenant);
            assert_eq!(response["allowed"], false, "{namespace} {tenant}");
            assert_eq!(response["status"]["code"], 422);
            assert_eq!(response["status"]["details"]["causes"][0]["field"], "spec.tenantId");
            assert!(
                response["status"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("sless-fn-{tenant}")),
                "{response}"
            );
        }
    }

    /// The REST API's rules hold for a QueueService applied directly.
    #[test]
    fn process_durability_without_persistence_is_denied() {
        let spec = |persistence| json!({"tenantId": "acme", "persistence": persistence, "durability": "process"});
        assert_eq!(queue_service_spec_review("sless-fn-acme", spec(true))["allowed"], true);
        let response = queue_service_spec_review("sless-fn-acme", spec(false));
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["details"]["causes"][0]["field"], "spec.durability");
    }
}
