//! The engine's workload. ElasticMQ runs in a Deployment of one pod
//! (`Recreate`, one PVC). `sless queue` runs in a StatefulSet of one or
//! three pods, numbered from 1 as the replicas are (pod `sqs-2` is
//! replica 2), each with a volume of its own. Three replicas keep the
//! queues together over Raft, reaching each other by their pods' names
//! under a headless Service; preferably on different nodes, at most one
//! down by choice (a PodDisruptionBudget), replaced one at a time by a
//! rolling update.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetOrdinals,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecretKeySelector, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    DATA_PATH, ENGINE_TOKEN_KEY, PEER_TOKEN_KEY, SQS_PORT, claim_spec, configmap_name, deployment_name, elasticmq,
    endpoint, labels, meta, namespace_name, pvc_name, secret_name,
};
use crate::config::OperatorConfig;
use crate::crd::queue_service::{QueueEngine, QueueService};
use crate::objects::{fenced_container, fenced_pod};

/// The port the replicas of an engine talk Raft on.
pub const PEER_PORT: i32 = 9325;
/// The name of the StatefulSet's volume (its claims are `data-sqs-N`).
const DATA_VOLUME: &str = "data";
/// The label the StatefulSet controller gives each pod: its ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// How long a stopping replica goes on serving once it handed its
/// leadership over: the Service's endpoints drop it meanwhile, so the
/// gateways' new connections reach the others (`sless queue --drain`).
const DRAIN: &str = "3s";
/// A stopping replica's time: the entry being committed (10 s at most),
/// the handover (3 s), the drain, and the answers in flight (25 s at most,
/// a long poll's 20 s), with room to spare.
const GRACE_SECONDS: i64 = 45;

/// The StatefulSet of `sless queue`. Its name holds no tenant id: the
/// namespace is the tenant's, and a longer name would not leave room for
/// the revision hash the StatefulSet controller puts in its pods' labels
/// (a label value is at most 63 characters).
pub const STATEFUL_SET: &str = "sqs";
/// The headless Service that names the replicas' pods in DNS.
pub const PEERS_SERVICE: &str = "sqs-peers";
pub fn disruption_budget_name(tenant: &str) -> String {
    format!("sqs-pdb-{tenant}")
}

/// Replica `id`'s peer address: its pod's name under the peers Service.
pub fn peer_address(tenant: &str, id: u8) -> String {
    format!(
        "{STATEFUL_SET}-{id}.{PEERS_SERVICE}.{}.svc:{PEER_PORT}",
        namespace_name(tenant)
    )
}

/// `--peers` of a queue service of `replicas` replicas.
fn peers(tenant: &str, replicas: u8) -> String {
    (1..=replicas)
        .map(|id| format!("{id}={}", peer_address(tenant, id)))
        .collect::<Vec<_>>()
        .join(",")
}

fn probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(SQS_PORT),
            ..Default::default()
        }),
        period_seconds: Some(period),
        ..Default::default()
    }
}

