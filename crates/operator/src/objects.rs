//! Writing children: server-side apply under the operator's field manager,
//! delete that tolerates absence, and the `Ready` condition of a status.

use k8s_openapi::NamespaceResourceScope;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SeccompProfile, SecurityContext};
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::FIELD_MANAGER;
use super::error::Error;

/// Applies `obj` server-side: creates it or brings our fields to it.
pub async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Ok(api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(obj))
        .await?)
}

/// Deletes `name` in `ns`; an absent object is fine.
pub async fn delete<K>(client: &Client, ns: &str, name: &str) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
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

/// The user and group of the sless image (`USER 65532:65532` in the
/// Dockerfile).
const IMAGE_USER: i64 = 65532;

/// The pod of a queue engine or a dataflow processor: the image's user and
/// group named (the kubelet takes only the user from the image and would
/// run it in group root), its volumes (Secrets, the journal's PVC, the
/// spill `emptyDir`) readable and writable through that group, the
/// runtime's default seccomp filter.
pub fn fenced_pod() -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: Some(IMAGE_USER),
        run_as_group: Some(IMAGE_USER),
        fs_group: Some(IMAGE_USER),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Its container: no privilege, no capability, nothing written outside its
/// volumes.
pub fn fenced_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A NetworkPolicy peer: the pods of `namespace`, or only those carrying
/// the label `pods` there.
pub fn namespace_peer(namespace: &str, pods: Option<(&str, &str)>) -> NetworkPolicyPeer {
    let selector = |(k, v): (&str, &str)| LabelSelector {
        match_labels: Some(BTreeMap::from([(k.to_owned(), v.to_owned())])),
        ..Default::default()
    };
    NetworkPolicyPeer {
        namespace_selector: Some(selector(("kubernetes.io/metadata.name", namespace))),
        pod_selector: pods.map(selector),
        ..Default::default()
    }
}

/// A NetworkPolicy port.
pub fn policy_port(protocol: &str, port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some(protocol.into()),
        ..Default::default()
    }
}

/// The `Ready` condition; its transition time moves only when its status does.
pub fn ready_condition(previous: &[Condition], ready: bool, reason: &str, message: &str) -> Condition {
    let status = if ready { "True" } else { "False" };
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: previous
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == status)
            .map_or_else(now, |c| c.last_transition_time.clone()),
    }
}

/// A Secret's values as text, `stringData` over `data`.
pub fn secret_strings(secret: k8s_openapi::api::core::v1::Secret) -> std::collections::BTreeMap<String, String> {
    let mut values: std::collections::BTreeMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    values.extend(secret.string_data.unwrap_or_default());
    values
}

pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The client the operator reaches its own pods with (processors,
/// engine replicas): they answer at once or not at all; never a redirect
/// or a proxy.
pub fn pod_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(2))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap_or_default()
}

/// `labels` as a list call's label selector (`k=v,k=v`).
pub fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
