//! A DataFlow's processor as the operator and the REST API reach it: over
//! HTTP at its pod's address, on the port of its `/metrics` and `/status`.
//! The processor holds what nothing else does: its counters, and its phase
//! with the reason (a refused login, a refused message and its count),
//! which the operator writes into the DataFlow's status so a tenant reads
//! them without the pod's log.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use sless_model::dataflow::DataFlowStatus;

use super::builders::{METRICS_PORT, processor_labels};

/// Longest `/status` answer read: a phase and a message.
const MAX_STATUS_BYTES: usize = 16 << 10;

/// How the processor's pods are reached.
#[derive(Clone)]
pub struct Processors {
    http: reqwest::Client,
    port: u16,
}

impl Default for Processors {
    fn default() -> Self {
        Self::on_port(u16::try_from(METRICS_PORT).unwrap_or(9090))
    }
}

impl Processors {
    /// On another port than the pods' (a test's processor on loopback).
    pub fn on_port(port: u16) -> Self {
        Self {
            http: crate::objects::pod_client(),
            port,
        }
    }

    /// The address of a processor pod of `dataflow`: a ready one, or with
    /// `ready` false any running one (a failing processor is not ready,
    /// and it is the one with something to say).
    async fn address(&self, client: &kube::Client, namespace: &str, dataflow: &str, ready: bool) -> Option<SocketAddr> {
        let selector = crate::objects::label_selector(&processor_labels(dataflow));
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .inspect_err(|error| tracing::debug!(%error, "cannot list a processor's pods"))
            .ok()?;
        pods.items.iter().find_map(|pod| {
            let status = pod.status.as_ref()?;
            let is_ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let running = status.phase.as_deref() == Some("Running");
            let usable = if ready { is_ready } else { running || is_ready };
            let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
            usable.then_some(SocketAddr::new(ip, self.port))
        })
    }

    /// `GET path` of a processor pod, its body within `cap` bytes.
    async fn get(&self, address: SocketAddr, path: &str, cap: usize) -> Option<Vec<u8>> {
        let response = self
            .http
            .get(format!("http://{address}{path}"))
            .send()
            .await
            .map_err(|error| tracing::debug!(error = %error.without_url(), "a processor does not answer"))
            .ok()?;
        let answer = sless_runtime::http::read_capped(response, cap)
            .await
            .map_err(|error| tracing::warn!(%error, %path, "a processor's answer is not read"))
            .ok()?;
        answer.status.is_success().then(|| answer.body.to_vec())
    }

    /// What the processor says of itself, `None` while no pod of it runs
    /// or answers.
    pub async fn status(&self, client: &kube::Client, namespace: &str, dataflow: &str) -> Option<DataFlowStatus> {
        let address = self.address(client, namespace, dataflow, false).await?;
        let body = self.get(address, "/status", MAX_STATUS_BYTES).await?;
        serde_json::from_slice(&body).ok()
    }

    /// The Prometheus exposition of a ready processor, within `cap` bytes.
    pub async fn metrics(&self, client: &kube::Client, namespace: &str, dataflow: &str, cap: usize) -> Option<String> {
        let address = self.address(client, namespace, dataflow, true).await?;
        let body = self.get(address, "/metrics", cap).await?;
        String::from_utf8(body).ok()
    }
}
