//! The DataFlow reconciler (seed 001, "reconcile loop"): validates the spec
//! with the REST API's rules, resolves its secret references, applies the
//! spec ConfigMap, the checkpoint ConfigMap and its RBAC (unless
//! `checkpointPersistence: false`) and the processor Deployment, and maps
//! the Deployment's state to the DataFlow's phase. Deletion removes them.

pub mod builders;
pub mod processor;
pub mod secrets;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use serde_json::Value;

use super::context::reconcile_finalized;
pub use super::context::{Context, error_policy};
pub use super::error::Error;
use sless_model::dataflow::DataFlowPhase;

use super::crd::dataflow::{DataFlow, DataFlowStatus};
use super::crd::queue_service::QueueService;
use super::objects;
use super::queue_service::builders as qs_builders;
use sless_dataflow::checkpoint::configmap::configmap_name as checkpoint_name;
use sless_dataflow::context::{PositionsKey, QueueAccess};
use sless_model::dataflow::DataFlowSpec;
use sless_model::queue_service::QueueServicePhase;

pub const FINALIZER: &str = "dataflow.dataflow.io/finalizer";

pub async fn reconcile(df: Arc<DataFlow>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ctx = &*ctx;
    reconcile_finalized(df, ctx, FINALIZER, |api, event| async move {
        match event {
            Finalizer::Apply(df) => apply(&df, &api, ctx).await,
            Finalizer::Cleanup(df) => cleanup(&df, &api, ctx).await,
        }
    })
    .await
}

/// Every config of a spec that may hold secret references, with its path.
fn configs_mut(spec: &mut DataFlowSpec) -> Vec<(&mut Value, String)> {
    let mut out = Vec::new();
    for (c, path) in [(&mut spec.source, "source"), (&mut spec.sink, "sink")] {
        if let Some(config) = c.config.as_mut() {
            out.push((config, format!("{path}.config")));
        }
    }
    if let Some(config) = spec.errors.as_mut().and_then(|e| e.config.as_mut()) {
        out.push((config, "errors.config".into()));
    }
    for (i, t) in spec.transformations.iter_mut().enumerate() {
        if let Some(config) = t.config.as_mut() {
            out.push((config, format!("transformations[{i}].config")));
        }
    }
    out
}

/// The Secrets a spec's references name, once each; refused when one
/// leaves `namespace`. Shared with the admission webhook.
pub fn referenced_secrets(spec: &DataFlowSpec, namespace: &str) -> Result<Vec<String>, secrets::ResolveError> {
    let mut spec = spec.clone();
    let configs = configs_mut(&mut spec);
    let shared: Vec<(&Value, String)> = configs.iter().map(|(c, p)| (&**c, p.clone())).collect();
    secrets::secret_names(&shared, namespace)
}

/// What resolving a spec's references to the cluster came to. The API
/// server failing is the reconcile's `Error`; a reference that cannot be
/// satisfied (yet) is the DataFlow's own trouble, shown on its status.
enum Resolved<T> {
    Ready(T),
    Unresolved(String),
}

