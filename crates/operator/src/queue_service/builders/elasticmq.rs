//! The children of a QueueService with `engine: elasticmq`: seed 000's
//! HOCON in a ConfigMap, mounted where elasticmq-native reads it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, SecurityContext};

use super::{DATA_PATH, SQS_PORT, configmap_name, meta};
use crate::config::OperatorConfig;
use crate::crd::queue_service::QueueService;
use crate::objects::fenced_container;

/// Where elasticmq-native reads its configuration.
pub(super) const CONFIG_PATH: &str = "/opt/elasticmq.conf";

/// ElasticMQ's HOCON: public address under `/sqs/{tenant}`, strict SQS
/// limits, H2 storage on the volume when persistence is on.
pub fn elasticmq_conf(config: &OperatorConfig, tenant: &str, persistence: bool) -> String {
    format!(
        r#"include classpath("application.conf")
node-address {{
  protocol = {protocol}
  host = "{host}"
  port = {port}
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
  region = "{region}"
  accountId = "{account}"
}}
"#,
        host = config.sqs_external_host,
        protocol = if config.sqs_tls() { "https" } else { "http" },
        port = if config.sqs_tls() { 443 } else { 80 },
        region = config.region,
        account = sless_sqs::credentials::account_id(tenant),
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

/// The elasticmq-native container, its HOCON mounted where it reads it.
pub(super) fn elasticmq_container(config: &OperatorConfig) -> Container {
    Container {
        name: "elasticmq".into(),
        image: Some(config.elasticmq_image.clone()),
        security_context: Some(SecurityContext {
            // The native image writes nothing outside its volume either, but
            // its user is not declared numerically; leave the root check off.
            run_as_non_root: None,
            ..fenced_container()
        }),
        ..Default::default()
    }
}
