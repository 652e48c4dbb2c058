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
pub mod voters;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;

use super::config::{FIELD_MANAGER, OperatorConfig};
use super::context::reconcile_finalized;
pub use super::context::{Context, error_policy};
pub use super::error::Error;
use sless_model::queue_service::QueueServicePhase;

use super::crd::queue_service::{QueueEngine, QueueService, QueueServiceStatus};
use super::objects;

pub const FINALIZER: &str = "sless.kube5s.ru/sqs-finalizer";

pub async fn reconcile(qs: Arc<QueueService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ctx = &*ctx;
    reconcile_finalized(qs, ctx, FINALIZER, |api, event| async move {
        match event {
            Finalizer::Apply(qs) => apply(&qs, &api, ctx).await,
            Finalizer::Cleanup(qs) => cleanup(&qs, &api, ctx).await,
        }
    })
    .await
}

/// Why a QueueService may not make its children, if it may not: they go
/// to its tenant's namespace, so it must stand there itself. Anywhere else
/// it could make, and read the keys of, another tenant's queue service.
/// The admission webhook refuses such an object; the reconciler refuses
/// it too, for a cluster that runs without the webhook.
pub fn misplaced(qs: &QueueService) -> Option<String> {
    let tenant = &qs.spec.tenant_id;
    let home = builders::namespace_name(tenant);
    let here = qs.metadata.namespace.as_deref().unwrap_or_default();
    (here != home).then(|| {
        format!("a QueueService of tenant {tenant} must be in the tenant's namespace {home}, where its objects go; it is in {here:?}")
    })
}

async fn apply(qs: &QueueService, api: &Api<QueueService>, ctx: &Context) -> Result<Action, Error> {
    let ns = builders::namespace_name(&qs.spec.tenant_id);
    let current = qs.status.clone().unwrap_or_default();
    if let Some(reason) = misplaced(qs) {
        return refuse(qs, api, &current, reason).await;
    }
    if current.phase.is_none() {
        let accepted = QueueServiceStatus {
            phase: Some(QueueServicePhase::Pending),
            message: Some("accepted; creating the queue engine".into()),
            ..current.clone()
        };
        patch_status(api, qs, &accepted).await?;
    }
    ensure_namespace(qs, ctx).await?;
    ensure_secret(qs, ctx, &ns).await?;
    let config = with_tls(qs, ctx, &ns).await?;
    let rollout = apply_objects(qs, ctx, &config, &ns).await?;
    report(qs, api, ctx, &current, rollout, &config).await
}

/// A queue service this operator will not serve: Failed with `reason`,
/// until it changes.
async fn refuse(
    qs: &QueueService,
    api: &Api<QueueService>,
    current: &QueueServiceStatus,
    reason: String,
) -> Result<Action, Error> {
    let refused = QueueServiceStatus {
        phase: Some(QueueServicePhase::Failed),
        message: Some(reason),
        ..current.clone()
    };
    if refused != *current {
        patch_status(api, qs, &refused).await?;
    }
    Ok(Action::await_change())
}

