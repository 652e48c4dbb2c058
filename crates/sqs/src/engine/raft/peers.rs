//! A replica's peer port: the Raft RPCs of the other replicas, and the SQS
//! requests a follower forwards to its leader. It serves only requests
//! that carry the replicas' shared token, and is meant for their network
//! alone (the gateways reach the engine's own port).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use openraft::Raft;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpListener;

use super::network::PEER_TOKEN;
use super::{NodeId, TypeConfig};
use crate::engine::Engine;
use crate::engine::server::same_secret;
use crate::error::Wire;

/// Largest peer request: a batch of log entries or a snapshot chunk.
const BODY_LIMIT: usize = 64 << 20;

#[derive(Clone)]
struct Peer {
    raft: Raft<TypeConfig>,
    engine: Weak<Engine>,
    token: Arc<str>,
}

/// An SQS request a follower passes on to its leader.
#[derive(Serialize, Deserialize)]
pub struct Forwarded {
    pub action: String,
    pub input: Value,
}

/// The peer port, served until dropped.
pub struct PeerServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves replica `raft` (of `engine`) to its peers on `listener`, bound at `addr`.
pub fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    raft: Raft<TypeConfig>,
    engine: Weak<Engine>,
    token: &str,
) -> PeerServer {
    let peer = Peer {
        raft,
        engine,
        token: Arc::from(token),
    };
    let app = Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/members", post(members))
        .route("/raft/status", axum::routing::get(status))
        .route("/raft/voters", post(voters))
        .route("/request", post(request))
        .layer(middleware::from_fn_with_state(peer.clone(), admit))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(peer);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the peer port stopped");
        }
    });
    PeerServer { addr, task }
}

async fn admit(State(peer): State<Peer>, request: Request, next: Next) -> Response {
    let given = request.headers().get(PEER_TOKEN).map_or(&[][..], |v| v.as_bytes());
    if !same_secret(given, peer.token.as_bytes()) {
        return StatusCode::FORBIDDEN.into_response();
    }
    next.run(request).await
}

async fn append(State(peer): State<Peer>, Json(rpc): Json<AppendEntriesRequest<TypeConfig>>) -> Response {
    Json(peer.raft.append_entries(rpc).await).into_response()
}

async fn vote(State(peer): State<Peer>, Json(rpc): Json<VoteRequest<NodeId>>) -> Response {
    Json(peer.raft.vote(rpc).await).into_response()
}

async fn snapshot(State(peer): State<Peer>, Json(rpc): Json<InstallSnapshotRequest<TypeConfig>>) -> Response {
    Json(peer.raft.install_snapshot(rpc).await).into_response()
}

/// The voters this replica knows (none before it joined a queue service).
async fn members(State(peer): State<Peer>) -> Response {
    let metrics = peer.raft.metrics();
    let voters: Vec<NodeId> = metrics.borrow().membership_config.membership().voter_ids().collect();
    Json(voters).into_response()
}

/// Which replicas should be the voters (a JSON list of ids): the leader
/// makes them so, and the others leave. Every replica is told, since any
/// may lead. For a platform lowering a queue service to one replica.
async fn voters(State(peer): State<Peer>, Json(voters): Json<std::collections::BTreeSet<NodeId>>) -> Response {
    let Some(engine) = peer.engine.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    match engine.replica.as_ref().map(|r| r.want_voters(voters)) {
        Some(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Some(Err(message)) => (StatusCode::BAD_REQUEST, message).into_response(),
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// What this replica knows of its queue service: who it is, whom it takes
/// for the leader, the term, its voters and how far it applied the log.
/// For operators, fault tests and a platform changing the voters; the
/// replicas do not use it.
#[derive(Serialize, Deserialize)]
pub struct Status {
    pub id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub voters: Vec<NodeId>,
    /// Whether a change of the voters is under way: until it is done, an
    /// election needs a majority of the voters before it as well.
    pub joint: bool,
    pub last_applied: Option<u64>,
}

async fn status(State(peer): State<Peer>) -> Response {
    let metrics = peer.raft.metrics();
    let m = metrics.borrow();
    Json(Status {
        id: m.id,
        leader: m.current_leader,
        term: m.current_term,
        voters: m.membership_config.membership().voter_ids().collect(),
        joint: m.membership_config.membership().get_joint_config().len() > 1,
        last_applied: m.last_applied.map(|l| l.index),
    })
    .into_response()
}

/// Runs a request a follower forwarded, here: this replica leads, or it
/// answers that it does not (never forwarding it again).
async fn request(State(peer): State<Peer>, Json(forwarded): Json<Forwarded>) -> Response {
    let Some(engine) = peer.engine.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let answer: Result<Value, Wire> = engine
        .handle_forwarded(&forwarded.action, &forwarded.input)
        .await
        .map_err(|e| e.to_wire());
    Json(answer).into_response()
}
