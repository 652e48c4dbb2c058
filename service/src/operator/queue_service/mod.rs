//! The QueueService reconciler (seed 000, step 4), in the shape of
//! kube-rs/controller-rs: one `reconcile` behind `kube::runtime::finalizer`,
//! an `error_policy`, children applied server-side under one field manager,
//! and the phase reported in the status with a `Ready` condition.
//!
//! Pending (accepted) → Provisioning (children applied, engine not yet
//! available) → Ready (the Deployment has an available replica); a Ready
//! instance whose engine loses its replica turns Failed, and Ready again
//! when it recovers. Deletion removes the children but keeps the PVC.

pub mod builders;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::{FIELD_MANAGER, OperatorConfig};
use super::crd::queue_service::{QueueService, QueueServicePhase, QueueServiceStatus};

pub const FINALIZER: &str = "sless.kube5s.ru/sqs-finalizer";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the QueueService has no namespace")]
    NoNamespace,
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
}

pub async fn reconcile(qs: Arc<QueueService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = qs.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<QueueService> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, qs, |event| async {
        match event {
            Finalizer::Apply(qs) => apply(&qs, &api, &ctx).await,
            Finalizer::Cleanup(qs) => cleanup(&qs, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Retries a failed reconcile after a pause; the controller's own backoff
/// queue spreads repeated failures.
pub fn error_policy(qs: Arc<QueueService>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %qs.name_any(), %error, "QueueService reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

/// Applies `obj` server-side: creates it or brings our fields to it.
async fn apply_object<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Ok(api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(obj))
        .await?)
}

async fn apply(qs: &QueueService, api: &Api<QueueService>, ctx: &Context) -> Result<Action, Error> {
    let tenant = &qs.spec.tenant_id;
    let ns = builders::namespace_name(tenant);
    let current = qs.status.clone().unwrap_or_default();
    if current.phase.is_none() {
        let accepted = QueueServiceStatus {
            phase: Some(QueueServicePhase::Pending),
            message: Some("accepted; creating the queue engine".into()),
            ..current.clone()
        };
        patch_status(api, qs, &accepted).await?;
    }
    let client = &ctx.client;
    let create = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    // The tenant's namespace may exist already (its functions live there).
    if ctx.config.create_namespaces {
        match Api::<Namespace>::all(client.clone())
            .create(&create, &builders::namespace(qs))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The keys are made once and kept: a re-apply must not rotate them.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    if secrets.get_opt(&builders::secret_name(tenant)).await?.is_none() {
        let credentials = crate::platform::credentials::generate(tenant);
        secrets.create(&create, &builders::secret(qs, &credentials)).await?;
    }
    apply_object(
        &Api::namespaced(client.clone(), &ns),
        &builders::configmap(qs, &ctx.config),
    )
    .await?;
    if qs.spec.persistence {
        apply_object(
            &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
            &builders::pvc(qs),
        )
        .await?;
    }
    let deployment = apply_object(
        &Api::<Deployment>::namespaced(client.clone(), &ns),
        &builders::deployment(qs, &ctx.config),
    )
    .await?;
    apply_object(&Api::<Service>::namespaced(client.clone(), &ns), &builders::service(qs)).await?;
    apply_object(
        &Api::<Ingress>::namespaced(client.clone(), &ns),
        &builders::ingress(qs, &ctx.config),
    )
    .await?;

    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
        >= 1;
    let desired = observed_status(&current, available, &builders::endpoint(&ctx.config, tenant), tenant);
    if desired != current {
        patch_status(api, qs, &desired).await?;
        tracing::info!(name = %qs.name_any(), %tenant, phase = ?desired.phase, "QueueService reconciled");
    }
    Ok(Action::requeue(match desired.phase {
        Some(QueueServicePhase::Ready) => Duration::from_secs(300),
        Some(QueueServicePhase::Failed) => Duration::from_secs(30),
        _ => Duration::from_secs(3),
    }))
}

/// The status a reconcile reports, from the one before and whether the
/// engine's Deployment has an available replica. Equal in, equal out: a
/// re-run without a change writes nothing.
fn observed_status(current: &QueueServiceStatus, available: bool, endpoint: &str, tenant: &str) -> QueueServiceStatus {
    use QueueServicePhase::{Failed, Provisioning, Ready};
    let (phase, reason, message) = match (available, current.phase) {
        (true, _) => (Ready, "Available", "the queue engine is available"),
        (false, Some(Ready | Failed)) => (Failed, "Unavailable", "the queue engine has no available replica"),
        (false, _) => (
            Provisioning,
            "Provisioning",
            "waiting for the queue engine to become available",
        ),
    };
    let status = if phase == Ready { "True" } else { "False" };
    let previous = current.conditions.iter().find(|c| c.type_ == "Ready");
    let condition = Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        // The transition time moves only when the condition's status does.
        last_transition_time: previous
            .filter(|c| c.status == status)
            .map_or_else(|| Time(jiff_now()), |c| c.last_transition_time.clone()),
    };
    QueueServiceStatus {
        phase: Some(phase),
        endpoint: if phase == Ready {
            Some(endpoint.to_owned())
        } else {
            current.endpoint.clone()
        },
        secret_name: Some(builders::secret_name(tenant)),
        message: Some(message.into()),
        conditions: vec![condition],
        ready_at: match (&current.ready_at, phase) {
            (Some(at), _) => Some(at.clone()),
            (None, Ready) => Some(Time(jiff_now())),
            (None, _) => None,
        },
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

async fn patch_status(api: &Api<QueueService>, qs: &QueueService, status: &QueueServiceStatus) -> Result<(), Error> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(&qs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Removes what the QueueService made, except the PVC: the messages stay
/// until an operator deletes them (seed 000).
async fn cleanup(qs: &QueueService, ctx: &Context) -> Result<Action, Error> {
    let tenant = &qs.spec.tenant_id;
    let ns = builders::namespace_name(tenant);
    let client = &ctx.client;
    delete::<Deployment>(client, &ns, &builders::deployment_name(tenant)).await?;
    delete::<Service>(client, &ns, &builders::service_name(tenant)).await?;
    delete::<Ingress>(client, &ns, &builders::ingress_name(tenant)).await?;
    delete::<ConfigMap>(client, &ns, &builders::configmap_name(tenant)).await?;
    delete::<Secret>(client, &ns, &builders::secret_name(tenant)).await?;
    tracing::info!(name = %qs.name_any(), %tenant, "QueueService removed; its PVC is kept");
    Ok(Action::await_change())
}

async fn delete<K>(client: &Client, ns: &str, name: &str) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