/// The tenant's namespace, where this operator makes them (it may exist
/// already: the tenant's functions live there).
async fn ensure_namespace(qs: &QueueService, ctx: &Context) -> Result<(), Error> {
    if !ctx.config.create_namespaces {
        return Ok(());
    }
    let create = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match Api::<Namespace>::all(ctx.client.clone())
        .create(&create, &builders::namespace(qs))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The configuration this queue service is built with: TLS is on while the
/// SQS host's certificate exists, and then its copy is in the tenant's
/// namespace and the endpoint says https.
async fn with_tls(qs: &QueueService, ctx: &Context, ns: &str) -> Result<OperatorConfig, Error> {
    let client = &ctx.client;
    let source = match &ctx.config.sqs_tls_secret {
        Some(name) => Api::<Secret>::namespaced(client.clone(), &ctx.config.sqs_tls_namespace)
            .get_opt(name)
            .await?
            .filter(|s| {
                s.data
                    .as_ref()
                    .is_some_and(|d| d.contains_key("tls.crt") && d.contains_key("tls.key"))
            }),
        None => None,
    };
    if ctx.config.sqs_tls_secret.is_some() && source.is_none() {
        tracing::warn!(
            secret = ?ctx.config.sqs_tls_secret,
            namespace = %ctx.config.sqs_tls_namespace,
            "the SQS host's TLS Secret is missing: endpoints are plain http until it exists"
        );
    }
    match &source {
        Some(source) => {
            objects::apply(
                &Api::<Secret>::namespaced(client.clone(), ns),
                &builders::tls_secret(qs, source),
            )
            .await?;
        }
        None => objects::delete::<Secret>(client, ns, &builders::tls_secret_name(&qs.spec.tenant_id)).await?,
    }
    Ok(OperatorConfig {
        sqs_tls_secret: source.and(ctx.config.sqs_tls_secret.clone()),
        ..ctx.config.clone()
    })
}

/// The engine and what stands around it (its network policy, Services and
/// Ingress), applied; where the engine's rollout stands.
async fn apply_objects(qs: &QueueService, ctx: &Context, config: &OperatorConfig, ns: &str) -> Result<Rollout, Error> {
    let client = &ctx.client;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), ns);
    let existing = sets.get_opt(builders::STATEFUL_SET).await?;
    // The fence before the engine: only gateways reach it. Replicas that
    // still run (three being lowered to one) keep reaching each other.
    let running = existing
        .as_ref()
        .filter(|_| qs.spec.engine == QueueEngine::Sless)
        .and_then(|set| set.spec.as_ref()?.replicas)
        .map_or(0, |r| u8::try_from(r).unwrap_or(u8::MAX));
    objects::apply(
        &Api::<NetworkPolicy>::namespaced(client.clone(), ns),
        &builders::network_policy(qs, config, qs.spec.replicas().max(running)),
    )
    .await?;
    let rollout = apply_engine(qs, ctx, config, ns, existing).await?;
    let services = Api::<Service>::namespaced(client.clone(), ns);
    objects::apply(&services, &builders::service(qs)).await?;
    objects::apply(&services, &builders::gateway_service(qs, config)).await?;
    objects::apply(
        &Api::<Ingress>::namespaced(client.clone(), ns),
        &builders::ingress(qs, config),
    )
    .await?;
    Ok(rollout)
}

/// The status `rollout` gives, written if it changed (with an Event when
/// the phase did); when to look again.
async fn report(
    qs: &QueueService,
    api: &Api<QueueService>,
    ctx: &Context,
    current: &QueueServiceStatus,
    rollout: Rollout,
    config: &OperatorConfig,
) -> Result<Action, Error> {
    let tenant = &qs.spec.tenant_id;
    let desired = QueueServiceStatus {
        observed_generation: qs.metadata.generation,
        ..observed_status(current, rollout, &builders::endpoint(config, tenant), tenant)
    };
    if desired != *current {
        patch_status(api, qs, &desired).await?;
        tracing::info!(name = %qs.name_any(), %tenant, phase = ?desired.phase, "QueueService reconciled");
        if desired.phase != current.phase {
            let healthy = desired.phase != Some(QueueServicePhase::Failed);
            ctx.publish_phase(qs, healthy, &desired.conditions[0]).await;
        }
    }
    Ok(Action::requeue(match desired.phase {
        Some(QueueServicePhase::Ready) => Duration::from_secs(300),
        Some(QueueServicePhase::Failed) => Duration::from_secs(30),
        _ => Duration::from_secs(3),
    }))
}

/// Where the engine's Deployment stands with the spec last applied to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rollout {
    /// Every replica runs the current template and is available, and no
    /// pod of an older one is left.
    Done,
    /// The Deployment controller has not yet replaced every pod (with
    /// `Recreate`, the old engine may still be the one answering).
    InProgress,
    /// Rolled out, but no replica is available.
    Unavailable,
}

impl Rollout {
    /// ElasticMQ's Deployment of one.
    fn of_deployment(deployment: &Deployment) -> Self {
        // No report yet: a Deployment just made (or made again) runs nothing.
        let Some((status, observed)) = deployment
            .status
            .as_ref()
            .and_then(|s| Some((s, s.observed_generation?)))
        else {
            return Self::Unavailable;
        };
        let want = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let seen = observed >= deployment.metadata.generation.unwrap_or(0);
        let updated = status.updated_replicas.unwrap_or(0);
        if !seen || updated < want || status.replicas.unwrap_or(0) > updated {
            Self::InProgress
        } else if status.available_replicas.unwrap_or(0) >= want {
            Self::Done
        } else {
            Self::Unavailable
        }
    }

