//! QueueService (`sless.kube5s.ru/v1alpha1`): one tenant's managed SQS
//! instance, as seed 000 defines it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use sless_model::ValidationErrors;
use sless_model::name::{MAX_TENANT_LEN, PATTERN};
use sless_model::queue_service::{
    BYTES_PER_SECOND, DEFAULT_MEMORY_MB, DEFAULT_STORAGE_MB, Durability, MEMORY_MB, QueueServicePhase,
    QueueServiceRequest, REQUESTS_PER_SECOND, STORAGE_MB,
};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sless.kube5s.ru",
    version = "v1alpha1",
    kind = "QueueService",
    namespaced,
    status = "QueueServiceStatus",
    shortname = "qs",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"TenantID","type":"string","jsonPath":".spec.tenantId"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QueueServiceSpec {
    /// The cloud tenant that owns the instance.
    // `sless_model::name::tenant_id`'s rule.
    #[schemars(length(min = 1, max = MAX_TENANT_LEN), regex(pattern = PATTERN))]
    pub tenant_id: String,
    /// Memory limit of the queue engine, in MiB.
    #[serde(rename = "memoryMB", default = "default_memory")]
    #[schemars(range(min = *MEMORY_MB.start(), max = *MEMORY_MB.end()))]
    pub memory_mb: u32,
    /// Size of the volume that keeps the messages, in MiB.
    #[serde(rename = "storageMB", default = "default_storage")]
    #[schemars(range(min = *STORAGE_MB.start(), max = *STORAGE_MB.end()))]
    pub storage_mb: u32,
    /// Keep messages on disk; false keeps them in memory only.
    #[serde(default = "default_persistence")]
    pub persistence: bool,
    /// The queue engine: `sless` (default) or `elasticmq` (seed 000's).
    #[serde(default)]
    pub engine: QueueEngine,
    /// When the `sless` engine acknowledges a change, with persistence on:
    /// `disk` (default) once synced to disk; `process` once written to its
    /// journal, synced within 100 ms. ElasticMQ keeps its own behaviour.
    #[serde(default)]
    pub durability: Durability,
    /// How many replicas of the `sless` engine keep the queues: 1, or 3
    /// (a StatefulSet, one volume each, Raft between them; needs
    /// persistence). Absent: 3 with persistence, 1 without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = [1, 3]))]
    pub replicas: Option<u8>,
    /// SQS requests a second the tenant may make through each gateway;
    /// over it calls are answered RequestThrottled. Absent: the gateways'
    /// `--tenant-requests-per-second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = *REQUESTS_PER_SECOND.start(), max = *REQUESTS_PER_SECOND.end()))]
    pub requests_per_second: Option<u32>,
    /// Request body bytes a second the tenant may send through each
    /// gateway. Absent: the gateways' `--tenant-bytes-per-second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = *BYTES_PER_SECOND.start(), max = *BYTES_PER_SECOND.end()))]
    pub bytes_per_second: Option<u64>,
}

impl QueueServiceSpec {
    /// The rules the REST API applies to the same fields.
    pub fn check(&self) -> Result<(), ValidationErrors> {
        let request = QueueServiceRequest {
            memory_mb: Some(i64::from(self.memory_mb)),
            storage_mb: Some(i64::from(self.storage_mb)),
            persistence: Some(self.persistence),
            durability: Some(self.durability),
            replicas: self.replicas.map(i64::from),
            requests_per_second: self.requests_per_second.map(i64::from),
            bytes_per_second: self.bytes_per_second.map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
            ..Default::default()
        };
        request.spec_over(Default::default()).map(drop)
    }

    /// The replicas the engine runs as, the default filled in.
    pub fn replicas(&self) -> u8 {
        match (self.replicas, self.engine) {
            // ElasticMQ keeps one process's store.
            (_, QueueEngine::Elasticmq) => 1,
            (Some(n), _) => n,
            (None, _) if self.persistence => DEFAULT_REPLICAS,
            (None, _) => 1,
        }
    }
}

/// Replicas of a persistent `sless` engine on Kubernetes, unless asked otherwise.
pub const DEFAULT_REPLICAS: u8 = 3;

/// Which SQS-compatible engine serves a tenant. Either way the tenant's
/// traffic reaches it only through the SigV4 gateway.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QueueEngine {
    /// `sless queue`, its journal on the volume, every send fsynced.
    #[default]
    Sless,
    /// `softwaremill/elasticmq-native` with the HOCON config of seed 000.
    Elasticmq,
}

fn default_memory() -> u32 {
    DEFAULT_MEMORY_MB
}

fn default_storage() -> u32 {
    DEFAULT_STORAGE_MB
}

fn default_persistence() -> bool {
    true
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueServiceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<QueueServicePhase>,
    /// `https://{SQS_EXTERNAL_HOST}/sqs/{tenantId}` once Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The Secret holding accessKey, secretKey and the engine's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Generation of the spec the status describes: Ready only once the
    /// engine of that spec runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
    /// True once every gateway connected to the control plane routes this
    /// queue service (set by the leader's route publisher; false again
    /// while its route is left out): only then is it Ready to its tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed: Option<bool>,
    /// Why the gateways leave this queue service's route out of their
    /// table (a malformed or shared access key, a token no header takes),
    /// while they do; its tenant's calls are refused meanwhile. Set by the
    /// leader's route publisher, with a Warning Event `RouteLeftOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_left_out: Option<String>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn the_crd_carries_the_seed_validation_and_columns() {
        let crd = serde_json::to_value(QueueService::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["tenantId"]));
        let tenant = &spec["properties"]["tenantId"];
        assert_eq!(
            (&tenant["pattern"], &tenant["maxLength"]),
            (&serde_json::json!(sless_model::name::PATTERN), &serde_json::json!(54))
        );
        let memory = &spec["properties"]["memoryMB"];
        assert_eq!(
            (
                memory["minimum"].as_f64(),
                memory["maximum"].as_f64(),
                memory["default"].as_u64()
            ),
            (Some(32.0), Some(1024.0), Some(64))
        );
        assert_eq!(spec["properties"]["storageMB"]["default"], 512);
        assert_eq!(spec["properties"]["persistence"]["default"], true);
        let durability = &spec["properties"]["durability"];
        assert_eq!(
            (&durability["default"], &durability["enum"]),
            (&serde_json::json!("disk"), &serde_json::json!(["disk", "process"]))
        );
        let replicas = &spec["properties"]["replicas"];
        assert_eq!(
            (&replicas["enum"], &replicas["default"]),
            (&serde_json::json!([1, 3]), &serde_json::Value::Null),
            "absent means 3 with persistence, 1 without: no single default"
        );
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(columns, ["TenantID", "Phase", "Endpoint", "Age"]);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
    }
}
