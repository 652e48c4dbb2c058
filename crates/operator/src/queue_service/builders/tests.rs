//! Every field of the built children.

use super::*;
use crate::crd::queue_service::{QueueEngine, QueueServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The size a claim asks for.
fn claimed(claim: &PersistentVolumeClaim) -> &str {
    &claim
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
}

/// One replica of `sless queue`.
fn qs(namespace: &str, persistence: bool) -> QueueService {
    with_engine(namespace, persistence, QueueEngine::Sless)
}

fn three() -> QueueService {
    let mut q = qs("sless-fn-acme", true);
    q.spec.replicas = Some(3);
    q
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
            durability: Default::default(),
            replicas: Some(1),
            requests_per_second: None,
            bytes_per_second: None,
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
        secret(&q, &sless_sqs::credentials::generate("acme"), "t0k3n", "p33r").metadata,
        configmap(&q, &c).metadata,
        pvc(&q).metadata,
        deployment(&q, &c).metadata,
        stateful_set(&q, &c).metadata,
        peers_service(&q).metadata,
        disruption_budget(&q).metadata,
        service(&q).metadata,
        ingress(&q, &c).metadata,
        gateway_service(&q, &c).metadata,
        network_policy(&q, &c, q.spec.replicas()).metadata,
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
            ("sqs", "sless-fn-acme"),
            ("sqs-peers", "sless-fn-acme"),
            ("sqs-pdb-acme", "sless-fn-acme"),
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
    let set = stateful_set(&same_namespace, &OperatorConfig::default());
    assert!(set.metadata.owner_references.is_some());
    assert_eq!(pvc(&same_namespace).metadata.owner_references, None);
    // The StatefulSet's claims are kept when it goes.
    let spec = set.spec.unwrap();
    let retention = spec.persistent_volume_claim_retention_policy.unwrap();
    assert_eq!(retention.when_deleted.as_deref(), Some("Retain"));
    assert_eq!(spec.volume_claim_templates.unwrap()[0].metadata.owner_references, None);
    assert_eq!(pvc(&same_namespace).metadata.owner_references, None);
}

#[test]
fn children_are_owned_only_from_the_same_namespace() {
    let c = OperatorConfig::default();
    let owned = stateful_set(&qs("sless-fn-acme", true), &c)
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
        stateful_set(&qs("elsewhere", true), &c)
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
    // Seed 000, step 8: requests 10m/32Mi, limits 500m/{MemoryMB}Mi.
    let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(
        (requests["cpu"].0.as_str(), requests["memory"].0.as_str()),
        ("10m", "32Mi")
    );
    assert_eq!(limits["cpu"].0, "500m");
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
fn one_replica_runs_sless_queue_with_its_journal_and_token_and_no_privilege() {
    let c = OperatorConfig::default();
    let set = stateful_set(&qs("sless-fn-acme", true), &c).spec.unwrap();
    assert_eq!(set.replicas, Some(1));
    let claim = &set.volume_claim_templates.unwrap()[0];
    assert_eq!(
        (claim.metadata.name.as_deref(), claimed(claim)),
        (Some("data"), "1024Mi")
    );
    let pod = set.template.spec.unwrap();
    assert_eq!(pod.affinity, None, "one replica has no others to keep away from");
    let container = &pod.containers[0];
    assert_eq!(container.image.as_deref(), Some("ghcr.io/kube5s/sless:latest"));
    assert_eq!(
        container.args.as_ref().unwrap().join(" "),
        "queue --listen 0.0.0.0:9324 --account-id 469329139872 --base-url http://sqs.kube5s.ru/sqs/acme --region ru-msk-1 --data-dir /data --durability disk"
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
    assert_eq!(container.env.as_ref().unwrap().len(), 1, "no peers, no peer token");
    let ready = container.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(ready.path.as_deref(), Some("/ready"));
    // In memory: no volume at all, and no --data-dir.
    let set = stateful_set(&qs("sless-fn-acme", false), &c).spec.unwrap();
    assert_eq!(set.volume_claim_templates, None);
    let pod = set.template.spec.unwrap();
    assert_eq!((pod.volumes, pod.containers[0].volume_mounts.clone()), (None, None));
    assert!(
        !pod.containers[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--data-dir".to_owned())
    );
    let mut process = qs("sless-fn-acme", true);
    process.spec.durability = sless_model::queue_service::Durability::Process;
    let pod = stateful_set(&process, &c).spec.unwrap().template.spec.unwrap();
    assert!(
        pod.containers[0]
            .args
            .as_ref()
            .unwrap()
            .join(" ")
            .ends_with("--data-dir /data --durability process")
    );
}

#[test]
fn three_replicas_are_pods_one_to_three_that_find_each_other_by_name() {
    let c = OperatorConfig::default();
    let set = stateful_set(&three(), &c).spec.unwrap();
    assert_eq!(
        (
            set.replicas,
            set.ordinals.and_then(|o| o.start),
            set.pod_management_policy.as_deref(),
            set.service_name.as_deref()
        ),
        (Some(3), Some(1), Some("Parallel"), Some("sqs-peers"))
    );
    let pod = set.template.spec.unwrap();
    let container = &pod.containers[0];
    let args = container.args.as_ref().unwrap().join(" ");
    assert!(
        args.ends_with(
            "--peers 1=sqs-1.sqs-peers.sless-fn-acme.svc:9325,2=sqs-2.sqs-peers.sless-fn-acme.svc:9325,\
             3=sqs-3.sqs-peers.sless-fn-acme.svc:9325 --peer-listen 0.0.0.0:9325 --drain 3s"
        ),
        "{args}"
    );
    // Time to hand the leadership over, drain and answer a long poll.
    assert_eq!(pod.termination_grace_period_seconds, Some(45));
    let env: Vec<(&str, String)> = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| {
            let from = e.value_from.as_ref().unwrap();
            let source = match (&from.secret_key_ref, &from.field_ref) {
                (Some(s), None) => format!("{}/{}", s.name, s.key),
                (None, Some(f)) => f.field_path.clone(),
                _ => panic!("{e:?}"),
            };
            (e.name.as_str(), source)
        })
        .collect();
    assert_eq!(
        env,
        [
            ("SLESS_ENGINE_TOKEN", "sqs-creds-acme/engineToken".to_owned()),
            ("SLESS_PEER_TOKEN", "sqs-creds-acme/peerToken".to_owned()),
            (
                "SLESS_REPLICA_ID",
                "metadata.labels['apps.kubernetes.io/pod-index']".to_owned()
            ),
        ]
    );
    let ports: Vec<i32> = container
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(ports, [9324, 9325]);
    let spread = &pod
        .affinity
        .unwrap()
        .pod_anti_affinity
        .unwrap()
        .preferred_during_scheduling_ignored_during_execution
        .unwrap()[0];
    assert_eq!(spread.pod_affinity_term.topology_key, "kubernetes.io/hostname");
    let budget = disruption_budget(&three()).spec.unwrap();
    assert_eq!(budget.max_unavailable, Some(IntOrString::Int(1)));
    let peers = peers_service(&three()).spec.unwrap();
    assert_eq!(
        (
            peers.cluster_ip.as_deref(),
            peers.publish_not_ready_addresses,
            peers.ports.unwrap()[0].port
        ),
        (Some("None"), Some(true), 9325)
    );
    // ElasticMQ keeps one process's store, whatever the spec says.
    let mut elasticmq = three();
    elasticmq.spec.engine = QueueEngine::Elasticmq;
    assert_eq!(elasticmq.spec.replicas(), 1);
}

#[test]
fn replicas_reach_each_other_on_the_peer_port_and_names_only() {
    let spec = network_policy(&three(), &OperatorConfig::default(), 3).spec.unwrap();
    let ingress = spec.ingress.unwrap();
    let from_replicas = &ingress[1];
    assert_eq!(
        from_replicas.from.as_ref().unwrap()[0]
            .pod_selector
            .as_ref()
            .unwrap()
            .match_labels,
        Some(labels("acme"))
    );
    assert_eq!(
        from_replicas.from.as_ref().unwrap()[0].namespace_selector,
        None,
        "its own namespace only"
    );
    // And the operator's pods alone of the platform's, which lower three
    // replicas to one through it (not its gateways: a cluster test probes).
    let operator = &from_replicas.from.as_ref().unwrap()[1];
    let namespaces = operator
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(namespaces["kubernetes.io/metadata.name"], "sless-system");
    let pods = operator.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
    assert_eq!(pods["app.kubernetes.io/name"], "sless-operator");
    // Replicas being lowered to one keep reaching each other until they go.
    let lowering = network_policy(&qs("sless-fn-acme", true), &OperatorConfig::default(), 3);
    assert_eq!(lowering.spec.unwrap().ingress.unwrap().len(), 2);
    assert_eq!(
        from_replicas.ports.as_ref().unwrap()[0].port,
        Some(IntOrString::Int(9325))
    );
    let egress = spec.egress.unwrap();
    let ports = |i: usize| -> Vec<(Option<String>, Option<IntOrString>)> {
        egress[i]
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.protocol.clone(), p.port.clone()))
            .collect()
    };
    assert_eq!(
        ports(0),
        [
            (Some("UDP".into()), Some(IntOrString::Int(53))),
            (Some("TCP".into()), Some(IntOrString::Int(53)))
        ]
    );
    assert_eq!(ports(1), [(Some("TCP".into()), Some(IntOrString::Int(9325)))]);
    assert_eq!(egress.len(), 2);
}

#[test]
fn only_gateway_pods_reach_the_engine_and_the_engine_reaches_nothing() {
    let spec = network_policy(&qs("sless-fn-acme", true), &OperatorConfig::default(), 1)
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
    // The tenant's 12-digit account id, which ElasticMQ's QueueUrl parsing needs.
    assert!(conf.contains(r#"accountId = "469329139872""#), "{conf}");
}

#[test]
fn pvc_service_and_ingress() {
    let q = qs("sless-fn-acme", true);
    assert_eq!(claimed(&pvc(&q)), "1024Mi");
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
    // The certificate's copy in the tenant's namespace, where an Ingress
    // can read it; the endpoint says https only with TLS.
    assert_eq!(spec.tls.unwrap()[0].secret_name.as_deref(), Some("sqs-tls-acme"));
    let plain = OperatorConfig::default();
    assert!(ingress(&q, &plain).spec.unwrap().tls.is_none());
    assert_eq!(endpoint(&plain, "acme"), "http://sqs.kube5s.ru/sqs/acme");
    let tls = OperatorConfig {
        sqs_tls_secret: Some("sqs-tls".into()),
        ..OperatorConfig::default()
    };
    assert_eq!(endpoint(&tls, "acme"), "https://sqs.kube5s.ru/sqs/acme");
    assert!(elasticmq_conf(&tls, "acme", true).contains("protocol = https"));
    assert!(elasticmq_conf(&plain, "acme", true).contains("protocol = http\n"));
}

/// Every label value in `v` (metadata, selectors, pod templates).
fn label_values(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if let ("labels" | "matchLabels", serde_json::Value::Object(labels)) = (k.as_str(), v) {
                    out.extend(labels.values().filter_map(|l| l.as_str().map(str::to_owned)));
                }
                label_values(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| label_values(i, out)),
        _ => {}
    }
}

/// The tenant-id rule's bound is where the derived names still fit: at the
/// longest id every name and label of every child is valid Kubernetes.
#[test]
fn every_derived_name_fits_kubernetes_at_the_longest_tenant_id() {
    let c = OperatorConfig::default();
    for tenant in ["a".to_owned(), "t".repeat(sless_model::name::MAX_TENANT_LEN)] {
        let mut q = qs(&namespace_name(&tenant), true);
        q.spec.tenant_id = tenant.clone();
        let label = |what: &str, v: &str| {
            assert!(
                sless_model::name::DnsLabel::parse(v, what).is_ok(),
                "{what} {v:?} is not a DNS label"
            );
        };
        label("namespace", namespace(&q).metadata.name.as_deref().unwrap());
        // Service names are DNS-1035 labels: a label that starts with a letter.
        for s in [service(&q), gateway_service(&q, &c)] {
            let name = s.metadata.name.unwrap();
            label("service", &name);
            assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
        }
        let objects = [
            serde_json::to_value(secret(&q, &sless_sqs::credentials::generate(&tenant), "t0k3n", "p33r")).unwrap(),
            serde_json::to_value(configmap(&q, &c)).unwrap(),
            serde_json::to_value(pvc(&q)).unwrap(),
            serde_json::to_value(deployment(&q, &c)).unwrap(),
            serde_json::to_value(stateful_set(&q, &c)).unwrap(),
            serde_json::to_value(peers_service(&q)).unwrap(),
            serde_json::to_value(disruption_budget(&q)).unwrap(),
            serde_json::to_value(service(&q)).unwrap(),
            serde_json::to_value(ingress(&q, &c)).unwrap(),
            serde_json::to_value(gateway_service(&q, &c)).unwrap(),
            serde_json::to_value(network_policy(&q, &c, q.spec.replicas())).unwrap(),
        ];
        for o in &objects {
            let name = o["metadata"]["name"].as_str().unwrap();
            assert!(name.len() <= 253, "{name}");
            // A Deployment's pods are named after it, plus 17 characters of
            // hashes, and their names must stay DNS labels for hostnames.
            if o["kind"] == "Deployment" {
                label("deployment", name);
            }
            // A StatefulSet's pods are named after it plus the ordinal, and
            // labelled with its name plus an 11-character revision hash.
            if o["kind"] == "StatefulSet" {
                label("pod", &format!("{name}-3"));
                assert!(name.len() + 11 <= 63, "{name}");
            }
            let mut values = Vec::new();
            label_values(o, &mut values);
            for v in values {
                label("label value", &v);
            }
        }
    }
}

/// A StatefulSet as the API server has it: `replicas` of this spec's
/// template, rolled out (or not) and Ready.
fn running(q: &QueueService, replicas: i32, rolled: bool) -> k8s_openapi::api::apps::v1::StatefulSet {
    let mut set = stateful_set(q, &OperatorConfig::default());
    set.spec.as_mut().unwrap().replicas = Some(replicas);
    set.metadata.generation = Some(1);
    set.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
        observed_generation: Some(1),
        replicas,
        ready_replicas: Some(replicas),
        current_revision: Some("a".into()),
        update_revision: Some(if rolled { "a" } else { "b" }.into()),
        ..Default::default()
    });
    set
}

