//! Settings of the kubernetes operator (seed 000, step 8: the operator's
//! ConfigMap sets `SQS_EXTERNAL_HOST` and the images).

use sless_dataflow::egress::Cidr;

/// Field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "sless-operator";

/// The label on every object the operator makes, by which it watches them.
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "sless-operator";
/// [`MANAGED_BY_KEY`]`=`[`MANAGED_BY_VALUE`] as a label selector.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by=sless-operator";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Public host of the SQS endpoints: `https://{host}/sqs/{tenant}`.
    pub sqs_external_host: String,
    /// The region of queue ARNs (the gateway takes signatures of any region).
    pub region: String,
    /// The sless image: tenants' queue engines (`sless queue`) and the
    /// dataflow processors (`sless processor`), unless a DataFlow names its own.
    pub image: String,
    /// Image of the queue engine of a QueueService with `engine: elasticmq`.
    pub elasticmq_image: String,
    /// The certificate of the SQS host: a `kubernetes.io/tls` Secret in
    /// [`Self::sqs_tls_namespace`] (one cert-manager Certificate makes it),
    /// which the operator copies into each tenant namespace as
    /// `sqs-tls-{tenant}`, since an Ingress reads its TLS Secret from its
    /// own namespace. Endpoints are `https://` only while it exists;
    /// without it they are plain `http://`.
    pub sqs_tls_secret: Option<String>,
    /// Namespace of [`Self::sqs_tls_secret`] (the operator's own).
    pub sqs_tls_namespace: String,
    /// DNS name of the SQS gateway's Service: tenant Ingresses route to it,
    /// never to an engine.
    pub gateway_host: String,
    /// Namespace of the gateway pods, the only pods a tenant's
    /// NetworkPolicy lets reach its engine.
    pub gateway_namespace: String,
    /// Create a tenant's namespace `sless-fn-{tenant}` when it is missing;
    /// off where the platform provisions tenant namespaces itself (then the
    /// operator needs no cluster-wide right to create namespaces).
    pub create_namespaces: bool,
    /// The cluster's own networks (Pods, Services, nodes): no processor
    /// reaches them. Each processor refuses them itself (its egress
    /// policy) and its NetworkPolicy leaves them out; its own namespace
    /// stays reachable.
    pub cluster_networks: Vec<Cidr>,
    /// The operator's namespace, whose pods (the API) read processors'
    /// status and metrics.
    pub operator_namespace: String,
}

impl OperatorConfig {
    /// Whether tenants' endpoints are served over TLS.
    pub fn sqs_tls(&self) -> bool {
        self.sqs_tls_secret.is_some()
    }
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            sqs_external_host: "sqs.kube5s.ru".into(),
            region: sless_sqs::DEFAULT_REGION.into(),
            image: "ghcr.io/kube5s/sless:latest".into(),
            elasticmq_image: "softwaremill/elasticmq-native:1.7.1".into(),
            sqs_tls_secret: None,
            sqs_tls_namespace: "sless-system".into(),
            gateway_host: "sless-gateway.sless-system.svc.cluster.local".into(),
            gateway_namespace: "sless-system".into(),
            create_namespaces: true,
            cluster_networks: Vec::new(),
            operator_namespace: "sless-system".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_the_label() {
        assert_eq!(MANAGED_BY, format!("{MANAGED_BY_KEY}={MANAGED_BY_VALUE}"));
        assert!(super::super::routes::CHILDREN_SELECTOR.starts_with(MANAGED_BY));
    }
}
