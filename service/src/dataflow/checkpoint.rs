//! Read positions of polling sources, saved only after the sink wrote what
//! was read up to them.

use async_trait::async_trait;

use crate::store::{Store, StoreError};

/// Keeps one read position per dataflow, keyed by the pipeline's id.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    async fn load(&self, flow: &str) -> Result<Option<String>, StoreError>;
    async fn save(&self, flow: &str, position: &str) -> Result<(), StoreError>;
}

/// The embedded store's setting that holds a dataflow's position.
pub fn setting_key(flow: &str) -> String {
    format!("checkpoint/{flow}")
}

/// `sless dev` keeps checkpoints in its embedded store.
#[async_trait]
impl CheckpointStore for Store {
    async fn load(&self, flow: &str) -> Result<Option<String>, StoreError> {
        self.setting(setting_key(flow)).await
    }

    async fn save(&self, flow: &str, position: &str) -> Result<(), StoreError> {
        self.put_setting(setting_key(flow), position.to_owned()).await
    }
}
