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
//!
//! Over 400 lines only with its unit tests, which sit beside the builders
//! they check.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    Namespace, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretKeySelector, SecurityContext, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule, IngressServiceBackend, IngressSpec,
    IngressTLS, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
    ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::config::OperatorConfig;
use crate::crd::queue_service::{QueueEngine, QueueService};
use sless_model::queue_service::Credentials;

pub const SQS_PORT: i32 = 9324;
/// Where elasticmq-native reads its configuration.
const CONFIG_PATH: &str = "/opt/elasticmq.conf";
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
pub fn endpoint(config: &OperatorConfig, tenant: &str) -> String {
    format!("https://{}/sqs/{tenant}", config.sqs_external_host)
}

fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "sqs".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), tenant.to_owned()),
        ("app.kubernetes.io/managed-by".to_owned(), "sless-operator".to_owned()),
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

/// ElasticMQ's HOCON: public address under `/sqs/{tenant}`, strict SQS
/// limits, H2 storage on the volume when persistence is on.
pub fn elasticmq_conf(config: &OperatorConfig, tenant: &str, persistence: bool) -> String {
    format!(
        r#"include classpath("application.conf")
node-address {{
  protocol = https
  host = "{host}"
  port = 443
  context-path = "/sqs/{tenant}"
}}
rest-sqs {{
  enabled = true
  bind-port = {SQS_PORT}
  bind-hostname = "0.0.0.0"
  sqs-limits = strict
}}
messages-storage {{
  enabled = {persistence}
  uri = "jdbc:h2:{DATA_PATH}/elasticmq"
}}
aws {{
  region = ru-msk-1
  accountId = "{tenant}"
}}
"#,
        host = config.sqs_external_host,
    )
}

pub fn configmap(qs: &QueueService, config: &OperatorConfig) -> ConfigMap {
    ConfigMap {
        metadata: meta(qs, configmap_name(&qs.spec.tenant_id)),
        data: Some(BTreeMap::from([(
            "elasticmq.conf".to_owned(),
            elasticmq_conf(config, &qs.spec.tenant_id, qs.spec.persistence),
        )])),
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

/// What every engine container shares: no root, no writes outside its
/// volume, no privilege.
fn locked_down() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
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
        tenant,
        "--base-url",
        &endpoint(config, tenant),
    ]
    .map(str::to_owned)
    .into();
    if qs.spec.persistence {
        args.extend(["--data-dir".to_owned(), DATA_PATH.to_owned()]);
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
        security_context: Some(locked_down()),
        ..Default::default()
    }
}

/// The elasticmq-native container, its HOCON mounted where it reads it.
fn elasticmq_container(config: &OperatorConfig) -> Container {
    Container {
        name: "elasticmq".into(),
        image: Some(config.elasticmq_image.clone()),
        security_context: Some(SecurityContext {
            // The native image writes nothing outside its volume either, but
            // its user is not declared numerically; leave the root check off.
            run_as_non_root: None,
            ..locked_down()
        }),
        ..Default::default()
    }
}

pub fn deployment(qs: &QueueService, config: &OperatorConfig) -> Deployment {
    let tenant = &qs.spec.tenant_id;
    let quantity = |s: &str| Quantity(s.to_owned());
    let (mut container, mut volumes, mut mounts) = match qs.spec.engine {
        QueueEngine::Sless => (sless_container(qs, config), vec![], vec![]),
        QueueEngine::Elasticmq => (
            elasticmq_container(config),
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
                mount_path: CONFIG_PATH.into(),
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
            ("memory".to_owned(), quantity("16Mi")),
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
                    // The volume is writable by the image's non-root user.
                    security_context: Some(PodSecurityContext {
                        fs_group: Some(65532),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Only gateway pods reach the engine, on its port; the engine reaches
/// nothing (it resolves no names and calls no one).
pub fn network_policy(qs: &QueueService, config: &OperatorConfig) -> NetworkPolicy {
    let tenant = &qs.spec.tenant_id;
    NetworkPolicy {
        metadata: meta(qs, network_policy_name(tenant)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(tenant)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_owned(),
                            config.gateway_namespace.clone(),
                        )])),
                        ..Default::default()
                    }),
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            GATEWAY_LABEL.0.to_owned(),
                            GATEWAY_LABEL.1.to_owned(),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(SQS_PORT)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            }]),
            egress: Some(vec![]),
        }),
    }
}

