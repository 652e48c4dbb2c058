//! A network of replicas in one process, for tests: each RPC is a call on
//! the target's `Raft`, unless the test cut the link between the two (then
//! the target is unreachable, as behind a partition).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Raft};
use sless_runtime::sync::Unpoisoned;

use super::{NodeId, TypeConfig};

#[derive(Clone, Default)]
pub struct Router {
    nodes: Arc<Mutex<BTreeMap<NodeId, Raft<TypeConfig>>>>,
    /// Links cut, each as (lower id, higher id).
    cut: Arc<Mutex<BTreeSet<(NodeId, NodeId)>>>,
}

#[derive(Debug)]
struct Cut;

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the link is cut")
    }
}

impl std::error::Error for Cut {}

impl Router {
    pub fn add(&self, id: NodeId, raft: Raft<TypeConfig>) {
        self.nodes.lock_unpoisoned().insert(id, raft);
    }

    pub fn remove(&self, id: NodeId) {
        self.nodes.lock_unpoisoned().remove(&id);
    }

    /// Cuts (or heals) every link between `island` and the other replicas.
    pub fn isolate(&self, island: NodeId, cut: bool) {
        let others: Vec<NodeId> = self.nodes.lock_unpoisoned().keys().copied().collect();
        let mut links = self.cut.lock_unpoisoned();
        for other in others.into_iter().filter(|o| *o != island) {
            let link = (island.min(other), island.max(other));
            if cut {
                links.insert(link);
            } else {
                links.remove(&link);
            }
        }
    }

    /// The target's Raft, if the link from `from` reaches it.
    fn reach<E: std::error::Error>(
        &self,
        from: NodeId,
        to: NodeId,
    ) -> Result<Raft<TypeConfig>, RPCError<NodeId, BasicNode, E>> {
        let cut = self.cut.lock_unpoisoned().contains(&(from.min(to), from.max(to)));
        let raft = self.nodes.lock_unpoisoned().get(&to).cloned();
        match raft {
            Some(raft) if !cut => Ok(raft),
            _ => Err(RPCError::Unreachable(Unreachable::new(&Cut))),
        }
    }
}

pub struct Factory {
    pub router: Router,
    pub from: NodeId,
}

pub struct Connection {
    router: Router,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Connection {
        Connection {
            router: self.router.clone(),
            from: self.from,
            to: target,
        }
    }
}

fn remote<T, E: std::error::Error>(to: NodeId, result: Result<T, E>) -> Result<T, RPCError<NodeId, BasicNode, E>> {
    result.map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.reach(self.from, self.to)?;
        remote(self.to, raft.append_entries(rpc).await)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        let raft = self.router.reach(self.from, self.to)?;
        remote(self.to, raft.install_snapshot(rpc).await)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.reach(self.from, self.to)?;
        remote(self.to, raft.vote(rpc).await)
    }
}
