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

pub use access::{gateway_service, ingress, network_policy};
pub use elasticmq::{configmap, elasticmq_conf};

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretKeySelector, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::config::{MANAGED_BY_KEY, MANAGED_BY_VALUE, OperatorConfig};
use crate::crd::queue_service::{QueueEngine, QueueService};
use crate::objects::{fenced_container, fenced_pod};
use sless_model::queue_service::Credentials;

pub const SQS_PORT: i32 = 9324;
const DATA_PATH: &str = "/data";
/// The Secret's key of the token the gateway presents to the engine.
pub const ENGINE_TOKEN_KEY: &str = "engineToken";
/// Label of the gateway pods (deploy/gateway).
pub const GATEWAY_LABEL: (&str, &str) = ("app.kubernetes.io/name", "sless-gateway");

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

fn labels(tenant: &str) -> BTreeMap<String, String> {
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

/// The tenant's keys and the engine's token (which only the gateway and
/// the engine know).
pub fn secret(qs: &QueueService, credentials: &Credentials, engine_token: &str) -> Secret {
    Secret {
        metadata: meta(qs, secret_name(&qs.spec.tenant_id)),
        string_data: Some(BTreeMap::from([
            ("accessKey".to_owned(), credentials.access_key.clone()),
            ("secretKey".to_owned(), credentials.secret_key.clone()),
            (ENGINE_TOKEN_KEY.to_owned(), engine_token.to_owned()),
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

/// The message volume. It has no owner reference: on a real cluster the
/// garbage collector would delete it with its QueueService, and seed 000
/// keeps a tenant's messages until an operator deletes them.
pub fn pvc(qs: &QueueService) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            owner_references: None,
            ..meta(qs, pvc_name(&qs.spec.tenant_id))
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(format!("{}Mi", qs.spec.storage_mb)),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn health_probe(period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::Int(SQS_PORT),
            ..Default::default()
        }),
        period_seconds: Some(period),
        ..Default::default()
    }
}

/// The `sless queue` container: its journal on the volume when persistent,
/// its token from the Secret.
fn sless_container(qs: &QueueService, config: &OperatorConfig) -> Container {
    let tenant = &qs.spec.tenant_id;
    let mut args: Vec<String> = [
        "queue",
        "--listen",
        &format!("0.0.0.0:{SQS_PORT}"),
        "--account-id",
        &sless_sqs::credentials::account_id(tenant),
        "--base-url",
        &endpoint(config, tenant),
        "--region",
        &config.region,
    ]
    .map(str::to_owned)
    .into();
    if qs.spec.persistence {
        args.extend([
            "--data-dir".to_owned(),
            DATA_PATH.to_owned(),
            "--durability".to_owned(),
            qs.spec.durability.as_str().to_owned(),
        ]);
    }
    Container {
        name: "sqs".into(),
        image: Some(config.image.clone()),
        args: Some(args),
        env: Some(vec![EnvVar {
            name: "SLESS_ENGINE_TOKEN".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name(tenant),
                    key: ENGINE_TOKEN_KEY.into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        security_context: Some(fenced_container()),
        ..Default::default()
    }
}

pub fn deployment(qs: &QueueService, config: &OperatorConfig) -> Deployment {
    let tenant = &qs.spec.tenant_id;
    let quantity = |s: &str| Quantity(s.to_owned());
    let (mut container, mut volumes, mut mounts) = match qs.spec.engine {
        QueueEngine::Sless => (sless_container(qs, config), vec![], vec![]),
        QueueEngine::Elasticmq => (
            elasticmq::elasticmq_container(config),
            vec![Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: configmap_name(tenant),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            vec![VolumeMount {
                name: "config".into(),
                mount_path: elasticmq::CONFIG_PATH.into(),
                sub_path: Some("elasticmq.conf".into()),
                read_only: Some(true),
                ..Default::default()
            }],
        ),
    };
    if qs.spec.persistence {
        volumes.push(Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc_name(tenant),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "data".into(),
            mount_path: DATA_PATH.into(),
            ..Default::default()
        });
    }
    container.ports = Some(vec![ContainerPort {
        container_port: SQS_PORT,
        name: Some("sqs".into()),
        ..Default::default()
    }]);
    container.resources = Some(ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), quantity("10m")),
            ("memory".to_owned(), quantity("32Mi")),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), quantity("500m")),
            ("memory".to_owned(), Quantity(format!("{}Mi", qs.spec.memory_mb))),
        ])),
        ..Default::default()
    });
    container.readiness_probe = Some(health_probe(5));
    container.liveness_probe = Some(health_probe(10));
    container.volume_mounts = Some(mounts).filter(|m| !m.is_empty());
    Deployment {
        metadata: meta(qs, deployment_name(tenant)),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            // One writer of the journal (or the H2 files) at a time.
            strategy: Some(k8s_openapi::api::apps::v1::DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(labels(tenant)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(tenant)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(volumes).filter(|v| !v.is_empty()),
                    // The engine needs no Kubernetes API.
                    automount_service_account_token: Some(false),
                    security_context: Some(match qs.spec.engine {
                        QueueEngine::Sless => fenced_pod(),
                        // Its image names its user by name: left as it is.
                        QueueEngine::Elasticmq => PodSecurityContext {
                            run_as_user: None,
                            run_as_group: None,
                            ..fenced_pod()
                        },
                    }),
                    ..Default::default()
                }),
            },
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
