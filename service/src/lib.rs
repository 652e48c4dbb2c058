//! sless: managed SQS-compatible queues and data pipelines, ordered with
//! `terraform apply`. This crate is the `sless` binary's library.

pub mod api;
pub mod controlplane;
pub mod crypto;
pub mod dataflow;
pub mod dev;
pub mod model;
pub mod operator;
pub mod platform;
pub mod processor;
pub mod random;
pub mod shutdown;
pub mod sqs;
pub mod store;
pub mod tenants;