/// The spec with its secret references replaced by values (TLS ones by
/// files to mount), or why not.
async fn resolve(
    ctx: &Context,
    namespace: &str,
    mut spec: DataFlowSpec,
) -> Result<Resolved<(DataFlowSpec, Vec<secrets::TlsMount>)>, Error> {
    let names = match referenced_secrets(&spec, namespace) {
        Ok(names) => names,
        Err(e) => return Ok(Resolved::Unresolved(e.to_string())),
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut values = BTreeMap::new();
    for name in names {
        let Some(secret) = api.get_opt(&name).await? else {
            return Ok(Resolved::Unresolved(format!("secret {name} not found in {namespace}")));
        };
        values.insert(name, objects::secret_strings(secret));
    }
    let mut mounts = Vec::new();
    for (config, path) in configs_mut(&mut spec) {
        if let Err(e) = secrets::resolve(config, &path, namespace, &values, &mut mounts) {
            return Ok(Resolved::Unresolved(e.to_string()));
        }
    }
    Ok(match resolve_queue_services(ctx, namespace, &mut spec).await? {
        Resolved::Ready(()) => Resolved::Ready((spec, mounts)),
        Resolved::Unresolved(reason) => Resolved::Unresolved(reason),
    })
}

/// Resolves the queue services `spec`'s SQS connectors name (the SQS
/// component says which). A DataFlow reaches only the QueueServices of its
/// own namespace, as the REST API lets a tenant reach only its own.
async fn resolve_queue_services(
    ctx: &Context,
    namespace: &str,
    spec: &mut DataFlowSpec,
) -> Result<Resolved<()>, Error> {
    let mut access = BTreeMap::new();
    for name in sless_dataflow::registry::named_queue_services(spec) {
        let Some(qs) = Api::<QueueService>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&name)
            .await?
        else {
            return Ok(Resolved::Unresolved(format!(
                "queue service {name} not found in {namespace}"
            )));
        };
        let status = qs.status.clone().unwrap_or_default();
        let (Some(QueueServicePhase::Ready), Some(endpoint)) = (status.phase, status.endpoint) else {
            return Ok(Resolved::Unresolved(format!("queue service {name} is not Ready yet")));
        };
        let tenant = &qs.spec.tenant_id;
        // Only the tenant's own: a QueueService in this namespace naming
        // another tenant must not hand that tenant's keys out.
        if qs_builders::namespace_name(tenant) != namespace {
            return Ok(Resolved::Unresolved(format!(
                "queue service {name} names tenant {tenant}, not the tenant of {namespace}"
            )));
        }
        let keys = Api::<Secret>::namespaced(ctx.client.clone(), &qs_builders::namespace_name(tenant))
            .get_opt(&qs_builders::secret_name(tenant))
            .await?
            .map(objects::secret_strings)
            .unwrap_or_default();
        let (Some(access_key), Some(secret_key)) = (keys.get("accessKey"), keys.get("secretKey")) else {
            return Ok(Resolved::Unresolved(format!("queue service {name} has no keys yet")));
        };
        access.insert(
            name,
            QueueAccess {
                endpoint,
                account_id: sless_sqs::credentials::account_id(tenant),
                access_key: access_key.clone(),
                secret_key: secret_key.clone(),
            },
        );
    }
    Ok(match sless_dataflow::registry::fill_queue_services(spec, &access) {
        Ok(()) => Resolved::Ready(()),
        Err(reason) => Resolved::Unresolved(reason),
    })
}