    /// `sless queue`'s StatefulSet: rolled out once the controller made
    /// every pod of the current template Ready once (its current revision
    /// is then the update revision; a pod evicted or lost afterwards does
    /// not undo that), and available while a majority of its replicas is
    /// (one replica of three down still serves).
    fn of_stateful_set(set: &StatefulSet) -> Self {
        let Some(status) = &set.status else {
            return Self::Unavailable;
        };
        let want = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let seen = status
            .observed_generation
            .is_some_and(|o| o >= set.metadata.generation.unwrap_or(0));
        let rolled = status.update_revision.is_some() && status.current_revision == status.update_revision;
        if !seen || !rolled || status.replicas < want {
            Self::InProgress
        } else if status.available_replicas.unwrap_or(0) > want / 2 {
            Self::Done
        } else {
            Self::Unavailable
        }
    }
}

/// Applies the engine's workload and what goes with it, and removes the
/// other engine's: where its rollout stands.
async fn apply_engine(
    qs: &QueueService,
    ctx: &Context,
    config: &OperatorConfig,
    ns: &str,
    existing: Option<StatefulSet>,
) -> Result<Rollout, Error> {
    let tenant = &qs.spec.tenant_id;
    let client = &ctx.client;
    match qs.spec.engine {
        QueueEngine::Elasticmq => {
            objects::delete::<StatefulSet>(client, ns, builders::STATEFUL_SET).await?;
            objects::delete::<Service>(client, ns, builders::PEERS_SERVICE).await?;
            objects::delete::<PodDisruptionBudget>(client, ns, &builders::disruption_budget_name(tenant)).await?;
            objects::apply(&Api::namespaced(client.clone(), ns), &builders::configmap(qs, config)).await?;
            if qs.spec.persistence {
                objects::apply(
                    &Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
                    &builders::pvc(qs),
                )
                .await?;
            }
            let deployment = objects::apply(
                &Api::<Deployment>::namespaced(client.clone(), ns),
                &builders::deployment(qs, config),
            )
            .await?;
            Ok(Rollout::of_deployment(&deployment))
        }
        QueueEngine::Sless => {
            objects::delete::<Deployment>(client, ns, &builders::deployment_name(tenant)).await?;
            objects::delete::<ConfigMap>(client, ns, &builders::configmap_name(tenant)).await?;
            objects::apply(
                &Api::<Service>::namespaced(client.clone(), ns),
                &builders::peers_service(qs),
            )
            .await?;
            objects::apply(
                &Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
                &builders::disruption_budget(qs),
            )
            .await?;
            let had = existing.as_ref().and_then(|s| s.spec.as_ref()?.replicas).unwrap_or(0);
            let wanted = i32::from(qs.spec.replicas());
            if wanted < had && !lower_voters(qs, ctx, ns, false).await? {
                return Ok(Rollout::InProgress);
            }
            // Not all Ready: a lowering given up midway may have left
            // replica 1 alone the voter.
            let ready = existing
                .as_ref()
                .and_then(|s| s.status.as_ref()?.ready_replicas)
                .unwrap_or(0);
            if wanted > 1 && wanted == had && ready < had {
                lower_voters(qs, ctx, ns, true).await?;
            }
            let sets = Api::<StatefulSet>::namespaced(client.clone(), ns);
            let (set, step) = builders::stateful_set_step(existing.as_ref(), builders::stateful_set(qs, config));
            let set = objects::apply(&sets, &set).await?;
            Ok(if step {
                Rollout::InProgress
            } else {
                Rollout::of_stateful_set(&set)
            })
        }
    }
}

/// Tells the replicas that replica 1 alone should be the voter (or, with
/// `undo`, the three again; see [`voters::Voters`]): whether replica 1
/// is the only voter, and so the set may lower to one.
async fn lower_voters(qs: &QueueService, ctx: &Context, ns: &str, undo: bool) -> Result<bool, Error> {
    let tenant = &qs.spec.tenant_id;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(&builders::secret_name(tenant))
        .await?;
    let Some(token) = secret
        .map(objects::secret_strings)
        .and_then(|mut v| v.remove(builders::PEER_TOKEN_KEY))
    else {
        return Ok(false);
    };
    if undo {
        ctx.voters.keep_three(&ctx.client, ns, tenant, &token).await;
        return Ok(false);
    }
    Ok(ctx.voters.lowered_to_one(&ctx.client, ns, tenant, &token).await)
}

