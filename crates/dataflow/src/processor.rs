//! `sless processor`: one dataflow in its own process, as the kubernetes
//! operator runs it (seed 001): the spec from a file (the operator's
//! ConfigMap, secrets resolved), the read position in the ConfigMap
//! `dataflow-<name>-checkpoint` (or a file outside Kubernetes), Prometheus
//! metrics and probes on HTTP. SIGTERM writes and commits the batch in hand,
//! then exits.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::checkpoint::CheckpointStore;
use crate::checkpoint::configmap::ConfigMapCheckpoint;
use crate::checkpoint::debounced::{self, Debounced};
use crate::checkpoint::file::FileCheckpoint;
use crate::context::{PipelineContext, PositionsKey};
use crate::metrics::{FlowSample, render};
use crate::pipeline::Stats;
use sless_model::dataflow::{DataFlowPhase, DataFlowStatus};
use sless_model::dataflow::{DataFlowRequest, DataFlowSpec};
use sless_runtime::sync::Unpoisoned;

#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    #[error("cannot read the spec {path}: {source}")]
    ReadSpec {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the spec {path} is not a dataflow spec: {reason}")]
    BadSpec { path: String, reason: String },
    #[error(
        "no Kubernetes configuration for the checkpoint ConfigMap ({0}): run in a cluster, set KUBECONFIG, or pass --checkpoint-file"
    )]
    Kube(#[source] kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics server: {0}")]
    Serve(#[source] std::io::Error),
    #[error("cannot read the positions key {path}: {reason}")]
    PositionsKey { path: String, reason: String },
}

pub struct ProcessorOptions {
    pub spec_path: PathBuf,
    pub namespace: String,
    pub name: String,
    /// Keep the position in this file instead of the checkpoint ConfigMap.
    pub checkpoint_file: Option<PathBuf>,
    /// The tenant's key for exactly-once positions, as 64 hex digits.
    pub positions_key_file: Option<PathBuf>,
    /// Where the dataflow may keep what does not fit in memory, and how much
    /// it may keep and hold.
    pub spill_dir: PathBuf,
    pub budget: crate::budget::BudgetArgs,
    pub metrics_listen: SocketAddr,
    /// Where the dataflow's connectors may connect.
    pub egress: crate::egress::EgressPolicy,
}

/// Reads the tenant's positions key, if the processor was given one.
fn load_positions_key(path: Option<&std::path::Path>) -> Result<Option<PositionsKey>, ProcessorError> {
    let Some(path) = path else { return Ok(None) };
    let failed = |reason: String| ProcessorError::PositionsKey {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    PositionsKey::from_text(&text)
        .map(Some)
        .ok_or_else(|| failed("not 64 hex digits".into()))
}

/// Reads and validates a spec file with the REST API's rules.
pub fn load_spec(path: &std::path::Path) -> Result<DataFlowSpec, ProcessorError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| ProcessorError::ReadSpec {
        path: shown.clone(),
        source,
    })?;
    let bad = |reason: String| ProcessorError::BadSpec {
        path: shown.clone(),
        reason,
    };
    let mut file: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    // Written by the operator from a DataFlowSpec: what a create body
    // holds, and the snapshot requests, which no body does.
    let snapshots = match file.remove("snapshots") {
        Some(value) => serde_json::from_value(value).map_err(|e| bad(format!("snapshots: {e}")))?,
        None => Vec::new(),
    };
    let request: DataFlowRequest =
        serde_json::from_value(serde_json::Value::Object(file)).map_err(|e| bad(e.to_string()))?;
    let registry = crate::registry::Registry;
    let mut spec = request.into_spec(&registry).map_err(|e| bad(e.to_string()))?;
    spec.snapshots = snapshots;
    spec.validate(&registry).map_err(|e| bad(e.to_string()))?;
    Ok(spec)
}

#[derive(Clone)]
struct Probe {
    phase: Arc<Mutex<(DataFlowPhase, String)>>,
    sample: Arc<FlowSample>,
}

