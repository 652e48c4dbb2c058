//! How replicas reach each other: JSON over HTTP to each peer's peer port
//! (see [`super::peers`]), with the replicas' shared token. A single
//! replica has no one to reach.

use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Failure, NodeId, TypeConfig};

/// The header in which a replica presents the replicas' shared token.
pub const PEER_TOKEN: &str = "x-sless-peer-token";

/// The network between an engine's replicas.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    token: Arc<str>,
}

impl Http {
    pub fn new(token: &str) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            client,
            token: Arc::from(token),
        })
    }

    /// POSTs `body` to `path` at peer `addr`; its JSON answer.
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, reqwest::Error> {
        self.client
            .post(format!("http://{addr}{path}"))
            .header(PEER_TOKEN, &*self.token)
            .json(body)
            .timeout(timeout)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }
}

/// One peer, reached over [`Http`].
pub struct HttpPeer {
    http: Http,
    target: NodeId,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for Http {
    type Network = HttpPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> HttpPeer {
        HttpPeer {
            http: self.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

impl HttpPeer {
    async fn call<Req, Resp, E>(
        &self,
        kind: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<Resp, RaftError<NodeId, E>> = self
            .http
            .post(&self.addr, &format!("/raft/{kind}"), request, option.hard_ttl())
            .await
            .map_err(|e| {
                if e.is_connect() || e.is_timeout() {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for HttpPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call("vote", &rpc, &option).await
    }
}

/// The network of an engine's only replica: every other replica is unreachable.
pub struct NoPeers;

fn unreachable<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&Failure(
        "an engine of one replica has no peers".into(),
    )))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }
}