async fn apply(df: &DataFlow, api: &Api<DataFlow>, ctx: &Context) -> Result<Action, Error> {
    let ns = &df.namespace().ok_or(Error::NoNamespace)?;
    let name = df.name_any();
    let current = df.status.clone().unwrap_or_default();
    // A refused spec leaves the children as they are: the processor keeps
    // running the last spec that was valid.
    let outcome = match df.spec.to_spec() {
        Err(errors) => Err(format!("invalid spec: {errors}")),
        Ok(spec) => match resolve(ctx, ns, spec).await? {
            Resolved::Unresolved(reason) => Err(reason),
            Resolved::Ready((resolved, mounts)) => Ok(apply_children(df, &resolved, &mounts, ctx, ns).await?),
        },
    };
    let was_up = current.phase == Some(DataFlowPhase::Running)
        || (current.phase == Some(DataFlowPhase::Error)
            && current.conditions.iter().any(|c| c.reason == "Unavailable"));
    // The processor's own word comes first: it knows why it fails (a
    // refused login, a refused message), which its readiness cannot say.
    let reported = match &outcome {
        Ok(_) => ctx.processors.status(&ctx.client, ns, &name).await,
        Err(_) => None,
    };
    let (phase, reason, message) = match (outcome, reported) {
        (Ok(_), Some(sless_model::dataflow::DataFlowStatus { phase, message })) => (
            phase,
            reported_reason(phase),
            message.unwrap_or_else(|| "the processor gave no reason".into()),
        ),
        (Ok(true), None) => (DataFlowPhase::Running, "Running", "the processor is running".to_owned()),
        (Ok(false), None) if was_up => (
            DataFlowPhase::Error,
            "Unavailable",
            "the processor has no ready replica".to_owned(),
        ),
        (Ok(false), None) => (
            DataFlowPhase::Pending,
            "Starting",
            "the processor is starting".to_owned(),
        ),
        (Err(reason), _) => (DataFlowPhase::Error, "Invalid", reason),
    };
    let desired = DataFlowStatus {
        phase: Some(phase),
        message: Some(message.clone()),
        conditions: vec![objects::ready_condition(
            &current.conditions,
            phase == DataFlowPhase::Running,
            reason,
            &message,
        )],
        observed_generation: df.metadata.generation,
        last_updated: current.last_updated.clone(),
    };
    if desired != current {
        let desired = DataFlowStatus {
            last_updated: Some(objects::now()),
            ..desired
        };
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": desired })),
        )
        .await?;
        tracing::info!(%ns, %name, ?phase, "DataFlow reconciled");
        // A new phase, or another reason to be in it (a different error).
        if Some(phase) != current.phase || desired.message != current.message {
            ctx.publish_phase(df, phase != DataFlowPhase::Error, &desired.conditions[0])
                .await;
        }
    }
    Ok(match phase {
        DataFlowPhase::Running => Action::requeue(Duration::from_secs(300)),
        DataFlowPhase::Pending => Action::requeue(Duration::from_secs(5)),
        _ => Action::requeue(Duration::from_secs(30)),
    })
}

/// The condition's reason for a phase the processor reported.
fn reported_reason(phase: DataFlowPhase) -> &'static str {
    match phase {
        DataFlowPhase::Running => "Running",
        DataFlowPhase::Pending => "Starting",
        DataFlowPhase::Error => "ProcessorFailing",
        DataFlowPhase::Stopped => "Stopped",
    }
}

/// Applies the children of a valid, resolved spec; whether the processor
/// has a ready replica.
async fn apply_children(
    df: &DataFlow,
    spec: &DataFlowSpec,
    mounts: &[secrets::TlsMount],
    ctx: &Context,
    ns: &str,
) -> Result<bool, Error> {
    let client = &ctx.client;
    let name = df.name_any();
    let json = builders::spec_json(spec);
    let positions_key = positions_key(client, ns).await?;
    // The resolved spec holds the secrets' values: a Secret, not a ConfigMap
    // (an older operator's ConfigMap of it is removed).
    objects::apply(
        &Api::<Secret>::namespaced(client.clone(), ns),
        &builders::spec_secret(df, &json, &positions_key),
    )
    .await?;
    objects::delete::<ConfigMap>(client, ns, &builders::spec_name(&name)).await?;
    if spec.checkpoint_persistence {
        objects::apply(
            &Api::<ConfigMap>::namespaced(client.clone(), ns),
            &builders::checkpoint_configmap(df),
        )
        .await?;
        objects::apply(
            &Api::<ServiceAccount>::namespaced(client.clone(), ns),
            &builders::service_account(df),
        )
        .await?;
        objects::apply(&Api::<Role>::namespaced(client.clone(), ns), &builders::role(df)).await?;
        objects::apply(
            &Api::<RoleBinding>::namespaced(client.clone(), ns),
            &builders::role_binding(df),
        )
        .await?;
    } else {
        remove_checkpoint(client, ns, &name).await?;
    }
    // The fence before the processor.
    objects::apply(
        &Api::<NetworkPolicy>::namespaced(client.clone(), ns),
        &builders::network_policy(df, &ctx.config),
    )
    .await?;
    let deployment = objects::apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        &builders::deployment(df, spec, &json, mounts, &ctx.config),
    )
    .await?;
    Ok(deployment.status.and_then(|s| s.ready_replicas).unwrap_or(0) >= 1)
}

