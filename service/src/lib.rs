//! sless: managed SQS-compatible queues and data pipelines, ordered with
//! `terraform apply`. This crate is the top of the crate graph: the REST API,
//! tenants, `sless dev`, and the `sless` binary that wires them.

pub mod api;
pub mod dev;
pub mod tenants;

#[cfg(test)]
mod layering;