#[test]
fn one_replica_grows_to_three_through_the_three_replica_template_first() {
    let c = OperatorConfig::default();
    let (one, mut three_q) = (qs("sless-fn-acme", true), three());
    let replicas = |set: &k8s_openapi::api::apps::v1::StatefulSet| set.spec.as_ref().unwrap().replicas;
    let has_peers = |set: &k8s_openapi::api::apps::v1::StatefulSet| {
        set.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--peers".to_owned())
    };
    // From a pod without peers: the three-replica template at one replica.
    let (step, partial) = stateful_set_step(Some(&running(&one, 1, true)), stateful_set(&three_q, &c));
    assert_eq!((replicas(&step), has_peers(&step), partial), (Some(1), true, true));
    // That template applied but not yet rolled out: still one.
    let (step, partial) = stateful_set_step(Some(&running(&three_q, 1, false)), stateful_set(&three_q, &c));
    assert_eq!((replicas(&step), partial), (Some(1), true));
    // Rolled out: three.
    let (step, partial) = stateful_set_step(Some(&running(&three_q, 1, true)), stateful_set(&three_q, &c));
    assert_eq!((replicas(&step), partial), (Some(3), false));
    // None there yet: all at once.
    let (step, partial) = stateful_set_step(None, stateful_set(&three_q, &c));
    assert_eq!((replicas(&step), partial), (Some(3), false));
    // Three lower to one at once (the reconciler first made replica 1
    // the only voter), and the claims of the replicas gone go with them.
    let (step, partial) = stateful_set_step(Some(&running(&three_q, 3, true)), stateful_set(&one, &c));
    assert_eq!((replicas(&step), has_peers(&step), partial), (Some(1), false, false));
    let retention = step
        .spec
        .as_ref()
        .unwrap()
        .persistent_volume_claim_retention_policy
        .clone()
        .unwrap();
    assert_eq!(
        (retention.when_scaled.as_deref(), retention.when_deleted.as_deref()),
        (Some("Delete"), Some("Retain"))
    );
    // The claims' template stays as made: the API server refuses a change.
    three_q.spec.storage_mb = 4096;
    let (step, _) = stateful_set_step(Some(&running(&three(), 3, true)), stateful_set(&three_q, &c));
    let claim = &step.spec.unwrap().volume_claim_templates.unwrap()[0];
    assert_eq!(claimed(claim), "1024Mi");
}
