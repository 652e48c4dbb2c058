//! A queue service's replicas as the operator reaches them: on their peer
//! port at their pods' addresses, with the replicas' token (their
//! NetworkPolicy lets the operator's pods in on that port). Lowering
//! three replicas to one first makes replica 1 the only voter: the other
//! two leave the membership through Raft while they still run, so that
//! replica 1, alone, is a majority of its voters once their pods are gone.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use sless_sqs::engine::raft::network::PEER_TOKEN;
use sless_sqs::engine::raft::peers::Status;

use super::builders::{self, PEER_PORT, POD_INDEX_LABEL};

/// Longest `/raft/status` answer read: an id, a term and a few voters.
const MAX_STATUS_BYTES: usize = 4 << 10;

/// How the replicas' peer ports are reached.
#[derive(Clone)]
pub struct Voters {
    http: reqwest::Client,
    port: u16,
}

impl Default for Voters {
    fn default() -> Self {
        Self {
            http: crate::objects::pod_client(),
            port: u16::try_from(PEER_PORT).unwrap_or(9325),
        }
    }
}

impl Voters {
    /// Tells every running replica of `tenant` that replica 1 alone should
    /// be the voter (the leader among them makes it so), and answers
    /// whether it is: replica 1 says its voters are [1], with no change
    /// under way. Asked at each reconcile until then.
    pub async fn lowered_to_one(&self, client: &kube::Client, namespace: &str, tenant: &str, token: &str) -> bool {
        self.tell(client, namespace, tenant, token, &[1])
            .await
            .is_some_and(|s| s.voters == [1] && !s.joint)
    }

    /// Tells every running replica of `tenant` that the three should be
    /// the voters: a lowering to one given up before it was done is undone
    /// (the replicas keep what they were told, across restarts).
    pub async fn keep_three(&self, client: &kube::Client, namespace: &str, tenant: &str, token: &str) {
        self.tell(client, namespace, tenant, token, &[1, 2, 3]).await;
    }

    /// Tells every running replica of `tenant` which replicas should be
    /// the voters: what replica 1 says of its queue service then.
    async fn tell(
        &self,
        client: &kube::Client,
        namespace: &str,
        tenant: &str,
        token: &str,
        voters: &[u64],
    ) -> Option<Status> {
        let selector = crate::objects::label_selector(&builders::labels(tenant));
        let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(pods) => pods.items,
            Err(error) => {
                tracing::debug!(%error, "cannot list the engine's pods");
                return None;
            }
        };
        let mut first = None;
        for pod in &pods {
            let Some(ip) = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref()?.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let address = SocketAddr::new(ip, self.port);
            if let Err(error) = self.post_voters(address, token, voters).await {
                tracing::debug!(%address, error = %error.without_url(), "a replica was not told its voters");
            }
            if pod.labels().get(POD_INDEX_LABEL).map(String::as_str) == Some("1") {
                first = Some(address);
            }
        }
        self.status(first?, token).await
    }

    async fn post_voters(&self, address: SocketAddr, token: &str, voters: &[u64]) -> Result<(), reqwest::Error> {
        self.http
            .post(format!("http://{address}/raft/voters"))
            .header(PEER_TOKEN, token)
            .json(voters)
            .send()
            .await?
            .error_for_status()
            .map(drop)
    }

    async fn status(&self, address: SocketAddr, token: &str) -> Option<Status> {
        let response = self
            .http
            .get(format!("http://{address}/raft/status"))
            .header(PEER_TOKEN, token)
            .send()
            .await
            .map_err(|error| tracing::debug!(%address, error = %error.without_url(), "a replica does not answer"))
            .ok()?;
        let answer = sless_runtime::http::read_capped(response, MAX_STATUS_BYTES)
            .await
            .ok()?;
        answer
            .status
            .is_success()
            .then(|| serde_json::from_slice(&answer.body).ok())
            .flatten()
    }
}
