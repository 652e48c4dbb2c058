//! The desired child objects of a DataFlow (seed 001), as pure functions:
//! the resolved spec's Secret, the checkpoint ConfigMap with the RBAC that
//! lets the processor write it, and the processor's Deployment, which mounts
//! the spec and the Kafka TLS files its Secrets hold.
//!
//! Over 400 lines only with its unit tests, which sit beside the builders
//! they check.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction, KeyToPath, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretVolumeSource, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::secrets::TlsMount;
use crate::config::{MANAGED_BY_KEY, MANAGED_BY_VALUE, OperatorConfig};
use crate::crd::dataflow::DataFlow;
use crate::objects::{fenced_container, fenced_pod, namespace_peer, policy_port};
use sless_dataflow::checkpoint::configmap::configmap_name as checkpoint_name;
use sless_dataflow::egress::PROCESSOR_TLS_DIR;
use sless_model::dataflow::DataFlowSpec;

const SPEC_DIR: &str = "/etc/dataflow";
/// Where a processor spills (an `emptyDir` of [`SPILL_SIZE`]), and the MiB
/// it may keep there: below the size, so that the processor refuses with
/// its reason before the kubelet would evict the pod.
const SPILL_DIR: &str = "/var/lib/sless/spill";
const SPILL_SIZE: &str = "2Gi";
const SPILL_LIMIT_MB: u32 = 1536;
/// Where a processor serves `/metrics` (the API reads its counters there).
pub const METRICS_PORT: i32 = 9090;

pub fn spec_name(dataflow: &str) -> String {
    format!("dataflow-{dataflow}-spec")
}
pub fn deployment_name(dataflow: &str) -> String {
    format!("dataflow-{dataflow}")
}
pub fn processor_account(dataflow: &str) -> String {
    format!("dataflow-{dataflow}-processor")
}

/// The labels of a dataflow's children and its processor's pods.
pub fn processor_labels(dataflow: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "dataflow-processor".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), dataflow.to_owned()),
        (MANAGED_BY_KEY.to_owned(), MANAGED_BY_VALUE.to_owned()),
    ])
}

fn labels(df: &DataFlow) -> BTreeMap<String, String> {
    processor_labels(&df.name_any())
}

/// A child in the DataFlow's namespace, owned (and so garbage-collected) by it.
fn meta(df: &DataFlow, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: df.namespace(),
        labels: Some(labels(df)),
        owner_references: df.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// The processor's spec, secrets resolved, as JSON.
pub fn spec_json(spec: &DataFlowSpec) -> String {
    serde_json::to_string_pretty(spec).unwrap_or_default()
}

/// The resolved spec holds secret values (passwords, connection strings),
/// so it is a Secret, mounted read-only into the processor, with the
/// namespace's positions key beside it.
pub fn spec_secret(df: &DataFlow, spec_json: &str, positions_key: &str) -> Secret {
    Secret {
        metadata: meta(df, spec_name(&df.name_any())),
        data: Some(BTreeMap::from([
            ("spec.json".to_owned(), ByteString(spec_json.as_bytes().to_vec())),
            (
                POSITIONS_KEY_FILE.to_owned(),
                ByteString(positions_key.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// The Secret that holds a namespace's key for the positions its
/// dataflows' exactly-once sinks store, and its one entry.
pub const POSITIONS_KEY_SECRET: &str = "sless-positions-key";
pub const POSITIONS_KEY_FILE: &str = "positions.key";

/// A namespace's positions key, made once and never changed (a changed key
/// would refuse every stored position): it outlives any one dataflow.
pub fn positions_key_secret(namespace: &str, key_text: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(POSITIONS_KEY_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_KEY.to_owned(),
                MANAGED_BY_VALUE.to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            POSITIONS_KEY_FILE.to_owned(),
            ByteString(key_text.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// Created empty: the processor owns its `position` key. It carries no
/// label the operator watches, so the processor's writes wake no reconcile;
/// its owner reference still removes it with the dataflow.
pub fn checkpoint_configmap(df: &DataFlow) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_owned(), "dataflow-checkpoint".to_owned()),
                ("app.kubernetes.io/instance".to_owned(), df.name_any()),
            ])),
            ..meta(df, checkpoint_name(&df.name_any()))
        },
        ..Default::default()
    }
}

pub fn service_account(df: &DataFlow) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(df, processor_account(&df.name_any())),
        ..Default::default()
    }
}

/// The processor may read and write its own checkpoint ConfigMap, nothing else.
pub fn role(df: &DataFlow) -> Role {
    Role {
        metadata: meta(df, processor_account(&df.name_any())),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![checkpoint_name(&df.name_any())]),
            verbs: vec!["get".into(), "patch".into(), "update".into()],
            ..Default::default()
        }]),
    }
}

