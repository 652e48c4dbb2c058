//! The desired child objects of a QueueService (seed 000), as pure
//! functions of the resource and the operator's config, so every field can
//! be unit-tested. All live in the tenant's namespace `sless-fn-{tenant}`.
//!
//! The engine is `sless queue` unless the QueueService asks for ElasticMQ.
//! Either way tenants reach it only through the SigV4 gateway: the tenant
//! Ingress routes `/sqs/{tenant}` to the gateway (through an ExternalName
//! Service, as an Ingress cannot name another namespace's Service), and a
//! NetworkPolicy lets only gateway pods reach the engine, which reaches
//! nothing.
//! ElasticMQ's pieces are in `elasticmq.rs`, the way in (Ingress, gateway
//! Service, NetworkPolicy) in `access.rs`.

mod access;
mod elasticmq;
mod engine;

pub use access::{gateway_service, ingress, network_policy};
pub use elasticmq::{configmap, elasticmq_conf};
pub use engine::{
    PEER_PORT, PEERS_SERVICE, POD_INDEX_LABEL, STATEFUL_SET, deployment, disruption_budget, disruption_budget_name,
    peer_address, peers_service, stateful_set, stateful_set_step,
};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret, Service, ServicePort, ServiceSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::config::{MANAGED_BY_KEY, MANAGED_BY_VALUE, OperatorConfig};
use crate::crd::queue_service::QueueService;
use sless_model::queue_service::Credentials;

pub const SQS_PORT: i32 = 9324;
const DATA_PATH: &str = "/data";
/// The Secret's key of the token the gateway presents to the engine.
pub const ENGINE_TOKEN_KEY: &str = "engineToken";
/// The Secret's key of the token the engine's replicas present to each other.
pub const PEER_TOKEN_KEY: &str = "peerToken";
/// Label of the gateway pods (deploy/gateway).
pub const GATEWAY_LABEL: (&str, &str) = ("app.kubernetes.io/name", "sless-gateway");
/// The label of the operator's pods (`sless serve`), the only platform
/// pods that reach a replica's peer port.
pub const OPERATOR_LABEL: (&str, &str) = ("app.kubernetes.io/name", "sless-operator");

pub fn namespace_name(tenant: &str) -> String {
    format!("sless-fn-{tenant}")
}
pub fn secret_name(tenant: &str) -> String {
    format!("sqs-creds-{tenant}")
}
pub fn configmap_name(tenant: &str) -> String {
    format!("sqs-cfg-{tenant}")
}
pub fn pvc_name(tenant: &str) -> String {
    format!("sqs-data-{tenant}")
}
/// ElasticMQ's Deployment.
pub fn deployment_name(tenant: &str) -> String {
    format!("sqs-{tenant}")
}
pub fn service_name(tenant: &str) -> String {
    format!("sqs-svc-{tenant}")
}
pub fn ingress_name(tenant: &str) -> String {
    format!("sqs-ing-{tenant}")
}
pub fn gateway_service_name(tenant: &str) -> String {
    format!("sqs-gw-{tenant}")
}
pub fn network_policy_name(tenant: &str) -> String {
    format!("sqs-netpol-{tenant}")
}

/// The endpoint clients use once the instance is Ready.
/// The Secret of the SQS host's certificate in the tenant's namespace.
pub fn tls_secret_name(tenant: &str) -> String {
    format!("sqs-tls-{tenant}")
}

/// The tenant's endpoint: `https://` only when its Ingress has TLS.
pub fn endpoint(config: &OperatorConfig, tenant: &str) -> String {
    let scheme = if config.sqs_tls() { "https" } else { "http" };
    format!("{scheme}://{}/sqs/{tenant}", config.sqs_external_host)
}

pub fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "sqs".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), tenant.to_owned()),
        (MANAGED_BY_KEY.to_owned(), MANAGED_BY_VALUE.to_owned()),
    ])
}

/// Metadata of a child: in the tenant's namespace, labelled, and owned by
/// the QueueService when it lives there too (owner references cannot cross
/// namespaces; the finalizer cleans up either way).
fn meta(qs: &QueueService, name: String) -> ObjectMeta {
    let namespace = namespace_name(&qs.spec.tenant_id);
    let owner = qs
        .controller_owner_ref(&())
        .filter(|_| qs.metadata.namespace.as_deref() == Some(namespace.as_str()));
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace),
        labels: Some(labels(&qs.spec.tenant_id)),
        owner_references: owner.map(|o: OwnerReference| vec![o]),
        ..Default::default()
    }
}

pub fn namespace(qs: &QueueService) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(namespace_name(&qs.spec.tenant_id)),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The tenant's keys, the engine's token (which only the gateway and the
/// engine know) and its replicas' token (which only they know).
pub fn secret(qs: &QueueService, credentials: &Credentials, engine_token: &str, peer_token: &str) -> Secret {
    Secret {
        metadata: meta(qs, secret_name(&qs.spec.tenant_id)),
        string_data: Some(BTreeMap::from([
            ("accessKey".to_owned(), credentials.access_key.clone()),
            ("secretKey".to_owned(), credentials.secret_key.clone()),
            (ENGINE_TOKEN_KEY.to_owned(), engine_token.to_owned()),
            (PEER_TOKEN_KEY.to_owned(), peer_token.to_owned()),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The copy of the SQS host's certificate (`source`, the operator's) in
/// the tenant's namespace, where its Ingress can read it.
pub fn tls_secret(qs: &QueueService, source: &Secret) -> Secret {
    let data = source.data.clone().unwrap_or_default();
    Secret {
        metadata: meta(qs, tls_secret_name(&qs.spec.tenant_id)),
        data: Some(
            data.into_iter()
                .filter(|(k, _)| k == "tls.crt" || k == "tls.key")
                .collect(),
        ),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    }
}

/// ElasticMQ's message volume (`sless queue`'s come from its StatefulSet's
/// template). It has no owner reference: on a real cluster the
/// garbage collector would delete it with its QueueService, and seed 000
/// keeps a tenant's messages until an operator deletes them.
pub fn pvc(qs: &QueueService) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            owner_references: None,
            ..meta(qs, pvc_name(&qs.spec.tenant_id))
        },
        spec: Some(claim_spec(qs)),
        ..Default::default()
    }
}

/// A message volume of the spec's size, one node's at a time: ElasticMQ's
/// PVC and each `sless queue` replica's claim.
fn claim_spec(qs: &QueueService) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(format!("{}Mi", qs.spec.storage_mb)),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn service(qs: &QueueService) -> Service {
    let tenant = &qs.spec.tenant_id;
    Service {
        metadata: meta(qs, service_name(tenant)),
        spec: Some(ServiceSpec {
            selector: Some(labels(tenant)),
            ports: Some(vec![ServicePort {
                name: Some("sqs".into()),
                port: SQS_PORT,
                target_port: Some(IntOrString::Int(SQS_PORT)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