async fn metrics(State(probe): State<Probe>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(std::slice::from_ref(&probe.sample)),
    )
}

/// The pipeline's phase and its reason, in the words `sless dev` shows:
/// the operator reads it into the DataFlow's status, so a tenant sees why
/// a flow fails without the pod's log.
async fn status(State(probe): State<Probe>) -> axum::Json<DataFlowStatus> {
    let (phase, message) = probe.phase.lock_unpoisoned().clone();
    axum::Json(DataFlowStatus {
        phase,
        message: Some(message),
    })
}

/// Ready while the pipeline runs; the reason otherwise.
async fn readyz(State(probe): State<Probe>) -> (StatusCode, String) {
    let (phase, message) = probe.phase.lock_unpoisoned().clone();
    let code = if phase == DataFlowPhase::Running {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, message)
}

/// Runs the dataflow until `shutdown` resolves, then lets the batch in hand
/// finish.
pub async fn run(opts: ProcessorOptions, shutdown: impl Future<Output = ()>) -> Result<(), ProcessorError> {
    let spec = load_spec(&opts.spec_path)?;
    let positions_key = load_positions_key(opts.positions_key_file.as_deref())?;
    // The ConfigMap is written at most once a second (each write wakes the
    // operator's reconciler), and its last position at shutdown.
    let mut debounced = None;
    let checkpoint: Option<Arc<dyn CheckpointStore>> = match (&opts.checkpoint_file, spec.checkpoint_persistence) {
        (_, false) => None,
        (Some(path), true) => Some(Arc::new(FileCheckpoint::new(path.clone()))),
        (None, true) => {
            let client = kube::Client::try_default().await.map_err(ProcessorError::Kube)?;
            let store = Debounced::new(
                Arc::new(ConfigMapCheckpoint::new(client, &opts.namespace, &opts.name)),
                debounced::INTERVAL,
            );
            debounced = Some(store.clone());
            Some(Arc::new(store))
        }
    };
    let stats = Arc::new(Stats::default());
    let probe = Probe {
        phase: Arc::new(Mutex::new((
            DataFlowPhase::Pending,
            "connecting the source and sinks".into(),
        ))),
        sample: Arc::new(FlowSample {
            namespace: opts.namespace.clone(),
            dataflow: opts.name.clone(),
            stats: stats.clone(),
        }),
    };
    let listener = TcpListener::bind(opts.metrics_listen)
        .await
        .map_err(|source| ProcessorError::Bind {
            addr: opts.metrics_listen,
            source,
        })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .with_state(probe.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let id = format!("{}/{}", opts.namespace, opts.name);
    let budget = crate::budget::Budgets::new(opts.spill_dir.clone(), opts.budget).for_flow(&opts.namespace, &id);
    let ctx = PipelineContext {
        id,
        checkpoint,
        egress: Arc::new(opts.egress),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        positions_key,
        budget,
    };
    tracing::info!(dataflow = %ctx.id, metrics = %opts.metrics_listen, "processor starting");
    let phase = probe.phase.clone();
    let flow = tokio::spawn(crate::supervisor::supervise(
        spec,
        ctx,
        stats,
        stopped,
        move |p, message| {
            tracing::info!(phase = ?p, %message, "dataflow phase");
            *phase.lock_unpoisoned() = (p, message);
        },
    ));
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(sless_runtime::shutdown::stopped(&stop.subscribe()))
            .into_future(),
    );
    shutdown.await;
    stop.send_replace(true);
    if let Err(e) = flow.await {
        tracing::error!(error = %e, "dataflow task failed");
    }
    if let Some(store) = debounced
        && let Err(error) = store.flush().await
    {
        tracing::warn!(%error, "cannot write the last checkpoint; its batches will be read again");
    }
    tracing::info!("processor stopped: the last batch is written and committed");
    match server.await {
        Ok(served) => served.map_err(ProcessorError::Serve),
        Err(e) => Err(ProcessorError::Serve(std::io::Error::other(e))),
    }
}
