//! The tonic adapter: protobuf ↔ commands, status codes, and the mTLS
//! identity check. No decision is made here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::identity::{IdentityError, IdentityPolicy};
use super::model::{OutcomeBatch, OutcomeCount, OutcomeKind, ProxyCounters, RuntimeReport};
use super::proto::{self, worker_control_plane_server::WorkerControlPlane};
use super::worker::{AckCommand, RegisterCommand, Service, ServiceError};

pub struct GrpcControlPlane {
    service: Arc<Service>,
    identity: IdentityPolicy,
}

impl GrpcControlPlane {
    pub fn new(service: Arc<Service>, identity: IdentityPolicy) -> Self {
        Self { service, identity }
    }

    fn authorize<T>(&self, request: &Request<T>, worker_id: &str) -> Result<(), Status> {
        let certs = request.peer_certs();
        let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
        self.identity.check(leaf, worker_id).map_err(|e| match e {
            IdentityError::NoCertificate => Status::unauthenticated(e.to_string()),
            IdentityError::NoWorkerId | IdentityError::Mismatch => Status::permission_denied(e.to_string()),
        })
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::InvalidArgument(m) => Status::invalid_argument(m),
            ServiceError::FailedPrecondition(m) => Status::failed_precondition(m),
            ServiceError::Aborted(m) => Status::aborted(m),
            ServiceError::AlreadyExists(m) => Status::already_exists(m),
            ServiceError::Unavailable => Status::unavailable(e.to_string()),
        }
    }
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn outcome_kind(kind: i32) -> Result<OutcomeKind, Status> {
    match proto::OutcomeKind::try_from(kind) {
        Ok(proto::OutcomeKind::Ok) => Ok(OutcomeKind::Ok),
        Ok(proto::OutcomeKind::ClientError) => Ok(OutcomeKind::ClientError),
        Ok(proto::OutcomeKind::AuthFailed) => Ok(OutcomeKind::AuthFailed),
        Ok(proto::OutcomeKind::BackendError) => Ok(OutcomeKind::BackendError),
        _ => Err(Status::invalid_argument("outcomes: kind must be set")),
    }
}

type DeliveryStream = Pin<Box<dyn Stream<Item = Result<proto::SnapshotDelivery, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerControlPlane for GrpcControlPlane {
    async fn register_worker(
        &self,
        request: Request<proto::RegisterWorkerRequest>,
    ) -> Result<Response<proto::RegisterWorkerResponse>, Status> {
        self.authorize(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let registration = self
            .service
            .register(RegisterCommand {
                supported_protocol_version: r.supported_protocol_version,
                worker_id: r.worker_id,
                instance_id: r.instance_id,
                zone: r.zone,
                labels: r.labels.into_iter().map(|l| (l.key, l.value)).collect(),
            })
            .await?;
        Ok(Response::new(proto::RegisterWorkerResponse {
            session_id: registration.session_id,
            ownership_epoch: registration.ownership_epoch,
            heartbeat_interval_ms: millis(registration.heartbeat_interval),
            max_stale_age_ms: millis(registration.max_stale_age),
            protocol_version: registration.protocol_version,
        }))
    }

    async fn acknowledge_snapshot(
        &self,
        request: Request<proto::AcknowledgeSnapshotRequest>,
    ) -> Result<Response<proto::AcknowledgeSnapshotResponse>, Status> {
        self.authorize(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let snapshot = r
            .snapshot
            .ok_or_else(|| Status::invalid_argument("snapshot: is required"))?;
        self.service
            .acknowledge(AckCommand {
                worker_id: r.worker_id,
                session_id: r.session_id,
                version: snapshot.version,
                ownership_epoch: snapshot.ownership_epoch,
                checksum: snapshot.checksum,
                applied: r.applied,
                error_code: r.error_code,
                error_message: r.error_message,
                nonce: r.nonce,
            })
            .await?;
        Ok(Response::new(proto::AcknowledgeSnapshotResponse {}))
    }

    async fn report_runtime(
        &self,
        request: Request<proto::ReportRuntimeRequest>,
    ) -> Result<Response<proto::ReportRuntimeResponse>, Status> {
        self.authorize(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let decision = self
            .service
            .report_runtime(RuntimeReport {
                worker_id: r.worker_id,
                session_id: r.session_id,
                sequence: r.sequence,
                snapshot_version: r.snapshot_version,
                ownership_epoch: r.ownership_epoch,
                counters: r
                    .counters
                    .into_iter()
                    .map(|c| ProxyCounters {
                        proxy_id: c.proxy_id,
                        requests: c.requests,
                        errors: c.errors,
                        in_flight: c.in_flight,
                        bytes_in: c.bytes_in,
                        bytes_out: c.bytes_out,
                    })
                    .collect(),
            })
            .await?;
        Ok(Response::new(proto::ReportRuntimeResponse {
            require_full_snapshot: decision.require_full_snapshot,
            ownership_epoch: decision.ownership_epoch,
            revoke_proxy_ids: decision.revoke_proxy_ids,
        }))
    }

    type WatchSnapshotsStream = DeliveryStream;

    async fn watch_snapshots(
        &self,
        request: Request<proto::WatchSnapshotsRequest>,
    ) -> Result<Response<Self::WatchSnapshotsStream>, Status> {
        self.authorize(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let deliveries = self.service.watch(r.worker_id, r.session_id)?;
        let stream = deliveries.map(|item| {
            item.map(|d| proto::SnapshotDelivery {
                nonce: d.nonce,
                snapshot: Some(proto::SnapshotRef {
                    version: d.snapshot.id.version,
                    ownership_epoch: d.snapshot.id.ownership_epoch,
                    checksum: d.snapshot.id.checksum.to_vec(),
                }),
                payload: d.snapshot.payload.clone(),
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report_outcomes(
        &self,
        request: Request<proto::ReportOutcomesRequest>,
    ) -> Result<Response<proto::ReportOutcomesResponse>, Status> {
        self.authorize(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let outcomes = r
            .outcomes
            .into_iter()
            .map(|o| {
                Ok(OutcomeCount {
                    proxy_id: o.proxy_id,
                    kind: outcome_kind(o.kind)?,
                    count: o.count,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let counted = self
            .service
            .report_outcomes(OutcomeBatch {
                worker_id: r.worker_id,
                session_id: r.session_id,
                batch_id: r.batch_id,
                outcomes,
            })
            .await?;
        Ok(Response::new(proto::ReportOutcomesResponse { duplicate: !counted }))
    }
}
