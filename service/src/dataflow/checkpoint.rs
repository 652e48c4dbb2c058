//! Read positions of polling sources, saved only after the sink wrote what
//! was read up to them.

use async_trait::async_trait;

use crate::store::{Store, StoreError};

#[async_trait]
pub trait CheckpointStore: Send + Sync {
    async fn load(&self, key: &str) -> Result<Option<String>, StoreError>;
    async fn save(&self, key: &str, position: &str) -> Result<(), StoreError>;
}

/// `sless dev` keeps checkpoints in its embedded store.
#[async_trait]
impl CheckpointStore for Store {
    async fn load(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.setting(key.to_owned()).await
    }

    async fn save(&self, key: &str, position: &str) -> Result<(), StoreError> {
        self.put_setting(key.to_owned(), position.to_owned()).await
    }
}
