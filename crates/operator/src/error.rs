//! The reconcilers' error, below everything that returns it (the context
//! and the object helpers), so neither imports the other for it.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the object has no namespace")]
    NoNamespace,
    #[error("{0} holds no positions key (64 hex digits); delete it to have one made")]
    PositionsKey(String),
}
