//! Read positions of polling sources, saved only after the sinks wrote what
//! was read up to them. Each store holds the position of one dataflow.

pub mod configmap;
pub mod file;

use async_trait::async_trait;

use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("embedded store: {0}")]
    Store(#[from] StoreError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("checkpoint file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[async_trait]
pub trait CheckpointStore: Send + Sync {
    async fn load(&self) -> Result<Option<String>, CheckpointError>;
    async fn save(&self, position: &str) -> Result<(), CheckpointError>;
}

/// `sless dev` keeps checkpoints in its embedded store, one setting each.
pub struct EmbeddedCheckpoint {
    store: Store,
    key: String,
}

impl EmbeddedCheckpoint {
    pub fn new(store: Store, flow: &str) -> Self {
        Self {
            store,
            key: Self::setting_key(flow),
        }
    }

    /// The setting that holds the position of the dataflow `flow`.
    pub fn setting_key(flow: &str) -> String {
        format!("checkpoint/{flow}")
    }
}

#[async_trait]
impl CheckpointStore for EmbeddedCheckpoint {
    async fn load(&self) -> Result<Option<String>, CheckpointError> {
        Ok(self.store.setting(self.key.clone()).await?)
    }

    async fn save(&self, position: &str) -> Result<(), CheckpointError> {
        Ok(self.store.put_setting(self.key.clone(), position.to_owned()).await?)
    }
}