/// The gateway's Service under a name in the tenant's namespace, for the
/// tenant Ingress to route to.
pub fn gateway_service(qs: &QueueService, config: &OperatorConfig) -> Service {
    Service {
        metadata: meta(qs, gateway_service_name(&qs.spec.tenant_id)),
        spec: Some(ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some(config.gateway_host.clone()),
            ports: Some(vec![ServicePort {
                name: Some("sqs".into()),
                port: SQS_PORT,
                ..Default::default()
            }]),
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

pub fn ingress(qs: &QueueService, config: &OperatorConfig) -> Ingress {
    let tenant = &qs.spec.tenant_id;
    Ingress {
        metadata: meta(qs, ingress_name(tenant)),
        spec: Some(IngressSpec {
            rules: Some(vec![IngressRule {
                host: Some(config.sqs_external_host.clone()),
                http: Some(HTTPIngressRuleValue {
                    paths: vec![HTTPIngressPath {
                        path: Some(format!("/sqs/{tenant}")),
                        path_type: "Prefix".into(),
                        backend: IngressBackend {
                            service: Some(IngressServiceBackend {
                                name: gateway_service_name(tenant),
                                port: Some(ServiceBackendPort {
                                    number: Some(SQS_PORT),
                                    ..Default::default()
                                }),
                            }),
                            ..Default::default()
                        },
                    }],
                }),
            }]),
            tls: config.sqs_tls_secret.as_ref().map(|secret| {
                vec![IngressTLS {
                    hosts: Some(vec![config.sqs_external_host.clone()]),
                    secret_name: Some(secret.clone()),
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue_service::QueueServiceSpec;

    fn qs(namespace: &str, persistence: bool) -> QueueService {
        with_engine(namespace, persistence, QueueEngine::Sless)
    }

    fn with_engine(namespace: &str, persistence: bool, engine: QueueEngine) -> QueueService {
        let mut qs = QueueService::new(
            "main",
            QueueServiceSpec {
                tenant_id: "acme".into(),
                memory_mb: 128,
                storage_mb: 1024,
                persistence,
                engine,
            },
        );
        qs.metadata.namespace = Some(namespace.into());
        qs.metadata.uid = Some("uid-1".into());
        qs
    }

    #[test]
    fn names_follow_the_seed_and_live_in_the_tenant_namespace() {
        let q = qs("sless-fn-acme", true);
        let c = OperatorConfig::default();
        assert_eq!(namespace(&q).metadata.name.as_deref(), Some("sless-fn-acme"));
        let names = [
            secret(&q, &sless_sqs::credentials::generate("acme"), "t0k3n").metadata,
            configmap(&q, &c).metadata,
            pvc(&q).metadata,
            deployment(&q, &c).metadata,
            service(&q).metadata,
            ingress(&q, &c).metadata,
            gateway_service(&q, &c).metadata,
            network_policy(&q, &c).metadata,
        ];
        let got: Vec<(&str, &str)> = names
            .iter()
            .map(|m| (m.name.as_deref().unwrap(), m.namespace.as_deref().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("sqs-creds-acme", "sless-fn-acme"),
                ("sqs-cfg-acme", "sless-fn-acme"),
                ("sqs-data-acme", "sless-fn-acme"),
                ("sqs-acme", "sless-fn-acme"),
                ("sqs-svc-acme", "sless-fn-acme"),
                ("sqs-ing-acme", "sless-fn-acme"),
                ("sqs-gw-acme", "sless-fn-acme"),
                ("sqs-netpol-acme", "sless-fn-acme"),
            ]
        );
    }

    /// kube-fake-client has no garbage collector, so a reconcile test cannot
    /// see an owned PVC vanish: the built object is checked instead.
    #[test]
    fn the_message_volume_is_never_owned_so_deleting_the_queue_service_keeps_it() {
        let same_namespace = qs("sless-fn-acme", true);
        assert!(
            deployment(&same_namespace, &OperatorConfig::default())
                .metadata
                .owner_references
                .is_some()
        );
        assert_eq!(pvc(&same_namespace).metadata.owner_references, None);
    }

    #[test]
    fn children_are_owned_only_from_the_same_namespace() {
        let c = OperatorConfig::default();
        let owned = deployment(&qs("sless-fn-acme", true), &c)
            .metadata
            .owner_references
            .unwrap();
        assert_eq!(
            (
                owned[0].kind.as_str(),
                owned[0].name.as_str(),
                owned[0].uid.as_str(),
                owned[0].controller
            ),
            ("QueueService", "main", "uid-1", Some(true))
        );
        assert!(
            deployment(&qs("elsewhere", true), &c)
                .metadata
                .owner_references
                .is_none()
        );
    }

    #[test]
    fn the_deployment_runs_elasticmq_with_its_config_volume_probes_and_limits() {
        let elasticmq = |persistence| with_engine("sless-fn-acme", persistence, QueueEngine::Elasticmq);
        let d = deployment(&elasticmq(true), &OperatorConfig::default());
        let pod = d.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("softwaremill/elasticmq-native:1.7.1"));
        // Where the native image reads it (not a -Dconfig.file option, which
        // the native binary does not take from JAVA_TOOL_OPTIONS).
        assert_eq!(c.env, None);
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["memory"].0, "128Mi");
        assert_eq!(c.readiness_probe.as_ref().unwrap().period_seconds, Some(5));
        assert_eq!(c.liveness_probe.as_ref().unwrap().period_seconds, Some(10));
        let mounts: Vec<&str> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, ["/opt/elasticmq.conf", "/data"]);
        assert_eq!(
            pod.volumes.unwrap()[1]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "sqs-data-acme"
        );
        // Without persistence there is no data volume.
        let d = deployment(&elasticmq(false), &OperatorConfig::default());
        assert_eq!(d.spec.unwrap().template.spec.unwrap().volumes.unwrap().len(), 1);
    }

    #[test]
    fn the_default_deployment_runs_sless_queue_with_its_journal_and_token_and_no_privilege() {
        let c = OperatorConfig::default();
        let pod = deployment(&qs("sless-fn-acme", true), &c)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("ghcr.io/kube5s/sless:latest"));
        assert_eq!(
            container.args.as_ref().unwrap().join(" "),
            "queue --listen 0.0.0.0:9324 --account-id acme --base-url https://sqs.kube5s.ru/sqs/acme --data-dir /data"
        );
        let token = &container.env.as_ref().unwrap()[0];
        let from = token.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (token.name.as_str(), from.name.as_str(), from.key.as_str()),
            ("SLESS_ENGINE_TOKEN", "sqs-creds-acme", ENGINE_TOKEN_KEY)
        );
        assert_eq!(token.value, None, "the token never sits in the spec");
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(
            (
                security.run_as_non_root,
                security.read_only_root_filesystem,
                security.allow_privilege_escalation
            ),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
        let mounts = container.volume_mounts.as_ref().unwrap();
        assert_eq!((mounts.len(), mounts[0].mount_path.as_str()), (1, "/data"));
        // In memory: no volume at all, and no --data-dir.
        let pod = deployment(&qs("sless-fn-acme", false), &c)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        assert_eq!(pod.volumes, None);
        assert!(
            !pod.containers[0]
                .args
                .as_ref()
                .unwrap()
                .contains(&"--data-dir".to_owned())
        );
    }

    #[test]
    fn only_gateway_pods_reach_the_engine_and_the_engine_reaches_nothing() {
        let spec = network_policy(&qs("sless-fn-acme", true), &OperatorConfig::default())
            .spec
            .unwrap();
        assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
        assert_eq!(spec.egress, Some(vec![]), "no egress at all");
        assert_eq!(spec.pod_selector.unwrap().match_labels.unwrap(), labels("acme"));
        let rules = spec.ingress.unwrap();
        assert_eq!(rules.len(), 1);
        let peer = &rules[0].from.as_ref().unwrap()[0];
        let namespaces = peer.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
        assert_eq!(namespaces["kubernetes.io/metadata.name"], "sless-system");
        let pods = peer.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
        assert_eq!(pods["app.kubernetes.io/name"], "sless-gateway");
        assert_eq!(rules[0].ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(9324)));
    }

    #[test]
    fn the_hocon_config_routes_under_the_tenant_path() {
        let conf = elasticmq_conf(&OperatorConfig::default(), "acme", false);
        assert!(conf.contains(r#"context-path = "/sqs/acme""#), "{conf}");
        assert!(conf.contains(r#"host = "sqs.kube5s.ru""#));
        assert!(conf.contains("bind-port = 9324"));
        assert!(conf.contains("sqs-limits = strict"));
        assert!(
            conf.contains("enabled = false\n  uri = \"jdbc:h2:/data/elasticmq\""),
            "{conf}"
        );
        assert!(conf.contains(r#"accountId = "acme""#));
    }

    #[test]
    fn pvc_service_and_ingress() {
        let q = qs("sless-fn-acme", true);
        let storage = &pvc(&q).spec.unwrap().resources.unwrap().requests.unwrap()["storage"];
        assert_eq!(storage.0, "1024Mi");
        let port = &service(&q).spec.unwrap().ports.unwrap()[0];
        assert_eq!(
            (port.port, port.target_port.clone()),
            (9324, Some(IntOrString::Int(9324)))
        );
        let config = OperatorConfig {
            sqs_tls_secret: Some("sqs-tls".into()),
            ..Default::default()
        };
        let spec = ingress(&q, &config).spec.unwrap();
        let rule = &spec.rules.unwrap()[0];
        let path = &rule.http.as_ref().unwrap().paths[0];
        assert_eq!(
            (rule.host.as_deref(), path.path.as_deref(), path.path_type.as_str()),
            (Some("sqs.kube5s.ru"), Some("/sqs/acme"), "Prefix")
        );
        // The tenant's path goes to the gateway, never to the engine.
        assert_eq!(path.backend.service.as_ref().unwrap().name, "sqs-gw-acme");
        let gateway = gateway_service(&q, &OperatorConfig::default()).spec.unwrap();
        assert_eq!(
            (gateway.type_.as_deref(), gateway.external_name.as_deref()),
            (
                Some("ExternalName"),
                Some("sless-gateway.sless-system.svc.cluster.local")
            )
        );
        assert_eq!(spec.tls.unwrap()[0].secret_name.as_deref(), Some("sqs-tls"));
        assert_eq!(
            endpoint(&OperatorConfig::default(), "acme"),
            "https://sqs.kube5s.ru/sqs/acme"
        );
    }
}
