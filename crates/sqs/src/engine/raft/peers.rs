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

/// The answer to a forwarded request this replica did not run (it does not
/// lead, or is stopping): the follower may send it to the leader again.
pub const NOT_RUN: StatusCode = StatusCode::MISDIRECTED_REQUEST;

/// Largest peer request: a batch of log entries or a snapshot chunk.
const BODY_LIMIT: usize = 64 << 20;

#[derive(Clone)]
struct Peer {
    raft: Raft<TypeConfig>,
    engine: Weak<Engine>,
    token: Arc<str>,
    /// Told of each append a leader made here.
    heard_leader: Arc<tokio::sync::Notify>,
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

/// Serves replica `raft` (of `engine`) to its peers on `listener`, bound
/// at `addr`, telling `heard_leader` of each append a leader makes.
pub fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    raft: Raft<TypeConfig>,
    engine: Weak<Engine>,
    token: &str,
    heard_leader: Arc<tokio::sync::Notify>,
) -> PeerServer {
    let peer = Peer {
        raft,
        engine,
        token: Arc::from(token),
        heard_leader,
    };
    let app = Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/members", post(members))
        .route("/raft/status", axum::routing::get(status))
        .route("/raft/voters", post(voters))
        .route("/raft/elect", post(elect))
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
    let answer = peer.raft.append_entries(rpc).await;
    if answer
        .as_ref()
        .is_ok_and(|a| !matches!(a, openraft::raft::AppendEntriesResponse::HigherVote(_)))
    {
        peer.heard_leader.notify_one();
    }
    Json(answer).into_response()
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

/// Stands for election at once: the leader, stopping, hands its
/// leadership over to this replica (see `Replica::hand_over`). The others
/// grant the vote only if this replica's log is as long as theirs.
async fn elect(State(peer): State<Peer>) -> Response {
    match peer.raft.trigger().elect().await {
        Ok(()) => Json(true).into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
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

/// Runs a request a follower forwarded, here, once this replica is the
/// leader that can serve it (waiting as the follower would); else answers
/// [`NOT_RUN`] (never forwarding it again), so the follower may send it on.
async fn request(State(peer): State<Peer>, Json(forwarded): Json<Forwarded>) -> Response {
    let Some(engine) = peer.engine.upgrade() else {
        return NOT_RUN.into_response();
    };
    if let Some(replica) = &engine.replica
        && let Err(e) = replica.serving_here().await
    {
        return (NOT_RUN, e.message).into_response();
    }
    match engine.handle_here(&forwarded.action, &forwarded.input).await {
        Err(e) if super::unrun(&e) => (NOT_RUN, e.message).into_response(),
        answer => Json(answer.map_err(|e| e.to_wire())).into_response(),
    }
}
