//! A checkpoint in the ConfigMap `dataflow-<name>-checkpoint` (seed 001), for
//! `sless processor` in Kubernetes. Written by server-side apply under its
//! own field manager, so it never fights the operator over other fields.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use super::{CheckpointError, CheckpointStore};

/// The data key holding the position.
pub const POSITION_KEY: &str = "position";
pub const FIELD_MANAGER: &str = "sless-processor";

/// Name of the checkpoint ConfigMap of the DataFlow `name`.
pub fn configmap_name(dataflow: &str) -> String {
    format!("dataflow-{dataflow}-checkpoint")
}

pub struct ConfigMapCheckpoint {
    api: Api<ConfigMap>,
    name: String,
}

impl ConfigMapCheckpoint {
    pub fn new(client: kube::Client, namespace: &str, dataflow: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: configmap_name(dataflow),
        }
    }
}

#[async_trait]
impl CheckpointStore for ConfigMapCheckpoint {
    async fn load(&self) -> Result<Option<String>, CheckpointError> {
        Ok(self
            .api
            .get_opt(&self.name)
            .await?
            .and_then(|cm| cm.data)
            .and_then(|mut data| data.remove(POSITION_KEY)))
    }

    async fn save(&self, position: &str) -> Result<(), CheckpointError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(POSITION_KEY.to_owned(), position.to_owned())])),
            ..Default::default()
        };
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! kube-fake-client stands in for the kube-apiserver (none runs here):
    //! an in-memory API with resource versions and server-side apply.
    use super::*;

    #[tokio::test]
    async fn positions_round_trip_through_the_configmap_and_keep_other_keys() {
        let existing = ConfigMap {
            metadata: ObjectMeta {
                name: Some(configmap_name("orders")),
                namespace: Some("team-a".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("note".to_owned(), "made by the operator".to_owned())])),
            ..Default::default()
        };
        let client = kube_fake_client::ClientBuilder::new()
            .with_object(existing)
            .build()
            .await
            .unwrap();
        let cp = ConfigMapCheckpoint::new(client.clone(), "team-a", "orders");
        assert_eq!(cp.load().await.unwrap(), None);
        cp.save("2026-12-02 10:00:00+00").await.unwrap();
        cp.save("2026-12-02 11:00:00+00").await.unwrap();
        assert_eq!(cp.load().await.unwrap().as_deref(), Some("2026-12-02 11:00:00+00"));
        let stored = Api::<ConfigMap>::namespaced(client.clone(), "team-a")
            .get("dataflow-orders-checkpoint")
            .await
            .unwrap();
        assert_eq!(
            stored.data.unwrap().get("note").map(String::as_str),
            Some("made by the operator")
        );
        // Another namespace's dataflow of the same name is another checkpoint.
        let other = ConfigMapCheckpoint::new(client, "team-b", "orders");
        assert_eq!(other.load().await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_first_save_creates_the_configmap() {
        let client = kube_fake_client::ClientBuilder::new().build().await.unwrap();
        let cp = ConfigMapCheckpoint::new(client, "ns", "fresh");
        cp.save("7").await.unwrap();
        assert_eq!(cp.load().await.unwrap().as_deref(), Some("7"));
    }
}
