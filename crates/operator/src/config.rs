//! Settings of the kubernetes operator (seed 000, step 8: the operator's
//! ConfigMap sets `SQS_EXTERNAL_HOST` and the queue engine image).

/// Field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "sless-operator";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Public host of the SQS endpoints: `https://{host}/sqs/{tenant}`.
    pub sqs_external_host: String,
    /// Image of a tenant's queue engine.
    pub elasticmq_image: String,
    /// TLS Secret of the SQS Ingress host.
    pub sqs_tls_secret: Option<String>,
    /// Image of the dataflow processors (`sless processor`), unless a
    /// DataFlow names its own.
    pub processor_image: String,
    /// Create a tenant's namespace `sless-fn-{tenant}` when it is missing;
    /// off where the platform provisions tenant namespaces itself (then the
    /// operator needs no cluster-wide right to create namespaces).
    pub create_namespaces: bool,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            sqs_external_host: "sqs.kube5s.ru".into(),
            elasticmq_image: "softwaremill/elasticmq-native:1.7.1".into(),
            sqs_tls_secret: None,
            processor_image: "ghcr.io/kube5s/sless:latest".into(),
            create_namespaces: true,
        }
    }
}
