//! The way into a tenant's engine: only through the gateway. The tenant
//! Ingress routes to the gateway's Service (by an ExternalName Service in
//! the tenant's namespace) and a NetworkPolicy admits only gateway pods.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule, IngressServiceBackend, IngressSpec,
    IngressTLS, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
    ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{
    GATEWAY_LABEL, OPERATOR_LABEL, PEER_PORT, SQS_PORT, gateway_service_name, ingress_name, labels, meta,
    network_policy_name, tls_secret_name,
};
use crate::config::OperatorConfig;
use crate::crd::queue_service::QueueService;
use crate::objects::{namespace_peer, policy_port};

/// Only gateway pods reach the engine, on its port. A single engine
/// reaches nothing (it resolves no names and calls no one); `replicas` of
/// one (those running or wanted, the more of the two) reach each other on
/// their peer port, by name, and the operator's pods reach that port too
/// (to lower three replicas to one); no other platform pod does.
pub fn network_policy(qs: &QueueService, config: &OperatorConfig, replicas: u8) -> NetworkPolicy {
    let tenant = &qs.spec.tenant_id;
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![namespace_peer(&config.gateway_namespace, Some(GATEWAY_LABEL))]),
        ports: Some(vec![policy_port("TCP", SQS_PORT)]),
    }];
    let mut egress = vec![];
    if replicas > 1 {
        let replicas = NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(tenant)),
                ..Default::default()
            }),
            ..Default::default()
        };
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![
                replicas.clone(),
                namespace_peer(&config.operator_namespace, Some(OPERATOR_LABEL)),
            ]),
            ports: Some(vec![policy_port("TCP", PEER_PORT)]),
        });
        egress.extend([
            NetworkPolicyEgressRule {
                to: Some(vec![namespace_peer("kube-system", Some(("k8s-app", "kube-dns")))]),
                ports: Some(vec![policy_port("UDP", 53), policy_port("TCP", 53)]),
            },
            NetworkPolicyEgressRule {
                to: Some(vec![replicas]),
                ports: Some(vec![policy_port("TCP", PEER_PORT)]),
            },
        ]);
    }
    NetworkPolicy {
        metadata: meta(qs, network_policy_name(tenant)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(tenant)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(egress),
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
            tls: config.sqs_tls().then(|| {
                vec![IngressTLS {
                    hosts: Some(vec![config.sqs_external_host.clone()]),
                    secret_name: Some(tls_secret_name(tenant)),
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
