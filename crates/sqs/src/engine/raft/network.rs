//! How replicas reach each other: JSON over HTTP to each peer's peer port
//! (see [`super::peers`]), with the replicas' shared token. A single
//! replica has no one to reach.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Entry, EntryPayload};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Failure, NodeId, TypeConfig};
use crate::engine::command::Command;

/// The header in which a replica presents the replicas' shared token.
pub const PEER_TOKEN: &str = "x-sless-peer-token";

/// The network between an engine's replicas.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    token: Arc<str>,
    /// Every replica's peer address as configured here: it wins over the
    /// membership's, which is of the replicas' last start (`sless dev`
    /// gives them new ports each time) until the leader updates it, and
    /// no leader is elected while the old addresses are all they have.
    peers: Arc<BTreeMap<NodeId, String>>,
}

impl Http {
    pub fn new(token: &str, peers: BTreeMap<NodeId, String>) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            client,
            token: Arc::from(token),
            peers: Arc::new(peers),
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

/// `e` with every error beneath it: reqwest's own message names only the
/// URL ("error sending request for url …"), its cause (a refused
/// connection, a name not found) is below.
pub fn causes(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
            addr: self.peers.get(&target).unwrap_or(&node.addr).clone(),
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
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // openraft 0.9 times an append out after the heartbeat: one that
        // is too big to be taken within it on a busy follower times out
        // every time it is sent again, and that follower never catches
        // up. So the entries go a budget at a time, and the rest next.
        let keep = within_budget(&rpc.entries);
        let last_sent = (keep < rpc.entries.len()).then(|| rpc.entries[keep - 1].log_id);
        rpc.entries.truncate(keep);
        match self.call("append", &rpc, &option).await? {
            AppendEntriesResponse::Success if last_sent.is_some() => {
                Ok(AppendEntriesResponse::PartialSuccess(last_sent))
            }
            answer => Ok(answer),
        }
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

/// About the most bytes of entries one append carries (at least one entry).
const APPEND_BUDGET: usize = 512 << 10;

/// How many of `entries`, from the first, fit in [`APPEND_BUDGET`].
fn within_budget(entries: &[Entry<TypeConfig>]) -> usize {
    let mut bytes = 0;
    for (n, entry) in entries.iter().enumerate() {
        bytes += match &entry.payload {
            EntryPayload::Normal(commands) => commands.0.iter().map(Command::weight).sum(),
            _ => Command::BASE_WEIGHT,
        };
        if n > 0 && bytes > APPEND_BUDGET {
            return n;
        }
    }
    entries.len()
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

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId};

    use super::*;

    fn blanks(n: u64) -> Vec<Entry<TypeConfig>> {
        (1..=n)
            .map(|index| Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Blank,
            })
            .collect()
    }

    #[test]
    fn an_append_carries_entries_up_to_its_budget_and_at_least_one() {
        let fit = APPEND_BUDGET / Command::BASE_WEIGHT;
        assert_eq!(within_budget(&blanks(10)), 10);
        assert_eq!(within_budget(&blanks(fit as u64 + 5)), fit);
        assert_eq!(within_budget(&[]), 0);
    }
}