/// The namespace's positions key: read, or made once (by whichever
/// operator's create wins) and then never changed.
async fn positions_key(client: &kube::Client, ns: &str) -> Result<String, Error> {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let stored = |secret: Secret| {
        objects::secret_strings(secret)
            .remove(builders::POSITIONS_KEY_FILE)
            .filter(|text| PositionsKey::from_text(text).is_some())
    };
    if let Some(key) = api.get_opt(builders::POSITIONS_KEY_SECRET).await?.and_then(stored) {
        return Ok(key);
    }
    let made = builders::positions_key_secret(ns, &PositionsKey::generate().to_text());
    match api.create(&kube::api::PostParams::default(), &made).await {
        Ok(created) => stored(created),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            api.get_opt(builders::POSITIONS_KEY_SECRET).await?.and_then(stored)
        }
        Err(e) => return Err(e.into()),
    }
    .ok_or_else(|| Error::PositionsKey(format!("{ns}/{}", builders::POSITIONS_KEY_SECRET)))
}

async fn remove_checkpoint(client: &kube::Client, ns: &str, name: &str) -> Result<(), Error> {
    let account = builders::processor_account(name);
    objects::delete::<ConfigMap>(client, ns, &checkpoint_name(name)).await?;
    objects::delete::<RoleBinding>(client, ns, &account).await?;
    objects::delete::<Role>(client, ns, &account).await?;
    objects::delete::<ServiceAccount>(client, ns, &account).await
}

/// How long the operator tries to remove a deleted dataflow's source state.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(15);

/// Removes what the source and the sink keep on their servers (a
/// `postgresql-cdc` replication slot and publication, an exactly-once
/// sink's stored position), after the processor is gone. A failure is
/// logged and does not hold the deletion: the slot is left on the tenant's
/// server (docs/connectors.md says how to drop it).
async fn release_source(df: &DataFlow, ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let Ok(spec) = df.spec.to_spec() else { return Ok(()) };
    let Resolved::Ready((resolved, _)) = resolve(ctx, ns, spec).await? else {
        return Ok(());
    };
    let pipeline = sless_dataflow::context::PipelineContext {
        // The processor's id, which names the slot.
        id: format!("{ns}/{name}"),
        checkpoint: None,
        egress: Arc::new(sless_dataflow::egress::EgressPolicy::restricted(vec![], vec![], None)),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        // Deleting a position needs no seal.
        positions_key: None,
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    };
    let released = tokio::time::timeout(
        RELEASE_TIMEOUT,
        sless_dataflow::registry::release(&resolved.source, &resolved.sink, &pipeline),
    )
    .await;
    match released {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%ns, %name, %error, "cannot remove the dataflow's state on its servers"),
        Err(_) => tracing::warn!(%ns, %name, "removing the dataflow's state on its servers timed out"),
    }
    Ok(())
}

async fn cleanup(df: &DataFlow, api: &Api<DataFlow>, ctx: &Context) -> Result<Action, Error> {
    let ns = &df.namespace().ok_or(Error::NoNamespace)?;
    let name = df.name_any();
    objects::delete::<Deployment>(&ctx.client, ns, &builders::deployment_name(&name)).await?;
    release_source(df, ctx, ns, &name).await?;
    objects::delete::<Secret>(&ctx.client, ns, &builders::spec_name(&name)).await?;
    objects::delete::<ConfigMap>(&ctx.client, ns, &builders::spec_name(&name)).await?;
    remove_checkpoint(&ctx.client, ns, &name).await?;
    // Seed 001: the processor and its objects are gone, the flow Stopped.
    let stopped = serde_json::json!({"status": {
        "phase": DataFlowPhase::Stopped,
        "message": "the processor is stopped and its objects removed; the dataflow is being deleted",
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&stopped))
        .await?;
    tracing::info!(%ns, %name, "DataFlow removed");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests;