/// The tenant's Secret: the keys and tokens are made once and kept (a
/// re-apply must not rotate them); a Secret from before a token was
/// needed gets it added.
async fn ensure_secret(qs: &QueueService, ctx: &Context, ns: &str) -> Result<(), Error> {
    let tenant = &qs.spec.tenant_id;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret_name = builders::secret_name(tenant);
    let Some(values) = secrets.get_opt(&secret_name).await?.map(objects::secret_strings) else {
        let credentials = sless_sqs::credentials::generate(tenant);
        let token = sless_sqs::credentials::engine_token;
        let secret = builders::secret(qs, &credentials, &token(), &token());
        let create = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        secrets.create(&create, &secret).await?;
        return Ok(());
    };
    let missing: serde_json::Map<String, serde_json::Value> = [builders::ENGINE_TOKEN_KEY, builders::PEER_TOKEN_KEY]
        .into_iter()
        .filter(|key| !values.contains_key(*key))
        .map(|key| (key.to_owned(), sless_sqs::credentials::engine_token().into()))
        .collect();
    if !missing.is_empty() {
        let patch = serde_json::json!({ "stringData": missing });
        secrets
            .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// The status a reconcile reports, from the one before and where the
/// engine's rollout stands. Equal in, equal out: a re-run without a change
/// writes nothing.
fn observed_status(current: &QueueServiceStatus, rollout: Rollout, endpoint: &str, tenant: &str) -> QueueServiceStatus {
    use QueueServicePhase::{Failed, Provisioning, Ready};
    let (phase, reason, message) = match (rollout, current.phase) {
        (Rollout::Done, _) => (Ready, "Available", "the queue engine is available"),
        (Rollout::Unavailable, Some(Ready | Failed)) => {
            (Failed, "Unavailable", "the queue engine has no available replica")
        }
        (Rollout::InProgress, Some(Ready | Failed)) => (
            Provisioning,
            "RollingOut",
            "replacing the queue engine for the new spec",
        ),
        (_, _) => (
            Provisioning,
            "Provisioning",
            "waiting for the queue engine to become available",
        ),
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
        conditions: vec![objects::ready_condition(
            &current.conditions,
            phase == Ready,
            reason,
            message,
        )],
        observed_generation: current.observed_generation,
        ready_at: match (&current.ready_at, phase) {
            (Some(at), _) => Some(at.clone()),
            (None, Ready) => Some(objects::now()),
            (None, _) => None,
        },
        // The route publisher's to set (crate::routes).
        routed: current.routed,
        route_left_out: current.route_left_out.clone(),
    }
}

/// Writes `status`, except where the route stands: that is the route
/// publisher's (crate::routes), and a copy read before its last write must
/// not undo it.
async fn patch_status(api: &Api<QueueService>, qs: &QueueService, status: &QueueServiceStatus) -> Result<(), Error> {
    let ours = QueueServiceStatus {
        routed: None,
        route_left_out: None,
        ..status.clone()
    };
    let patch = serde_json::json!({ "status": ours });
    api.patch_status(&qs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Removes what the QueueService made, except the PVC: the messages stay
/// until an operator deletes them (seed 000).
async fn cleanup(qs: &QueueService, api: &Api<QueueService>, ctx: &Context) -> Result<Action, Error> {
    let deleting = QueueServiceStatus {
        phase: Some(QueueServicePhase::Deleting),
        message: Some("deleting the queue engine and its objects; the message volume is kept".into()),
        ..qs.status.clone().unwrap_or_default()
    };
    patch_status(api, qs, &deleting).await?;
    let tenant = &qs.spec.tenant_id;
    let ns = builders::namespace_name(tenant);
    let client = &ctx.client;
    objects::delete::<Deployment>(client, &ns, &builders::deployment_name(tenant)).await?;
    objects::delete::<StatefulSet>(client, &ns, builders::STATEFUL_SET).await?;
    objects::delete::<PodDisruptionBudget>(client, &ns, &builders::disruption_budget_name(tenant)).await?;
    objects::delete::<Service>(client, &ns, builders::PEERS_SERVICE).await?;
    objects::delete::<Service>(client, &ns, &builders::service_name(tenant)).await?;
    objects::delete::<Ingress>(client, &ns, &builders::ingress_name(tenant)).await?;
    objects::delete::<Service>(client, &ns, &builders::gateway_service_name(tenant)).await?;
    objects::delete::<NetworkPolicy>(client, &ns, &builders::network_policy_name(tenant)).await?;
    objects::delete::<ConfigMap>(client, &ns, &builders::configmap_name(tenant)).await?;
    objects::delete::<Secret>(client, &ns, &builders::secret_name(tenant)).await?;
    objects::delete::<Secret>(client, &ns, &builders::tls_secret_name(tenant)).await?;
    tracing::info!(name = %qs.name_any(), %tenant, "QueueService removed; its PVC is kept");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests;
