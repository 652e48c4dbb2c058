//! `sless dev` keeps the read positions of its dataflows in its embedded
//! store.

use async_trait::async_trait;
use sless_dataflow::checkpoint::{CheckpointError, CheckpointStore};

use super::db::Store;

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
        self.store
            .setting(self.key.clone())
            .await
            .map_err(|e| CheckpointError::Store(e.into()))
    }

    async fn save(&self, position: &str) -> Result<(), CheckpointError> {
        self.store
            .put_setting(self.key.clone(), position.to_owned())
            .await
            .map_err(|e| CheckpointError::Store(e.into()))
    }
}
