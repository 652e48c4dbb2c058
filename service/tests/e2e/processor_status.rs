//! Why a dataflow fails, in Kubernetes: a real `sless processor` against a
//! real database fails, and the operator's DataFlow reconciler (the one
//! `sless serve` runs) writes the processor's own reason into the
//! DataFlow's status, which the REST API, the console and Terraform show.
//!
//! kube-fake-client stands in for the API server (none runs here). It has
//! no kubelet and no Deployment controller: the test writes the processor's
//! Pod as the kubelet would report it (running, unready, its address on
//! loopback, where the test's processor listens), and calls the reconciler
//! as the controller would on each change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};
use sless_model::dataflow::DataFlowPhase;
use sless_operator::config::OperatorConfig;
use sless_operator::context::Context;
use sless_operator::crd::dataflow::DataFlow;
use sless_operator::dataflow::builders::processor_labels;
use sless_operator::dataflow::processor::Processors;
use sless_testkit::clickhouse::{ClickHouseServer, PASSWORD};

use crate::common::TempDir;
use crate::common::pg::{db, pg, refusing_tables, unique};
use crate::processor::Processor;

const NS: &str = "team-a";
/// The processor's name (`sless processor --name copy`).
const NAME: &str = "copy";

/// The phase and message the operator writes for `spec`'s processor,
/// once `done` accepts them; panics after 30 s (the bound a tenant waits).
async fn operator_status(spec: &Value, processor: &Processor, done: impl Fn(DataFlowPhase, &str) -> bool) -> String {
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<DataFlow>()
        .with_status_subresource::<DataFlow>()
        .with_status_subresource::<Deployment>()
        .build()
        .await
        .unwrap();
    let flows: Api<DataFlow> = Api::namespaced(client.clone(), NS);
    let mut df = DataFlow::new(NAME, serde_json::from_value(spec.clone()).unwrap());
    // The fake refuses kube's first-finalizer patch; another keeps it.
    df.metadata.finalizers = Some(vec!["example.com/backup".into()]);
    flows.create(&PostParams::default(), &df).await.unwrap();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(format!("dataflow-{NAME}-5d9c-x7k2p")),
            namespace: Some(NS.into()),
            labels: Some(processor_labels(NAME)),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.0.0.1".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let ctx = Arc::new(
        Context::new(client, OperatorConfig::default(), None).with_processors(Processors::on_port(processor.port)),
    );
    let started = Instant::now();
    loop {
        let df = flows.get(NAME).await.unwrap();
        let status = df.status.clone().unwrap_or_default();
        if let (Some(phase), Some(message)) = (status.phase, status.message.as_deref())
            && done(phase, message)
        {
            tracing::info!(after = ?started.elapsed(), "the reason reached the status");
            return message.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the reason never reached the status: {status:?}"
        );
        sless_operator::dataflow::reconcile(Arc::new(df), ctx.clone())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_wrong_password_reaches_the_dataflow_status_without_the_password() {
    let ch = ClickHouseServer::start();
    let src = unique("wrong_pw_src");
    db().await
        .batch_execute(&format!(
            "CREATE TABLE {src} (id serial PRIMARY KEY, v text); INSERT INTO {src} (v) VALUES ('a');"
        ))
        .await
        .unwrap();
    let wrong = ch.dsn().replace(PASSWORD, "not-the-password");
    let spec = json!({
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": {"type": "clickhouse", "config": {"connectionString": wrong, "table": "t"}},
    });
    let dir = TempDir::new("status-wrong-password");
    let processor = Processor::start(&dir.0, &spec);
    let message = operator_status(&spec, &processor, |phase, message| {
        phase == DataFlowPhase::Error && message.contains("password")
    })
    .await;
    assert!(
        !message.contains("not-the-password") && !message.contains(PASSWORD),
        "{message}"
    );
    // The processor's own words, as `sless dev` shows them.
    let (_, said) = processor.get("/status").await;
    assert_eq!(
        serde_json::from_str::<Value>(&said).unwrap()["message"],
        message.as_str()
    );
}

#[tokio::test]
async fn a_refused_message_and_its_count_reach_the_dataflow_status() {
    let db = db().await;
    let (src, dst) = refusing_tables(&db, "k8s_refused").await;
    let spec = json!({"source": pg(&src, json!({"pollInterval": 1})), "sink": pg(&dst, json!({}))});
    let dir = TempDir::new("status-refused");
    let processor = Processor::start(&dir.0, &spec);
    let message = operator_status(&spec, &processor, |phase, message| {
        phase == DataFlowPhase::Error && message.contains("refuses a message")
    })
    .await;
    assert!(message.contains(&dst) && message.contains("no error sink"), "{message}");
    assert!(message.contains("time(s) so far"), "{message}");
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}