fn from_secret(name: &str, tenant: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret_name(tenant),
                key: key.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `sless queue` container: its store on the volume when persistent,
/// its tokens from the Secret, and with several replicas its id from its
/// pod's ordinal and the others' addresses.
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
    let mut env = vec![from_secret("SLESS_ENGINE_TOKEN", tenant, ENGINE_TOKEN_KEY)];
    let replicas = qs.spec.replicas();
    if replicas > 1 {
        args.extend([
            "--peers".to_owned(),
            peers(tenant, replicas),
            "--peer-listen".to_owned(),
            format!("0.0.0.0:{PEER_PORT}"),
            "--drain".to_owned(),
            DRAIN.to_owned(),
        ]);
        env.push(from_secret("SLESS_PEER_TOKEN", tenant, PEER_TOKEN_KEY));
        env.push(EnvVar {
            name: "SLESS_REPLICA_ID".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.labels['{POD_INDEX_LABEL}']"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let mut ports = vec![ContainerPort {
        container_port: SQS_PORT,
        name: Some("sqs".into()),
        ..Default::default()
    }];
    if replicas > 1 {
        ports.push(ContainerPort {
            container_port: PEER_PORT,
            name: Some("peers".into()),
            ..Default::default()
        });
    }
    Container {
        name: "sqs".into(),
        image: Some(config.image.clone()),
        args: Some(args),
        env: Some(env),
        ports: Some(ports),
        // Ready: a replica serving as a voter of its queue service that
        // knows its leader, so a rolling update takes the next pod only
        // once this one is back among the majority.
        readiness_probe: Some(probe("/ready", 2)),
        security_context: Some(fenced_container()),
        ..Default::default()
    }
}

/// The engine's container with its limits (seed 000, step 8: requests
/// 10m/32Mi, limits 500m/{MemoryMB}Mi) and probes.
fn engine_container(qs: &QueueService, config: &OperatorConfig) -> Container {
    let quantity = |s: &str| Quantity(s.to_owned());
    let mut container = match qs.spec.engine {
        QueueEngine::Sless => sless_container(qs, config),
        QueueEngine::Elasticmq => Container {
            ports: Some(vec![ContainerPort {
                container_port: SQS_PORT,
                name: Some("sqs".into()),
                ..Default::default()
            }]),
            readiness_probe: Some(probe("/health", 5)),
            ..elasticmq::elasticmq_container(config)
        },
    };
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
    container.liveness_probe = Some(probe("/health", 10));
    container
}

fn data_mount() -> VolumeMount {
    VolumeMount {
        name: DATA_VOLUME.into(),
        mount_path: DATA_PATH.into(),
        ..Default::default()
    }
}

/// The pod of either engine, given its container and volumes.
fn pod_template(qs: &QueueService, mut container: Container, volumes: Vec<Volume>) -> PodTemplateSpec {
    let tenant = &qs.spec.tenant_id;
    container.volume_mounts = container.volume_mounts.filter(|m| !m.is_empty());
    PodTemplateSpec {
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
            termination_grace_period_seconds: (qs.spec.replicas() > 1).then_some(GRACE_SECONDS),
            // Replicas on different nodes where there are several: one
            // node lost takes one replica.
            affinity: (qs.spec.replicas() > 1).then(|| Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: Some(selector(tenant)),
                            topology_key: "kubernetes.io/hostname".into(),
                            ..Default::default()
                        },
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn selector(tenant: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(tenant)),
        ..Default::default()
    }
}

/// ElasticMQ: one pod, its HOCON from the ConfigMap and its H2 files on
/// the PVC; `Recreate`, since one process at a time may hold the files.
pub fn deployment(qs: &QueueService, config: &OperatorConfig) -> Deployment {
    let tenant = &qs.spec.tenant_id;
    let mut container = engine_container(qs, config);
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: configmap_name(tenant),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "config".into(),
        mount_path: elasticmq::CONFIG_PATH.into(),
        sub_path: Some("elasticmq.conf".into()),
        read_only: Some(true),
        ..Default::default()
    }];
    if qs.spec.persistence {
        volumes.push(Volume {
            name: DATA_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc_name(tenant),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(data_mount());
    }
    container.volume_mounts = Some(mounts);
    Deployment {
        metadata: meta(qs, deployment_name(tenant)),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: selector(tenant),
            template: pod_template(qs, container, volumes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `sless queue`: a pod per replica, each with a volume of its own when
/// persistent. Pods start and stop in parallel (a replica waits for the
/// others through Raft, not for the StatefulSet's order); a rolling
/// update replaces one at a time, waiting for each to be Ready again.
pub fn stateful_set(qs: &QueueService, config: &OperatorConfig) -> StatefulSet {
    let tenant = &qs.spec.tenant_id;
    let mut container = engine_container(qs, config);
    let claims = qs.spec.persistence.then(|| {
        container.volume_mounts = Some(vec![data_mount()]);
        vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(DATA_VOLUME.into()),
                labels: Some(labels(tenant)),
                ..Default::default()
            },
            spec: Some(claim_spec(qs)),
            ..Default::default()
        }]
    });
    StatefulSet {
        metadata: meta(qs, STATEFUL_SET.to_owned()),
        spec: Some(StatefulSetSpec {
            replicas: Some(i32::from(qs.spec.replicas())),
            // Replica ids start at 1: pod sqs-1 is replica 1.
            ordinals: Some(StatefulSetOrdinals { start: Some(1) }),
            pod_management_policy: Some("Parallel".into()),
            service_name: Some(PEERS_SERVICE.to_owned()),
            selector: selector(tenant),
            template: pod_template(qs, container, vec![]),
            // Claims are kept when the set is deleted: the messages stay
            // until an operator deletes them (seed 000). Those of replicas
            // that left (three lowered to one) go with their pods: started
            // again on them, a replica would hold a log of voters gone.
            volume_claim_templates: claims,
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Retain".into()),
                when_scaled: Some("Delete".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The replicas' names in DNS, published before they are Ready: a replica
/// must reach the others to become Ready at all.
pub fn peers_service(qs: &QueueService) -> Service {
    let tenant = &qs.spec.tenant_id;
    Service {
        metadata: meta(qs, PEERS_SERVICE.to_owned()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels(tenant)),
            ports: Some(vec![ServicePort {
                name: Some("peers".into()),
                port: PEER_PORT,
                target_port: Some(IntOrString::Int(PEER_PORT)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// At most one replica down by choice (a drain, an eviction): two of
/// three keep the majority.
pub fn disruption_budget(qs: &QueueService) -> PodDisruptionBudget {
    let tenant = &qs.spec.tenant_id;
    PodDisruptionBudget {
        metadata: meta(qs, disruption_budget_name(tenant)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(selector(tenant)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What to apply of `desired` given the StatefulSet there is, if any, and
/// whether that is a step towards it rather than all of it:
/// - the claims' template stays as made (the API server refuses a change
///   of it; a larger `storageMB` is refused before it gets here);
/// - one replica grows to three in two steps: first the one pod restarts
///   with the three-replica template (peers named), then the set grows. At
///   once, the new pods would never be Ready (the old pod, without peers,
///   never adds them) and the rolling update, which waits for them, would
///   never replace the old pod;
/// - three lower to one at once (pods 2 and 3 go, pod 1 restarts alone),
///   once replica 1 is the only voter (the caller sees to it first: the
///   one left would otherwise wait for a majority of the voters it had);
///   the claims of pods 2 and 3 go with them.
pub fn stateful_set_step(existing: Option<&StatefulSet>, mut desired: StatefulSet) -> (StatefulSet, bool) {
    let Some(existing) = existing else {
        return (desired, false);
    };
    let (Some(have), Some(want)) = (existing.spec.as_ref(), desired.spec.as_mut()) else {
        return (desired, false);
    };
    want.volume_claim_templates.clone_from(&have.volume_claim_templates);
    let had = have.replicas.unwrap_or(1);
    let wanted = want.replicas.unwrap_or(1);
    let peered = |set: &StatefulSet| {
        set.spec.as_ref().is_some_and(|s| {
            s.template.spec.as_ref().is_some_and(|p| {
                p.containers
                    .iter()
                    .any(|c| c.args.as_ref().is_some_and(|a| a.iter().any(|a| a == "--peers")))
            })
        })
    };
    if had < wanted && !(peered(existing) && rolled_out(existing)) {
        want.replicas = Some(had);
        return (desired, true);
    }
    (desired, false)
}

/// Whether every pod of `set` runs its current template and is Ready.
fn rolled_out(set: &StatefulSet) -> bool {
    let Some(status) = &set.status else {
        return false;
    };
    let seen = status.observed_generation >= set.metadata.generation;
    seen && status.update_revision.is_some()
        && status.current_revision == status.update_revision
        && status.ready_replicas.unwrap_or(0) >= set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}
