//! What every reconcile shares, and the reconcilers' error.

use kube::Client;

use super::config::OperatorConfig;

pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the object has no namespace")]
    NoNamespace,
}
