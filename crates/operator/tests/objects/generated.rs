//! Every object the reconcilers generate is valid Kubernetes: rendered from
//! the pure builders and checked offline against the Kubernetes 1.32
//! OpenAPI schemas by `kubernetes-validate` (strict; installed by
//! scripts/install-test-deps.sh), the same check as the manifests in deploy/.

use std::process::Command;

use serde_json::json;
use sless_operator::config::OperatorConfig;
use sless_operator::crd::dataflow::DataFlow;
use sless_operator::crd::queue_service::{QueueEngine, QueueService, QueueServiceSpec};
use sless_operator::{dataflow, queue_service};
use sless_testkit::TempDir;

fn yaml<T: serde::Serialize>(object: &T) -> String {
    serde_saphyr::to_string(object).unwrap()
}

#[test]
fn generated_children_pass_the_kubernetes_schemas() {
    let config = OperatorConfig {
        sqs_tls_secret: Some("sqs-tls".into()),
        ..OperatorConfig::default()
    };
    let mut qs = QueueService::new(
        "main",
        QueueServiceSpec {
            tenant_id: "acme".into(),
            memory_mb: 128,
            storage_mb: 1024,
            persistence: true,
            engine: Default::default(),
            durability: Default::default(),
            replicas: None,
            requests_per_second: None,
            bytes_per_second: None,
        },
    );
    qs.metadata.namespace = Some("sless-fn-acme".into());
    qs.metadata.uid = Some("6f1c1d3e-0000-4000-8000-000000000001".into());
    let credentials = sless_sqs::credentials::generate("acme");
    use queue_service::builders as q;
    let mut objects = vec![
        ("namespace", yaml(&q::namespace(&qs))),
        ("secret", yaml(&q::secret(&qs, &credentials, "t0k3n", "p33r"))),
        ("configmap", yaml(&q::configmap(&qs, &config))),
        ("pvc", yaml(&q::pvc(&qs))),
        ("stateful-set", yaml(&q::stateful_set(&qs, &config))),
        ("peers-service", yaml(&q::peers_service(&qs))),
        ("disruption-budget", yaml(&q::disruption_budget(&qs))),
        ("service", yaml(&q::service(&qs))),
        ("ingress", yaml(&q::ingress(&qs, &config))),
        ("gateway-service", yaml(&q::gateway_service(&qs, &config))),
        (
            "network-policy",
            yaml(&q::network_policy(&qs, &config, qs.spec.replicas())),
        ),
        (
            "tls-secret",
            yaml(&q::tls_secret(
                &qs,
                &k8s_openapi::api::core::v1::Secret {
                    data: Some(
                        [
                            ("tls.crt".to_owned(), k8s_openapi::ByteString(b"CERT".to_vec())),
                            ("tls.key".to_owned(), k8s_openapi::ByteString(b"KEY".to_vec())),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                },
            )),
        ),
    ];
    let mut one = qs.clone();
    one.spec.replicas = Some(1);
    objects.push(("one-replica", yaml(&q::stateful_set(&one, &config))));
    objects.push((
        "one-replica-network-policy",
        yaml(&q::network_policy(&one, &config, one.spec.replicas())),
    ));
    let mut elasticmq = qs.clone();
    elasticmq.spec.engine = QueueEngine::Elasticmq;
    objects.push(("elasticmq-deployment", yaml(&q::deployment(&elasticmq, &config))));

    let mut df = DataFlow::new(
        "orders",
        serde_json::from_value(json!({
            "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "in"}},
            "sink": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "t"}},
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"memory": "64Mi"}},
            "scheduling": {"nodeSelector": {"pool": "etl"}, "tolerations": [{"key": "etl", "operator": "Exists"}]}
        }))
        .unwrap(),
    );
    df.metadata.namespace = Some("team-a".into());
    df.metadata.uid = Some("6f1c1d3e-0000-4000-8000-000000000002".into());
    let spec = df.spec.to_spec().unwrap();
    let json = dataflow::builders::spec_json(&spec);
    use dataflow::builders as d;
    objects.extend([
        ("df-spec", yaml(&d::spec_secret(&df, &json, &"0".repeat(64)))),
        (
            "df-positions-key",
            yaml(&d::positions_key_secret("team-a", &"0".repeat(64))),
        ),
        ("df-checkpoint", yaml(&d::checkpoint_configmap(&df))),
        ("df-account", yaml(&d::service_account(&df))),
        ("df-role", yaml(&d::role(&df))),
        ("df-binding", yaml(&d::role_binding(&df))),
        (
            "df-deployment",
            yaml(&d::deployment(
                &df,
                &spec,
                &json,
                &[sless_operator::dataflow::secrets::TlsMount {
                    secret: "kafka-tls".into(),
                    key: "ca.crt".into(),
                }],
                &config,
            )),
        ),
    ]);

    let dir = TempDir::new("generated");
    let files: Vec<_> = objects
        .iter()
        .map(|(name, text)| {
            let path = dir.0.join(format!("{name}.yaml"));
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "-k", "1.32.0", "--strict"])
        .args(&files)
        .output()
        .expect("python3");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    assert_eq!(report.matches("passed for resource").count(), files.len(), "{report}");
}
