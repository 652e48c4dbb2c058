//! The SQS data plane: the queue engine (a tenant's backend), the two wire
//! protocols, and the SigV4-verifying gateway in front of the engines.

pub mod credentials;
pub mod engine;
pub mod gateway;
pub mod protocol;

/// Region of queue ARNs (seed 000's `aws.region`) and the only region a
/// request's signature may be scoped to, unless configured otherwise.
pub const DEFAULT_REGION: &str = "ru-msk-1";
