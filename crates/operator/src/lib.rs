//! Kubernetes mode (seeds 000 and 001): the custom resources QueueService
//! and DataFlow, and their reconcilers. The generated
//! CustomResourceDefinitions are committed under `deploy/crds/` and printed
//! by `sless crds`.

pub mod config;
pub mod context;
pub mod crd;
pub mod dataflow;
pub mod error;
pub mod leader;
pub mod objects;
pub mod queue_service;
pub mod routes;
pub mod runner;
pub mod webhook;