pub fn role_binding(df: &DataFlow) -> RoleBinding {
    let name = processor_account(&df.name_any());
    RoleBinding {
        metadata: meta(df, name.clone()),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: df.namespace(),
            ..Default::default()
        }]),
    }
}

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(METRICS_PORT),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    }
}

/// The volumes and mounts of the TLS files `mounts` names: one volume per
/// Secret, holding only the keys named, under the processor's TLS directory.
fn tls_volumes(mounts: &[TlsMount]) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut by_secret: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in mounts {
        by_secret.entry(&m.secret).or_default().push(&m.key);
    }
    by_secret
        .into_iter()
        .enumerate()
        .map(|(i, (secret, keys))| {
            let name = format!("tls-{i}");
            (
                Volume {
                    name: name.clone(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret.to_owned()),
                        items: Some(
                            keys.iter()
                                .map(|k| KeyToPath {
                                    key: (*k).to_owned(),
                                    path: (*k).to_owned(),
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                        default_mode: Some(0o440),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeMount {
                    name,
                    mount_path: format!("{PROCESSOR_TLS_DIR}/{secret}"),
                    read_only: Some(true),
                    ..Default::default()
                },
            )
        })
        .unzip()
}

pub fn deployment(
    df: &DataFlow,
    spec: &DataFlowSpec,
    spec_json: &str,
    mounts: &[TlsMount],
    config: &OperatorConfig,
) -> Deployment {
    let name = df.name_any();
    let namespace = df.namespace().unwrap_or_default();
    let quantities = |m: &BTreeMap<String, String>| {
        (!m.is_empty()).then(|| m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect())
    };
    let resources = spec.resources.as_ref().map(|r| ResourceRequirements {
        limits: quantities(&r.limits),
        requests: quantities(&r.requests),
        ..Default::default()
    });
    let scheduling = df.spec.scheduling.clone().unwrap_or_default();
    // A new spec must restart the processor: a mounted Secret changes
    // under a running process, which reads it only at start.
    let digest = Sha256::digest(spec_json.as_bytes());
    let (tls_volumes, tls_mounts) = tls_volumes(mounts);
    let annotations = BTreeMap::from([(
        "sless.kube5s.ru/spec-sha256".to_owned(),
        digest.iter().map(|b| format!("{b:02x}")).collect::<String>(),
    )]);
    Deployment {
        metadata: meta(df, deployment_name(&name)),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            // Two processors of one dataflow would both write its sinks.
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(labels(df)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(df)),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // Only a processor that keeps its checkpoint in a
                    // ConfigMap talks to the API server.
                    service_account_name: spec.checkpoint_persistence.then(|| processor_account(&name)),
                    automount_service_account_token: Some(spec.checkpoint_persistence),
                    security_context: Some(fenced_pod()),
                    containers: vec![Container {
                        name: "processor".into(),
                        image: Some(df.spec.processor_image.clone().unwrap_or_else(|| config.image.clone())),
                        args: Some(
                            [
                                "processor".into(),
                                format!("--spec-path={SPEC_DIR}/spec.json"),
                                format!("--positions-key-file={SPEC_DIR}/{POSITIONS_KEY_FILE}"),
                                format!("--spill-dir={SPILL_DIR}"),
                                format!("--spill-limit-mb={SPILL_LIMIT_MB}"),
                                format!("--tenant-spill-limit-mb={SPILL_LIMIT_MB}"),
                                format!("--tls-dir={PROCESSOR_TLS_DIR}"),
                                format!("--namespace={namespace}"),
                                format!("--name={name}"),
                            ]
                            .into_iter()
                            // The processor refuses the cluster itself, with
                            // or without a network that enforces policies.
                            .chain(config.cluster_networks.iter().map(|c| format!("--egress-deny={c}")))
                            .collect(),
                        ),
                        env: Some(vec![EnvVar {
                            name: "SLESS_LOG".into(),
                            value: Some("info".into()),
                            ..Default::default()
                        }]),
                        ports: Some(vec![ContainerPort {
                            container_port: METRICS_PORT,
                            name: Some("metrics".into()),
                            ..Default::default()
                        }]),
                        liveness_probe: Some(probe("/healthz")),
                        // Unready at the first failed check: the Deployment's
                        // status changes and the controller reads the
                        // processor's reason within seconds.
                        readiness_probe: Some(Probe {
                            period_seconds: Some(5),
                            failure_threshold: Some(1),
                            ..probe("/readyz")
                        }),
                        resources,
                        security_context: Some(fenced_container()),
                        volume_mounts: Some(
                            [
                                VolumeMount {
                                    name: "spec".into(),
                                    mount_path: SPEC_DIR.into(),
                                    read_only: Some(true),
                                    ..Default::default()
                                },
                                VolumeMount {
                                    name: "spill".into(),
                                    mount_path: SPILL_DIR.into(),
                                    ..Default::default()
                                },
                            ]
                            .into_iter()
                            .chain(tls_mounts)
                            .collect(),
                        ),
                        ..Default::default()
                    }],
                    volumes: Some(
                        [
                            Volume {
                                name: "spec".into(),
                                secret: Some(SecretVolumeSource {
                                    secret_name: Some(spec_name(&name)),
                                    default_mode: Some(0o440),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                            Volume {
                                name: "spill".into(),
                                empty_dir: Some(EmptyDirVolumeSource {
                                    size_limit: Some(Quantity(SPILL_SIZE.into())),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                        ]
                        .into_iter()
                        .chain(tls_volumes)
                        .collect(),
                    ),
                    node_selector: (!scheduling.node_selector.is_empty()).then_some(scheduling.node_selector),
                    affinity: scheduling.affinity,
                    tolerations: (!scheduling.tolerations.is_empty()).then_some(scheduling.tolerations),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn network_policy_name(dataflow: &str) -> String {
    format!("dataflow-{dataflow}")
}

/// What a processor may reach on the network: DNS, its own namespace, and
/// everything outside the cluster's own networks (the endpoints a spec
/// names are outside the cluster or in the tenant's namespace); only the
/// operator's pods reach it, on its metrics port. Where the network
/// enforces no policy, the processor's egress policy still refuses the
/// cluster's networks.
pub fn network_policy(df: &DataFlow, config: &OperatorConfig) -> NetworkPolicy {
    let outside = |everything: &str, v4: bool| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: everything.into(),
            except: Some(
                config
                    .cluster_networks
                    .iter()
                    .filter(|c| c.is_ipv4() == v4)
                    .map(ToString::to_string)
                    .collect(),
            )
            .filter(|e: &Vec<String>| !e.is_empty()),
        }),
        ..Default::default()
    };
    let own_namespace = df.namespace().unwrap_or_default();
    NetworkPolicy {
        metadata: meta(df, network_policy_name(&df.name_any())),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(df)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![namespace_peer(&config.operator_namespace, None)]),
                ports: Some(vec![policy_port("TCP", METRICS_PORT)]),
            }]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![namespace_peer("kube-system", Some(("k8s-app", "kube-dns")))]),
                    ports: Some(vec![policy_port("UDP", 53), policy_port("TCP", 53)]),
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![
                        namespace_peer(&own_namespace, None),
                        outside("0.0.0.0/0", true),
                        outside("::/0", false),
                    ]),
                    ports: None,
                },
            ]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn df(extra: serde_json::Value) -> (DataFlow, DataFlowSpec) {
        let mut body = json!({
            "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "in"}},
            "sink": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "t"}},
            "resources": {"limits": {"memory": "256Mi"}}
        });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let mut df = DataFlow::new("orders", serde_json::from_value(body).unwrap());
        df.metadata.namespace = Some("team-a".into());
        df.metadata.uid = Some("uid-9".into());
        let spec = df.spec.to_spec().unwrap();
        (df, spec)
    }

    #[test]
    fn the_processor_deployment_mounts_the_spec_and_runs_sless_processor() {
        let (df, spec) = df(json!({"scheduling": {"nodeSelector": {"pool": "etl"}}}));
        let json = spec_json(&spec);
        let d = deployment(&df, &spec, &json, &[], &OperatorConfig::default());
        assert_eq!(d.metadata.name.as_deref(), Some("dataflow-orders"));
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-9");
        let template = d.spec.unwrap().template;
        let pod = template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(
            c.args.as_deref().unwrap(),
            [
                "processor",
                "--spec-path=/etc/dataflow/spec.json",
                "--positions-key-file=/etc/dataflow/positions.key",
                "--spill-dir=/var/lib/sless/spill",
                "--spill-limit-mb=1536",
                "--tenant-spill-limit-mb=1536",
                "--tls-dir=/etc/dataflow-tls",
                "--namespace=team-a",
                "--name=orders"
            ]
        );
        assert_eq!(c.image.as_deref(), Some("ghcr.io/kube5s/sless:latest"));
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
            "256Mi"
        );
        let volumes = pod.volumes.unwrap();
        assert_eq!(
            volumes[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("dataflow-orders-spec"),
            "the spec (secrets resolved) is a Secret"
        );
        // Spilled transactions go to an emptyDir of a bounded size.
        assert_eq!(volumes[1].name, "spill");
        assert_eq!(
            volumes[1].empty_dir.as_ref().unwrap().size_limit.as_ref().unwrap().0,
            "2Gi"
        );
        assert_eq!(volumes.len(), 2, "no TLS files, no TLS volumes");
        assert_eq!(pod.service_account_name.as_deref(), Some("dataflow-orders-processor"));
        assert_eq!(
            pod.automount_service_account_token,
            Some(true),
            "it writes its checkpoint"
        );
        assert_eq!(pod.node_selector.unwrap()["pool"], "etl");
        // The image's user reads the spec Secret (mode 0440) through its
        // group; nothing else is writable, no capability, seccomp on.
        let security = pod.security_context.unwrap();
        assert_eq!(
            (security.run_as_user, security.run_as_group),
            (Some(65532), Some(65532))
        );
        assert_eq!(security.fs_group, Some(65532));
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let container = c.security_context.as_ref().unwrap();
        assert_eq!(container.read_only_root_filesystem, Some(true));
        assert_eq!(container.run_as_non_root, Some(true));
        assert_eq!(container.allow_privilege_escalation, Some(false));
        assert_eq!(
            container.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        // A changed spec changes the pod template, so the processor restarts.
        let mut other = spec.clone();
        other.channel_buffer_size = 500;
        let changed = deployment(&df, &other, &spec_json(&other), &[], &OperatorConfig::default());
        assert_ne!(
            template.metadata.unwrap().annotations,
            changed.spec.unwrap().template.metadata.unwrap().annotations
        );
    }

    #[test]
    fn without_checkpoint_persistence_there_is_no_service_account() {
        let (df, spec) = df(json!({"checkpointPersistence": false, "processorImage": "my/proc:1"}));
        let d = deployment(&df, &spec, &spec_json(&spec), &[], &OperatorConfig::default());
        let pod = d.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name, None);
        assert_eq!(pod.automount_service_account_token, Some(false), "no token at all");
        assert_eq!(pod.containers[0].image.as_deref(), Some("my/proc:1"));
    }

    #[test]
    fn the_role_grants_only_the_checkpoint_configmap() {
        let (df, _) = df(json!({}));
        let rule = &role(&df).rules.unwrap()[0];
        assert_eq!(rule.resource_names.as_deref().unwrap(), ["dataflow-orders-checkpoint"]);
        assert_eq!(rule.verbs, ["get", "patch", "update"]);
        let binding = role_binding(&df);
        assert_eq!(binding.role_ref.name, "dataflow-orders-processor");
        assert_eq!(binding.subjects.unwrap()[0].namespace.as_deref(), Some("team-a"));
        let checkpoint = checkpoint_configmap(&df).metadata;
        assert_eq!(checkpoint.name.as_deref(), Some("dataflow-orders-checkpoint"));
        assert_eq!(checkpoint.owner_references.unwrap()[0].uid, "uid-9");
        assert!(
            !checkpoint.labels.unwrap().contains_key(MANAGED_BY_KEY),
            "the controllers watch that label: each checkpoint write would wake a reconcile"
        );
        assert_eq!(spec_secret(&df, "{}", "k").data.unwrap()["spec.json"].0, b"{}");
    }

    #[test]
    fn tls_files_are_mounted_from_their_secrets_under_the_tls_directory() {
        let (df, spec) = df(json!({}));
        let mount = |secret: &str, key: &str| TlsMount {
            secret: secret.into(),
            key: key.into(),
        };
        let mounts = [
            mount("kafka-tls", "ca.crt"),
            mount("kafka-tls", "tls.key"),
            mount("other", "ca.pem"),
        ];
        let d = deployment(&df, &spec, &spec_json(&spec), &mounts, &OperatorConfig::default());
        let pod = d.spec.unwrap().template.spec.unwrap();
        let volumes = pod.volumes.unwrap();
        let source = volumes[2].secret.as_ref().unwrap();
        assert_eq!(source.secret_name.as_deref(), Some("kafka-tls"));
        let keys: Vec<_> = source.items.as_ref().unwrap().iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, ["ca.crt", "tls.key"], "only the keys named");
        assert_eq!(
            volumes[3].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("other")
        );
        let paths: Vec<_> = pod.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            paths,
            [
                ("/etc/dataflow", Some(true)),
                ("/var/lib/sless/spill", None),
                ("/etc/dataflow-tls/kafka-tls", Some(true)),
                ("/etc/dataflow-tls/other", Some(true))
            ]
        );
        // The spec's relative file names land on those files.
        assert_eq!(
            std::path::Path::new(PROCESSOR_TLS_DIR).join(mounts[0].relative_path()),
            std::path::Path::new("/etc/dataflow-tls/kafka-tls/ca.crt")
        );
    }

    #[test]
    fn a_processor_reaches_dns_its_namespace_and_outside_the_cluster_only() {
        let (df, spec) = df(json!({}));
        let config = OperatorConfig {
            cluster_networks: vec!["10.96.0.0/12".parse().unwrap(), "fd00::/8".parse().unwrap()],
            ..OperatorConfig::default()
        };
        let args = deployment(&df, &spec, &spec_json(&spec), &[], &config)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.ends_with(&["--egress-deny=10.96.0.0/12".into(), "--egress-deny=fd00::/8".into()]));
        let policy = network_policy(&df, &config).spec.unwrap();
        assert_eq!(
            policy.pod_selector.unwrap().match_labels.unwrap()["app.kubernetes.io/instance"],
            "orders"
        );
        let ingress = &policy.ingress.unwrap()[0];
        let from = &ingress.from.as_ref().unwrap()[0];
        assert_eq!(
            from.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
            "sless-system"
        );
        assert_eq!(
            ingress.ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(METRICS_PORT))
        );
        let egress = policy.egress.unwrap();
        assert_eq!(egress.len(), 2);
        let dns = &egress[0];
        assert_eq!(dns.ports.as_ref().unwrap().len(), 2);
        let to = egress[1].to.as_ref().unwrap();
        assert_eq!(
            to[0]
                .namespace_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["kubernetes.io/metadata.name"],
            "team-a"
        );
        let v4 = to[1].ip_block.as_ref().unwrap();
        assert_eq!(
            (v4.cidr.as_str(), v4.except.as_deref()),
            ("0.0.0.0/0", Some(&["10.96.0.0/12".to_owned()][..]))
        );
        let v6 = to[2].ip_block.as_ref().unwrap();
        assert_eq!(
            (v6.cidr.as_str(), v6.except.as_deref()),
            ("::/0", Some(&["fd00::/8".to_owned()][..]))
        );
    }
}
