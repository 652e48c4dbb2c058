//! The SQS data plane: the queue engine (a tenant's backend), the two wire
//! protocols, and the SigV4-verifying gateway in front of the engines.

pub mod engine;
pub mod gateway;
pub mod protocol;
