//! Read positions of polling sources, saved only after the sinks wrote what
//! was read up to them. Each store holds the position of one dataflow.

pub mod configmap;
pub mod debounced;
pub mod file;

use async_trait::async_trait;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store of another platform (`sless dev`'s embedded database).
    #[error("checkpoint store: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    /// Saves `position` before returning, whatever the store's pace: what
    /// follows must not happen before it is kept.
    async fn save_now(&self, position: &str) -> Result<(), CheckpointError> {
        self.save(position).await
    }
}
